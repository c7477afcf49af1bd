"""A kernel receive date is kept between the least transit after sending and now."""

from __future__ import annotations

import random
from pathlib import Path

from netem.elements.delay import jitter_sampler, lowest_jitter
from netem.schedule import load_schedule
from pddemu.config import load_config
from pddemu.roles.base import Instance, least_scheduled_transit, least_transit
from pddemu.roles.spec import Address, InstanceSpec
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


def _transits_of(me: str, overrides: list[str]) -> dict[str, tuple[float, bool]]:
    """The transits instance `me` of a P0/RLD0/MD0 deployment takes from a config."""
    instance = Instance.__new__(Instance)  # only what `_transits` reads
    instance.config = load_config(overrides=overrides)
    peers = {
        "P0": Address("P0", "P", "198.18.0.1", 7000, 8000),
        "RLD0": Address("RLD0", "RLD", "198.18.2.1", 7000, 8000),
        "MD0": Address("MD0", "MD", "198.19.0.1", 7000, 8000),
    }
    instance.spec = InstanceSpec(peers[me], "pdd", "ns", peers, {}, 0.0)
    return instance._transits()


def test_a_schedule_that_lowers_the_wan_delay_lowers_the_floor(tmp_path: Path) -> None:
    """A kernel date is raised to the floor: a step from 20 ms to 5 ms must take it to at
    most 5 ms less the jitter's lowest draw, or arrivals after the step are dated late."""
    schedule = tmp_path / "wan.schedule"
    schedule.write_text("10 delay=5ms\n")
    config = ["wan.delay=20ms", "wan.jitter=1ms", "wan.jitter_dist=normal"]
    floor = 0.005 + lowest_jitter("normal", 0.001)
    assert floor > 0  # the bound is not met by the clamp at 0
    without = _transits_of("MD0", config)
    assert without["P0"] == (least_transit(0.020, 0.001, "normal"), False)
    assert without["P0"][0] > 0.015
    scheduled = _transits_of("MD0", [*config, f"wan.schedule={schedule}"])
    assert scheduled["P0"][0] <= floor and scheduled["RLD0"][0] <= floor
    assert _transits_of("P0", [*config, f"wan.schedule={schedule}"])["MD0"][0] <= floor


def test_a_faults_file_link_change_lowers_the_floor_in_its_direction_only(
    tmp_path: Path,
) -> None:
    faults = tmp_path / "faults"
    faults.write_text("10 a2b.delay=5ms a2b.jitter=0ms\n")
    config = ["wan.delay=20ms", "wan.jitter=0ms", f"faults.schedule={faults}"]
    assert _transits_of("MD0", config)["P0"][0] == 0.005  # a2b: towards MD
    assert _transits_of("P0", config)["MD0"][0] == 0.020  # b2a is unchanged


def test_the_floor_takes_every_state_the_schedule_passes_through(tmp_path: Path) -> None:
    """Changes accumulate (a later jitter on an earlier delay), a repeat starts from where
    the last pass ended, and a link that goes down does not lower the floor."""
    path = tmp_path / "wan.schedule"
    path.write_text("1 delay=10ms\n2 link=down\n3 link=up delay=30ms\n4 jitter=4ms\n9 repeat\n")
    events = load_schedule(path)
    floor = least_scheduled_transit((0.020, 0.001, "uniform"), events, "wan", "b2a")
    # the second pass's first step: 10 ms under the 4 ms jitter the first pass left
    assert floor == least_transit(0.010, 0.004, "uniform")
    path.write_text("1 link=down delay=50ms\n2 link=up delay=20ms\n")
    assert least_scheduled_transit((0.020, 0.0, "normal"), load_schedule(path), "wan", "a2b") == (
        0.020
    )
    path.write_text("1 intra.delay=1ms\n")
    assert least_scheduled_transit((0.020, 0.0, "normal"), load_schedule(path), "wan", "a2b") == (
        0.020
    )


def test_an_intra_path_a_schedule_shapes_is_no_longer_taken_as_exact(tmp_path: Path) -> None:
    path = tmp_path / "wan.schedule"
    path.write_text("5 intra.delay=2ms\n")
    assert _transits_of("RLD0", [])["P0"] == (0.0, True)
    assert _transits_of("RLD0", [f"wan.schedule={path}"])["P0"] == (0.0, False)
    path.write_text("5 intra.link=down\n6 intra.link=up intra.loss=1%\n")  # no time added
    assert _transits_of("RLD0", [f"wan.schedule={path}"])["P0"] == (0.0, True)
