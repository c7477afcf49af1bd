"""A sample list of bounded size: the lag samples and TPOTs a `pddemu serve` gathers without end.

`Reservoir` is a list (it serialises, iterates and feeds numpy as one) that keeps a uniform
random sample of at most `capacity` of the values appended to it (Vitter's algorithm R, from a
fixed seed so that a run's sample is reproducible: the reservoir's name, or the order it was made
in, so that reservoirs fed in step do not keep the same slots), and besides the sample the exact count,
sum and largest value of everything appended (`totals`). Means, maxima and counts computed
from `totals` are exact; percentiles computed from the sample are estimates once more values
than `capacity` were appended: with n kept the q-th percentile's rank is off by
sqrt(q (1 - q) / n) in standard deviation, i.e. at the default 65,536 the p99 lies within
about ±0.08 percentile points (two standard deviations) of the true p99 and the p50 within
±0.4. Below the capacity the sample is every value, in order: nothing is estimated.
Pooling several (`pooled`) weighs each by the values it saw, not by those it kept.
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Iterable, Sequence
from typing import SupportsIndex

# Values kept per sample: every value of the reference run's (at most 18,032 of one kind of lag
# on one participant), about 2 MB of floats; a long serve keeps a uniform sample of this many.
RESERVOIR_CAPACITY = 65_536
_unnamed = itertools.count(1)  # the seeds of reservoirs made without a name, in order


class Reservoir(list[float]):
    """At most `capacity` values, a uniform sample of those appended, plus exact totals."""

    def __init__(
        self,
        values: Iterable[float] = (),
        capacity: int = RESERVOIR_CAPACITY,
        seed: int | str | None = None,
    ) -> None:
        super().__init__()
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.seen = 0  # values appended, kept or not
        self.total = 0.0
        self.largest: float | None = None
        self._random = random.Random(_seed(seed))
        self.extend(values)

    def append(self, value: float) -> None:  # type: ignore[override]
        self.seen += 1
        self.total += value
        self.largest = value if self.largest is None else max(self.largest, value)
        if len(self) < self.capacity:
            super().append(value)
            return
        slot = self._random.randrange(self.seen)  # kept with probability capacity / seen
        if slot < self.capacity:
            self[slot] = value

    def extend(self, values: Iterable[float]) -> None:  # type: ignore[override]
        for value in values:
            self.append(value)

    def __iadd__(self, values: Iterable[float]) -> Reservoir:  # type: ignore[override]
        self.extend(values)
        return self

    def insert(self, index: SupportsIndex, value: float) -> None:
        raise TypeError("a reservoir is appended to, not inserted into")

    @classmethod
    def restored(
        cls, values: Iterable[float], totals: Sequence[float | int | None] | None = None
    ) -> Reservoir:
        """A reservoir from what was sent of it (its sample and `totals()`); a plain
        list's values without totals are every value."""
        kept = list(values)
        restored = cls(capacity=max(1, len(kept)))
        list.extend(restored, kept)
        count, total, largest = (
            totals if totals else (len(kept), sum(kept), max(kept, default=None))
        )
        restored.seen, restored.total, restored.largest = (
            int(count or 0),
            float(total or 0.0),
            largest,
        )
        return restored

    @classmethod
    def pooled(cls, parts: Iterable[Sequence[float]]) -> Reservoir:
        """Several samples as one uniform sample of all their values, with their totals summed.

        A part sampled down keeps fewer of its values than it saw, so pooling kept values alike
        would under-weigh it: each part contributes in proportion to what it saw, every part
        thinned (from a fixed seed) to the smallest kept fraction among them. Parts that kept
        every value are pooled whole, in order."""
        parts = [part if isinstance(part, Reservoir) else cls.restored(part) for part in parts]
        fraction = min((len(part) / part.seen for part in parts if part.seen), default=1.0)
        thinning = random.Random(0)
        pool = cls.restored([])
        for part in parts:
            kept = list(part)
            if fraction < 1.0:
                kept = thinning.sample(kept, min(len(kept), round(fraction * part.seen)))
            list.extend(pool, kept)
            pool.seen += part.seen
            pool.total += part.total
            if part.largest is not None:
                pool.largest = (
                    part.largest if pool.largest is None else max(pool.largest, part.largest)
                )
        pool.capacity = max(1, len(pool))
        return pool

    def __reduce__(self) -> tuple:
        """Pickled and copied whole (a list's default would append the values again)."""
        return (_rebuilt, (list(self), self.capacity, self.totals(), self._random.getstate()))

    def mean(self) -> float | None:
        return self.total / self.seen if self.seen else None

    def totals(self) -> list[float | int | None]:
        """[count, sum, max] of every value appended (JSON: a list, read back by `restored`)."""
        return [self.seen, self.total, self.largest]


def _seed(seed: int | str | None) -> int:
    """A reservoir's own random stream: two fed in step (each kind of lag, appended together)
    from one seed would keep and replace the same slots. A name gives a seed that does not
    depend on what else the process made; without one, the order of making does."""
    if seed is None:
        return next(_unnamed)
    if isinstance(seed, str):
        return zlib.crc32(seed.encode())
    return seed


def _rebuilt(
    values: list[float], capacity: int, totals: list[float | int | None], state: tuple
) -> Reservoir:
    rebuilt = Reservoir.restored(values, totals)
    rebuilt.capacity = capacity
    rebuilt._random.setstate(state)
    return rebuilt
