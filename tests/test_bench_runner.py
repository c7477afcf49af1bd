"""`make bench`'s runner: a benchmark that fails is recorded as failed and the others still run."""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path

import pytest

import pddemu.bench.__main__ as bench_main
import pddemu.bench.costmodel
import pddemu.bench.reproduce_quick
import pddemu.bench.wire
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

    def untimed(quick: bool) -> dict:
        """A benchmark that times nothing itself; stubbed, as the real one's speed targets
        depend on the host's load. It sleeps so that its job time rounds above zero."""
        time.sleep(0.01)
        return {"targets": {"ran": True}}

    monkeypatch.setattr(pddemu.bench.costmodel, "run", timed)
    monkeypatch.setattr(pddemu.bench.wire, "run", untimed)
    assert main(["--only", "costmodel", "--only", "wire", "--quick", "--out", str(tmp_path)]) == 0
    timed_result = json.loads((tmp_path / "costmodel.json").read_text())
    assert timed_result["wall_s"] == 1234.5
    assert 0 <= timed_result["job_wall_s"] < 1234.5
    wire = json.loads((tmp_path / "wire.json").read_text())
    assert "wall_s" not in wire and wire["job_wall_s"] > 0


def test_every_benchmark_module_has_a_run_function() -> None:
    """A module without one would be recorded as a failed benchmark by every `make bench`."""
    names = bench_main.benchmark_names()
    assert "reproduce_quick" in names and "__main__" not in names
    missing = [
        n
        for n in names
        if not callable(getattr(importlib.import_module(f"pddemu.bench.{n}"), "run", None))
    ]
    assert not missing, f"not benchmarks: {missing}"


def test_the_quick_experiments_run_in_the_default_set_and_alone() -> None:
    """`make bench` (no --only) runs every experiment's quick variant too (issue 15's tests);
    `make bench-reproduce` names it alone."""
    names = ["costmodel", "reproduce_quick", "wire"]
    assert bench_main.chosen(names, None) == names
    assert bench_main.chosen(names, ["reproduce_quick"]) == ["reproduce_quick"]


def test_reproduce_quick_runs_the_experiments_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    swept = []

    def sweep(name: str) -> dict:
        swept.append(name)
        return {"exit_status": 4, "wall_s": 60.0, "points": 2, "points_done": 2}

    monkeypatch.setattr(bench_main, "ensure_network_privileges", lambda: None)
    monkeypatch.setattr(pddemu.bench.reproduce_quick, "sweep", sweep)
    argv = ["--only", "reproduce_quick", "--experiments", "kv-transfer", "--out", str(tmp_path)]
    assert main(argv) == 0
    result = json.loads((tmp_path / "reproduce_quick.json").read_text())
    assert swept == ["kv-transfer"] and list(result["experiments"]) == ["kv-transfer"]
    assert result["total_wall_s"] == 60.0 and result["targets"]["every_point_has_results"]
    assert main([*argv[:3], "no-such-experiment", *argv[4:]]) == 1
    failed = json.loads((tmp_path / "reproduce_quick.json").read_text())
    assert "unknown experiment(s) no-such-experiment" in failed["error"]
    with pytest.raises(SystemExit):
        main(["--only", "wire", "--experiments", "kv-transfer", "--out", str(tmp_path)])


def test_reproduce_quick_counts_valid_points_and_the_mean_speedup() -> None:
    def point(status: str, valid: bool | None, speed: float | None, wall: float) -> dict:
        return {
            "point": {"status": status, "wall_s": wall},
            "valid": valid,
            "scale": {"time_scale": speed},
        }

    entries = [point("done", True, 0.5, 20.0), point("done", False, 0.3, 40.0)]
    entries.append(point("failed", None, None, 5.0))
    figures = pddemu.bench.reproduce_quick.point_figures(entries)
    assert figures["points"] == 3 and figures["points_done"] == 2
    assert figures["points_valid"] == 1 and figures["mean_speedup"] == 0.4
    assert figures["point_wall_s"] == {"min": 20.0, "mean": 30.0, "max": 40.0}
