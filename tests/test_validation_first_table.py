"""docs/validation.md's first table gives, in its TTFT -51.5 % row, what the `ttft-reduction`
experiment measured under the paper's setup: both variants' reductions, the full run's beside
the quick one's, each read from the committed sweep.json files as `pddemu sweep report` reads
them (the change of pdd's TTFT statistic against naive's, per seed, averaged), and the naive
requests that completed in the full run, which its figures are over. No figure of the row's
experiment part is typed by hand or left from an earlier run."""

from __future__ import annotations

from pathlib import Path

from pddemu.sweep.provenance import point_code
from pddemu.sweep.report import by_seed, change, done, load_results, number

ROOT = Path(__file__).resolve().parents[1]
QUICK, FULL = (
    ROOT / "docs/reproduction/ttft-reduction",
    ROOT / "docs/reproduction/full/ttft-reduction",
)
STATISTICS = ("mean", "p50", "p90", "p99")
ROW = "| TTFT reduced by 51.5 % versus an unoptimised cross-DC deployment |"


def the_row() -> str:
    text = (ROOT / "docs/validation.md").read_text()
    first_table = text[: text.index("\n## ", text.index("## What the report claims"))]
    (row,) = [line for line in first_table.splitlines() if line.startswith(ROW)]
    return row


def reductions(variant: Path, versus_part: str) -> str:
    """pdd's TTFT (part drc) against naive's (part `versus_part`), each statistic's change
    per seed averaged over the seeds, as the table writes it: `mean −99.2 %, p50 ...`."""
    pdd = load_results(variant / "drc")[0]
    naive = load_results(variant / versus_part)[0]
    cells = []
    for statistic in STATISTICS:
        name = f"ttft_s.{statistic}"
        spread = change(by_seed(pdd, "pdd", name, None), by_seed(naive, "naive", name, None))
        assert spread is not None and spread.n == 3, (variant, versus_part, statistic)
        cells.append(f"{statistic} {number(spread.mean, 'ratio').lstrip('+').replace('-', '−')}")
    return ", ".join(cells)


def completed(variant: Path, part: str) -> str:
    """Naive's completed measured requests per seed: `21, 4 and 6`."""
    counts = {e["seed"]: e["requests"]["completed"] for e in done(load_results(variant / part)[0])}
    figures = [str(counts[seed]) for seed in sorted(counts)]
    return f"{', '.join(figures[:-1])} and {figures[-1]}"


def code(variant: Path) -> str:
    (label,) = {
        point_code(e) for part in ("drc", "no-drc") for e in load_results(variant / part)[0]
    }
    return label[:7]


def test_the_ttft_row_gives_both_variants_reductions_full_first() -> None:
    row = the_row()
    figures = [
        reductions(FULL, "no-drc"),
        reductions(FULL, "drc"),
        reductions(QUICK, "no-drc"),
        reductions(QUICK, "drc"),
    ]
    places = [row.find(figure) for figure in figures]
    assert -1 not in places, [f for f, at in zip(figures, places, strict=True) if at < 0]
    assert places == sorted(places), "full run first, then the quick one; without the cache first"
    assert code(FULL) in row and code(QUICK) in row


def test_the_ttft_row_says_how_many_of_naives_requests_its_full_figures_are_over() -> None:
    row = the_row()
    assert f"completed {completed(FULL, 'no-drc')} of its 100 measured requests" in row
    assert f"({completed(FULL, 'drc')} with it)" in row
