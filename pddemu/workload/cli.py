"""`pddemu trace ...`: `stats` on trace files, `gen` to write a generated trace."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import Field, replace
from pathlib import Path
from typing import Any

from pddemu.workload.formats import FORMATS
from pddemu.workload.janfeb import PDD_JANFEB, GeneratedTrace, generate_pdd_janfeb
from pddemu.workload.janfeb_config import GeneratorError, PddJanFebConfig, parameter_fields
from pddemu.workload.mooncake_writer import write_mooncake
from pddemu.workload.records import TraceError
from pddemu.workload.stats import HitRateSummary, TraceStats, hit_bucket_labels, trace_stats


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    trace = subparsers.add_parser("trace", help="inspect and generate request trace files")
    commands = trace.add_subparsers(dest="trace_command", required=True)
    _add_stats(commands)
    _add_gen(commands)


def _add_stats(commands: argparse._SubParsersAction) -> None:
    stats = commands.add_parser(
        "stats",
        help="request count, length percentiles and prefix hit-rate distribution",
        description="Request count, input/output length percentiles (linear interpolation) "
        "and the prefix hit-rate distribution of a trace file.",
    )
    stats.add_argument(
        "path",
        help="trace file: Mooncake (and AIPerf's variants), WEKA, Bailian JSONL, BurstGPT or "
        "length CSV, ShareGPT JSON; gzip read too (docs/traces.md)",
    )
    stats.add_argument(
        "--cache-tokens",
        type=_non_negative_int,
        default=None,
        help="prefix cache capacity in tokens with LRU eviction (default: infinite)",
    )
    stats.add_argument(
        "--format",
        choices=sorted(FORMATS),
        metavar="FORMAT",
        help=f"skip format detection: {', '.join(sorted(FORMATS))}",
    )
    stats.add_argument(
        "--block-size",
        type=_positive_int,
        default=None,
        help="tokens per hash id of a Mooncake trace whose lines have no block_size (default 512)",
    )
    grouping = stats.add_mutually_exclusive_group()
    grouping.add_argument(
        "--by-day",
        dest="group",
        action="store_const",
        const="day",
        help="also the hit-rate buckets of each day (traces with a day field: pdd-janfeb)",
    )
    grouping.add_argument(
        "--by-week",
        dest="group",
        action="store_const",
        const="week",
        help="also the hit-rate buckets of each ISO week of the day field",
    )
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.set_defaults(func=_run_stats)


def _add_gen(commands: argparse._SubParsersAction) -> None:
    gen = commands.add_parser(
        "gen",
        help="write a generated trace (Mooncake JSONL with session_id and day fields)",
        description="Generate a seeded trace and write it as Mooncake JSONL (gzip when FILE "
        "ends in .gz). pdd-janfeb reconstructs the Jan-Feb agentic workload PDD describes "
        "from its published aggregates; docs/traces.md lists every parameter.",
    )
    gen.add_argument("generator", choices=[PDD_JANFEB], help="the workload to generate")
    gen.add_argument("--out", required=True, type=Path, help="file to write")
    gen.add_argument("--seed", type=_non_negative_int, default=0, help="random seed (default 0)")
    for spec in parameter_fields():
        gen.add_argument(
            "--" + spec.name.replace("_", "-"),
            dest=spec.name,
            type=_parameter_parser(spec),
            default=None,
            metavar=spec.name.upper(),
            help=f"{spec.metadata['help']} (default {_shown(spec.default)}; "
            f"from {spec.metadata['source']})".replace("%", "%%"),
        )
    gen.set_defaults(func=_run_gen)


def _shown(value: Any) -> str:
    return ",".join(f"{x:g}" for x in value) if isinstance(value, tuple) else str(value)


def _parameter_parser(spec: Field[Any]) -> Any:
    """The argparse type of a config field, from its annotation (a string under postponed
    evaluation)."""
    kinds = {"int": int, "float": float, "str": str}
    if spec.type in kinds:
        return kinds[spec.type]
    return _float_list


def _float_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}"
        ) from None


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _run_stats(args: argparse.Namespace) -> int:
    try:
        stats = trace_stats(
            args.path,
            format=args.format,
            cache_tokens=args.cache_tokens,
            group=args.group,
            block_size=args.block_size,
        )
    except TraceError as exc:
        print(f"pddemu trace stats: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(stats.to_dict()) if args.json else format_table(stats))
    return 0


def _run_gen(args: argparse.Namespace) -> int:
    changes = {
        spec.name: getattr(args, spec.name)
        for spec in parameter_fields()
        if getattr(args, spec.name) is not None
    }
    try:
        config = replace(PddJanFebConfig(), **changes)
        trace = generate_pdd_janfeb(config, args.seed)
        write_mooncake(trace.records, args.out)
    except (GeneratorError, TraceError) as exc:
        print(f"pddemu trace gen: error: {exc}", file=sys.stderr)
        return 1
    print(format_generator_report(trace, args.out))
    return 0


def format_generator_report(trace: GeneratedTrace, path: Path) -> str:
    """What was written and the intended distribution next to the realised one."""
    records = trace.records
    sessions = len({r.session for r in records})
    config = trace.config
    lines = [
        f"wrote {len(records):,} requests, {sessions:,} sessions, {len(config.days)} days "
        f"({config.first_day} .. {config.last_day}) to {path}",
        f"seed {trace.seed}; long-input short-output {trace.long_input_short_output.mean():.1%}",
        f"{'bucket':<12}{'intended':>10}{'realised':>10}",
    ]
    realised = trace.buckets()
    intended = trace.intended_bucket_shares()
    for bucket, label in enumerate(hit_bucket_labels()):
        lines.append(f"{label:<12}{intended[bucket]:>10.1%}{(realised == bucket).mean():>10.1%}")
    return "\n".join(lines)


def format_table(stats: TraceStats) -> str:
    sessions = ""
    if stats.sessions is not None:
        sessions = f", {stats.sessions:,} session{'' if stats.sessions == 1 else 's'}"
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
    lines.append(f"{'bucket':<12}{'requests':>10}{'share':>9}{'miss share':>12}")
    for label, count, share, miss in zip(
        hit_bucket_labels(),
        hit.bucket_counts,
        hit.bucket_shares,
        hit.bucket_miss_shares,
        strict=True,
    ):
        lines.append(f"{label:<12}{count:>10,}{share:>9.1%}{miss:>12.1%}")
    lines.append(f"mean token hit rate       {hit.mean_token_hit_rate:.1%}  (mean over requests)")
    lines.append(
        f"token-weighted hit rate   {hit.token_weighted_hit_rate:.1%}  (all hit / all input)"
    )
    lines.append("(miss share: the bucket's part of all uncached input tokens)")
    if stats.group is not None and stats.groups is not None:
        lines += ["", *_grouped_table(stats.group, stats.groups)]
    return "\n".join(lines)


def _grouped_table(group: str, groups: tuple[tuple[str, HitRateSummary], ...]) -> list[str]:
    labels = hit_bucket_labels()
    lines = [
        f"hit rate by {group} (share of the {group}'s requests in each bucket, %)",
        f"{group:<11}{'requests':>8}"
        + "".join(f"{label:>10}" for label in labels)
        + f"{'>=95%':>7}{'mean':>7}",
    ]
    for name, hit in groups:
        shares = "".join(f"{share * 100:>10.1f}" for share in hit.bucket_shares)
        lines.append(
            f"{name:<11}{hit.requests:>8,}{shares}"
            f"{hit.share_above_95 * 100:>7.1f}{hit.mean_token_hit_rate * 100:>7.1f}"
        )
    return lines
