"""A run in AIPerf's profile-export layout, so that AIPerf's result tooling reads pddemu's runs:
`profile_export_aiperf.json` (aggregate metrics, each `{unit, avg, p1 ... p99, min, max, std,
count, sum}`) and `profile_export.jsonl` (one record per request: `metadata`, `metrics` as
`{value, unit}`, `error`), as AIPerf 0.13 writes them (its export schema 1.4).

AIPerf's names differ from vLLM's and pddemu's: its `inter_token_latency` is a request's
(latency − TTFT) / (output tokens − 1), pddemu's TPOT; its `inter_chunk_latency` is the gaps
between streamed chunks, pddemu's ITL. Times are the emulator's modelled time; `request_start_ns`
and `request_end_ns` count modelled nanoseconds from the run's first arrival.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pddemu.export.run import SystemRun
from pddemu.metrics.records import RequestRecord

SCHEMA_VERSION = "1.4"
SUMMARY_FILE = "profile_export_aiperf.json"
RECORDS_FILE = "profile_export.jsonl"
PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)


def _distribution(unit: str, values: list[float]) -> dict[str, Any]:
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return {"unit": unit, "count": 0}
    result: dict[str, Any] = {"unit": unit, "avg": float(data.mean())}
    result.update({f"p{p}": float(np.percentile(data, p)) for p in PERCENTILES})
    result.update(
        {
            "min": float(data.min()),
            "max": float(data.max()),
            "std": float(data.std()),
            "count": int(data.size),
            "sum": float(data.sum()),
        }
    )
    return result


def _record_metrics(record: RequestRecord) -> dict[str, dict[str, Any]]:
    """AIPerf's per-request metrics (display units: ms, tokens, tokens/sec/user)."""
    metrics: dict[str, dict[str, Any]] = {
        "input_sequence_length": {"value": record.input_tokens, "unit": "tokens"}
    }
    if record.state != "completed":
        return metrics
    times = record.token_times_s
    metrics["output_sequence_length"] = {"value": record.output_tokens, "unit": "tokens"}
    metrics["output_token_count"] = {"value": record.output_tokens, "unit": "tokens"}
    metrics["request_latency"] = {"value": record.e2el_s * 1e3, "unit": "ms"}
    metrics["time_to_first_token"] = {"value": record.ttft_s * 1e3, "unit": "ms"}
    if len(times) >= 2:
        metrics["time_to_second_token"] = {"value": (times[1] - times[0]) * 1e3, "unit": "ms"}
        metrics["inter_chunk_latency"] = {"value": (np.diff(times) * 1e3).tolist(), "unit": "ms"}
    if record.tpot_s is not None and record.tpot_s > 0:
        metrics["inter_token_latency"] = {"value": record.tpot_s * 1e3, "unit": "ms"}
        metrics["output_token_throughput_per_user"] = {
            "value": 1.0 / record.tpot_s,
            "unit": "tokens/sec/user",
        }
    return metrics


def _metadata(record: RequestRecord, index: int, start: float) -> dict[str, Any]:
    end = record.finish_s if record.finish_s is not None else record.arrival_s
    return {
        "session_num": index,
        "x_request_id": record.request_id,
        "x_correlation_id": record.request_id,
        "conversation_id": record.request_id,
        "turn_index": 0,
        "request_start_ns": round((record.arrival_s - start) * 1e9),
        "request_end_ns": round((end - start) * 1e9),
        "worker_id": f"pddemu-{record.system}",
        "record_processor_id": "pddemu-export",
        "benchmark_phase": "profiling",
        "was_cancelled": False,
    }


def _error(record: RequestRecord) -> dict[str, Any] | None:
    if record.state == "completed":
        return None
    return {"code": 500, "type": "RequestFailed", "message": record.failure_reason or "failed"}


def aiperf_records(run: SystemRun) -> list[dict[str, Any]]:
    start = min((r.arrival_s for r in run.records), default=0.0)
    return [
        {"metadata": _metadata(r, i, start), "metrics": _record_metrics(r), "error": _error(r)}
        for i, r in enumerate(run.records)
    ]


def aiperf_summary(run: SystemRun, records: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in run.records if r.state == "completed"]
    failed = len(run.records) - len(ok)
    duration = run.summary.get("duration_s") or 0.0
    per_second = (lambda n: n / duration) if duration > 0 else (lambda n: 0.0)
    output_total = sum(r.output_tokens for r in ok)
    input_total = sum(r.input_tokens for r in ok)

    def pooled(name: str) -> list[float]:
        values: list[float] = []
        for record in records:
            if record["error"] is None and name in record["metrics"]:
                value = record["metrics"][name]["value"]
                values.extend(value if isinstance(value, list) else [value])
        return values

    summary: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "aiperf_version": None,
        "benchmark_id": f"pddemu-{run.system}",
        "exporter": "pddemu export --format aiperf",
        "system": run.system,
        "request_throughput": {"unit": "requests/sec", "avg": per_second(len(ok))},
        "request_count": {"unit": "requests", "avg": float(len(ok))},
        "completed_request_count": {"unit": "requests", "avg": float(len(ok))},
        "error_request_count": {"unit": "requests", "avg": float(failed)},
        "request_error_rate": {
            "unit": "%",
            "avg": 100.0 * failed / len(run.records) if run.records else 0.0,
        },
        "output_token_throughput": {"unit": "tokens/sec", "avg": per_second(output_total)},
        "input_token_throughput": {"unit": "tokens/sec", "avg": per_second(input_total)},
        "total_token_throughput": {
            "unit": "tokens/sec",
            "avg": per_second(input_total + output_total),
        },
        "total_output_tokens": {"unit": "tokens", "avg": float(output_total)},
        "total_osl": {"unit": "tokens", "avg": float(output_total)},
        "total_isl": {"unit": "tokens", "avg": float(input_total)},
        "benchmark_duration": {"unit": "sec", "avg": float(duration)},
        "good_request_count": {
            "unit": "requests",
            "avg": float(run.summary.get("good_requests") or 0),
        },
        "goodput": {"unit": "requests/sec", "avg": run.summary.get("goodput_rps")},
        "error_summary": [
            {"error_details": error, "count": count} for error, count in _error_counts(run.records)
        ],
        "was_cancelled": False,
        "is_complete": True,
    }
    for name, unit in (
        ("request_latency", "ms"),
        ("time_to_first_token", "ms"),
        ("time_to_second_token", "ms"),
        ("inter_token_latency", "ms"),
        ("inter_chunk_latency", "ms"),
        ("output_token_throughput_per_user", "tokens/sec/user"),
        ("output_sequence_length", "tokens"),
        ("input_sequence_length", "tokens"),
        ("output_token_count", "tokens"),
    ):
        summary[name] = _distribution(unit, pooled(name))
    return summary


def _error_counts(records: list[RequestRecord]) -> list[tuple[dict[str, Any], int]]:
    counts: dict[str, int] = {}
    for record in records:
        if record.state != "completed":
            reason = record.failure_reason or "failed"
            counts[reason] = counts.get(reason, 0) + 1
    return [
        ({"code": 500, "type": "RequestFailed", "message": reason}, count)
        for reason, count in counts.items()
    ]


def write_aiperf(run: SystemRun, directory: Path) -> list[Path]:
    """AIPerf's artifact directory layout: the summary and the per-request records."""
    directory.mkdir(parents=True, exist_ok=True)
    records = aiperf_records(run)
    summary_path, records_path = directory / SUMMARY_FILE, directory / RECORDS_FILE
    summary_path.write_text(json.dumps(aiperf_summary(run, records), indent=2) + "\n")
    records_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return [summary_path, records_path]
