"""When cross-traffic flows start and how big they are: a clock-free sequence of (time, bytes)
per direction, on a timeline of seconds from the cross-traffic's start."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterator

from netem.crosstraffic.spec import CrossTrafficSpec


def size_sampler(spec: CrossTrafficSpec, rng: random.Random) -> Callable[[], int]:
    """Flow sizes in bytes (at least 1) with mean `spec.mean_bytes`."""
    mean = spec.mean_bytes
    if spec.sizes == "exponential":
        return lambda: max(1, round(rng.expovariate(1.0 / mean)))
    shape = spec.pareto_shape
    scale = mean * (shape - 1.0) / shape  # the smallest flow; the mean is scale * shape / (shape-1)
    return lambda: max(1, round(scale / (1.0 - rng.random()) ** (1.0 / shape)))


def _targets(spec: CrossTrafficSpec) -> list[tuple[float, float]]:
    """(time, utilisation) steps, starting with the spec's own at time 0."""
    steps = [(0.0, spec.utilisation)]
    for change in spec.schedule:
        if change.utilisation is not None:
            if change.at_s <= 0.0:
                steps[0] = (0.0, change.utilisation)
            else:
                steps.append((change.at_s, change.utilisation))
    return steps


def random_flows(
    spec: CrossTrafficSpec, rate_bps: float, rng: random.Random
) -> Iterator[tuple[float, int]]:
    """Flows whose offered load is the target utilisation of `rate_bps`: Poisson arrivals
    (restarted at each change of target, which their lack of memory allows), or paced ones
    (each flow's bytes at the target rate before the next one starts)."""
    sizes = size_sampler(spec, rng)
    targets = _targets(spec)
    index, t = 0, 0.0
    while True:
        while index + 1 < len(targets) and targets[index + 1][0] <= t:
            index += 1
        share = targets[index][1]
        next_change = targets[index + 1][0] if index + 1 < len(targets) else math.inf
        if share <= 0.0:
            if next_change == math.inf:
                return
            t = next_change
            continue
        rate = share * rate_bps / 8.0  # offered bytes per second
        if spec.arrivals == "paced":
            size = sizes()
            yield t, size
            t += size / rate
            continue
        gap = rng.expovariate(rate / spec.mean_bytes)
        if t + gap >= next_change:
            t = next_change
            continue
        t += gap
        yield t, sizes()


def flows(
    spec: CrossTrafficSpec, direction: str, rate_bps: float, seed: int
) -> Iterator[tuple[float, int]]:
    """Every flow of one direction in time order: the random ones (when the direction is
    one the spec loads) merged with the schedule's single flows for it."""
    scheduled = [
        (change.at_s, change.flow_bytes)
        for change in spec.schedule
        if change.flow_bytes is not None and (change.direction or spec.directions()[0]) == direction
    ]
    rng = random.Random(f"{seed}:{direction}")
    loaded = direction in spec.directions()
    streams = [random_flows(spec, rate_bps, rng)] if loaded else []
    return heapq.merge(*streams, scheduled, key=lambda flow: flow[0])


def mean_target(spec: CrossTrafficSpec, duration_s: float) -> float:
    """The time-weighted mean of the target utilisation over [0, duration_s]."""
    if duration_s <= 0:
        return 0.0
    targets = _targets(spec)
    total = 0.0
    for (at, share), (until, _) in zip(targets, [*targets[1:], (math.inf, 0.0)], strict=True):
        total += share * max(0.0, min(until, duration_s) - min(at, duration_s))
    return total / duration_s
