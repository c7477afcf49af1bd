"""The side-by-side comparison table: systems as columns, as text for a terminal or Markdown.

The relative-change columns compare the reference system (pdd) with each other system present:
(pdd - other) / other, so a TTFT change of -50 % halves the latency and a BCR change of +30 %
buys 30 % more goodput per unit of hardware cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pddemu.metrics.errors import MetricsError
from pddemu.metrics.summary import PDD_SYSTEM

Summary = Mapping[str, Any]
MISSING = "-"
BYTE_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


@dataclass(frozen=True)
class TableRow:
    """One metric: how to print it, and (for compared rows) the number to compare."""

    label: str
    cell: Callable[[Summary], str]
    value: Callable[[Summary], float | None] | None = None


def field(summary: Summary, dotted: str) -> Any:
    """summary["a"]["b"] for "a.b"; a missing key is an error naming it."""
    value: Any = summary
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            raise MetricsError(f"summary of {summary.get('system')!r} has no field {dotted!r}")
        value = value[key]
    return value


def number(x: float | None) -> str:
    """Three significant digits, never in exponent notation."""
    if x is None:
        return MISSING
    if x == 0:
        return "0"
    decimals = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def seconds(x: float | None) -> str:
    if x is None:
        return MISSING
    return f"{number(x * 1000)} ms" if abs(x) < 1 else f"{number(x)} s"


def byte_count(x: float | None) -> str:
    if x is None:
        return MISSING
    unit = 0
    while abs(x) >= 1000 and unit < len(BYTE_UNITS) - 1:
        x /= 1000
        unit += 1
    return f"{number(x)} {BYTE_UNITS[unit]}" if unit else f"{int(x)} B"


def percent(x: float | None) -> str:
    return MISSING if x is None else f"{x * 100:.1f}%"


def relative_change(new: float | None, base: float | None) -> str:
    if new is None or base is None or base == 0:
        return MISSING
    return f"{(new - base) / base * 100:+.1f}%"


def _metric(label: str, dotted: str, show: Callable[[Any], str], compare: bool = False) -> TableRow:
    def get(summary: Summary) -> Any:
        return field(summary, dotted)

    return TableRow(label, lambda s: show(get(s)), get if compare else None)


def _joined(label: str, dotted_fields: tuple[str, ...]) -> TableRow:
    """Several counts in one cell, `a / b / c`; a field a system lacks prints as '-'."""

    def cell(summary: Summary) -> str:
        parts = []
        for dotted in dotted_fields:
            parent, _, key = dotted.rpartition(".")
            holder = field(summary, parent) if parent else summary
            parts.append(str(holder[key]) if key in holder else MISSING)
        return " / ".join(parts)

    return TableRow(label, cell)


ROWS: tuple[TableRow, ...] = (
    _joined("requests completed / total", ("requests.completed", "requests.total")),
    _metric("TTFT p50", "ttft_s.p50", seconds, compare=True),
    _metric("TTFT p90", "ttft_s.p90", seconds, compare=True),
    _metric("TTFT p99", "ttft_s.p99", seconds, compare=True),
    _metric("TTFT p90, hit < 90%", "ttft_s_by_hit.0-90%.p90", seconds),
    _metric("TTFT p90, hit >= 95%", "ttft_s_by_hit.95-100%.p90", seconds),
    _metric("TPOT p50", "tpot_s.p50", seconds),
    _metric("TPOT p99", "tpot_s.p99", seconds),
    _metric("ITL p99", "itl_s.p99", seconds),
    _metric("E2EL p50", "e2el_s.p50", seconds),
    _metric("requests within SLO", "slo_attainment", percent),
    _metric("goodput (req/s within SLO)", "goodput_rps", number, compare=True),
    _joined(
        "pipelines P-MD / P-RLD-MD / RLD-only / P-D",
        ("pipelines.P-MD", "pipelines.P-RLD-MD", "pipelines.RLD-only", "pipelines.P-D"),
    ),
    _metric("RLD token share", "rld_token_share", percent),
    _joined("handoffs one-shot / catch-up", ("handoffs.one_shot", "handoffs.catch_up")),
    _metric("max handoff stall", "handoffs.max_stall_s", seconds),
    _metric("handoff stall p99", "handoffs.p99_stall_s", seconds),
    _joined("duplicate / missing tokens", ("delivery.duplicate_tokens", "delivery.gap_tokens")),
    _joined(
        "anomaly filter: routed RLD-only / cut off",
        ("anomaly_filter.routed_rld_only", "anomaly_filter.cut_off"),
    ),
    _metric("WAN bytes the filter saved", "anomaly_filter.wan_bytes_saved", byte_count),
    _metric("WAN bytes sent", "wan_bytes.sent", byte_count),
    _metric("WAN bytes without DRC", "wan_bytes.without_drc", byte_count),
    _metric("hit rate, P side (mean)", "hit_rate.p_side_mean", percent),
    _metric("hit rate, MD side (mean)", "hit_rate.md_side_mean", percent),
    _metric("token mismatches", "token_mismatches", str),
    _metric("emulator lag p99", "emulator_lag_s.p99", seconds),
    TableRow("effective speed-up (modelled s per wall s)", lambda s: _speedup(s)),
    TableRow("speed-up the cores allow at the run's CPU", lambda s: _cpu_ceiling(s)),
    TableRow("clock slowed by (slow-downs)", lambda s: _slowed_by(s)),
    TableRow("valid (lag within the bound)", lambda s: _validity(s)),
    _metric("cost per hour", "cost_per_hour", number),
    _metric("BCR (goodput / cost per hour)", "bcr", number, compare=True),
)


def _speedup(summary: Summary) -> str:
    """How fast the run went (a summary from before the shared clock has none)."""
    speedup = summary.get("dilation", {}).get("speedup")
    return MISSING if speedup is None else f"x{number(speedup)}"


def _cpu_ceiling(summary: Summary) -> str:
    """Modelled seconds x cores / the run's CPU seconds, and those CPU seconds."""
    cpu = summary.get("cpu", {})
    if cpu.get("ceiling_speedup") is None:
        return MISSING
    return f"x{number(cpu['ceiling_speedup'])} ({number(cpu['total_s'])} CPU s)"


