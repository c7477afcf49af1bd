"""The flows' judgement at each of its bounds (`pddemu.metrics.wan_flows`), on constructed
records as the shaper writes them (`netem.flow_count`): just under, at and just over 1 % of the
windows with data starved, 1 modelled s of them, and 4 packets of fair share; a crowded window
without drops and a window without data count for nothing. A run is judged as emulate and
serve judge it: `wan_flows_summary`, then `starved_run`."""

from __future__ import annotations

from typing import Any

import pytest

from netem.flow_count import FlowCount
from pddemu.metrics.wan_flows import (
    FAST_RETRANSMIT_PACKETS,
    STARVED_MIN_S,
    STARVED_SHARE_MAX,
    starved,
    starved_run,
    wan_flows_summary,
)
from tests.netem.test_flow_count import segment

PATH = 42.0
WIDTH = 0.1  # 10 windows a modelled second
CALM = (2, 21.0, 0)  # a window with data, two flows of 21 packets each, no drop
STARVED = (12, 3.5, 3)  # with data, under the bound, with drops
IDLE = (0, None, 0)  # no data, no drop


def record(windows: list[tuple[int, float | None, int]], width: float = WIDTH) -> dict[str, Any]:
    """A direction's record of `windows` (flows, share in packets, drops) from window 0."""
    return {
        "window_s": width,
        "origin": 0.0,
        "first": 0,
        "flows": [w[0] for w in windows],
        "share_packets": [w[1] for w in windows],
        "drops": [w[2] for w in windows],
    }


def judge(
    a2b: list[tuple[int, float | None, int]],
    b2a: list[tuple[int, float | None, int]] | None = None,
    width: float = WIDTH,
) -> tuple[bool, dict[str, Any]]:
    """Whether the run of these windows (the replay: all of them) is starved, and its summary."""
    records = {"a2b": record(a2b, width)}
    if b2a is not None:
        records["b2a"] = record(b2a, width)
    end = max(len(a2b), len(b2a or [])) * width
    summary = wan_flows_summary(records, 0.0, end, PATH)
    return starved_run(summary), summary


def run_of(active: int, starved_windows: int) -> list[tuple[int, float | None, int]]:
    """`active` windows with data, the first `starved_windows` of them starved."""
    return [STARVED] * starved_windows + [CALM] * (active - starved_windows)


def test_the_bounds_are_the_documented_ones() -> None:
    assert (FAST_RETRANSMIT_PACKETS, STARVED_SHARE_MAX, STARVED_MIN_S) == (4, 0.01, 1.0)


def test_a_window_is_starved_under_four_packets_with_a_drop() -> None:
    assert starved(3.999, drops=1)
    assert not starved(4.0, drops=1)
    assert not starved(4.001, drops=1)
    assert not starved(0.5, drops=0)  # crowded, nothing lost: nothing to recover
    assert not starved(None, drops=7)  # no data in the window (or an unlimited link)


@pytest.mark.parametrize(
    ("starved_windows", "expected"),
    [(10, False), (11, True), (12, True)],  # 1.0 %: at the bound; 1.1 %, 1.2 %: over it
)
def test_over_one_percent_of_the_windows_with_data(starved_windows: int, expected: bool) -> None:
    """1,000 windows with data (100 s), 1 s of them starved at least."""
    verdict, summary = judge(run_of(1000, starved_windows))
    assert summary["starved_share"] == starved_windows / 1000
    assert summary["starved_s"] >= STARVED_MIN_S
    assert verdict is expected


def test_just_over_one_percent() -> None:
    """20 of 1,999 windows: 1.0005 %, 2 s."""
    verdict, summary = judge(run_of(1999, 20))
    assert summary["starved_share"] > STARVED_SHARE_MAX and verdict


@pytest.mark.parametrize(
    ("starved_windows", "expected"),
    [(9, False), (10, True), (11, True)],  # 0.9 s: under; 1.0 s: at; 1.1 s: over
)
def test_at_least_one_modelled_second(starved_windows: int, expected: bool) -> None:
    """Of 100 windows with data: 9 % or more, over the share whatever the count."""
    verdict, summary = judge(run_of(100, starved_windows))
    assert summary["starved_s"] == pytest.approx(starved_windows * WIDTH)
    assert verdict is expected


