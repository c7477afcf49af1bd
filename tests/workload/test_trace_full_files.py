"""The full public traces through `trace_stats`, against a straightforward computation written
independently of the readers and the radix cache (json + a plain set of seen ids), and
against the facts stated in the public traces' README (see pddemu.workload.public_traces). Skipped where the files are absent;
the WEKA file takes about half a minute."""

from __future__ import annotations

import bisect
import gzip
import json
from itertools import takewhile
from typing import Any

import numpy as np
import pytest
from trace_samples import MOONCAKE_FULL, WEKA_FULL

from pddemu.workload.stats import TraceStats, trace_stats

EDGES_PCT = [90, 95, 97, 98, 99, 99.5]


def _plain_weka() -> tuple[list[float], list[int], list[int]]:
    """Token hit rate, input and output of every request, subagents' requests included at the
    position of their entry; cache keys are (conversation, model, hash id)."""
    rates: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []

    def walk(entries: list[dict[str, Any]], seen: dict[str, set[int]], block: int) -> None:
        for entry in entries:
            if entry["type"] == "subagent":
                walk(entry["requests"], seen, block)
                continue
            seen_here = seen.setdefault(entry["model"], set())
            hit = len(list(takewhile(seen_here.__contains__, entry["hash_ids"])))
            seen_here.update(entry["hash_ids"])
            rates.append(min(hit * block, entry["in"]) / entry["in"])
            inputs.append(entry["in"])
            outputs.append(entry["out"])

    with gzip.open(WEKA_FULL, "rt") as lines:
        for line in lines:
            conversation = json.loads(line)
            walk(conversation["requests"], {}, conversation["block_size"])
    return rates, inputs, outputs


@pytest.fixture(scope="module")
def weka_stats() -> TraceStats:
    if not WEKA_FULL.exists():
        pytest.skip(f"{WEKA_FULL} not present")
    return trace_stats(WEKA_FULL)


def test_weka_hit_rates_equal_a_plain_set_computation(weka_stats: TraceStats) -> None:
    rates, inputs, outputs = _plain_weka()
    buckets = np.bincount([bisect.bisect_right(EDGES_PCT, 100 * r) for r in rates], minlength=7)
    hit = weka_stats.hit_rate
    assert hit is not None
    assert weka_stats.requests == len(rates) == 49_334
    assert hit.bucket_counts == tuple(buckets)
    assert hit.mean_token_hit_rate == pytest.approx(np.mean(rates), abs=1e-12)
    assert weka_stats.input_tokens.p90 == np.percentile(inputs, 90)
    assert weka_stats.output_tokens.p99 == np.percentile(outputs, 99)
    assert weka_stats.input_tokens.max == max(inputs)


def test_weka_matches_the_published_figures(weka_stats: TraceStats) -> None:
    hit = weka_stats.hit_rate
    assert hit is not None
    assert [round(100 * s, 1) for s in hit.bucket_shares] == [7.0, 4.4, 5.6, 6.6, 17.7, 23.1, 35.6]
    assert round(100 * hit.mean_token_hit_rate, 1) == 95.1
    assert weka_stats.sessions == 710
    assert round(weka_stats.input_tokens.mean) == 122_379
    assert round(weka_stats.input_tokens.p50) == 103_659
    assert round(weka_stats.input_tokens.p99) == 498_519
    assert round(weka_stats.output_tokens.mean) == 440
    assert round(weka_stats.output_tokens.p50) == 216


def test_mooncake_matches_the_published_figures() -> None:
    if not MOONCAKE_FULL.exists():
        pytest.skip(f"{MOONCAKE_FULL} not present")
    stats = trace_stats(MOONCAKE_FULL)
    assert stats.requests == 3993
    assert round(stats.input_tokens.mean) == 15_325
    assert round(stats.input_tokens.p50) == 11_587
    assert round(stats.output_tokens.mean) == 149
    assert round(stats.output_tokens.p50) == 69
