"""A run as `vllm bench serve --save-result --save-detailed` writes it, so that tools reading
vLLM's result JSON read pddemu's runs: vLLM's key names and units (latency statistics in ms,
per-request lists in seconds, throughputs per second).

Times are the emulator's modelled seconds. Following vLLM, the latency statistics, token
totals and peaks (output tokens per second, concurrent requests) are over successful requests, a failed request is listed with TTFT 0, no ITLs and its
error text, and TPOT is per request over those with more than one output token. vLLM's
`queue_times` (each request's wait in the client for a concurrency slot) are 0: the replayer
sends each request at its arrival; `rtfx` (speech models only) is vLLM's 0 for text.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pddemu.export.run import SystemRun
from pddemu.metrics.records import RequestRecord
from pddemu.metrics.summary import pooled_itls

PERCENTILES = (50, 90, 99)


def _stats(name: str, seconds: list[float] | np.ndarray) -> dict[str, float]:
    values = np.asarray(seconds, dtype=np.float64) * 1e3
    if values.size == 0:
        values = np.zeros(1)  # vLLM reports 0 for an empty sample
    stats = {
        f"mean_{name}_ms": float(values.mean()),
        f"median_{name}_ms": float(np.median(values)),
        f"std_{name}_ms": float(values.std()),
    }
    stats.update({f"p{p}_{name}_ms": float(np.percentile(values, p)) for p in PERCENTILES})
    return stats


def _max_output_tokens_per_s(ok: list[RequestRecord]) -> float:
    """The most output tokens delivered within one second, counted in whole seconds from the
    first successful request's arrival (vLLM's peak, over successful requests)."""
    times = [t for r in ok for t in r.token_times_s]
    if not times:
        return 0.0
    start = min(r.arrival_s for r in ok)
    return float(np.bincount(np.floor(np.asarray(times) - start).astype(np.int64)).max())


def _max_concurrent(ok: list[RequestRecord]) -> int:
    """The most successful requests in flight at once, each over [arrival, finish) (vLLM's
    sweep: a departure goes before an arrival at the same time)."""
    edges = sorted(
        [(r.arrival_s, 1) for r in ok] + [(r.finish_s, -1) for r in ok if r.finish_s is not None]
    )
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def vllm_result(run: SystemRun) -> dict[str, Any]:
    records = run.records
    ok = [r for r in records if r.state == "completed"]
    start = min((r.arrival_s for r in records), default=0.0)
    duration = run.summary.get("duration_s") or 0.0
    total_input = sum(r.input_tokens for r in ok)
    total_output = sum(r.output_tokens for r in ok)
    per_second = (lambda n: n / duration) if duration > 0 else (lambda n: 0.0)
    rate = run.meta.get("arrival_rate")
    result: dict[str, Any] = {
        "date": run.meta.get("date", ""),
        "endpoint_type": "pddemu",
        "backend": "pddemu",
        "label": f"pddemu-{run.system}",
        "model_id": "pddemu",  # the name `pddemu serve` gives its model (summary.json has no other)
        "tokenizer_id": "pddemu",
        "num_prompts": len(records),
        "request_rate": rate if isinstance(rate, int | float) else "inf",
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": duration,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_second(len(ok)),
        "request_goodput": run.summary.get("goodput_rps"),
        "output_throughput": per_second(total_output),
        "total_token_throughput": per_second(total_input + total_output),
        "input_lens": [r.input_tokens for r in records],
        "output_lens": [r.output_tokens if r.state == "completed" else 0 for r in records],
        "ttfts": [r.ttft_s if r.state == "completed" else 0.0 for r in records],
        "itls": [
            np.diff(r.token_times_s).tolist() if r.state == "completed" else [] for r in records
        ],
        "latencies": [r.e2el_s if r.state == "completed" else 0.0 for r in records],
        "start_times": [r.arrival_s - start for r in records],
        "queue_times": [0.0 for _ in records],
        "generated_texts": ["" for _ in records],  # the emulator keeps ids, not texts
        "errors": [
            "" if r.state == "completed" else (r.failure_reason or "failed") for r in records
        ],
        "max_output_tokens_per_s": _max_output_tokens_per_s(ok),
        "max_concurrent_requests": _max_concurrent(ok),
        "rtfx": 0.0,
    }
    result.update(_stats("ttft", [r.ttft_s for r in ok]))
    result.update(_stats("tpot", [r.tpot_s for r in ok if r.tpot_s is not None]))
    result.update(_stats("itl", pooled_itls(ok)))
    result.update(_stats("e2el", [r.e2el_s for r in ok]))
    return result
