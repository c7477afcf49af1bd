"""Trace statistics on hand-built traces, whose every hit rate is known by construction, and
on the real Mooncake file against an independent LRU model."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from trace_samples import (
    DATA,
    MOONCAKE_FULL,
    mooncake_line,
    weka_conversation,
    weka_request,
    weka_subagent,
    write_jsonl,
)

from pddemu.workload.stats import hit_bucket_labels, hit_buckets, trace_stats


def _ids(*runs: range | list[int]) -> list[int]:
    return [i for run in runs for i in run]


def _bucket_trace(tmp_path: Path) -> tuple[Path, list[float], list[int]]:
    """One request per bucket edge; returns the path, the token hit rates and the buckets."""
    m = "model"
    main = [
        weka_request(0, m, 12800, 1, _ids(range(1, 201))),  # nothing cached: 0 %
        weka_request(1, m, 12800, 1, _ids(range(1, 200), [1000])),  # 199/200 = 99.5 % exactly
        weka_request(2, m, 12801, 1, _ids(range(1, 200), [1001])),  # 12736/12801 < 99.5 %
        weka_request(3, m, 12800, 1, _ids(range(1, 201))),  # 100 %
        weka_request(4, m, 640, 1, _ids(range(1, 4), range(5000, 5007))),  # 30 %
        weka_request(5, m, 640, 1, _ids(range(1, 10), [6000])),  # 90 % exactly
    ]
    subagent = [
        weka_request(0, m, 1280, 1, _ids(range(1, 20), [7000])),  # 95 % exactly
        weka_request(1, m, 6400, 1, _ids(range(1, 98), [8000, 8001, 8002])),  # 97 % exactly
    ]
    tail = [
        weka_request(7, m, 3200, 1, _ids(range(1, 50), [9000])),  # 98 % exactly
        weka_request(8, m, 6400, 1, _ids(range(1, 100), [9500])),  # 99 % exactly
    ]
    conversation = weka_conversation("a", [*main, weka_subagent(6, "agent_1", subagent), *tail])
    other = weka_conversation("b", [weka_request(0, m, 12800, 1, _ids(range(1, 201)))])  # 0 %
    path = write_jsonl(tmp_path / "buckets.jsonl", [conversation, other])
    rates = [0, 0.995, 12736 / 12801, 1, 0.3, 0.9, 0.95, 0.97, 0.98, 0.99, 0]
    buckets = [0, 6, 5, 6, 0, 1, 2, 3, 4, 5, 0]
    return path, rates, buckets


def test_bucket_edges_include_the_lower_edge(tmp_path: Path) -> None:
    path, rates, buckets = _bucket_trace(tmp_path)
    stats = trace_stats(path)
    assert stats.requests == 11
    assert stats.sessions == 2
    assert stats.hit_rate is not None
    assert stats.hit_rate.bucket_counts == tuple(np.bincount(buckets, minlength=7))
    assert stats.hit_rate.mean_token_hit_rate == pytest.approx(np.mean(rates))
    inputs = [12800, 12800, 12801, 12800, 640, 640, 1280, 6400, 3200, 6400, 12800]
    hits = [round(rate * size) for rate, size in zip(rates, inputs, strict=True)]
    assert stats.hit_rate.token_weighted_hit_rate == pytest.approx(sum(hits) / sum(inputs))


def test_hit_bucket_arithmetic_is_exact() -> None:
    # 99.5 % of 200 blocks, and one token short of it, in integer arithmetic.
    assert hit_buckets(np.array([199, 199, 0, 10]), np.array([200, 201, 5, 10])).tolist() == [
        6,
        5,
        0,
        6,
    ]
    assert hit_bucket_labels() == [
        "0-90%",
        "90-95%",
        "95-97%",
        "97-98%",
        "98-99%",
        "99-99.5%",
        "99.5-100%",
    ]


def test_partial_last_block_counts_only_the_input(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "m.jsonl", [mooncake_line(0, 1000, 1, [0, 1]), mooncake_line(1, 1000, 1, [0, 1])]
    )
    hit = trace_stats(path).hit_rate
    assert hit is not None
    assert hit.bucket_counts == (1, 0, 0, 0, 0, 0, 1)
    assert hit.mean_token_hit_rate == 0.5


def test_lru_cache_forgets_least_recently_used_blocks(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [
            mooncake_line(0, 1024, 1, [0, 1]),
            mooncake_line(1, 1024, 1, [2, 3]),
            mooncake_line(2, 1024, 1, [4, 5]),  # 6 blocks > 4: blocks 1 then 0 go
            mooncake_line(3, 1024, 1, [0, 1]),  # a miss with the small cache
            mooncake_line(4, 1536, 1, [4, 5, 6]),  # 2 of 3 blocks still there
        ],
    )
    unbounded = trace_stats(path).hit_rate
    small = trace_stats(path, cache_tokens=4 * 512).hit_rate
    assert unbounded is not None and small is not None
    assert unbounded.mean_token_hit_rate == pytest.approx((1 + 2 / 3) / 5)
    assert small.mean_token_hit_rate == pytest.approx((2 / 3) / 5)
    assert small.cache_tokens == 2048


def _independent_lru_hits(path: Path, capacity_tokens: int) -> list[float]:
    """Block-level LRU with an ordered dict: a request touches its blocks deepest first, so
    the oldest entry is always the end of the least recently used chain."""
    cache: OrderedDict[int, None] = OrderedDict()
    rates = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        hit = 0
        for block in row["hash_ids"]:
            if block not in cache:
                break
            hit += 1
        for block in reversed(row["hash_ids"]):
            cache[block] = None
            cache.move_to_end(block)
        while len(cache) * 512 > capacity_tokens:
            cache.popitem(last=False)
        rates.append(min(hit * 512, row["input_length"]) / row["input_length"])
    return rates


@pytest.mark.parametrize("capacity", [200_000, 1_000_000, 5_000_000])
def test_real_mooncake_lru_matches_an_independent_model(capacity: int) -> None:
    if not MOONCAKE_FULL.exists():
        pytest.skip(f"{MOONCAKE_FULL} not present")
    rates = np.array(_independent_lru_hits(MOONCAKE_FULL, capacity))
    hit = trace_stats(MOONCAKE_FULL, cache_tokens=capacity).hit_rate
    assert hit is not None
    assert hit.mean_token_hit_rate == pytest.approx(rates.mean(), abs=1e-12)
    percent = rates * 100
    expected = np.searchsorted([90, 95, 97, 98, 99, 99.5], percent, side="right")
    assert hit.bucket_counts == tuple(np.bincount(expected, minlength=7))


def test_real_mooncake_excerpt_lengths() -> None:
    rows = [json.loads(line) for line in (DATA / "mooncake_excerpt.jsonl").read_text().splitlines()]
    stats = trace_stats(DATA / "mooncake_excerpt.jsonl")
    inputs = np.array([row["input_length"] for row in rows])
    assert stats.input_tokens.mean == pytest.approx(inputs.mean())
    assert stats.input_tokens.p90 == pytest.approx(np.percentile(inputs, 90))
    assert stats.input_tokens.max == inputs.max()


def test_length_only_trace_has_no_hit_rate(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,5\n1,300,7\n2,200,9\n")
    stats = trace_stats(path)
    assert stats.hit_rate is None
    assert "no block ids" in (stats.hit_rate_unavailable or "")
    assert (stats.input_tokens.mean, stats.input_tokens.p50, stats.input_tokens.max) == (
        200,
        200,
        300,
    )
    assert stats.output_tokens.p90 == pytest.approx(8.6)
