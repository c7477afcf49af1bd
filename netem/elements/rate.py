"""A drop-tail queue served at a fixed bit rate: the bottleneck's serialization.

A packet starts when it has arrived and the previous one has finished; it leaves one
transmission time later. Its finish time is computed when it leaves, with the rate in force
then, so a live rate change applies to every packet not yet sent. `rate_bps=None` passes
packets straight through (an unlimited link).
"""

from __future__ import annotations

import math
from collections import deque

from netem.elements.base import Element


class RateQueue(Element):
    def __init__(self, rate_bps: float | None, limit_bytes: int) -> None:
        super().__init__()
        self.rate_bps = rate_bps
        self.limit_bytes = limit_bytes
        self.queue: deque[tuple[bytes, float]] = deque()
        self.queued_bytes = 0
        self.busy_until = -math.inf
        self.max_queued_bytes = 0

    def push(self, packet: bytes, at: float) -> None:
        if self.rate_bps is None:
            self.passed += 1
            self.downstream.push(packet, at)  # type: ignore[union-attr]
            return
        size = len(packet)
        if self.queued_bytes + size > self.limit_bytes:
            self.dropped += 1
            return
        self.queue.append((packet, at))
        self.queued_bytes += size
        if self.queued_bytes > self.max_queued_bytes:
            self.max_queued_bytes = self.queued_bytes

    def next_time(self) -> float:
        if not self.queue:  # an unlimited link holds nothing
            return math.inf
        packet, at = self.queue[0]
        start = at if at > self.busy_until else self.busy_until
        return start + len(packet) * 8.0 / self.rate_bps

    def release(self, now: float) -> None:
        queue = self.queue
        downstream = self.downstream
        while queue:
            finish = self.next_time()
            if finish > now:
                return
            packet, _ = queue.popleft()
            self.queued_bytes -= len(packet)
            self.busy_until = finish
            self.passed += 1
            downstream.push(packet, finish)  # type: ignore[union-attr]

    def set_rate(self, rate_bps: float | None, now: float) -> None:
        """Change the rate. Queued packets leave at the new rate, or at once when the link
        becomes unlimited."""
        if rate_bps is None and self.queue:
            self.rate_bps = rate_bps
            while self.queue:
                packet, _ = self.queue.popleft()
                self.queued_bytes -= len(packet)
                self.passed += 1
                self.downstream.push(packet, now)  # type: ignore[union-attr]
        self.rate_bps = rate_bps

    def clear(self) -> int:
        dropped = len(self.queue)
        self.queue.clear()
        self.queued_bytes = 0
        self.dropped += dropped
        return dropped

    def counters(self) -> dict[str, int]:
        return {
            **super().counters(),
            "queued_bytes": self.queued_bytes,
            "max_queued_bytes": self.max_queued_bytes,
        }
