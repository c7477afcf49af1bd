"""`make bench`'s runner: a benchmark that fails is recorded as failed and the others still run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pddemu.bench.__main__ as bench_main
import pddemu.bench.costmodel
from netem.rootless import RootlessError
from pddemu.bench.__main__ import main


def test_a_failing_benchmark_is_recorded_and_the_rest_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(quick: bool) -> dict:
        raise FileNotFoundError("no such trace")

    monkeypatch.setattr(pddemu.bench.costmodel, "run", broken)
    status = main(["--only", "costmodel", "--only", "wire", "--quick", "--out", str(tmp_path)])
    assert status == 1
    failed = json.loads((tmp_path / "costmodel.json").read_text())
    assert failed["error"] == "FileNotFoundError: no such trace"
    assert failed["targets"] == {"ran": False}
    wire = json.loads((tmp_path / "wire.json").read_text())  # runs after the failed one
    assert "error" not in wire and wire["targets"]


def test_without_network_privileges_only_the_network_benchmarks_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused() -> None:
        raise RootlessError("not root, and user namespaces are refused here")

    monkeypatch.setattr(bench_main, "ensure_network_privileges", refused)
    status = main(["--only", "handoff", "--only", "costmodel", "--quick", "--out", str(tmp_path)])
    assert status == 1
    handoff = json.loads((tmp_path / "handoff.json").read_text())
    assert handoff["error"] == "RootlessError: not root, and user namespaces are refused here"
    assert "error" not in json.loads((tmp_path / "costmodel.json").read_text())


def test_the_jobs_wall_time_is_job_wall_s_and_a_benchmarks_own_wall_s_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def timed(quick: bool) -> dict:
        return {"wall_s": 1234.5, "targets": {"ran": True}}  # its deployments', summed

    monkeypatch.setattr(pddemu.bench.costmodel, "run", timed)
    assert main(["--only", "costmodel", "--only", "wire", "--quick", "--out", str(tmp_path)]) == 0
    timed_result = json.loads((tmp_path / "costmodel.json").read_text())
    assert timed_result["wall_s"] == 1234.5
    assert 0 <= timed_result["job_wall_s"] < 1234.5
    wire = json.loads((tmp_path / "wire.json").read_text())
    assert "wall_s" not in wire and wire["job_wall_s"] > 0
