"""One direction of a shaped link: the element chain built from a LinkSpec, live changes,
and the time-varying schedule.

Chain order is gate -> loss -> rate queue -> delay line -> sink: a packet is lost or admitted
when it reaches the link, waits its turn at the bottleneck, then propagates.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

from netem.elements import DelayLine, Element, Gate, LossProcess, RateQueue, Sink
from netem.spec import LinkSpec


class Direction:
    def __init__(self, spec: LinkSpec, seed: int, start: float) -> None:
        rng = random.Random(seed)
        self.gate = Gate()
        self.loss = LossProcess(spec.loss, rng)
        self.rate = RateQueue(spec.rate_bps, spec.queue_limit_bytes)
        self.delay = DelayLine(spec.delay_s, spec.jitter_s, spec.jitter_dist, spec.reorder, rng)
        self.sink = Sink()
        self.chain: list[Element] = [self.gate, self.loss, self.rate, self.delay, self.sink]
        for upstream, downstream in zip(self.chain, self.chain[1:], strict=False):
            upstream.downstream = downstream
        self.spec = spec
        self.cycle_start = start  # when the schedule's current pass began
        self._step = 0  # next step of that pass

    def push(self, packet: bytes, now: float) -> None:
        self.gate.push(packet, now)

    def next_time(self) -> float:
        return min(self.rate.next_time(), self.delay.next_time(), self._next_step_time())

    def release(self, now: float) -> list[tuple[bytes, float]]:
        """Apply due schedule steps, move due packets through the chain, return what leaves."""
        while (at := self._next_step_time()) <= now:
            self._apply_step(at)
        self.rate.release(now)
        self.delay.release(now)
        return self.sink.take()

    def apply(self, spec: LinkSpec, now: float) -> None:
        """Switch to a new spec without losing queued packets (live change)."""
        self.rate.set_rate(spec.rate_bps, now)
        self.rate.limit_bytes = spec.queue_limit_bytes
        self.loss.model = spec.loss
        self.delay.configure(spec.delay_s, spec.jitter_s, spec.jitter_dist, spec.reorder)
        if spec.schedule != self.spec.schedule:
            self.cycle_start, self._step = now, 0
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
            "queue_dropped": self.rate.dropped,
            "down_dropped": self.delay.dropped,
            "delivered": self.sink.passed,
            "queued_bytes": self.rate.queued_bytes,
            "max_queued_bytes": self.rate.max_queued_bytes,
            "spec": self.spec.to_dict(),
        }

    def _next_step_time(self) -> float:
        schedule = self.spec.schedule
        if not schedule:
            return math.inf
        if self._step < len(schedule):
            return self.cycle_start + schedule[self._step].at_s
        period = self.spec.schedule_period_s
        return math.inf if period is None else self.cycle_start + period + schedule[0].at_s

    def _apply_step(self, at: float) -> None:
        if self._step >= len(self.spec.schedule):  # a new pass of a repeating schedule
            self.cycle_start += self.spec.schedule_period_s or 0.0
            self._step = 0
        step = self.spec.schedule[self._step]
        self._step += 1
        self.apply(replace(self.spec, **step.changes), at)