def _slowed_by(summary: Summary, most: int = 3) -> str:
    """The causes the clock slowed down for most often (kind of lag or holds, participant):
    what bounds the run's speed."""
    causes = summary.get("dilation", {}).get("slowed_by") or {}
    if not causes:
        return MISSING
    ranked = sorted(causes.items(), key=lambda item: -item[1])
    shown = ", ".join(f"{cause} {count}" for cause, count in ranked[:most])
    rest = sum(count for _, count in ranked[most:])
    return f"{shown}, others {rest}" if rest else shown


def _validity(summary: Summary) -> str:
    if "valid" not in summary:
        return MISSING
    return "yes" if summary["valid"] else f"NO: {summary.get('invalid_reason')}"


def comparison_rows(summaries: Mapping[str, Summary]) -> list[list[str]]:
    """Header row, then one row per metric: label, one cell per system, relative changes."""
    if not summaries:
        raise MetricsError("no system to tabulate")
    systems = list(summaries)
    others = [s for s in systems if s != PDD_SYSTEM] if PDD_SYSTEM in summaries else []
    rows = [["metric", *systems, *(f"{PDD_SYSTEM} vs {other}" for other in others)]]
    for row in ROWS:
        cells = [row.label, *(row.cell(summaries[s]) for s in systems)]
        for other in others:
            if row.value is None:
                cells.append("")
            else:
                cells.append(
                    relative_change(row.value(summaries[PDD_SYSTEM]), row.value(summaries[other]))
                )
        rows.append(cells)
    return rows


def format_table(summaries: Mapping[str, Summary]) -> str:
    """Plain text, aligned: labels left, values right."""
    rows = comparison_rows(summaries)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(cells: list[str]) -> str:
        first, *rest = cells
        parts = [
            first.ljust(widths[0]),
            *(c.rjust(w) for c, w in zip(rest, widths[1:], strict=True)),
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(rows[0]), rule, *(line(r) for r in rows[1:])]) + "\n"


def format_markdown_table(summaries: Mapping[str, Summary]) -> str:
    rows = comparison_rows(summaries)
    header, *body = rows
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines) + "\n"
