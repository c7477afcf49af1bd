"""Trace statistics: request lengths and the prefix hit-rate distribution.

Conventions (docs/traces.md has the full list):
- percentiles interpolate linearly between the two nearest ranks (numpy's default "linear");
- a request's hit is the longest leading run of its block ids found in the cache, looked up
  before its own blocks are inserted; token hit rate = min(hit blocks x block tokens, input) /
  input; requests are taken in file order (for WEKA: conversation by conversation, a
  subagent's requests at the position of its entry);
- hit-rate buckets include their lower edge and exclude their upper one, except the last,
  which ends at 100 % inclusive; the comparison is exact integer arithmetic, so a request at
  exactly 99.5 % lands in 99.5-100.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pddemu.cache import RadixCache, RadixCacheConfig
from pddemu.workload.formats import detect_format, read_trace
from pddemu.workload.records import TraceError, TraceRequest

# Bucket edges in per mille: buckets [0, 90), [90, 95), ..., [99.5, 100] %.
HIT_BUCKET_EDGES_PERMILLE: tuple[int, ...] = (900, 950, 970, 980, 990, 995)
PERCENTILE_METHOD = "linear"


def hit_bucket_labels() -> list[str]:
    edges = [0, *HIT_BUCKET_EDGES_PERMILLE, 1000]
    return [f"{lo / 10:g}-{hi / 10:g}%" for lo, hi in zip(edges, edges[1:], strict=False)]


@dataclass(frozen=True)
class LengthSummary:
    mean: float
    p50: float
    p90: float
    p99: float
    max: int

    @classmethod
    def of(cls, values: np.ndarray) -> LengthSummary:
        p50, p90, p99 = np.percentile(values, [50, 90, 99], method=PERCENTILE_METHOD)
        return cls(float(values.mean()), float(p50), float(p90), float(p99), int(values.max()))


@dataclass(frozen=True)
class HitRateSummary:
    """Prefix hit rates of a trace with block ids under one cache size."""

    cache_tokens: int | None
    block_tokens: int
    bucket_counts: tuple[int, ...]
    mean_token_hit_rate: float
    token_weighted_hit_rate: float

    @property
    def bucket_shares(self) -> list[float]:
        total = sum(self.bucket_counts)
        return [count / total for count in self.bucket_counts]


@dataclass(frozen=True)
class TraceStats:
    path: str
    format: str
    requests: int
    sessions: int | None
    input_tokens: LengthSummary
    output_tokens: LengthSummary
    hit_rate: HitRateSummary | None
    hit_rate_unavailable: str | None

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "path": self.path,
            "format": self.format,
            "requests": self.requests,
            "sessions": self.sessions,
            "percentile_method": PERCENTILE_METHOD,
            "input_tokens": vars(self.input_tokens),
            "output_tokens": vars(self.output_tokens),
            "hit_rate": None,
        }
        if self.hit_rate is None:
            result["hit_rate_unavailable"] = self.hit_rate_unavailable
            return result
        hit = self.hit_rate
        edges = [0, *HIT_BUCKET_EDGES_PERMILLE, 1000]
        result["hit_rate"] = {
            "cache_tokens": hit.cache_tokens,
            "block_tokens": hit.block_tokens,
            "buckets": [
                {"lo_pct": lo / 10, "hi_pct": hi / 10, "requests": count, "share": share}
                for lo, hi, count, share in zip(
                    edges, edges[1:], hit.bucket_counts, hit.bucket_shares, strict=False
                )
            ],
            "mean_token_hit_rate": hit.mean_token_hit_rate,
            "token_weighted_hit_rate": hit.token_weighted_hit_rate,
        }
        return result


def hit_buckets(hit_tokens: np.ndarray, input_tokens: np.ndarray) -> np.ndarray:
    """Bucket index of each request (0 = below 90 %), by exact integer comparison."""
    hit = np.asarray(hit_tokens, dtype=np.int64)[:, None] * 1000
    edges = np.asarray(HIT_BUCKET_EDGES_PERMILLE, dtype=np.int64)[None, :]
    return (hit >= edges * np.asarray(input_tokens, dtype=np.int64)[:, None]).sum(axis=1)


class PrefixHitCounter:
    """Hit tokens of each request in turn: match in a radix cache of block ids, then insert."""

    def __init__(self, block_tokens: int, cache_tokens: int | None) -> None:
        self.block_tokens = block_tokens
        self.cache = RadixCache(
            RadixCacheConfig(page_size=1, key_tokens=block_tokens, capacity=cache_tokens)
        )

    def observe(self, block_ids: np.ndarray, input_tokens: int) -> int:
        hit_blocks = self.cache.match(block_ids).length
        self.cache.insert(block_ids)
        return min(hit_blocks * self.block_tokens, input_tokens)


def summarize(
    requests: Iterable[TraceRequest], path: str, format: str, cache_tokens: int | None = None
) -> TraceStats:
    """Statistics of a request stream, consumed once."""
    inputs: list[int] = []
    outputs: list[int] = []
    hits: list[int] = []
    sessions: set[str] = set()
    counter: PrefixHitCounter | None = None
    no_blocks = False
    for request in requests:
        inputs.append(request.input_tokens)
        outputs.append(request.output_tokens)
        if request.session is not None:
            sessions.add(request.session)
        if request.block_ids is None or request.block_tokens is None:
            no_blocks = True
            continue
        if counter is None:
            counter = PrefixHitCounter(request.block_tokens, cache_tokens)
        elif request.block_tokens != counter.block_tokens:
            raise TraceError(
                f"{path}:{request.source_line}: block size {request.block_tokens} differs from "
                f"the first request's {counter.block_tokens}; one cache cannot hold both"
            )
        hits.append(counter.observe(request.block_ids, request.input_tokens))
    if not inputs:
        raise TraceError(f"{path}: empty file (no requests)")
    input_array = np.asarray(inputs, dtype=np.int64)
    hit_rate: HitRateSummary | None = None
    unavailable: str | None = None
    if no_blocks or counter is None:
        unavailable = (
            f"a {format} trace has no block ids, only lengths: it says nothing about which "
            "requests share a prefix"
        )
    else:
        hit_array = np.asarray(hits, dtype=np.int64)
        counts = np.bincount(hit_buckets(hit_array, input_array), minlength=7)
        hit_rate = HitRateSummary(
            cache_tokens=cache_tokens,
            block_tokens=counter.block_tokens,
            bucket_counts=tuple(int(c) for c in counts),
            mean_token_hit_rate=float((hit_array / input_array).mean()),
            token_weighted_hit_rate=float(hit_array.sum() / input_array.sum()),
        )
    return TraceStats(
        path=path,
        format=format,
        requests=len(inputs),
        sessions=len(sessions) if sessions else None,
        input_tokens=LengthSummary.of(input_array),
        output_tokens=LengthSummary.of(np.asarray(outputs, dtype=np.int64)),
        hit_rate=hit_rate,
        hit_rate_unavailable=unavailable,
    )


def trace_stats(
    path: Path | str, format: str | None = None, cache_tokens: int | None = None
) -> TraceStats:
    """Statistics of the trace file at `path` (format detected unless given)."""
    format = format or detect_format(path)
    return summarize(read_trace(path, format), str(path), format, cache_tokens)
