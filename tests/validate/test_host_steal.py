"""validation.json records, per run, how much CPU the host's hypervisor took while it ran."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pddemu.config import load_config
from pddemu.validate import analytic, cli


def test_analytic_part_records_each_pipelines_steal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stolen = iter([[0.1, 0.2], [0.0, 0.0], [1.5, 0.3], [0.4, 0.0]])

    def run(
        system: str, config: Any, workload: list[Any], out: Path, launcher: Any = None
    ) -> SimpleNamespace:
        return SimpleNamespace(records=[], timing={"cpu": {"host_steal_s": next(stolen)}})

    monkeypatch.setattr(cli, "_run", run)
    result = cli.run_analytic(load_config(), tmp_path, full=False)
    names = [f"{system} {pipeline}" for system, pipeline, _ in analytic.PIPELINES]
    assert list(result["host_steal_s"]) == names == list(result["wall_s"])
    assert result["host_steal_s"][names[2]] == [1.5, 0.3]
