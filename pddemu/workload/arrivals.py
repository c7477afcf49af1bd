"""Seeded arrival processes: Poisson request arrivals and Poisson conversation starts.

Each process draws from its own random stream, `numpy.random.default_rng([seed, stream])`, so
changing one part of a workload (say the arrival rate) leaves every other random choice alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

# Stream numbers of the independent random streams derived from one seed.
STRUCTURE_STREAM = 1
ARRIVAL_STREAM = 2
SESSION_START_STREAM = 3


class ArrivalError(ValueError):
    """An arrival rate that no process can have."""


def check_rate(rate: float, name: str) -> float:
    if isinstance(rate, bool) or not isinstance(rate, int | float):
        raise ArrivalError(f"{name} must be a number, got {rate!r}")
    if not math.isfinite(rate) or rate <= 0:
        raise ArrivalError(f"{name} must be finite and positive, got {rate}")
    return float(rate)


def stream(seed: int, number: int) -> np.random.Generator:
    return np.random.default_rng([seed, number])


def poisson_arrivals(count: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Times (s) of `count` arrivals of a Poisson process of `rate` per second, the first at 0.

    Gaps are standard exponential draws divided by the rate, so another rate rescales the same
    draws: the order and relative spacing of a seeded run do not change with the rate.
    """
    rate = check_rate(rate, "arrival rate")
    gaps = rng.standard_exponential(max(count - 1, 0)) / rate
    return np.concatenate([[0.0], np.cumsum(gaps)])[:count]


def poisson_starts(rate: float, rng: np.random.Generator) -> Iterator[float]:
    """Start times of an endless sequence of conversations, Poisson at `rate`, the first at 0."""
    rate = check_rate(rate, "session rate")
    start = 0.0
    while True:
        yield start
        start += float(rng.standard_exponential()) / rate
