"""`pddemu emulate`'s last step: the files of a run, and an exit status that tells a mismatch."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from metrics_samples import sample_instances, sample_records

from pddemu.config import load_config
from pddemu.emulate import DEFECT_EXIT, SystemRun, write_outputs
from pddemu.emulated_network import scale_model, wan_link


def write(records: list, out: Path, protocol_errors: int = 0) -> int:
    config = load_config()
    scale = scale_model(config)
    run = SystemRun("pdd", records, {}, sample_instances(), protocol_errors)
    out.mkdir()
    return write_outputs(config, scale, wan_link(config, scale), {"pdd": run}, out)


def test_a_token_mismatch_makes_the_exit_status_non_zero(tmp_path: Path) -> None:
    records = sample_records()
    assert sum(r.token_mismatch for r in records) == 1
    assert write(records, tmp_path / "mismatch") == DEFECT_EXIT
    summary = json.loads((tmp_path / "mismatch" / "summary.json").read_text())
    assert summary["systems"]["pdd"]["token_mismatches"] == 1


def test_failed_requests_are_results_not_an_error(tmp_path: Path) -> None:
    records = [replace(r, token_mismatch=False) for r in sample_records()]
    assert any(r.state == "failed" for r in records)
    assert write(records, tmp_path / "clean") == 0
    rows = (tmp_path / "clean" / "requests.csv").read_text().splitlines()
    assert len(rows) == 1 + len(records)


def test_an_answer_the_replayer_could_not_read_is_a_defect(tmp_path: Path) -> None:
    records = [replace(r, token_mismatch=False) for r in sample_records()]
    assert write(records, tmp_path / "unread", protocol_errors=1) == DEFECT_EXIT
