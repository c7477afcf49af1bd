"""A run's timing in summary.json: lag by kind, validity against the bound, TCP per path."""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace

import pytest

import pddemu.roles.transfer as transfer
from pddemu.metrics.timing import histogram_percentile, invalid_reason, timing_summary

DILATION = {"min": 0.1, "mean": 0.125, "max": 0.2, "speedup": 8.0, "timeline": []}


def stats(**lags: list[float]) -> dict:
    instant = {"posted": 5, "binding": 2, "frozen_wall_s": 0.01}
    return {
        "lags_s": lags,
        "holds": {"posted": 10, "binding": 1, "frozen_wall_s": 0.002, "instant": instant},
    }


def test_the_mean_lag_of_known_times_judges_the_run_and_bounds_are_only_reported() -> None:
    """The frontend's lateness in reading (`delivery`, 5 ms here, over the 1.5 ms bound)
    reaches no result: reported, not judged (it was judged before the relay held the ends
    the frontend acts on)."""
    instances = {
        "P0": stats(step=[0.0] * 98 + [0.0001, 0.0002]),
        "FE0": stats(delivery=[0.005] * 50, delivery_wan=[0.5] * 50),
    }
    replayer_holds = {"posted": 4, "binding": 1, "frozen_wall_s": 0.5}
    summary = timing_summary(
        instances, {"send": [0.0]}, None, DILATION, 0.030, 0.05, replayer_holds
    )
    assert summary["valid"] and summary["invalid_reason"] is None
    assert summary["lag"]["bound_s"] == pytest.approx(0.0015)
    assert summary["emulator_lag_s"]["samples"] == 101  # the WAN bounds are not judged
    assert summary["lag"]["by_kind"]["delivery_wan"]["p50"] == 0.5  # but reported
    assert summary["lag"]["by_kind"]["delivery"]["p50"] == 0.005  # and so is the reading
    assert "delivery" not in summary["lag"]["mean_by_kind"]
    assert summary["lag"]["by_participant"]["replayer"]["send"]["count"] == 1
    assert summary["holds"] == {
        "posted": 20,
        "binding": 2,
        "frozen_wall_s": 0.004,
        # the instances' instant holds and the replayer's, where a slow participant shows
        "instant": {"posted": 14, "binding": 5, "frozen_wall_s": pytest.approx(0.52)},
        "routing": {"posted": 0, "binding": 0, "frozen_wall_s": 0.0},  # the shaper's: none
    }
    assert summary["dilation"]["speedup"] == 8.0
    spiky = stats(handler=[0.0] * 99 + [0.2])  # p99 2 ms, from one stall of 200 ms
    late = timing_summary({"MD0": spiky}, {}, None, DILATION, 0.03, 0.05)
    assert not late["valid"]
    assert late["invalid_reason"] == (
        "mean handler lag 2.00 ms is over its bound 1.50 ms (5% of TPOT p50 30.00 ms); "
        "handler lag of MD0 2.00 ms mean over 100"
    )
    assert late["lag"]["mean_by_kind"]["handler"] == pytest.approx(0.002)


def test_a_not_valid_reason_names_whose_lag_it_is_largest_mean_first() -> None:
    """As serve's verdict does (c4c83d8), emulate's reason goes on with the participants of
    the worst kind, largest mean first, three at most, the others' kinds left out; the
    shaper's release lag is the shaper's. Before, it stopped at the bound."""
    instances = {
        "MD0": stats(step=[0.004, 0.0], handler=[0.0]),
        "RLD0": stats(step=[0.006] * 3),
        "D0": stats(step=[0.001]),
        "P0": stats(step=[0.0005] * 4),
        "FE0": stats(handler=[0.002]),
    }
    late = timing_summary(instances, {}, None, DILATION, 0.03, 0.05)
    assert late["invalid_reason"] == (
        "mean step lag 2.50 ms is over its bound 1.50 ms (5% of TPOT p50 30.00 ms); "
        "step lag of RLD0 6.00 ms mean over 3, MD0 2.00 ms mean over 2, D0 1.00 ms mean over 1"
    )
    histogram = {"bucket_edges_s": [0.0, 0.01], "counts": [0, 9, 1], "total_s": 0.03,
                 "max_s": 0.012}  # fmt: skip
    released = timing_summary({"MD0": stats(step=[0.0])}, {}, histogram, DILATION, 0.03, 0.05)
    assert released["invalid_reason"].endswith(
        "; release lag of the shaper 3.00 ms mean over 10 packets"
    )


def test_the_dates_taken_inexactly_or_as_the_reading_time_are_counted() -> None:
    """The frontend's inexact kernel dates and every reader's dates older than the clock's
    anchor history (read as now) are summed into the lag section."""
    instances = {
        "FE0": {**stats(delivery=[0.0]), "inexact_dates": 3, "dates_past_history": 2},
        "MD0": {**stats(step=[0.0]), "dates_past_history": 1},
        "P0": stats(step=[0.0]),  # from before the counts: none
    }
    lag = timing_summary(instances, {}, None, DILATION, 0.03, 0.05)["lag"]
    assert (lag["inexact_dates"], lag["dates_past_history"]) == (3, 3)


