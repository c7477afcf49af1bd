"""The README's results table is a reference run's, copied from the report that run wrote: each
of its rows is a row of that run's report.md, so no figure of it is typed by hand or left from
an older run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## What `make emulate` prints"
RUN_DIR = re.compile(r"`(docs/reference-run/[\w-]+/)`")


def _section(text: str, heading: str) -> str:
    start = text.index(heading) + len(heading)
    end = text.find("\n## ", start)
    return text[start : end if end >= 0 else len(text)]


def _table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def test_the_readme_table_is_the_reference_runs_report() -> None:
    section = _section((ROOT / "README.md").read_text(), SECTION)
    named = RUN_DIR.search(section)
    assert named, f"README's {SECTION!r} names no docs/reference-run/<date>/ directory"
    report = ROOT / named.group(1) / "report.md"
    reported = set(_table_rows(_section(report.read_text(), "## Results")))
    rows = _table_rows(section)
    assert len(rows) > 10, "README's section has no results table"
    foreign = [row for row in rows if row not in reported]
    assert not foreign, f"rows not in {report.relative_to(ROOT)}: {foreign}"
