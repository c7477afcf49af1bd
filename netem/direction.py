"""One direction of a shaped link: the element chain built from a LinkSpec, and live changes.

Chain order is gate -> loss -> rate queue (queueing discipline + serialization) -> delay line
-> sink: a packet is lost or admitted when it reaches the link, waits its turn at the
bottleneck, then propagates. Timed changes come from outside (`netem.schedule`), each applied
at its own time after everything due before it has been released.
"""

from __future__ import annotations

import random
from typing import Any

from netem.elements import DelayLine, Element, Gate, LossProcess, RateQueue, Sink
from netem.qdisc import make_qdisc
from netem.spec import LinkSpec

SEED_LIMIT = 2**31  # a run's seed is below it, so each link's seeds keep a range of their own


class Direction:
    def __init__(self, spec: LinkSpec, seed: int) -> None:
        # Loss draws at arrival, jitter at the end of serialization: separate streams, so
        # the order in which the shaper happens to run them does not change the draws.
        self.gate = Gate()
        self.loss = LossProcess(spec.loss, random.Random(_loss_seed(seed)))
        self.rate = RateQueue(
            spec.rate_bps, make_qdisc(spec.qdisc, spec.queue_limit_bytes, spec.mtu)
        )
        self.delay = DelayLine(
            spec.delay_s,
            spec.jitter_s,
            spec.jitter_dist,
            spec.reorder,
            random.Random(_jitter_seed(seed)),
        )
        self.sink = Sink()
        self.chain: list[Element] = [self.gate, self.loss, self.rate, self.delay, self.sink]
        for upstream, downstream in zip(self.chain, self.chain[1:], strict=False):
            upstream.downstream = downstream
        self.spec = spec

    def restart_draws(self, seed: int) -> None:
        """Loss and jitter draw again from `seed`'s start, as a direction just made with it
        would (a Gilbert-Elliott loss back in its good state): what comes next meets the same
        weather as on a fresh link. Packets already in the chain keep the times they drew."""
        self.loss.rng.seed(_loss_seed(seed))
        self.loss.bad_state = False
        self.delay.rng.seed(_jitter_seed(seed))

    def push(self, packet: bytes, now: float) -> None:
        self.gate.push(packet, now)

    def push_many(self, packets: list[bytes], now: float) -> None:
        """Packets that all arrived at `now`, in order (as `push` for each)."""
        self.gate.push_many(packets, now)

    def next_time(self) -> float:
        """When the chain next moves a packet (the bottleneck's next finish or the delay
        line's next exit): `release` before then changes nothing."""
        return min(self.rate.next_time(), self.delay.next_time())

    def next_exit(self) -> float:
        """The earliest time a packet can leave the direction: the delay line's head, or the
        packet on the wire's finish plus the least delay it can draw. The shaper wakes for
        this, not for each end of serialization: `release` works those out, at their exact
        times, whenever it runs, so nothing that leaves is due before this."""
        on_wire = self.rate.next_time() + self.delay.least_delay_s
        in_flight = self.delay.next_time()
        return on_wire if on_wire < in_flight else in_flight

    def release(self, now: float) -> list[tuple[bytes, float]]:
        """Move due packets through the chain; return what leaves, with exit times."""
        self.rate.release(now)
        self.delay.release(now)
        return self.sink.take()

    def apply(self, spec: LinkSpec, now: float) -> None:
        """Switch to a new spec at `now` without losing queued packets (a live change); the
        caller has released everything due before `now`."""
        self.rate.set_rate(spec.rate_bps, now)
        if spec.qdisc != self.spec.qdisc or spec.mtu != self.spec.mtu:
            self.rate.set_qdisc(make_qdisc(spec.qdisc, spec.queue_limit_bytes, spec.mtu))
        else:
            self.rate.qdisc.resize(spec.queue_limit_bytes)
        self.loss.model = spec.loss
        self.delay.configure(spec.delay_s, spec.jitter_s, spec.jitter_dist, spec.reorder)
        self.spec = spec

    def set_up(self, up: bool) -> None:
        """Take the direction down (everything queued or in flight is lost) or bring it up."""
        self.gate.up = up
        if not up:
            self.rate.clear()
            self.delay.clear()

    def counters(self) -> dict[str, Any]:
        return {
            "up": self.gate.up,
            "gate_dropped": self.gate.dropped,
            "loss_dropped": self.loss.dropped,
            "queue_dropped": self.rate.dropped_total,
            "down_dropped": self.delay.dropped,
            "delivered": self.sink.passed,
            "delivered_bytes": self.sink.bytes,
            "queued_bytes": self.rate.queued_bytes,
            "max_queued_bytes": self.rate.max_queued_bytes,
            "qdisc": self.rate.qdisc.counters(),
            "spec": self.spec.to_dict(),
        }


def _loss_seed(seed: int) -> str:
    return f"{seed}:loss"


def _jitter_seed(seed: int) -> str:
    return f"{seed}:jitter"