def test_the_shapers_release_lag_counts_too() -> None:
    histogram = {
        "bucket_edges_s": [0.0, 0.001, 0.01],
        "counts": [900, 50, 49, 1],
        "total_s": 0.5,
        "max_s": 0.05,
    }
    assert histogram_percentile(histogram, 99) == 0.01
    assert histogram_percentile(histogram, 99.95) == 0.05  # the open bucket: the largest seen
    summary = timing_summary({}, {}, histogram, DILATION, 0.01, 0.05)
    assert summary["lag"]["release"]["mean"] == pytest.approx(0.0005)
    assert summary["valid"]
    assert invalid_reason({"release": 0.001}, 0.0005, 0.05).startswith("mean release lag 1.00 ms")
    assert invalid_reason({}, None, 0.05) is None  # no request: nothing to judge


def test_tcp_counters_are_summed_per_path() -> None:
    transfers = [
        {"wan": True, "bytes": 1, "retransmits": 3, "rto_events": 1, "min_rtt_s": 0.04,
         "delivery_rate_Bps": 1e6},
        {"wan": True, "bytes": 1, "retransmits": 0, "rto_events": 0, "min_rtt_s": 0.041,
         "delivery_rate_Bps": None},
        {"wan": False, "bytes": 1, "retransmits": 0, "rto_events": 0, "min_rtt_s": 1e-4,
         "delivery_rate_Bps": 2e6},
    ]  # fmt: skip
    summary = timing_summary(
        {"P0": {"kv_transfers_tcp": transfers}}, {}, None, DILATION, 0.03, 0.05
    )
    wan, intra = summary["tcp"]["wan"], summary["tcp"]["intra"]
    assert (wan["transfers"], wan["retransmits"], wan["rto_events"]) == (2, 3, 1)
    assert wan["transfers_with_retransmits"] == 1
    assert wan["min_rtt_s"]["p50"] == pytest.approx(0.0405)
    assert wan["delivery_rate_bps"]["count"] == 1 and intra["delivery_rate_bps"]["p50"] == 1.6e7


def test_a_sender_keeps_its_tcp_summary_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A serve transfers KV without end: the sender keeps the latest rows only, and the summary
    (as /stats sends it) counts every transfer."""
    monkeypatch.setattr(transfer, "KEPT_TRANSFERS", 10)
    ledger = transfer.TcpLedger(lambda: 1.0)
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()) as sock:
            channel = SimpleNamespace(writer=SimpleNamespace(get_extra_info=lambda _: sock))
            for index in range(300):
                ledger.charge(channel, index % 3 != 0, 1000)
    assert len(ledger.transfers) == 10
    stats = {
        "P0": {
            "kv_transfers_tcp": list(ledger.transfers),
            "kv_transfers_tcp_totals": json.loads(json.dumps(ledger.totals.as_dict())),
        }
    }
    tcp = timing_summary(stats, {}, None, DILATION, 0.03, 0.05)["tcp"]
    assert (tcp["wan"]["transfers"], tcp["intra"]["transfers"]) == (200, 100)
    assert tcp["wan"]["min_rtt_s"]["count"] == 200 and tcp["wan"]["min_rtt_s"]["p50"] > 0
    assert ledger.totals.counters["wan"]["bytes"] == 200_000


def test_a_run_without_a_tpot_is_judged_against_the_modelled_decode_step() -> None:
    """Two-token outputs whose tokens reached the user together have a TPOT of 0, which the
    bound leaves out (`completed_tpot_p50`): such a run is judged against the modelled decode
    step its controller aimed at, not declared untrustworthy for lacking a TPOT."""
    on_time = timing_summary(
        {"MD0": stats(step=[0.0, 0.0002])}, {}, None, DILATION, None, 0.05, decode_step_s=0.006
    )
    assert on_time["valid"] and on_time["invalid_reason"] is None
    assert on_time["lag"]["bound_s"] == pytest.approx(0.0003)
    assert on_time["lag"]["bound_from"] == "decode_step"
    late = timing_summary(
        {"MD0": stats(step=[0.0, 0.002])}, {}, None, DILATION, None, 0.05, decode_step_s=0.006
    )
    assert late["invalid_reason"] == (
        "mean step lag 1.00 ms is over its bound 0.30 ms "
        "(5% of the modelled decode step 6.00 ms: no request had a TPOT); "
        "step lag of MD0 1.00 ms mean over 2"
    )
    measured = timing_summary(
        {"MD0": stats(step=[0.0, 0.0002])}, {}, None, DILATION, 0.03, 0.05, decode_step_s=0.006
    )
    assert measured["lag"]["bound_from"] == "tpot_p50"  # a TPOT, when there is one, judges
    assert measured["lag"]["bound_s"] == pytest.approx(0.0015)


def test_the_shapers_holds_at_routing_answers_count_as_instant_and_apart() -> None:
    """The shaper holds the clock at each routing answer's release until the frontend has read
    it: time stood still by design, shown with the instant holds and apart (`answers`)."""
    replayer = {"posted": 4, "binding": 2, "frozen_wall_s": 0.01}
    answers = {"posted": 3, "binding": 3, "frozen_wall_s": 0.002}
    holds = timing_summary(
        {}, {}, None, DILATION, 0.03, 0.05, replayer_holds=replayer, routing_holds=answers
    )["holds"]
    assert holds["routing"] == answers
    assert holds["instant"]["posted"] == 7 and holds["instant"]["binding"] == 5
    assert holds["instant"]["frozen_wall_s"] == pytest.approx(0.012)
