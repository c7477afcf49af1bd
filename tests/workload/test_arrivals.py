"""Seeded Poisson arrival processes: rate, gap distribution, first arrival, rescaling."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pddemu.workload.arrivals import ArrivalError, poisson_arrivals, poisson_starts, stream


def test_poisson_arrivals_have_the_rate_and_exponential_gaps() -> None:
    times = poisson_arrivals(20_000, 5.0, stream(0, 2))
    assert times[0] == 0 and np.all(np.diff(times) >= 0)
    gaps = np.diff(times)
    # 19,999 exponential gaps: the mean's standard error is 0.7 %, the coefficient of
    # variation is 1 for an exponential, and P(gap > mean) = 1/e.
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)
    assert (gaps > 0.2).mean() == pytest.approx(np.exp(-1), abs=0.02)


def test_another_rate_rescales_the_same_draws() -> None:
    slow = poisson_arrivals(100, 1.0, stream(3, 2))
    fast = poisson_arrivals(100, 4.0, stream(3, 2))
    np.testing.assert_allclose(fast * 4, slow)


def test_seeded_and_sized() -> None:
    assert poisson_arrivals(1, 1.0, stream(0, 2)).tolist() == [0.0]
    assert poisson_arrivals(0, 1.0, stream(0, 2)).size == 0
    a, b = poisson_arrivals(50, 1.0, stream(1, 2)), poisson_arrivals(50, 1.0, stream(1, 2))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, poisson_arrivals(50, 1.0, stream(2, 2)))


def test_conversation_starts() -> None:
    starts = list(itertools.islice(poisson_starts(0.5, stream(0, 3)), 5000))
    assert starts[0] == 0
    assert np.diff(starts).mean() == pytest.approx(2.0, rel=0.05)


@pytest.mark.parametrize("rate", [0, -1.0, float("inf"), float("nan"), "2", True])
def test_bad_rates(rate: object) -> None:
    with pytest.raises(ArrivalError, match="must be"):
        poisson_arrivals(3, rate, stream(0, 2))  # type: ignore[arg-type]
    with pytest.raises(ArrivalError, match="session rate must be"):
        next(poisson_starts(rate, stream(0, 3)))  # type: ignore[arg-type]
