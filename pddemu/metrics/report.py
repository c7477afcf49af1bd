"""report.md: the comparison table in Markdown, the scale of the emulation, the figures and a
short guide to reading them, so that one file tells a reader what a run found."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pddemu.metrics.errors import MetricsError
from pddemu.metrics.table import MISSING, Summary, format_markdown_table, number, seconds

REPORT_FILE = "report.md"
BIT_UNITS = ("bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s")

HOW_TO_READ = """\
- Every time is in **modelled seconds**: what the emulated hardware and WAN would take, whatever
  the time scale the emulation ran at. Byte counts are modelled bytes (the target model's KV).
- **TTFT** is first token minus arrival; **TPOT** is (finish - first token) / (tokens - 1) per
  request; **ITL** pools every gap between consecutive tokens of every request, so a handoff
  stall shows up in its p99 and in the right tail of the ITL CCDF (the share of gaps at least x long, log axes); **E2EL** is finish minus
  arrival. Latency statistics cover completed requests only (docs/metrics.md).
- **Goodput** counts completed requests that met both SLO targets, per second of the run (first
  arrival to last finish). **BCR** is goodput divided by the hardware's cost per hour: the
  figure to compare across deployments of different size and chips.
- The `pdd vs X` columns are (pdd - X) / X: negative is better for TTFT, positive for goodput
  and BCR.
- **Pipelines**: P-MD for high-hit requests, P-RLD-MD when the relay decode streams eager tokens
  while the KV crosses the WAN, RLD-only for requests the anomaly filter kept off the WAN, P-D
  for the baselines. **RLD token share** is the share of delivered tokens the relay produced.
- **WAN bytes without DRC** is what would have crossed with no decode-side radix cache; the gap
  to **WAN bytes sent** is the cache's saving.
- **Token mismatches** must be 0: each counts a request whose tokens differ from a
  single-process run of the same model. A large **emulator lag** means the machine could not keep
  up with the modelled time and the latencies are too high.
"""


def bits_per_second(rate: float | None) -> str:
    if rate is None:
        return "no WAN"
    unit = 0
    while rate >= 1000 and unit < len(BIT_UNITS) - 1:
        rate /= 1000
        unit += 1
    return f"{number(rate)} {BIT_UNITS[unit]}"


def _meta_lines(meta: Mapping[str, Any]) -> list[str]:
    lines = []
    for key, value in meta.items():
        if key in ("partial_reasons", "systems_not_run"):  # in the partial notice above
            continue
        shown = value if isinstance(value, str | int | float) else json.dumps(value)
        lines.append(f"- {key}: {shown}")
    return lines or ["- (no run metadata given)"]


def _slo_lines(summaries: Mapping[str, Summary]) -> list[str]:
    targets = {
        system: (seconds(s["slo"]["ttft_s"]), seconds(s["slo"]["tpot_s"]))
        for system, s in summaries.items()
    }
    if len(set(targets.values())) == 1:
        ttft, tpot = next(iter(targets.values()))
        return [f"SLO: TTFT at most {ttft}, TPOT at most {tpot}."]
    return [
        f"SLO of {system}: TTFT at most {t}, TPOT at most {p}."
        for system, (t, p) in targets.items()
    ]


def _scale_table(summaries: Mapping[str, Summary]) -> list[str]:
    extra = sorted(
        {k for s in summaries.values() for k in s["scale"]}
        - {"token_scale", "time_scale", "wan_rate_emulated_bps"}
    )
    header = ["system", "token scale", "time scale", "emulated WAN rate", *extra]
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for system, summary in summaries.items():
        scale = summary["scale"]
        cells = [
            system,
            f"{scale['token_scale']:g}",
            f"{scale['time_scale']:g}",
            bits_per_second(scale["wan_rate_emulated_bps"]),
            *(str(scale.get(k, MISSING)) for k in extra),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _figure_lines(out_dir: Path, plots: Mapping[str, Path | str]) -> list[str]:
    lines: list[str] = []
    for title, plot in plots.items():
        plot = Path(plot)
        if not plot.is_file() or plot.stat().st_size == 0:
            raise MetricsError(f"plot {title!r}: {plot} is missing or empty")
        relative = Path(os.path.relpath(plot.resolve(), out_dir.resolve())).as_posix()
        lines += [f"### {title}", "", f"![{title}]({relative})", ""]
    return lines or ["(no figures)", ""]


def _partial_lines(meta: Mapping[str, Any]) -> list[str]:
    """A run cut short says so first, with why."""
    if not meta.get("partial"):
        return []
    lines = ["**Partial run**: these results cover only what finished.", ""]
    for system, reasons in meta.get("partial_reasons", {}).items():
        lines += [f"- {system}: {reason}" for reason in reasons]
    lines += [f"- {system}: not run" for system in meta.get("systems_not_run", [])]
    return [*lines, ""]


def _dropped_events_lines(summaries: Mapping[str, Summary]) -> list[str]:
    """Timelines past their bound dropped their oldest events: the figures drawn from them (the
    WAN's) miss those; the records and the table do not."""
    lines = [
        f"- {system}: {name} dropped {count:,}"
        for system, summary in summaries.items()
        for name, count in sorted(summary.get("events_dropped", {}).items())
    ]
    if not lines:
        return []
    head = "**Incomplete timelines**: the WAN figure misses these instances' oldest events."
    return [head, "", *lines, ""]


def _timeline_lines(summaries: Mapping[str, Summary]) -> list[str]:
    """Every fault of each replay and its effect (modelled seconds from its start): link
    events, what happened to instances, the router's view and its failovers."""
    rows = [
        (system, row) for system, summary in summaries.items() for row in _timeline_rows(summary)
    ]
    if not rows:
        return []
    lines = [
        "## Timeline",
        "",
        "| system | t (modelled s) | where | what | detail |",
        "|---|---:|---|---|---|",
    ]
    for system, row in rows:
        detail = str(row["detail"]).replace("|", "\\|")
        lines.append(
            f"| {system} | {row['at_s']:.2f} | {row['instance']} | {row['what']} | {detail} |"
        )
    return [*lines, ""]


def _timeline_rows(summary: Summary) -> list[dict[str, Any]]:
    if "faults" in summary:
        return list(summary["faults"]["timeline"])
    return [
        {
            "at_s": event["at_s"],
            "instance": event["instance"],
            "what": event["kind"],
            "detail": ("scheduled" if event["planned"] else "not planned")
            + (f": {event['detail']}" if event.get("detail") else ""),
        }
        for event in summary.get("instance_events", [])
    ]


def write_report(
    out_dir: Path | str,
    summaries: Mapping[str, Summary],
    meta: Mapping[str, Any],
    plots: Mapping[str, Path | str],
) -> Path:
    """Write out_dir/report.md; `plots` maps a figure's title to its PNG (which must exist)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = ["# pddemu run report", "", *_partial_lines(meta), *_dropped_events_lines(summaries)]
    lines += ["## Run", "", *_meta_lines(meta), ""]
    lines += ["## Results", "", format_markdown_table(summaries).rstrip("\n"), ""]
    lines += _slo_lines(summaries)
    lines += [
        "Percentiles interpolate linearly between the two nearest samples (numpy's `linear`).",
        "",
        "## Scale",
        "",
        "The factors by which the emulation shrinks the modelled deployment, as configured for",
        "the run; the emulated WAN rate is the rate the emulated link was set to so that",
        "transfers of genuine bytes take their modelled time.",
        "",
        *_scale_table(summaries),
        "",
        *_timeline_lines(summaries),
        "## Figures",
        "",
        *_figure_lines(out_dir, plots),
        "## How to read",
        "",
        HOW_TO_READ,
    ]
    path = out_dir / REPORT_FILE
    path.write_text("\n".join(lines))
    return path