def test_one_second_of_windows_whose_width_is_not_exact_in_binary() -> None:
    """A WAN of 5 ms each way and a 90 ms queue: windows of 2 x 0.005 + 0.09 s, which is
    0.09999999999999999 in binary; ten of them are a second."""
    width = 2 * 0.005 + 0.09
    assert 10 * width < 1.0  # the product falls short of the bound by the binary's error
    verdict, summary = judge(run_of(100, 10), width=width)
    assert summary["starved_s"] == 1.0 and verdict


def test_a_crowded_window_without_drops_counts_for_nothing() -> None:
    crowded = (60, 0.7, 0)
    verdict, summary = judge([crowded] * 500 + [CALM] * 500)
    assert summary["directions"]["a2b"]["windows_crowded"] == 500
    assert (summary["starved_share"], summary["starved_s"], verdict) == (0.0, 0.0, False)
    assert summary["starved_direction"] is None
    # one drop in each turns them starved
    verdict, _ = judge([(60, 0.7, 1)] * 500 + [CALM] * 500)
    assert verdict


def test_a_window_without_data_counts_for_nothing() -> None:
    """Idle windows (drops without data among them: a share is a window's with data) neither
    dilute the starved ones nor add to them."""
    idle_with_drops = (0, None, 4)
    at_the_share = run_of(1000, 10) + [IDLE] * 5000 + [idle_with_drops] * 50
    verdict, summary = judge(at_the_share)
    assert summary["directions"]["a2b"]["windows_active"] == 1000
    assert (summary["starved_share"], verdict) == (0.01, False)
    verdict, summary = judge(run_of(1000, 11) + [IDLE] * 5000)
    assert (summary["starved_share"], verdict) == (0.011, True)


def test_the_bound_is_four_packets_in_a_record() -> None:
    at_four = [(10, 4.0, 5)] * 20 + [CALM] * 80
    assert judge(at_four)[0] is False
    assert judge([(10, 3.999, 5)] * 20 + [CALM] * 80)[0] is True
    assert judge([(10, 4.001, 5)] * 20 + [CALM] * 80)[0] is False


def test_a_share_just_under_four_packets_is_recorded_under_four() -> None:
    """The shaper writes shares to the thousandth: one of 3.9996 packets (a flow offering more
    than a window carries at 319,968 bit/s in 0.1 s windows of 1,000-byte packets) must not be
    written 4.0, which the judgement would read as enough."""
    count = FlowCount(WIDTH, origin=0.0)
    rate, mtu = 319_968.0, 1000
    count.count([segment(1, data=960)] * 5, 0.01, 0, rate, mtu)  # 5,000 bytes offered
    (share,) = count.to_dict(rate, mtu)["share_packets"]
    assert share < FAST_RETRANSMIT_PACKETS and starved(share, drops=1)
    exactly = 4 * mtu * 8 / WIDTH  # a window carries exactly 4 packets
    count = FlowCount(WIDTH, origin=0.0)
    count.count([segment(1, data=960)] * 5, 0.01, 0, exactly, mtu)
    assert count.to_dict(exactly, mtu)["share_packets"] == [4.0]


def test_each_direction_is_judged_on_its_own() -> None:
    """Over the share in one direction (2 %, 0.2 s) and a second of starved windows in the
    other (0.1 % of its windows): neither direction was starved long enough over enough of its
    time, so the run is not starved; the figures reported are one direction's."""
    verdict, summary = judge(run_of(100, 2), run_of(10_000, 10))
    assert verdict is False
    assert (summary["starved_share"], summary["starved_s"]) == (0.02, pytest.approx(0.2))
    assert summary["starved_direction"] == "a2b"
    verdict, summary = judge(run_of(100, 2), run_of(100, 11))
    assert verdict is True
    assert (summary["starved_share"], summary["starved_s"]) == (0.11, pytest.approx(1.1))
    assert summary["starved_direction"] == "b2a"
