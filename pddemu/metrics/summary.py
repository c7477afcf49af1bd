"""One system's run, summarised: its object in summary.json, whose keys other tools rely on.

Conventions (docs/metrics.md defines every field from the per-request timestamps):
- latency statistics (TTFT, TPOT, ITL, E2EL) are over completed requests only, as in vLLM's
  benchmark; ITL pools the gaps of all of them; percentiles interpolate linearly (numpy);
- a request meets the SLO when it completed, its TTFT is at most the TTFT target and its TPOT
  at most the TPOT target; a one-token request has no TPOT and passes that target (vLLM counts
  its TPOT as 0);
- the run's duration is the last finish minus the first arrival, in modelled seconds;
- counts, token shares, bytes and hit rates are over every request, failed ones included (what
  they moved or delivered before failing did happen); the MD-side hit rate is over the requests
  that reached an MD;
- hit-rate means are per-request means of hit tokens / input tokens (each request weighs the
  same, as in the bucket histogram); token-weighted rates are given beside them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pddemu.metrics.distribution import describe, percentile
from pddemu.metrics.errors import MetricsError
from pddemu.metrics.records import HANDOFF_MODES, HANDOFF_PAYLOADS, InstanceReport, RequestRecord
from pddemu.metrics.reservoir import Reservoir
from pddemu.metrics.validation import check_instances, check_records
from pddemu.workload.stats import (
    HIT_BUCKET_EDGES_PERMILLE,
    PERCENTILE_METHOD,
    hit_bucket_labels,
    hit_buckets,
)

PDD_SYSTEM = "pdd"
PDD_PIPELINES = ("P-MD", "P-RLD-MD", "RLD-only")
BASELINE_PIPELINE = "P-D"
REQUIRED_SCALE_KEYS = ("token_scale", "time_scale")
HIT_BUCKETS = len(HIT_BUCKET_EDGES_PERMILLE) + 1


@dataclass(frozen=True)
class SLO:
    """Latency targets a request must meet to count towards goodput (modelled seconds)."""

    ttft_s: float
    tpot_s: float

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            value = getattr(self, name)
            if not (_is_number(value) and math.isfinite(value) and value > 0):
                raise MetricsError(
                    f"SLO {name} must be a positive number of seconds, got {value!r}"
                )

    def met_by(self, record: RequestRecord) -> bool:
        if record.state != "completed" or record.ttft_s is None:
            return False
        tpot = record.tpot_s
        return record.ttft_s <= self.ttft_s and (tpot is None or tpot <= self.tpot_s)


def summarize(
    system: str,
    records: Iterable[RequestRecord],
    instances: Iterable[InstanceReport],
    slo: SLO,
    scale: Mapping[str, Any],
    wan_rate_emulated_bps: float | None,
    wan_cost_per_hour: float = 0.0,
) -> dict[str, Any]:
    """The summary of one system's run; valid (None or 0 where undefined) for any input size.

    `scale` must hold `token_scale` and `time_scale`; its other entries are copied as given.
    `wan_rate_emulated_bps` is None for a system with no WAN link (the in-DC baseline).
    `wan_cost_per_hour` is the leased WAN line's price, added to the instances' (`WAN` in
    `cost_per_hour_by_role` when not 0).
    """
    scale_fields = _scale(scale, wan_rate_emulated_bps)
    records = list(records)
    instances = list(instances)
    check_records(system, records)
    check_instances(instances)
    completed = [r for r in records if r.state == "completed"]
    duration = run_duration(records)
    good = sum(1 for r in completed if slo.met_by(r))
    goodput = _rate(good, duration)
    if not (_is_number(wan_cost_per_hour) and 0 <= wan_cost_per_hour < math.inf):
        raise MetricsError(f"wan_cost_per_hour must be a price >= 0, got {wan_cost_per_hour!r}")
    cost = float(sum(i.price_per_hour for i in instances)) + wan_cost_per_hour
    delivered = sum(r.output_tokens for r in records)
    rld_tokens = sum(r.rld_tokens for r in records)
    input_total = sum(r.input_tokens for r in completed)
    output_total = sum(r.output_tokens for r in completed)
    return {
        "system": system,
        "requests": _request_counts(records),
        "ttft_s": describe([r.ttft_s for r in completed]),
        "ttft_s_by_hit": _ttft_by_hit(completed),
        "tpot_s": describe([r.tpot_s for r in completed if r.tpot_s is not None]),
        "itl_s": describe(pooled_itls(completed)),
        "e2el_s": describe([r.e2el_s for r in completed]),
        "percentile_method": PERCENTILE_METHOD,
        "duration_s": duration,
        "good_requests": good,
        "slo_attainment": good / len(records) if records else None,
        "goodput_rps": goodput,
        "throughput_rps": _rate(len(completed), duration),
        "input_tokens_total": input_total,
        "output_tokens_total": output_total,
        "output_throughput_tps": _rate(output_total, duration),
        "total_token_throughput_tps": _rate(input_total + output_total, duration),
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "pipelines": _pipeline_counts(system, records),
        "rld_token_share": rld_tokens / delivered if delivered else None,
        "tokens": {
            "delivered": delivered,
            "rld": rld_tokens,
            "md": sum(r.md_tokens for r in records),
            "expected": sum(r.expected_output_tokens for r in records),
        },
        "handoffs": _handoffs(records),
        "wan_bytes": _wan_bytes(records),
        "kv_transfer_s": _kv_transfers(records),
        "anomaly_filtered": sum(1 for r in records if r.anomaly_filtered),
        "anomaly_filter": _anomaly_filter(records),
        "output_length_prediction": _prediction_error(records),
        "hit_rate": _hit_rates(records),
        "token_mismatches": sum(1 for r in records if r.token_mismatch),
        "delivery": {
            "duplicate_tokens": sum(r.duplicate_tokens for r in records),
            "gap_tokens": sum(r.gap_tokens for r in records),
            "dropped_stale_tokens": sum(r.dropped_stale_tokens for r in records),
        },
        "failover": {
            "retried": sum(1 for r in records if r.retries),
            "moved": sum(1 for r in records if r.failovers),
            "retries": sum(r.retries for r in records),
            "failovers": sum(r.failovers for r in records),
        },
        "emulator_lag_s": _lag(instances),
        "kv_peak_over_capacity_tokens": sum(i.kv_peak_over_capacity_tokens for i in instances),
        "cost_per_hour": cost,
        "cost_per_hour_by_role": _cost_by_role(instances, wan_cost_per_hour),
        "bcr": goodput / cost if goodput is not None and cost > 0 else None,
        "scale": scale_fields,
    }


# why requests routed unmatched make a run not valid (emulate's `judge_unmatched`, serve's verdict)
UNMATCHED_CAUSE = (
    "routed with no decode-side hit: MD's answer to their match came later than the WAN can hold it"
)


def judge_unmatched(summary: dict[str, Any]) -> None:
    """A run that routed requests with no decode-side hit because MD's answer to their match
    came later than the WAN can hold a question and its answer (`requests.unmatched`, of the
    measured requests and the warm-up's, `Frontend.decode_side_hit`) is not valid, whatever
    its lag: the modelled system has the answer in a round trip, and the emulated WAN held
    the match for seconds (docs/validation.md, "Which lag counts"), so those requests' TTFT,
    hit and WAN bytes are not the modelled system's. Not a run with scheduled faults or link
    events (`faults`): an outage or a slower link may hold the answer in the modelled system
    too. `summary`: a system's, with its timing keys (`valid`, `invalid_reason`), its
    `warmup` and its `faults` in."""
    faults = summary.get("faults") or {}
    if faults.get("scheduled") or faults.get("link_events"):
        return
    measured = summary["requests"].get("unmatched", 0)
    warm = (summary.get("warmup") or {}).get("requests", {}).get("unmatched", 0)
    if not measured + warm:
        return
    reason = (
        f"{measured} measured and {warm} warm-up requests {UNMATCHED_CAUSE} (requests.unmatched)"
    )
    lag = summary.get("invalid_reason")
    summary["valid"] = False
    summary["invalid_reason"] = f"{lag}; {reason}" if lag else reason


def run_duration(records: Sequence[RequestRecord]) -> float | None:
    """Last finish minus first arrival (modelled s); None when no request finished."""
    finishes = [r.finish_s for r in records if r.finish_s is not None]
    if not finishes:
        return None
    return max(finishes) - min(r.arrival_s for r in records)


def pooled_itls(records: Iterable[RequestRecord]) -> np.ndarray:
    """Every gap between consecutive token times of every given request, in one array."""
    gaps = [np.diff(np.asarray(r.token_times_s, dtype=np.float64)) for r in records]
    gaps = [g for g in gaps if g.size]
    return np.concatenate(gaps) if gaps else np.empty(0)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _rate(count: int, duration: float | None) -> float | None:
    """count / duration; 0 when nothing counted, None when a count has no duration to divide."""
    if count == 0:
        return 0.0
    if duration is None or duration <= 0:
        return None
    return count / duration


def _request_counts(records: Sequence[RequestRecord]) -> dict[str, Any]:
    failed = [r for r in records if r.state == "failed"]
    return {
        "total": len(records),
        "completed": len(records) - len(failed),
        "failed": len(failed),
        "unrouted": sum(1 for r in records if not r.pipeline),
        "unmatched": sum(1 for r in records if r.unmatched),
        "failure_reasons": dict(Counter(r.failure_reason or "unspecified" for r in failed)),
    }


def _pipeline_counts(system: str, records: Sequence[RequestRecord]) -> dict[str, int]:
    """PDD's three pipelines always; the baselines' P-D when the system is one or used it."""
    counts = Counter(r.pipeline for r in records if r.pipeline)
    names = list(PDD_PIPELINES)
    if system != PDD_SYSTEM or counts[BASELINE_PIPELINE]:
        names.append(BASELINE_PIPELINE)
    return {name: counts[name] for name in names}


def _handoffs(records: Sequence[RequestRecord]) -> dict[str, Any]:
    handed = [r for r in records if r.handoff_mode is not None]
    modes = Counter(r.handoff_mode for r in handed)
    payloads = Counter(r.handoff_payload for r in handed if r.handoff_payload is not None)
    taken = [r for r in handed if r.handoff_stall_s is not None]
    stalls = [r.handoff_stall_s for r in taken]
    in_tpots = [r.handoff_stall_s / r.tpot_s for r in taken if r.tpot_s]
    result: dict[str, Any] = {mode: modes[mode] for mode in HANDOFF_MODES}
    result.update(
        {
            "max_stall_s": max(stalls) if stalls else None,
            "p99_stall_s": percentile(stalls, 99),
            "mean_stall_s": float(np.mean(stalls)) if stalls else None,
            "stall_s": describe(stalls),
            "stall_tpots": describe(in_tpots),
            "gap_s": describe([r.handoff_gap_s for r in taken if r.handoff_gap_s is not None]),
            "md_latency_s": describe(
                [r.handoff_latency_s for r in taken if r.handoff_latency_s is not None]
            ),
            "switch_mismatches": sum(1 for r in taken if r.handoff_position != r.handoff_switch),
            "rounds": sum(r.handoff_rounds for r in handed),
            "payloads": {payload: payloads[payload] for payload in HANDOFF_PAYLOADS},
        }
    )
    return result


def _anomaly_filter(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """What PDD's anomalous-traffic filter did: requests routed relay-only from the start
    (the output length predictor's early routing), relayed requests whose WAN transfer it cut off
    mid-way (the relay finished first), and the modelled WAN bytes that were not sent."""
    filtered = [r for r in records if r.anomaly_filtered]
    return {
        "routed_rld_only": sum(1 for r in filtered if r.pipeline == "RLD-only"),
        "cut_off": sum(1 for r in filtered if r.pipeline != "RLD-only"),
        "wan_bytes_saved": sum(r.wan_bytes_cancelled for r in filtered),
    }


def _prediction_error(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """The router's output length predictions against what the requests produced (completed
    ones): median absolute log error (log 2 = 0.69 is a factor of 2) and the share within 2x."""
    pairs = [
        (r.predicted_output_tokens, r.output_tokens)
        for r in records
        if r.predicted_output_tokens is not None and r.state == "completed"
    ]
    errors = np.abs(np.log([max(p, 1e-9) for p, _ in pairs]) - np.log([o for _, o in pairs]))
    return {
        "requests": len(pairs),
        "median_abs_log_error": float(np.median(errors)) if pairs else None,
        "within_2x": float(np.mean(errors < math.log(2))) if pairs else None,
    }


def _wan_bytes(records: Sequence[RequestRecord]) -> dict[str, Any]:
    sent = sum(r.wan_bytes for r in records)
    without_drc = sum(r.wan_bytes_without_drc for r in records)
    return {
        "sent": sent,
        "without_drc": without_drc,
        "drc_reduction": without_drc / sent if sent else None,
        "cancelled": sum(r.wan_bytes_cancelled for r in records),
        "genuine": sum(r.wan_bytes_genuine for r in records),
    }


def _kv_transfers(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """The KV transfers P→decode that ended (PDD's latency of an increment): `to_ready` from
    the routing (P starts prefilling and streaming) to the decode side holding the whole KV,
    ready to decode; `first_to_last_chunk` from its first KV chunk to its last, as the decode
    side had them (0 for a transfer of one chunk)."""
    ended = [r for r in records if r.kv_arrived_s is not None]
    return {
        "to_ready": describe(
            [r.kv_arrived_s - r.routed_s for r in ended if r.routed_s is not None]
        ),
        "first_to_last_chunk": describe(
            [r.kv_arrived_s - r.kv_first_chunk_s for r in ended if r.kv_first_chunk_s is not None]
        ),
    }


def _hit_rates(records: Sequence[RequestRecord]) -> dict[str, Any]:
    inputs = np.asarray([r.input_tokens for r in records], dtype=np.int64)
    p_hits = np.asarray([r.p_hit_tokens for r in records], dtype=np.int64)
    reached_md = [r for r in records if r.md_hit_tokens is not None]
    md_inputs = np.asarray([r.input_tokens for r in reached_md], dtype=np.int64)
    md_hits = np.asarray([r.md_hit_tokens for r in reached_md], dtype=np.int64)
    p_side, md_side = _hit_side(p_hits, inputs), _hit_side(md_hits, md_inputs)
    return {
        "p_side_mean": p_side["mean"],
        "md_side_mean": md_side["mean"],
        "p_side_token_weighted": p_side["token_weighted"],
        "md_side_token_weighted": md_side["token_weighted"],
        "md_side_requests": len(reached_md),
        "bucket_labels": hit_bucket_labels(),
        "p_side_buckets": p_side["buckets"],
        "md_side_buckets": md_side["buckets"],
    }


TTFT_HIT_GROUPS = {"0-90%": (0,), "90-95%": (1,), "95-100%": (2, 3, 4, 5, 6)}  # bucket indices


def _ttft_by_hit(completed: Sequence[RequestRecord]) -> dict[str, Any]:
    """TTFT of completed requests grouped by their P-side hit rate (P's measured prefix-cache
    hit, known in every system): PDD's point is that the few low-hit requests make the tail."""
    inputs = np.asarray([r.input_tokens for r in completed], dtype=np.int64)
    hits = np.asarray([r.p_hit_tokens for r in completed], dtype=np.int64)
    buckets = hit_buckets(hits, inputs) if completed else np.empty(0, dtype=np.int64)
    ttfts = np.asarray([r.ttft_s for r in completed], dtype=np.float64)
    return {
        group: describe(ttfts[np.isin(buckets, indices)])
        for group, indices in TTFT_HIT_GROUPS.items()
    }


def _hit_side(hits: np.ndarray, inputs: np.ndarray) -> dict[str, Any]:
    if inputs.size == 0:
        return {"mean": None, "token_weighted": None, "buckets": [0] * HIT_BUCKETS}
    buckets = np.bincount(hit_buckets(hits, inputs), minlength=HIT_BUCKETS)
    return {
        "mean": float((hits / inputs).mean()),
        "token_weighted": float(hits.sum() / inputs.sum()),
        "buckets": [int(count) for count in buckets],
    }


def _lag(instances: Sequence[InstanceReport]) -> dict[str, Any]:
    """Step lag over the instances: mean, max and count exact, the p99 from their samples (a
    long run's are bounded: `pddemu.metrics.reservoir`)."""
    pool = Reservoir.pooled(i.lag_samples_s for i in instances)
    if not pool.seen:
        return {"p99": None, "max": None, "mean": None, "samples": 0}
    return {
        "p99": percentile(pool, 99),
        "max": float(pool.largest),
        "mean": pool.mean(),
        "samples": pool.seen,
    }


def _cost_by_role(instances: Sequence[InstanceReport], wan_cost: float) -> dict[str, float]:
    costs: dict[str, float] = {}
    for instance in instances:
        costs[instance.role] = costs.get(instance.role, 0.0) + instance.price_per_hour
    if wan_cost:
        costs["WAN"] = float(wan_cost)
    return costs


def _scale(scale: Mapping[str, Any], wan_rate_emulated_bps: float | None) -> dict[str, Any]:
    for key in REQUIRED_SCALE_KEYS:
        value = scale.get(key)
        if not (_is_number(value) and math.isfinite(value) and value > 0):
            raise MetricsError(f"scale[{key!r}] must be a positive number, got {value!r}")
    if wan_rate_emulated_bps is not None and not (
        math.isfinite(wan_rate_emulated_bps) and wan_rate_emulated_bps > 0
    ):
        raise MetricsError(f"wan_rate_emulated_bps must be positive, got {wan_rate_emulated_bps}")
    if "wan_rate_emulated_bps" in scale and scale["wan_rate_emulated_bps"] != wan_rate_emulated_bps:
        raise MetricsError(
            f"scale['wan_rate_emulated_bps'] = {scale['wan_rate_emulated_bps']} contradicts "
            f"wan_rate_emulated_bps = {wan_rate_emulated_bps}"
        )
    return {
        "token_scale": float(scale["token_scale"]),
        "time_scale": float(scale["time_scale"]),
        "wan_rate_emulated_bps": wan_rate_emulated_bps,
        **{
            k: v
            for k, v in scale.items()
            if k not in (*REQUIRED_SCALE_KEYS, "wan_rate_emulated_bps")
        },
    }
