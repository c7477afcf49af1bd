"""Propagation delay with jitter, FIFO unless reordering is asked for.

Each packet's delay is `delay + X` with X drawn from the jitter distribution, scaled so that
its standard deviation is `jitter` (uniform: +-sqrt(3)*jitter; normal and pareto: netem's
table, see `netem.distributions`), and clipped at zero. Without reordering a packet never
leaves before the one ahead of it (release = max(own time, previous release)), which is what
one physical path does.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from itertools import count

from netem.distributions import unit_table
from netem.elements.base import Element


def jitter_sampler(dist: str, sigma: float, rng: random.Random) -> Callable[[], float]:
    """A zero-mean sampler with standard deviation `sigma` for the named distribution."""
    if sigma == 0:
        return lambda: 0.0
    if dist == "uniform":
        half = math.sqrt(3.0) * sigma
        return lambda: rng.uniform(-half, half)
    table = unit_table(dist)
    size = len(table)
    return lambda: table[int(rng.random() * size)] * sigma


def lowest_jitter(dist: str, sigma: float) -> float:
    """The lowest value `jitter_sampler(dist, sigma, ...)` can draw."""
    if sigma == 0:
        return 0.0
    if dist == "uniform":
        return -math.sqrt(3.0) * sigma
    return min(unit_table(dist)) * sigma


class DelayLine(Element):
    def __init__(
        self, delay_s: float, jitter_s: float, dist: str, reorder: bool, rng: random.Random
    ) -> None:
        super().__init__()
        self.rng = rng
        self.fifo: deque[tuple[float, bytes]] = deque()
        self.heap: list[tuple[float, int, bytes]] = []
        self._sequence = count()
        self.last_release = -math.inf
        self.configure(delay_s, jitter_s, dist, reorder)

    def configure(self, delay_s: float, jitter_s: float, dist: str, reorder: bool) -> None:
        self.delay_s = delay_s
        self.jitter_s = jitter_s
        self.dist = dist
        self.reorder = reorder
        self._jitter = jitter_sampler(dist, jitter_s, self.rng)
        self.least_delay_s = max(0.0, delay_s + lowest_jitter(dist, jitter_s))

    def push(self, packet: bytes, at: float) -> None:
        delay = self.delay_s + self._jitter()
        release = at + (delay if delay > 0 else 0.0)
        if self.reorder:
            heapq.heappush(self.heap, (release, next(self._sequence), packet))
            return
        if release < self.last_release:
            release = self.last_release
        self.last_release = release
        self.fifo.append((release, packet))

    def next_time(self) -> float:
        first = self.fifo[0][0] if self.fifo else math.inf
        if self.heap and self.heap[0][0] < first:
            return self.heap[0][0]
        return first

    def release(self, now: float) -> None:
        downstream = self.downstream
        fifo = self.fifo
        while fifo and fifo[0][0] <= now:
            release, packet = fifo.popleft()
            self.passed += 1
            downstream.push(packet, release)  # type: ignore[union-attr]
        heap = self.heap
        while heap and heap[0][0] <= now:
            release, _, packet = heapq.heappop(heap)
            self.passed += 1
            downstream.push(packet, release)  # type: ignore[union-attr]

    def clear(self) -> int:
        dropped = len(self.fifo) + len(self.heap)
        self.fifo.clear()
        self.heap.clear()
        self.last_release = -math.inf  # nothing left to wait behind
        self.dropped += dropped
        return dropped
