"""The element interface: packets go in with a time, come out with a (later) time."""

from __future__ import annotations

import math


class Element:
    """One stage of a direction. `push` takes a packet that reaches this stage at time `at`;
    `release(now)` hands every packet whose exit time is at or before `now` downstream, with
    that exit time (not `now`), so a late pump never adds delay; `next_time()` says when the
    next packet will be ready (math.inf when idle). Stateless filters forward inside `push`.
    """

    downstream: Element | None = None

    def __init__(self) -> None:
        self.passed = 0
        self.dropped = 0

    def push(self, packet: bytes, at: float) -> None:
        raise NotImplementedError

    def push_many(self, packets: list[bytes], at: float) -> None:
        """Packets that all reach this stage at `at`, in order: the same as pushing each in
        turn (a stage may take them in one call, to spare the shaper a call per packet)."""
        for packet in packets:
            self.push(packet, at)

    def release(self, now: float) -> None:
        """Hand due packets downstream. Filters hold nothing, so the default does nothing."""

    def next_time(self) -> float:
        return math.inf

    def clear(self) -> int:
        """Drop everything held (link taken down); returns how many packets were dropped."""
        return 0

    def counters(self) -> dict[str, int]:
        return {"passed": self.passed, "dropped": self.dropped}


class Sink(Element):
    """End of a chain: collects (packet, exit time) for the writer."""

    def __init__(self) -> None:
        super().__init__()
        self.out: list[tuple[bytes, float]] = []
        self.bytes = 0

    def push(self, packet: bytes, at: float) -> None:
        self.passed += 1
        self.bytes += len(packet)
        self.out.append((packet, at))

    def take(self) -> list[tuple[bytes, float]]:
        out, self.out = self.out, []
        return out
