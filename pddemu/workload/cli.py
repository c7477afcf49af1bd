"""`pddemu trace ...`: commands on trace files (`stats` for now)."""

from __future__ import annotations

import argparse
import json
import sys

from pddemu.workload.formats import FORMATS
from pddemu.workload.records import TraceError
from pddemu.workload.stats import TraceStats, hit_bucket_labels, trace_stats


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    trace = subparsers.add_parser("trace", help="inspect request trace files")
    commands = trace.add_subparsers(dest="trace_command", required=True)
    stats = commands.add_parser(
        "stats",
        help="request count, length percentiles and prefix hit-rate distribution",
        description="Request count, input/output length percentiles (linear interpolation) "
        "and the prefix hit-rate distribution of a trace file.",
    )
    stats.add_argument("path", help="trace file: Mooncake JSONL, WEKA JSONL(.gz) or length CSV")
    stats.add_argument(
        "--cache-tokens",
        type=_non_negative_int,
        default=None,
        help="prefix cache capacity in tokens with LRU eviction (default: infinite)",
    )
    stats.add_argument("--format", choices=sorted(FORMATS), help="skip format detection")
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.set_defaults(func=_run_stats)


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value


def _run_stats(args: argparse.Namespace) -> int:
    try:
        stats = trace_stats(args.path, format=args.format, cache_tokens=args.cache_tokens)
    except TraceError as exc:
        print(f"pddemu trace stats: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(stats.to_dict()) if args.json else format_table(stats))
    return 0


def format_table(stats: TraceStats) -> str:
    sessions = f", {stats.sessions:,} sessions" if stats.sessions is not None else ""
    lines = [
        f"trace    {stats.path}",
        f"format   {stats.format}, {stats.requests:,} requests{sessions}",
        "",
        f"{'tokens':<8}{'mean':>11}{'p50':>11}{'p90':>11}{'p99':>11}{'max':>11}",
    ]
    for name, summary in (("input", stats.input_tokens), ("output", stats.output_tokens)):
        values = (summary.mean, summary.p50, summary.p90, summary.p99, summary.max)
        lines.append(f"{name:<8}" + "".join(f"{v:>11,.0f}" for v in values))
    lines.append("(percentiles interpolate linearly between the nearest ranks)")
    lines.append("")
    hit = stats.hit_rate
    if hit is None:
        lines.append(f"prefix hit rate: not available ({stats.hit_rate_unavailable})")
        return "\n".join(lines)
    cache = (
        "infinite cache"
        if hit.cache_tokens is None
        else f"LRU cache of {hit.cache_tokens:,} tokens"
    )
    lines.append(f"prefix hit rate ({hit.block_tokens}-token blocks, {cache})")
    lines.append(f"{'bucket':<12}{'requests':>10}{'share':>9}")
    for label, count, share in zip(
        hit_bucket_labels(), hit.bucket_counts, hit.bucket_shares, strict=True
    ):
        lines.append(f"{label:<12}{count:>10,}{share:>9.1%}")
    lines.append(f"mean token hit rate       {hit.mean_token_hit_rate:.1%}  (mean over requests)")
    lines.append(
        f"token-weighted hit rate   {hit.token_weighted_hit_rate:.1%}  (all hit / all input)"
    )
    return "\n".join(lines)
