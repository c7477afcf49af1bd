"""A kernel receive date is kept between the least transit after sending and now."""

from __future__ import annotations

import random

from netem.elements.delay import jitter_sampler
from pddemu.roles.base import Instance, least_transit
from pddemu.runtime.channel import Envelope


class _Clock:
    shared = True

    def __init__(self, now: float) -> None:
        self._now = now

    def now(self) -> float:
        return self._now


class _Channel:
    peer = "P0"


def _instance(now: float, least_transit: float) -> Instance:
    instance = Instance.__new__(Instance)  # only what `arrival` reads
    instance.clock = _Clock(now)  # type: ignore[assignment]
    instance.transit = {"P0": (least_transit, False)}
    instance.resumed_at = 0.0
    return instance


def _dated(sent: float | None, received: float) -> Envelope:
    body = {} if sent is None else {"t": sent}
    return Envelope("x", body, channel=_Channel(), received=received)  # type: ignore[arg-type]


def test_a_date_before_the_least_transit_is_raised_to_it() -> None:
    instance = _instance(now=10.0, least_transit=0.05)
    assert instance.arrival(_dated(sent=5.0, received=5.01)) == 5.05


def test_a_date_after_now_is_lowered_to_now() -> None:
    instance = _instance(now=10.0, least_transit=0.05)
    assert instance.arrival(_dated(sent=5.0, received=10.3)) == 10.0


def test_a_date_in_range_is_kept_and_without_a_send_time_only_now_bounds_it() -> None:
    instance = _instance(now=10.0, least_transit=0.05)
    assert instance.arrival(_dated(sent=5.0, received=7.5)) == 7.5
    assert instance.arrival(_dated(sent=None, received=1.0)) == 1.0
    assert instance.arrival(_dated(sent=None, received=11.0)) == 10.0


class _ForgetfulClock(_Clock):
    """A clock whose anchor history reaches back to wall time 100 only."""

    def modelled_at(self, wall: float) -> float | None:
        return None if wall < 100.0 else wall


def test_a_date_older_than_the_clocks_history_is_counted() -> None:
    instance = _instance(now=10.0, least_transit=0.0)
    instance.clock = _ForgetfulClock(10.0)  # type: ignore[assignment]
    instance.dates_past_history = 0
    assert instance.modelled_at(150.0) == 150.0
    assert instance.modelled_at(50.0) is None
    assert instance.modelled_at(99.0) is None
    assert instance.dates_past_history == 2


def test_the_least_transit_is_the_shapers_own_floor() -> None:
    """No draw of the shaper's jitter is below it, and the lowest come within a tenth of a
    deviation of it (a floor that low a date is never raised past a real arrival)."""
    delay, jitter = 0.04, 0.002
    for dist in ("uniform", "normal", "pareto"):
        sample = jitter_sampler(dist, jitter, random.Random(f"floor:{dist}"))
        lowest = min(delay + sample() for _ in range(40_000))
        least = least_transit(delay, jitter, dist)
        assert least <= lowest < least + 0.1 * jitter, dist
    # delay - 3 deviations, the bound it replaced, is above draws of normal jitter
    assert least_transit(delay, jitter, "normal") < delay - 3 * jitter
