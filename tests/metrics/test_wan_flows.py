"""The closed form the WAN's flows are judged by (`pddemu.metrics.wan_flows`): a window whose
flows' fair share is under 4 packets (three duplicate ACKs behind a lost packet, RFC 5681
section 3.2) and whose queue dropped packets is starved, and a run starved over more than 1 %
of its replay and for 1 modelled s at least is not valid, unless it schedules link events. On
synthetic records as the shaper writes them (`netem.flow_count`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from netem.control import ControlError
from netem.flow_count import fair_share
from pddemu.config import load_config
from pddemu.emulate import replay_wan_flows
from pddemu.metrics.wan_flows import (
    FAST_RETRANSMIT_PACKETS,
    STARVED_MIN_S,
    STARVED_SHARE_MAX,
    flows_reason,
    judge_wan_flows,
    starved,
    wan_flows_summary,
)

PATH = 42.0  # the default deployment's: 21 packets of queue and 21 of bandwidth-delay product
BULK = 1000.0  # a flow that offers more than any share


def test_the_bound_is_four_packets_a_flow_with_drops() -> None:
    assert FAST_RETRANSMIT_PACKETS == 4
    ten, eleven = fair_share([BULK] * 10, PATH), fair_share([BULK] * 11, PATH)
    assert ten == pytest.approx(4.2) and not starved(ten, drops=5)
    assert eleven < 4 and starved(eleven, drops=1)
    assert not starved(fair_share([BULK] * 60, PATH), drops=0)  # crowded, nothing to recover
    # 50 one-packet flows (other tenants' short transfers) beside 2 bulk ones: not crowded
    assert not starved(fair_share([1.0] * 30 + [BULK] * 2, PATH), drops=9)
    assert not starved(None, drops=9)  # no data in the window, or an unlimited link


def record(
    flows: list[int], shares: list[float | None], drops: list[int], first: int = 0
) -> dict[str, Any]:
    return {
        "window_s": 0.1,
        "origin": 0.0,
        "first": first,
        "flows": flows,
        "share_packets": shares,
        "drops": drops,
    }


def test_the_summary_counts_the_replays_windows_only() -> None:
    # windows 0-19 (0-2 s); the replay is [0.5, 1.5): windows 5-14
    flows = [30] * 5 + [2, 2, 12, 12, 12, 2, 0, 2, 2, 2] + [30] * 5
    shares: list[float | None] = [1.4] * 5 + [21, 21, 3.5, 3.5, 3.5, 21, None, 21, 21, 21]
    shares += [1.4] * 5
    drops = [9] * 5 + [0, 0, 3, 0, 3, 0, 1, 0, 0, 0] + [9] * 5
    summary = wan_flows_summary(
        {"a2b": record(flows, shares, drops), "b2a": record([1] * 20, [PATH] * 20, [0] * 20)},
        0.5,
        1.5,
        PATH,
    )
    assert summary["windows"] == 10
    assert (summary["flows_peak"], summary["share_min_packets"]) == (12, 3.5)
    assert summary["directions"]["a2b"] == {
        "flows_peak": 12,
        "windows_active": 9,
        "share_min_packets": 3.5,
        "drops": 7,
        "windows_crowded": 3,
        "windows_starved": 2,
    }
    assert summary["starved_share"] == pytest.approx(2 / 9)  # of the windows with data
    assert summary["starved_s"] == pytest.approx(0.2)


def test_idle_windows_do_not_thin_out_the_starved_ones() -> None:
    """A served run idle for long after a starved burst stays as starved as the burst was."""
    burst = record([30] * 10 + [0] * 990, [1.4] * 10 + [None] * 990, [5] * 10 + [0] * 990)
    summary = wan_flows_summary({"a2b": burst}, 0.0, 100.0, PATH)
    assert summary["windows"] == 1000 and summary["starved_share"] == pytest.approx(1.0)


def test_a_record_that_begins_after_the_replay_start_is_aligned() -> None:
    summary = wan_flows_summary({"a2b": record([20, 1], [2.1, PATH], [1, 0], 7)}, 0.5, 1.5, PATH)
    assert summary["directions"]["a2b"]["windows_starved"] == 1
    assert summary["directions"]["a2b"]["flows_peak"] == 20


def judged(
    share: float,
    link_events: list[Any] | None = None,
    lag: str | None = None,
    starved_s: float = 5.0,
) -> dict:
    summary = {
        "valid": lag is None,
        "invalid_reason": lag,
        "faults": {"scheduled": [], "link_events": link_events or []},
        "wan_flows": {
            "flows_peak": 60,
            "path_packets": PATH,
            "bound_packets": 4,
            "share_min_packets": 0.7,
            "starved_share": share,
            "starved_s": starved_s,
        },
    }
    judge_wan_flows(summary)
    return summary


def test_a_run_starved_over_its_share_is_not_valid() -> None:
    assert judged(STARVED_SHARE_MAX)["valid"] is True
    # a moment's crowding of a short run (one 80 ms window of 78: a quick handoff point's)
    assert judged(1 / 78, starved_s=0.08)["valid"] is True
    assert judged(0.25, starved_s=STARVED_MIN_S)["valid"] is False
    flagged = judged(0.25)
    assert flagged["valid"] is False
    assert flagged["invalid_reason"] == (
        "the emulated WAN left TCP too few packets per flow: losses were recovered by timeouts "
        "the modelled system's flows would not suffer (a path of 42 packets, up to 60 flows at "
        "once; their fair share under 4 packets each, down to 0.7, with losses in 25% of the "
        "replay, 5.0 s: wan_flows)"
    )
    both = judged(0.25, lag="mean step lag 9.00 ms is over its bound")["invalid_reason"]
    assert both.startswith("mean step lag 9.00 ms is over its bound; the emulated WAN left")
    # a schedule that changes the links changes the path the share is taken of
    assert judged(0.25, link_events=[{"at_s": 1.0, "rate": "1gbit"}])["valid"] is True


def test_a_flow_count_that_cannot_be_read_leaves_the_run_partial(tmp_path: Path) -> None:
    """The shaper's control channel fails as ControlError (a timeout, a broken socket): the
    run keeps its results, partial, rather than losing them to the exception."""

    def unreadable() -> dict[str, Any]:
        raise ControlError("shaper: no answer within 5 s")

    network = SimpleNamespace(flow_window_s=0.08, flow_counts=unreadable)
    run = SimpleNamespace(system="pdd", partial=[], replay_start_s=0.0)
    found = replay_wan_flows(network, load_config(), run, 10.0, tmp_path)  # type: ignore[arg-type]
    assert found is None
    assert run.partial == ["the WAN's flow count could not be read: shaper: no answer within 5 s"]


def test_the_reason_gives_the_starved_directions_own_figures() -> None:
    """B to A crowded by 60 flows without a loss is not what starved A to B's 12 flows."""
    starving = record([12] * 20, [3.5] * 20, [2] * 20)
    crowded = record([60] * 20, [0.7] * 20, [0] * 20)
    flows = wan_flows_summary({"a2b": starving, "b2a": crowded}, 0.0, 2.0, PATH)
    assert flows["starved_direction"] == "a2b" and flows["flows_peak"] == 60
    reason = flows_reason(flows)
    assert "up to 12 flows at once from A to B" in reason and "down to 3.5" in reason
    assert "60" not in reason and "0.7" not in reason
