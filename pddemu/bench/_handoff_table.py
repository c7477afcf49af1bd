"""The handoff benchmark's table in docs/validation.md, rendered from its JSON, so the table is
regenerated from `bench/results/handoff.json` rather than edited by hand:

    pddemu bench handoff --report                          # print the table
    pddemu bench handoff --report --doc docs/validation.md # replace the table in the doc

One row per cell, in the file's order; every figure is the cell's own (modelled ms, rounded to
the ms, TPOT to 0.1 ms); a cell's code as sweep tables print it (`code_label`: the commit, and
the modification's digest when the tree differed from it); "—" where a figure is unknown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pddemu.bench.handoff import wanted
from pddemu.sweep.provenance import code_label

COLUMNS = (
    "payload",
    "jitter",
    "WAN discipline",
    "N, code, deployments",
    "handoffs (samples sent, rounds)",
    "MD-side latency mean / p50 / p99 / max / std (ms)",
    "stall mean / p50 / p99 / max / std (ms)",
    "TPOT p50",
    "lag-1 autocorr. (95 % band)",
    "effective samples",
    "bulk",
    "warm-ups (ms)",
    "overlapping",
    "retransmits",
    "dup / missing / stale",
    "valid",
)
ALIGN = ("---", "---:", "---", "---", "---:", "---", "---", "---:", "---:", "---:", "---:")
ALIGN += ("---", "---:", "---:", "---", "---")
# The header rows are found by their start, so a column renamed later still matches.
HEADER_START = "| payload | jitter | WAN discipline |"
FIGURES = ("mean", "p50", "p99", "max", "std")


class TableNotFoundError(ValueError):
    """The document has no handoff table to replace."""


def _line(cells: tuple[str, ...] | list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _figures(stats: dict[str, float | None]) -> str:
    return " / ".join("—" if stats[k] is None else f"{stats[k]:.0f}" for k in FIGURES)


def _signed(r: float | None) -> str:
    if r is None:
        return "—"
    return ("+" if r >= 0 else "−") + f"{abs(r):.2f}"


def _count(value: float | None) -> str:
    return "—" if value is None else str(value)


def row(cell: dict[str, Any], setup: dict[str, Any]) -> str:
    """One cell as a table row."""
    measured = cell.get("measured", {})
    code = code_label(measured)  # a modified tree's cell shows its modification's digest
    runs = ", ".join(str(i) for i in cell.get("runs", []))
    independence = cell["independence"]
    band = independence["band_95"]
    warmups = ", ".join(f"{x:.0f}" for one in cell["warmup"]["md_latency_ms_by_round"] for x in one)
    retransmits = cell.get("tcp_retransmits")
    tokens = (cell["duplicate_tokens"], cell["gap_tokens"], cell["dropped_stale_tokens"])
    return _line(
        [
            cell["payload"],
            f"{cell['jitter_ms']:g} ms",
            cell["qdisc"],
            f"{wanted(cell, setup)}, {code}, runs {runs}",
            f"{cell['handoffs']} ({cell['samples_sent']}, {cell['rounds']})",
            _figures(cell["md_latency_ms"]),
            _figures(cell["stall_ms"]),
            f"{cell['tpot_ms']['p50']:.1f} ms",
            f"{_signed(independence['lag1_autocorrelation'])} "
            + ("(—)" if band is None else f"(±{band:.2f})"),
            _count(independence.get("effective_samples")),
            str(cell["bulk_requests"]),
            warmups,
            str(cell["overlapping_handoffs"]),
            "—" if retransmits is None else str(retransmits),
            " / ".join(str(t) for t in tokens),
            "yes" if cell["valid"] else "**no**",
        ]
    )


def table(result: dict[str, Any]) -> str:
    """The whole table (header, alignment, one row per cell) for a handoff.json."""
    lines = [_line(COLUMNS), "|" + "|".join(ALIGN) + "|"]
    lines += [row(cell, result["setup"]) for cell in result["cells"]]
    return "\n".join(lines) + "\n"


def replaced(text: str, new_table: str) -> str:
    """`text` with its handoff table (the header row and every table row after it) replaced."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith(HEADER_START)), None)
    if start is None:
        raise TableNotFoundError(f"no table whose header starts {HEADER_START!r}")
    end = start + 1
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[:start] + new_table.rstrip("\n").split("\n") + lines[end:])


def update_doc(doc: Path, result: dict[str, Any]) -> bool:
    """Rewrite `doc`'s handoff table from `result`; whether it changed."""
    before = doc.read_text()
    after = replaced(before, table(result))
    if after != before:
        doc.write_text(after)
    return after != before
