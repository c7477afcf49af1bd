"""The invariance check: the same workload gives the same results however the emulation runs.

Two comparisons, each over several seeds (each seed a different sample of the workload):
- time: `time_scale = 1` (real time, the reference) against the default, `"auto"`;
- tokens: `token_scale` 16 against 32, and 64 with `--full` (all at `"auto"`).
For TTFT p50, p90, p99 and TPOT p50 it reports, per variant, the relative difference from the
reference seed by seed, their mean (what the bound judges) and the largest, beside the spread
of the reference itself from seed to seed (how much the metric moves with the workload alone).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pddemu.config import Config, config_from_json, config_to_json
from pddemu.metrics.distribution import percentile
from pddemu.metrics.records import RequestRecord

TOLERANCE = 0.03
METRICS: dict[str, Callable[[list[RequestRecord]], float | None]] = {
    "ttft_p50_s": lambda records: percentile([r.ttft_s for r in _done(records)], 50),
    "ttft_p90_s": lambda records: percentile([r.ttft_s for r in _done(records)], 90),
    "ttft_p99_s": lambda records: percentile([r.ttft_s for r in _done(records)], 99),
    "tpot_p50_s": lambda records: percentile(
        [r.tpot_s for r in _done(records) if r.tpot_s is not None], 50
    ),
}


@dataclass(frozen=True)
class Variant:
    """One way of running the workload: a name and the config fields it sets."""

    name: str
    scale: dict[str, Any]


TIME = (Variant("time_scale 1", {"time_scale": 1.0}), Variant("auto", {"time_scale": None}))
TOKENS = (
    Variant("token_scale 32", {"token_scale": 32, "time_scale": None}),
    Variant("token_scale 16", {"token_scale": 16, "time_scale": None}),
    Variant("token_scale 64", {"token_scale": 64, "time_scale": None}),
)


def _done(records: list[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.state == "completed"]


def configure(base: Config, variant: Variant, seed: int, requests: int, rate: float) -> Config:
    data = config_to_json(base)
    data["scale"] = {**data["scale"], **variant.scale}
    data["workload"] = {
        **data["workload"],
        "seed": seed,
        "requests": requests,
        "arrival_rate": rate,
    }
    return config_from_json(data)


def metrics_of(records: list[RequestRecord]) -> dict[str, float | None]:
    return {name: metric(records) for name, metric in METRICS.items()}


def compare(
    measured: dict[str, dict[int, dict[str, float | None]]], reference: str, tolerance: float
) -> dict[str, Any]:
    """`measured[variant][seed][metric]` against `measured[reference]`."""
    seeds = sorted(measured[reference])
    out: dict[str, Any] = {"reference": reference, "tolerance": tolerance, "variants": {}}
    spread = {}
    for metric in METRICS:
        values = [measured[reference][s][metric] for s in seeds]
        known = [v for v in values if v is not None]
        spread[metric] = (
            (max(known) - min(known)) / float(np.mean(known)) if len(known) > 1 else None
        )
    out["seed_spread"] = spread  # (max - min) / mean of the reference over the seeds
    passed = True
    for variant, by_seed in measured.items():
        if variant == reference:
            continue
        rows = {}
        for metric in METRICS:
            diffs = []
            for seed in seeds:
                ref, got = measured[reference][seed][metric], by_seed.get(seed, {}).get(metric)
                if ref and got is not None:
                    diffs.append((got - ref) / ref)
            mean = float(np.mean(diffs)) if diffs else None
            within = mean is not None and abs(mean) <= tolerance
            passed &= within
            rows[metric] = {
                "by_seed": diffs,
                "mean": mean,
                "max_abs": max(abs(d) for d in diffs) if diffs else None,
                "largest": max(diffs, key=abs) if diffs else None,  # the same, signed
                "within": within,
            }
        out["variants"][variant] = rows
    out["passed"] = passed
    return out
