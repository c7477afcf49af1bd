"""A Ray node running older code returns its point without `provenance`: the point is still
recorded as done with its results, its code stays unrecorded (never the driver's, which is not
the node's), and so it stays through a resume. A real in-process Ray cluster runs the task; the
task is an older node's: it writes what `pddemu emulate` would and returns the result dict
without the field, so nothing here emulates."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pddemu.sweep import executors, provenance
from pddemu.sweep.driver import Sweep
from pddemu.sweep.grid import expand, parse_grid
from pddemu.sweep.progress import Progress
from pddemu.sweep.provenance import UNRECORDED, mixed_code_note
from tests.conftest import require_ray


@pytest.fixture(autouse=True)
def _needs_ray() -> None:
    require_ray()


DRIVER = {"commit": "3" * 40, "dirty": False}


def older_node_task() -> Callable[..., dict[str, Any]]:
    """What run_point_on_node returned before points carried their provenance; made in a
    function, so Ray ships it to its worker by value (a worker need not import the tests)."""

    def run(point: Any, config_file: Any, rootless: bool, cwd: Path) -> dict[str, Any]:
        summary = {"system": point.system, "ttft_s": {"p99": 0.75}, "slo_attainment": 1.0}
        files = {
            "summary.json": json.dumps({"systems": {point.system: summary}}).encode(),
            "emulate.log": b"emulated on an older node\n",
        }
        return {"exit_status": 0, "wall_s": 2.5, "files": files}

    return run


class ResumeOnly:
    """An executor for the resume: every point is finished already, so it must get no job."""

    def run(self, jobs: list, done, tick) -> None:
        assert jobs == []


def read(out: Path) -> dict[str, Any]:
    return json.loads((out / "sweep.json").read_text())


def test_a_point_from_an_older_ray_node_is_kept_with_its_code_unrecorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(provenance, "code_version", lambda: dict(DRIVER))
    monkeypatch.setattr(executors, "run_point_on_node", older_node_task())
    points = expand(None, [], parse_grid(["wan.delay=5ms"]), 1, ["pdd"])
    meta = {"code": provenance.code_version()}

    sweep = Sweep(tmp_path, executors.RayExecutor(None, cpus_per_point=1), meta, Progress())
    sweep.run(points)
    sweep.progress.close()
    assert sweep.exit_status() == 0
    (entry,) = read(tmp_path)["points"]
    assert entry["point"]["status"] == "done" and entry["point"]["wall_s"] == 2.5
    assert entry["ttft_s"] == {"p99": 0.75}  # the node's files were written back and read
    assert (tmp_path / entry["point"]["dir"] / "emulate.log").read_bytes().startswith(b"emulated")
    assert entry["point"]["provenance"] is None
    assert read(tmp_path)["sweep"]["point_codes"] == [{"code": UNRECORDED, "points": 1}]
    with open(tmp_path / "sweep.csv") as handle:
        (row,) = csv.DictReader(handle)
    assert row["code"] == UNRECORDED and row["load_before"] == ""

    # resumed: skipped, and not stamped with the driver's code (the node's is unknown)
    resumed = Sweep(tmp_path, ResumeOnly(), meta, Progress())
    resumed.run(points)
    resumed.progress.close()
    (again,) = read(tmp_path)["points"]
    assert again["point"]["provenance"] is None and again["ttft_s"] == {"p99": 0.75}
    recorded = {"point": {"id": "b", "status": "done", "provenance": {"code": DRIVER}}}
    assert mixed_code_note([again, recorded]) == (
        f"points ran on 2 code versions: {UNRECORDED} (1 point), 3333333333 (1 point)"
    )
