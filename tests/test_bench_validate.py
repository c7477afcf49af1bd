"""`make bench`'s validate benchmark: what it keeps of `pddemu validate` and `make emulate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pddemu.bench.validate as bench_validate
from pddemu.config import SYSTEMS


def _summary(system: str) -> dict:
    return {
        "system": system,
        "dilation": {"min": 0.2, "mean": 0.4, "max": 0.5, "speedup": 2.5},
        "valid": True,
        "invalid_reason": None,
        "lag": {"mean_by_kind": {"step": 1e-4}},
        "ttft_s": {"p50": 0.33},
        "tpot_s": {"p50": 0.0093},
        "phases_wall_s": {"network_up": 1.5, "start": 2.6, "replay": 94.5, "stop": 0.2},
    }


def test_the_emulate_part_says_where_each_systems_wall_time_went_and_how_they_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench/results/validate.json's emulate section keeps each system's `phases_wall_s` and
    whether the systems ran at once (`systems_at_once`), as summary.json has them since
    ab7302f; before, both were left out. The commands are stood in for by what they write."""

    def pddemu(*args: str) -> int:
        out = Path(args[args.index("--out") + 1])
        out.mkdir(parents=True)
        if args[0] == "validate":
            passed = {"passed": True}
            (out / "validation.json").write_text(
                json.dumps({"analytic": passed, "invariance": passed})
            )
        else:
            systems = {system: _summary(system) for system in SYSTEMS}
            (out / "summary.json").write_text(
                json.dumps({"systems": systems, "systems_at_once": True, "wall_s": 103.6})
            )
        return 0

    monkeypatch.setattr(bench_validate, "_pddemu", pddemu)
    monkeypatch.setenv(bench_validate.KEEP_ENV, str(tmp_path))
    emulate = bench_validate.run(quick=False)["emulate"]
    assert emulate["systems_at_once"] is True
    assert emulate["systems"]["pdd"]["phases_wall_s"]["replay"] == 94.5
    assert set(emulate["systems"]) == set(SYSTEMS)
