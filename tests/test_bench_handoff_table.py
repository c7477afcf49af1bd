"""The handoff benchmark's docs table is rendered from its JSON (`pddemu bench handoff
--report`), and the table in docs/validation.md is the committed JSON's."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from pddemu.bench import _cli as bench_cli
from pddemu.bench._handoff_table import TableNotFoundError, replaced, row, table

ROOT = Path(__file__).resolve().parents[1]


def stats(mean: float, p50: float, p99: float, peak: float, std: float) -> dict:
    return {"mean": mean, "p50": p50, "p99": p99, "max": peak, "std": std}


def cell(**changes) -> dict:
    base = {
        "payload": "kv-delta",
        "jitter_ms": 2.0,
        "qdisc": "prio",
        "handoffs": 105,
        "measured": {"commit": "9862970abcdef", "samples_per_cell": 100},
        "runs": [11, 12],
        "rounds": 2,
        "valid": False,
        "bulk_requests": 6,
        "samples_sent": 111,
        "duplicate_tokens": 0,
        "gap_tokens": 1,
        "dropped_stale_tokens": 2,
        "tcp_retransmits": 578,
        "overlapping_handoffs": 3,
        "md_latency_ms": stats(64.4, 42.2, 315.0, 365.4, 61.0),
        "stall_ms": stats(79.0, 59.0, 328.0, 379.0, 61.0),
        "tpot_ms": stats(7.3, 7.24, 8.0, 8.1, 0.2),
        "warmup": {"md_latency_ms_by_round": [[90.2, 77.0], [80.6]]},
        "independence": {
            "lag1_autocorrelation": -0.004,
            "band_95": 0.191,
            "effective_samples": 104.1,
        },
    }
    return {**base, **changes}


SETUP = {"samples_per_cell": 30, "eager_tokens": 100}


def test_a_row_shows_the_cells_own_figures() -> None:
    assert row(cell(), SETUP) == (
        "| kv-delta | 2 ms | prio | 100, 9862970abc, runs 11, 12 | 105 (111, 2) "
        "| 64 / 42 / 315 / 365 / 61 | 79 / 59 / 328 / 379 / 61 | 7.2 ms | −0.00 (±0.19) | 104.1 "
        "| 6 | 90, 77, 81 | 3 | 578 | 0 / 1 / 2 | **no** |"
    )


def test_a_row_without_its_own_n_or_retransmits_says_so() -> None:
    bare = cell(valid=True, tcp_retransmits=None, jitter_ms=10.0)
    del bare["measured"]
    cells = row(bare, SETUP).split(" | ")
    assert cells[1] == "10 ms"
    assert cells[3] == "30, unknown, runs 11, 12"  # the setup's N, no commit recorded
    assert cells[13] == "—"
    assert cells[-1] == "yes |"


def test_a_cell_measured_on_a_modified_tree_says_so() -> None:
    """A cell's code is its label as sweep tables print it: the commit alone looked clean."""
    digest = "74aa05fd" + "0" * 56
    measured = {
        "commit": "9862970abcdef",
        "dirty": True,
        "diff_sha256": digest,
        "samples_per_cell": 100,
    }
    assert row(cell(measured=measured), SETUP).split(" | ")[3] == (
        "100, 9862970abc+modified:74aa05fd, runs 11, 12"
    )
    unknown = {"commit": "9862970abcdef", "dirty": None, "samples_per_cell": 100}
    assert "9862970abc+modified:unknown" in row(cell(measured=unknown), SETUP)


def test_an_unknown_effective_sample_count_is_a_dash() -> None:
    """With r unknown the count is None: the row said "None"."""
    independence = {"lag1_autocorrelation": None, "band_95": 0.191, "effective_samples": None}
    cells = row(cell(independence=independence), SETUP).split(" | ")
    assert cells[8:10] == ["— (±0.19)", "—"]


def test_the_table_replaces_the_old_one_and_nothing_else() -> None:
    doc = "# Title\n\ntext before\n\n| payload | jitter | WAN discipline | old |\n|---|\n| a |\n| b |\n\ntext after\n"
    new = table({"setup": SETUP, "cells": [cell(), cell(qdisc="fifo")]})
    out = replaced(doc, new)
    assert out.startswith("# Title\n\ntext before\n\n| payload | jitter | WAN discipline | N,")
    assert out.endswith("| **no** |\n\ntext after\n")
    assert "| a |" not in out and "| old |" not in out
    assert out.count("\n| kv-delta |") == 2
    assert replaced(out, new) == out  # regenerating is idempotent


def test_a_document_without_the_table_is_an_error() -> None:
    with pytest.raises(TableNotFoundError, match="no table whose header starts"):
        replaced("# nothing here\n", table({"setup": SETUP, "cells": []}))


def bench(*argv: str) -> int:
    """`pddemu bench ...` as the command line parses it (without the namespace set-up)."""
    parser = argparse.ArgumentParser()
    bench_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", *argv])
    return args.func(args)


def test_report_rewrites_the_docs_table_from_the_json(tmp_path, capsys) -> None:
    result = {"setup": SETUP, "cells": [cell()]}
    out = tmp_path / "handoff.json"
    out.write_text(json.dumps(result))
    doc = tmp_path / "validation.md"
    doc.write_text("intro\n\n| payload | jitter | WAN discipline | x |\n|---|\n| stale |\n\nend\n")
    assert bench("handoff", "--report", "--out", str(out), "--doc", str(doc)) == 0
    assert doc.read_text() == "intro\n\n" + table(result) + "\nend\n"
    assert bench("handoff", "--report", "--out", str(out)) == 0
    assert capsys.readouterr().out == table(result)
    with pytest.raises(SystemExit, match="cannot read"):
        bench("handoff", "--report", "--out", str(tmp_path / "missing.json"))


def test_the_committed_docs_table_is_the_committed_results() -> None:
    """Regenerate with `pddemu bench handoff --report --doc docs/validation.md`."""
    result = json.loads((ROOT / "bench/results/handoff.json").read_text())
    doc = (ROOT / "docs/validation.md").read_text()
    assert replaced(doc, table(result)) == doc
