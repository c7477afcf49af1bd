"""summarize() on hand-built records with known answers, on empty and failed runs, and on bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from metrics_samples import (
    SAMPLE_SCALE,
    SAMPLE_SLO,
    SAMPLE_WAN_RATE,
    baseline_records,
    completed,
    sample_instances,
    sample_records,
)

from pddemu.metrics import SLO, MetricsError, RequestRecord, judge_unmatched, summarize
from pddemu.metrics.records import InstanceReport

# The per-system object of summary.json as the design notes' interface section fixes it;
# a nested dict lists the keys it must hold, a None the leaf.
STAT = {"mean": None, "p50": None, "p90": None, "p99": None}
DESIGN_SCHEMA = {
    "system": None,
    "requests": {"total": None, "completed": None, "failed": None},
    "ttft_s": STAT,
    "tpot_s": STAT,
    "itl_s": STAT,
    "e2el_s": STAT,
    "goodput_rps": None,
    "slo": {"ttft_s": None, "tpot_s": None},
    "pipelines": {"P-MD": None, "P-RLD-MD": None, "RLD-only": None},
    "rld_token_share": None,
    "handoffs": {"one_shot": None, "catch_up": None, "max_stall_s": None},
    "wan_bytes": {"sent": None, "without_drc": None},
    "hit_rate": {"p_side_mean": None, "md_side_mean": None},
    "token_mismatches": None,
    "emulator_lag_s": {"p99": None},
    "cost_per_hour": None,
    "bcr": None,
    "scale": {"token_scale": None, "time_scale": None, "wan_rate_emulated_bps": None},
}


def assert_schema(summary: dict, schema: dict = DESIGN_SCHEMA, where: str = "") -> None:
    for key, inner in schema.items():
        assert key in summary, f"missing {where}{key}"
        value = summary[key]
        if inner is None:
            assert value is None or isinstance(value, int | float | str), f"{where}{key}: {value!r}"
        else:
            assert isinstance(value, dict), f"{where}{key} is not an object"
            assert_schema(value, inner, f"{where}{key}.")


def pdd_summary(records: list[RequestRecord] | None = None) -> dict:
    records = sample_records() if records is None else records
    return summarize("pdd", records, sample_instances(), SAMPLE_SLO, SAMPLE_SCALE, SAMPLE_WAN_RATE)


def test_latency_statistics_match_hand_computed_values() -> None:
    s = pdd_summary()
    approx = pytest.approx
    # TTFT of r1, r2, r3, r5 = 1.0, 2.0, 0.5, 1.0; sorted 0.5 1 1 2; p90 at rank 2.7 -> 1.7
    assert s["ttft_s"] == approx(
        {"mean": 1.125, "p50": 1.0, "p90": 1.7, "p99": 1.97, "max": 2.0, "count": 4}
    )
    # TPOT of r1, r2, r5 = 0.1, 1.0, 0.2 (r3 has one token: no TPOT)
    assert s["tpot_s"] == approx(
        {"mean": 1.3 / 3, "p50": 0.2, "p90": 0.84, "p99": 0.984, "max": 1.0, "count": 3}
    )
    # ITL pools 0.1 x3, 0.5 0.5 2.0, 0.2 0.2 -> sorted 0.1 0.1 0.1 0.2 0.2 0.5 0.5 2.0
    assert s["itl_s"] == approx(
        {"mean": 3.7 / 8, "p50": 0.2, "p90": 0.95, "p99": 1.895, "max": 2.0, "count": 8}
    )
    assert s["e2el_s"] == approx(
        {"mean": 2.05, "p50": 1.35, "p90": 3.92, "p99": 4.892, "max": 5.0, "count": 4}
    )
    assert s["percentile_method"] == "linear"


def test_percentiles_agree_with_numpy_on_a_large_sample() -> None:
    rng = np.random.default_rng(7)
    ttfts = rng.exponential(2.0, 501)
    records = [
        completed(f"q{i}", float(i), [i + t, i + t + 0.05], pipeline="P-MD")
        for i, t in enumerate(ttfts)
    ]
    s = pdd_summary(records)
    assert s["ttft_s"]["p99"] == pytest.approx(float(np.percentile(ttfts, 99)))
    assert s["ttft_s"]["p50"] == pytest.approx(float(np.median(ttfts)))
    assert s["itl_s"]["p50"] == pytest.approx(0.05)


def test_requests_goodput_cost_and_bcr() -> None:
    s = pdd_summary()
    assert s["requests"] == {
        "total": 5,
        "completed": 4,
        "failed": 1,
        "unrouted": 0,
        "unmatched": 0,
        "failure_reasons": {"timeout": 1},
    }
    assert s["duration_s"] == pytest.approx(6.0)
    assert s["good_requests"] == 3  # r2 misses the TTFT target
    assert s["slo_attainment"] == pytest.approx(3 / 5)  # r4 failed: counted, not good
    assert s["goodput_rps"] == pytest.approx(0.5)
    assert s["throughput_rps"] == pytest.approx(4 / 6)
    # completed r1, r2, r3, r5: 100 input tokens each; 4 + 4 + 1 + 3 output tokens
    assert (s["input_tokens_total"], s["output_tokens_total"]) == (400, 12)
    assert s["output_throughput_tps"] == pytest.approx(12 / 6)
    assert s["total_token_throughput_tps"] == pytest.approx(412 / 6)
    assert s["slo"] == {"ttft_s": 1.5, "tpot_s": 0.5}
    assert s["cost_per_hour"] == pytest.approx(27.0)
    assert s["cost_per_hour_by_role"] == {"P": 10.0, "RLD": 5.0, "MD": 12.0}
    assert s["bcr"] == pytest.approx(0.5 / 27)


def test_ttft_grouped_by_the_requests_hit_rate() -> None:
    by_hit = pdd_summary()["ttft_s_by_hit"]
    # P-side hits of 100 input tokens: r2 0 (TTFT 2.0), r1 90 (1.0), r3 99 (0.5), r5 95 (1.0);
    # r4 failed and has no TTFT. 90 % is the lower edge of 90-95 %, 95 % of 95-100 %.
    assert list(by_hit) == ["0-90%", "90-95%", "95-100%"]
    assert (by_hit["0-90%"]["count"], by_hit["0-90%"]["p50"]) == (1, pytest.approx(2.0))
    assert (by_hit["90-95%"]["count"], by_hit["90-95%"]["p50"]) == (1, pytest.approx(1.0))
    assert by_hit["95-100%"]["count"] == 2
    assert by_hit["95-100%"]["mean"] == pytest.approx(0.75)
    assert by_hit["95-100%"]["max"] == pytest.approx(1.0)


def test_tpot_target_decides_goodput() -> None:
    tight = summarize(
        "pdd",
        sample_records(),
        sample_instances(),
        SLO(ttft_s=1.5, tpot_s=0.15),
        SAMPLE_SCALE,
        SAMPLE_WAN_RATE,
    )
    assert tight["good_requests"] == 2  # r5's TPOT of 0.2 now misses; r3 has no TPOT and passes


def test_pdd_mechanism_counters() -> None:
    s = pdd_summary()
    assert s["pipelines"] == {"P-MD": 2, "P-RLD-MD": 2, "RLD-only": 1}
    assert s["tokens"] == {"delivered": 12, "rld": 5, "md": 7, "expected": 20}
    assert s["rld_token_share"] == pytest.approx(5 / 12)
    handoffs = s["handoffs"]
    assert (handoffs["one_shot"], handoffs["catch_up"], handoffs["rounds"]) == (1, 1, 4)
    assert handoffs["max_stall_s"] == pytest.approx(2.0)
    assert handoffs["p99_stall_s"] == pytest.approx(0.2 + 0.99 * 1.8)
    assert handoffs["payloads"] == {"extend": 2, "kv_delta": 0}
    assert s["wan_bytes"] == {
        "sent": 24_500,
        "without_drc": 85_000,
        "drc_reduction": pytest.approx(85 / 24.5),
        "cancelled": 5000,
        "genuine": 210,
    }
    assert s["anomaly_filtered"] == 1
    assert s["token_mismatches"] == 1
    assert s["delivery"] == {"duplicate_tokens": 2, "gap_tokens": 0, "dropped_stale_tokens": 0}


def test_hit_rates_per_request_and_token_weighted() -> None:
    hit = pdd_summary()["hit_rate"]
    # P side: 0.90, 0.00, 0.99, 1.00, 0.95; MD side (r1, r2, r5): 0.95, 0.50, 0.97
    assert hit["p_side_mean"] == pytest.approx(3.84 / 5)
    assert hit["md_side_mean"] == pytest.approx(2.42 / 3)
    assert hit["p_side_token_weighted"] == pytest.approx(384 / 500)
    assert hit["md_side_requests"] == 3
    assert hit["bucket_labels"][0] == "0-90%" and hit["bucket_labels"][-1] == "99.5-100%"
    assert hit["p_side_buckets"] == [1, 1, 1, 0, 0, 1, 1]  # 99 % opens the 99-99.5 bucket
    assert hit["md_side_buckets"] == [1, 0, 1, 1, 0, 0, 0]


def test_kv_transfer_times_from_routing_and_from_the_first_chunk() -> None:
    records = [  # routed at 0.1 / 2.1, first chunk at 0.5 / 2.2, whole KV at 0.9 / 3.2
        completed("a", 0.0, [1.0, 1.1], routed_s=0.1, kv_first_chunk_s=0.5, kv_arrived_s=0.9),
        completed("b", 2.0, [3.5], routed_s=2.1, kv_first_chunk_s=2.2, kv_arrived_s=3.2),
        completed("c", 4.0, [4.5], routed_s=4.1),  # the relay's alone: no transfer ended
    ]
    kv = summarize("pdd", records, [], SAMPLE_SLO, SAMPLE_SCALE, SAMPLE_WAN_RATE)["kv_transfer_s"]
    assert kv["to_ready"]["count"] == 2 and kv["first_to_last_chunk"]["count"] == 2
    assert kv["to_ready"]["mean"] == pytest.approx((0.8 + 1.1) / 2)
    assert kv["to_ready"]["max"] == pytest.approx(1.1)
    assert kv["first_to_last_chunk"]["mean"] == pytest.approx((0.4 + 1.0) / 2)
    empty = summarize("pdd", [], [], SAMPLE_SLO, SAMPLE_SCALE, None)["kv_transfer_s"]
    assert empty["to_ready"]["mean"] is None and empty["first_to_last_chunk"]["count"] == 0


def test_emulator_lag_pools_every_instance() -> None:
    lag = pdd_summary()["emulator_lag_s"]
    # samples 0, 0.01, 0.02, 0, 0.5 -> sorted rank 3.96 lies between 0.02 and 0.5
    assert lag == pytest.approx(
        {"p99": 0.02 + 0.96 * 0.48, "max": 0.5, "mean": 0.106, "samples": 5}
    )


def test_kv_beyond_capacity_is_summed_over_the_instances() -> None:
    instances = [
        InstanceReport("RLD0", "RLD", "A", 2, 5.0, kv_peak_over_capacity_tokens=7),
        InstanceReport("MD0", "MD", "B", 8, 12.0, kv_peak_over_capacity_tokens=30),
        InstanceReport("MD1", "MD", "B", 8, 12.0),
    ]
    summary = summarize("pdd", sample_records(), instances, SAMPLE_SLO, SAMPLE_SCALE, None)
    assert summary["kv_peak_over_capacity_tokens"] == 37
    assert pdd_summary()["kv_peak_over_capacity_tokens"] == 0


def test_scale_holds_the_factors_and_the_wan_rate() -> None:
    assert pdd_summary()["scale"] == {
        "token_scale": 0.0625,
        "time_scale": 2.0,
        "wan_rate_emulated_bps": 8e6,
        "byte_scale": 0.001,
    }


def test_summary_has_every_design_key_and_is_strict_json() -> None:
    s = pdd_summary()
    assert_schema(s)
    assert json.loads(json.dumps(s, allow_nan=False)) == s


def test_baseline_counts_the_plain_pipeline() -> None:
    s = summarize(
        "naive", baseline_records("naive", 2.0), [], SAMPLE_SLO, SAMPLE_SCALE, SAMPLE_WAN_RATE
    )
    assert s["pipelines"] == {"P-MD": 0, "P-RLD-MD": 0, "RLD-only": 0, "P-D": 2}
    assert s["rld_token_share"] == 0.0
    assert s["cost_per_hour"] == 0.0 and s["bcr"] is None  # no hardware, no ratio
    assert_schema(s)


def test_empty_run_gives_a_valid_summary() -> None:
    s = summarize("pdd", [], [], SAMPLE_SLO, SAMPLE_SCALE, None)
    assert_schema(s)
    json.dumps(s, allow_nan=False)
    assert s["requests"]["total"] == 0
    assert s["ttft_s"] == {
        "mean": None,
        "p50": None,
        "p90": None,
        "p99": None,
        "max": None,
        "count": 0,
    }
    assert s["duration_s"] is None and s["goodput_rps"] == 0.0 and s["bcr"] is None
    assert s["rld_token_share"] is None
    assert s["hit_rate"]["p_side_mean"] is None and s["hit_rate"]["md_side_mean"] is None
    assert s["hit_rate"]["p_side_buckets"] == [0] * 7
    assert s["emulator_lag_s"] == {"p99": None, "max": None, "mean": None, "samples": 0}
    assert s["handoffs"]["max_stall_s"] is None and s["wan_bytes"]["drc_reduction"] is None
    assert s["scale"]["wan_rate_emulated_bps"] is None


def test_all_failed_run_gives_zero_goodput() -> None:
    failed = [
        RequestRecord(f"f{i}", "pdd", float(i), 10, 5, failure_reason="no capacity")
        for i in range(3)
    ]
    s = summarize("pdd", failed, sample_instances(), SAMPLE_SLO, SAMPLE_SCALE, SAMPLE_WAN_RATE)
    assert_schema(s)
    json.dumps(s, allow_nan=False)
    assert s["requests"] == {
        "total": 3,
        "completed": 0,
        "failed": 3,
        "unrouted": 3,
        "unmatched": 0,
        "failure_reasons": {"no capacity": 3},
    }
    assert s["goodput_rps"] == 0.0 and s["bcr"] == 0.0
    assert s["ttft_s"]["p99"] is None and s["itl_s"]["count"] == 0
    assert s["hit_rate"]["p_side_mean"] == 0.0


def test_failed_request_with_a_finish_extends_the_duration() -> None:
    records = sample_records()
    records[3].finish_s = 12.0  # r4 gave up at 12 s
    assert pdd_summary(records)["duration_s"] == pytest.approx(12.0)
    assert pdd_summary(records)["goodput_rps"] == pytest.approx(3 / 12)


def broken(**changes: object) -> list[RequestRecord]:
    records = sample_records()
    for name, value in changes.items():
        setattr(records[0], name, value)
    return records


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"system": "naive"}, "record says system 'naive'"),
        ({"state": "running"}, "state 'running'"),
        ({"pipeline": "P-X"}, "pipeline 'P-X'"),
        ({"handoff_mode": "two_shot"}, "handoff_mode"),
        ({"handoff_payload": "pixels"}, "handoff_payload"),
        ({"input_tokens": 0}, "input_tokens must be at least 1"),
        ({"wan_bytes": -1}, "wan_bytes is negative"),
        ({"p_hit_tokens": 101}, "p_hit_tokens = 101 outside"),
        ({"md_hit_tokens": -1}, "md_hit_tokens = -1 outside"),
        ({"first_token_s": None}, "completed without first_token_s"),
        ({"first_token_s": -1.0}, "before arrival"),
        ({"finish_s": 0.5}, "finish at 0.5 before"),
        ({"arrival_s": float("nan")}, "arrival_s is nan"),
        ({"token_times_s": [1.0, 1.1]}, "2 token times for 4 output tokens"),
        ({"token_times_s": [1.0, 1.2, 1.1, 1.3]}, "go back in time"),
        ({"output_tokens": 0, "token_times_s": []}, "completed with no output token"),
        ({"handoff_stall_s": -0.1}, "handoff_stall_s"),
        ({"request_id": "r2"}, "appears twice"),
    ],
)
def test_inconsistent_record_is_named_in_the_error(changes: dict, message: str) -> None:
    with pytest.raises(MetricsError, match=message):
        pdd_summary(broken(**changes))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: SLO(ttft_s=0, tpot_s=0.1), "SLO ttft_s must be a positive"),
        (lambda: SLO(ttft_s=1, tpot_s=float("inf")), "SLO tpot_s"),
        (
            lambda: summarize("pdd", [], [], SAMPLE_SLO, {"token_scale": 1.0}, None),
            r"scale\['time_scale'\]",
        ),
        (
            lambda: summarize(
                "pdd", [], [], SAMPLE_SLO, {**SAMPLE_SCALE, "time_scale": True}, None
            ),
            r"scale\['time_scale'\]",
        ),
        (
            lambda: summarize(
                "pdd", [], [], SAMPLE_SLO, {**SAMPLE_SCALE, "wan_rate_emulated_bps": 1.0}, 2.0
            ),
            "contradicts",
        ),
        (lambda: summarize("pdd", [], [], SAMPLE_SLO, SAMPLE_SCALE, -5.0), "must be positive"),
        (
            lambda: summarize(
                "pdd", [], [InstanceReport("P0", "P", "A", 1, -1.0)], SAMPLE_SLO, SAMPLE_SCALE, None
            ),
            "price_per_hour",
        ),
        (
            lambda: summarize(
                "pdd",
                [],
                [InstanceReport("P0", "P", "A", 1, 1.0)] * 2,
                SAMPLE_SLO,
                SAMPLE_SCALE,
                None,
            ),
            "appears twice",
        ),
    ],
)
def test_bad_parameters_raise(call, message: str) -> None:
    with pytest.raises(MetricsError, match=message):
        call()


@pytest.mark.parametrize(
    ("lag_reason", "warm_unmatched", "reason"),
    [
        (None, 0, "1 measured and 0 warm-up requests routed with no decode-side hit"),
        ("mean step lag", 2, "mean step lag; 1 measured and 2 warm-up requests routed"),
    ],
)
def test_a_run_that_routed_requests_unmatched_is_not_valid(
    lag_reason: str | None, warm_unmatched: int, reason: str
) -> None:
    """A request routed with no decode-side hit because MD's answer to its match came too late
    (the emulated WAN held the match: docs/validation.md, "Which lag counts") makes the run
    not valid, its lag within bounds or not; the count says it, measured and warm-up apart.
    None such: the run's validity is its lag's."""
    records = sample_records()
    records[0].unmatched = True
    s = pdd_summary(records)
    assert s["requests"]["unmatched"] == 1
    s.update(valid=lag_reason is None, invalid_reason=lag_reason)
    s["warmup"] = {"requests": {"unmatched": warm_unmatched}}
    judge_unmatched(s)
    assert s["valid"] is False and s["invalid_reason"].startswith(reason)
    clean = pdd_summary()
    clean.update(valid=True, invalid_reason=None, warmup=None)
    judge_unmatched(clean)
    assert (clean["valid"], clean["invalid_reason"]) == (True, None)


def test_a_run_with_scheduled_faults_is_not_judged_on_its_unmatched_requests() -> None:
    """An outage or a slower link the run schedules may hold MD's answer in the modelled
    system too: its unmatched requests are counted, the run's validity left to its lag."""
    records = sample_records()
    records[0].unmatched = True
    s = pdd_summary(records)
    s.update(valid=True, invalid_reason=None, warmup=None)
    s["faults"] = {"scheduled": [], "link_events": [{"at_s": 1.0, "actions": []}]}
    judge_unmatched(s)
    assert (s["requests"]["unmatched"], s["valid"], s["invalid_reason"]) == (1, True, None)
