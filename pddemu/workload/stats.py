"""Trace statistics: request lengths and the prefix hit-rate distribution.

Conventions (docs/traces.md has the full list):
- percentiles interpolate linearly between the two nearest ranks (numpy's default "linear");
- a request's hit is the longest leading run of its block ids found in the cache, looked up
  before its own blocks are inserted; token hit rate = min(hit blocks x block tokens, input) /
  input; requests are taken in file order (for WEKA: conversation by conversation, a
  subagent's requests at the position of its entry);
- hit-rate buckets include their lower edge and exclude their upper one, except the last,
  which ends at 100 % inclusive; the comparison is exact integer arithmetic, so a request at
  exactly 99.5 % lands in 99.5-100;
- a bucket's miss share is its requests' uncached tokens over all requests' uncached tokens:
  the share of the prefill work and of the KV that must cross the WAN;
- per day or per ISO week (`group`): the same hits, computed over the whole trace in order,
  grouped by the requests' `day` field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
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
    bucket_miss_tokens: tuple[int, ...]
    mean_token_hit_rate: float
    token_weighted_hit_rate: float

    @classmethod
    def of(
        cls, hits: np.ndarray, inputs: np.ndarray, block_tokens: int, cache_tokens: int | None
    ) -> HitRateSummary:
        buckets = hit_buckets(hits, inputs)
        counts = np.bincount(buckets, minlength=len(HIT_BUCKET_EDGES_PERMILLE) + 1)
        misses = np.bincount(
            buckets, weights=inputs - hits, minlength=len(HIT_BUCKET_EDGES_PERMILLE) + 1
        )
        return cls(
            cache_tokens=cache_tokens,
            block_tokens=block_tokens,
            bucket_counts=tuple(int(c) for c in counts),
            bucket_miss_tokens=tuple(int(m) for m in misses),
            mean_token_hit_rate=float((hits / inputs).mean()),
            token_weighted_hit_rate=float(hits.sum() / inputs.sum()),
        )

    @property
    def requests(self) -> int:
        return sum(self.bucket_counts)

    @property
    def bucket_shares(self) -> list[float]:
        total = sum(self.bucket_counts)
        return [count / total for count in self.bucket_counts]

    @property
    def bucket_miss_shares(self) -> list[float]:
        """Each bucket's share of all uncached tokens (all zero when nothing was missed)."""
        total = sum(self.bucket_miss_tokens)
        return [miss / total if total else 0.0 for miss in self.bucket_miss_tokens]

    @property
    def share_above_95(self) -> float:
        return sum(self.bucket_shares[HIT_BUCKET_EDGES_PERMILLE.index(950) + 1 :])

    def to_dict(self) -> dict[str, Any]:
        edges = [0, *HIT_BUCKET_EDGES_PERMILLE, 1000]
        return {
            "cache_tokens": self.cache_tokens,
            "block_tokens": self.block_tokens,
            "buckets": [
                {
                    "lo_pct": lo / 10,
                    "hi_pct": hi / 10,
                    "requests": count,
                    "share": share,
                    "miss_tokens": miss,
                    "miss_share": miss_share,
                }
                for lo, hi, count, share, miss, miss_share in zip(
                    edges,
                    edges[1:],
                    self.bucket_counts,
                    self.bucket_shares,
                    self.bucket_miss_tokens,
                    self.bucket_miss_shares,
                    strict=False,
                )
            ],
            "mean_token_hit_rate": self.mean_token_hit_rate,
            "token_weighted_hit_rate": self.token_weighted_hit_rate,
        }


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
    group: str | None = None
    groups: tuple[tuple[str, HitRateSummary], ...] | None = None

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
        result["hit_rate"] = self.hit_rate.to_dict()
        if self.group is not None and self.groups is not None:
            result[f"by_{self.group}"] = [
                {self.group: name, "requests": hit.requests, **hit.to_dict()}
                for name, hit in self.groups
            ]
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


NO_DAY = "(no day)"
GROUPS = ("day", "week")


def _group_name(day: str | None, group: str, path: str) -> str:
    """The day itself, or its ISO week ("2026-W01"; weeks start on Monday)."""
    if day is None:
        return NO_DAY
    if group == "day":
        return day
    try:
        year, week, _ = date.fromisoformat(day).isocalendar()
    except ValueError:
        raise TraceError(f"{path}: day {day!r} is not an ISO date, so it has no week") from None
    return f"{year}-W{week:02d}"


def summarize(
    requests: Iterable[TraceRequest],
    path: str,
    format: str,
    cache_tokens: int | None = None,
    group: str | None = None,
) -> TraceStats:
    """Statistics of a request stream, consumed once; `group` ("day" or "week") adds the hit
    rates of each day or week."""
    if group is not None and group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS} or None, got {group!r}")
    inputs: list[int] = []
    outputs: list[int] = []
    hits: list[int] = []
    days: list[str | None] = []
    sessions: set[str] = set()
    counter: PrefixHitCounter | None = None
    no_blocks = False
    for request in requests:
        inputs.append(request.input_tokens)
        outputs.append(request.output_tokens)
        days.append(request.day)
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
    groups: tuple[tuple[str, HitRateSummary], ...] | None = None
    if no_blocks or counter is None:
        unavailable = (
            f"a {format} trace has no block ids, only lengths: it says nothing about which "
            "requests share a prefix"
        )
    else:
        hit_array = np.asarray(hits, dtype=np.int64)
        hit_rate = HitRateSummary.of(hit_array, input_array, counter.block_tokens, cache_tokens)
        if group is not None:
            groups = _grouped(path, group, days, hit_array, input_array, hit_rate)
    return TraceStats(
        path=path,
        format=format,
        requests=len(inputs),
        sessions=len(sessions) if sessions else None,
        input_tokens=LengthSummary.of(input_array),
        output_tokens=LengthSummary.of(np.asarray(outputs, dtype=np.int64)),
        hit_rate=hit_rate,
        hit_rate_unavailable=unavailable,
        group=group,
        groups=groups,
    )


def _grouped(
    path: str,
    group: str,
    days: list[str | None],
    hits: np.ndarray,
    inputs: np.ndarray,
    overall: HitRateSummary,
) -> tuple[tuple[str, HitRateSummary], ...]:
    if all(day is None for day in days):
        raise TraceError(f"{path}: no request carries a day, so there is nothing to group by")
    labels = np.array([_group_name(day, group, path) for day in days])
    return tuple(
        (
            str(name),
            HitRateSummary.of(
                hits[labels == name],
                inputs[labels == name],
                overall.block_tokens,
                overall.cache_tokens,
            ),
        )
        for name in sorted(set(labels.tolist()))
    )


def trace_stats(
    path: Path | str,
    format: str | None = None,
    cache_tokens: int | None = None,
    group: str | None = None,
    block_size: int | None = None,
) -> TraceStats:
    """Statistics of the trace file at `path` (format detected unless given; `block_size`:
    tokens per hash id of a Mooncake file whose lines do not say)."""
    format = format or detect_format(path)
    requests = read_trace(path, format, block_size)
    return summarize(requests, str(path), format, cache_tokens, group)
