"""`make bench`'s runner: a benchmark that fails is recorded as failed and the others still run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pddemu.bench.costmodel
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
