"""The max-goodput search on synthetic attainment curves: where it stops, how many probes it
takes, and what it says at the edges of its range."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from pddemu.sweep.search import GoodputSearch, SearchError


def run(search: GoodputSearch, attainment: Callable[[float], float]) -> GoodputSearch:
    while (rate := search.next_rate()) is not None:
        search.record(rate, attainment(rate))
    return search


def knee_at(knee: float) -> Callable[[float], float]:
    """Attainment falling smoothly through 0.9 at `knee` (monotone)."""
    return lambda rate: 1 / (1 + (rate / knee) ** 8 * (1 / 0.9 - 1))


@pytest.mark.parametrize("knee", [0.013, 0.37, 1.03, 2.9, 41.0])
def test_finds_the_knee_within_the_tolerance(knee: float) -> None:
    search = run(
        GoodputSearch(0.9, start=0.5, rate_min=0.01, rate_max=64, tolerance=0.05), knee_at(knee)
    )
    assert search.status == "found"
    assert search.passing <= knee < search.failing
    assert search.failing - search.passing <= 0.05 * search.passing
    # doubling or halving to the bracket, then halving the bracket: logarithmic in both
    bracket_steps = abs(math.log2(knee / 0.5)) + 1
    assert len(search.probes) <= bracket_steps + math.log2(1 / 0.05) + 2
    assert all(p.passed == (p.rate <= knee) for p in search.probes)


def test_a_step_function_is_found_exactly_enough() -> None:
    search = run(
        GoodputSearch(0.9, start=1, rate_min=0.01, rate_max=64, tolerance=0.01),
        lambda rate: 1.0 if rate <= 3.3 else 0.5,
    )
    assert search.status == "found" and 3.26 < search.passing <= 3.3 < search.failing


def test_passing_at_the_top_of_the_range_says_so() -> None:
    search = run(GoodputSearch(0.9, 1, 0.01, 8, 0.1), lambda rate: 1.0)
    assert search.status == "at-max" and search.passing == 8 and search.failing is None
    assert [p.rate for p in search.probes] == [1, 2, 4, 8]


def test_failing_at_the_bottom_of_the_range_says_so() -> None:
    search = run(GoodputSearch(0.9, 1, 0.125, 8, 0.1), lambda rate: 0.5)
    assert search.status == "below-min" and search.passing is None
    assert [p.rate for p in search.probes] == [1, 0.5, 0.25, 0.125]


def test_the_probe_limit_ends_a_search() -> None:
    search = run(GoodputSearch(0.9, 1, 0.01, 64, 0.001, max_probes=5), knee_at(3.0))
    assert search.status == "probe-limit" and len(search.probes) == 5
    assert search.passing is not None and search.failing is not None


def test_noise_never_stops_it_converging() -> None:
    """Attainment that wobbles around the knee: the bracket still shrinks to the tolerance,
    and the answer is a rate that passed below every rate that failed."""
    rng = random.Random(3)
    curve = knee_at(2.0)
    search = run(
        GoodputSearch(0.9, 1, 0.01, 64, 0.05), lambda r: curve(r) + rng.uniform(-0.04, 0.04)
    )
    assert search.status == "found"
    assert all(search.passing < p.rate for p in search.probes if not p.passed)
    assert 1.5 < search.passing < 2.6


def test_attainment_exactly_at_the_target_passes() -> None:
    search = GoodputSearch(0.9, 1, 0.01, 64)
    search.record(1.0, 0.9)
    assert search.passing == 1.0


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ((0, 1, 0.1, 8), "slo-attainment"),
        ((1.1, 1, 0.1, 8), "slo-attainment"),
        ((0.9, 0.05, 0.1, 8), "rate-min"),
        ((0.9, 9, 0.1, 8), "rate-max"),
        ((0.9, 1, 0, 8), "rate-min"),
    ],
)
def test_bad_parameters_are_refused(arguments: tuple, message: str) -> None:
    with pytest.raises(SearchError, match=message):
        GoodputSearch(*arguments)
    with pytest.raises(SearchError, match="rate-tolerance"):
        GoodputSearch(0.9, 1, 0.1, 8, tolerance=1.5)


def test_a_lower_rate_follows_a_failing_start_before_any_halving() -> None:
    """Started above capacity with a lower bound (`--rate-start prefill-bounds`): the start
    fails, the lower rate passes, and bisection between them finds the knee."""
    search = run(GoodputSearch(0.9, 12.0, 0.01, 64, 0.05, lower=2.5), knee_at(6.1))
    assert [p.rate for p in search.probes][:3] == [12.0, 2.5, 7.25]
    assert search.status == "found" and search.passing <= 6.1 < search.failing


def test_a_failing_lower_rate_is_halved_and_a_passing_start_doubles() -> None:
    below = run(GoodputSearch(0.9, 12.0, 0.01, 64, 0.05, max_probes=4, lower=2.5), knee_at(0.9))
    assert [p.rate for p in below.probes] == [12.0, 2.5, 1.25, 0.625]
    above = run(GoodputSearch(0.9, 12.0, 0.01, 64, 0.05, max_probes=2, lower=2.5), knee_at(30))
    assert [p.rate for p in above.probes] == [12.0, 24.0]
    with pytest.raises(SearchError, match="lower rate"):
        GoodputSearch(0.9, 2.0, 0.01, 64, lower=3.0)
