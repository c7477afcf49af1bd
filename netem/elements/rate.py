"""The bottleneck: packets wait in a queueing discipline and leave one at a time at the link's
bit rate (serialization).

Whenever the link falls idle it asks the discipline (`netem.qdisc`) for the next packet,
passing the time the transmission starts, so a discipline choosing among flows or bands, or
dropping by sojourn time, decides at the right instant even when the pump runs late. Before a
new arrival is queued, everything due until its arrival time is sent first, so a packet never
competes for a transmission that started before it came.

The rate is piecewise constant: a live change re-times the packet being sent from the bits it
has left, so a delivery trace replayed as rate steps gives exactly its capacity per step.
Rate 0 holds everything (a stalled link, as a trace's gap); `rate_bps=None` passes packets
straight through (an unlimited link).
"""

from __future__ import annotations

import math
from typing import Any

from netem.elements.base import Element
from netem.qdisc import Qdisc


class RateQueue(Element):
    def __init__(self, rate_bps: float | None, qdisc: Qdisc) -> None:
        super().__init__()
        self.rate_bps = rate_bps
        self.qdisc = qdisc
        self.sending: bytes | None = None  # the packet on the wire
        self.bits_left = 0.0  # of that packet, as of `progress_at`
        self.progress_at = 0.0
        self.max_queued_bytes = 0
        self.retired_dropped = 0  # drops counted by disciplines replaced by a live change

    @property
    def queued_bytes(self) -> int:
        return self.qdisc.queued_bytes

    @property
    def dropped_total(self) -> int:
        return self.retired_dropped + self.qdisc.dropped

    def push(self, packet: bytes, at: float) -> None:
        if self.rate_bps is None:
            self.passed += 1
            self.downstream.push(packet, at)  # type: ignore[union-attr]
            return
        self.release(at)
        qdisc = self.qdisc
        qdisc.enqueue(packet, at)
        if qdisc.queued_bytes > self.max_queued_bytes:
            self.max_queued_bytes = qdisc.queued_bytes
        if self.sending is None:
            self._start(at)

    def push_many(self, packets: list[bytes], at: float) -> None:
        """As `push` for each packet in turn (the same releases, drops and order), with the
        per-packet work inlined."""
        if self.rate_bps is None:
            self.passed += len(packets)
            self.downstream.push_many(packets, at)  # type: ignore[union-attr]
            return
        qdisc = self.qdisc
        enqueue = qdisc.enqueue
        for packet in packets:
            if self.sending is not None and self.next_time() <= at:
                self.release(at)
            enqueue(packet, at)
            if qdisc.queued_bytes > self.max_queued_bytes:
                self.max_queued_bytes = qdisc.queued_bytes
            if self.sending is None:
                self._start(at)

    def next_time(self) -> float:
        if self.sending is None or not self.rate_bps:
            return math.inf
        return self.progress_at + self.bits_left / self.rate_bps

    def release(self, now: float) -> None:
        rate = self.rate_bps
        if not rate:
            return  # unlimited (nothing held) or stalled (nothing leaves)
        push = self.downstream.push  # type: ignore[union-attr]
        while self.sending is not None:
            finish = self.progress_at + self.bits_left / rate  # next_time(), inlined
            if finish > now:
                return
            packet, self.sending = self.sending, None
            self.passed += 1
            push(packet, finish)
            self._start(finish)

    def _start(self, now: float) -> None:
        item = self.qdisc.dequeue(now)
        if item is None:
            return
        packet, arrived = item
        self.sending = packet
        self.bits_left = len(packet) * 8.0
        self.progress_at = arrived if arrived > now else now

    def set_rate(self, rate_bps: float | None, now: float) -> None:
        """Change the rate at `now` (everything due before it already released). The packet
        on the wire keeps the bits it has sent; queued packets leave at the new rate, or at
        once when the link becomes unlimited."""
        if self.sending is not None and self.rate_bps:
            sent = max(0.0, now - self.progress_at) * self.rate_bps
            self.bits_left = max(0.0, self.bits_left - sent)
            self.progress_at = max(now, self.progress_at)
        elif self.sending is not None:
            self.progress_at = max(now, self.progress_at)  # a stalled packet resumes from now
        self.rate_bps = rate_bps
        if rate_bps is None:
            held = [self.sending] if self.sending is not None else []
            held += [packet for packet, _ in self.qdisc.drain()]
            self.sending = None
            for packet in held:
                self.passed += 1
                self.downstream.push(packet, now)  # type: ignore[union-attr]

    def set_qdisc(self, qdisc: Qdisc) -> None:
        """Replace the discipline; what waits in the old one moves to the new one in arrival
        order (the new one may drop some, as it would have on arrival)."""
        old, self.qdisc = self.qdisc, qdisc
        for packet, at in old.drain():
            qdisc.enqueue(packet, at)
        self.retired_dropped += old.dropped

    def clear(self) -> int:
        dropped = self.qdisc.clear()
        if self.sending is not None:
            self.sending = None
            self.qdisc.dropped += 1
            dropped += 1
        return dropped

    def counters(self) -> dict[str, Any]:
        return {
            **self.qdisc.counters(),
            "passed": self.passed,
            "dropped": self.dropped_total,
            "queued_bytes": self.queued_bytes,
            "max_queued_bytes": self.max_queued_bytes,
        }
