"""The quick variant of every experiment under experiments/, each as one `pddemu sweep` job:
what each costs (the job's wall time, its points) and what it got (points valid, the clock's
mean speed-up), so that the wall times docs/sweep.md quotes are measured by a benchmark.

    python -m pddemu.bench --only reproduce_quick [--experiments NAME ...]    # make bench-reproduce

`make bench` runs it with the other benchmarks, every experiment; all of them take about 25
minutes on 2 cores (measured: docs/sweep.md, "Quick variants").
Each experiment sweeps into a fresh `runs/bench/reproduce_quick/<name>` (removed first, so
that no point is skipped as done and the wall time is the whole job's), where its results stay
for `pddemu sweep report` or plots.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pddemu.sweep.store import SWEEP_JSON, metric

EXPERIMENTS_DIR = Path(__file__).resolve().parents[2] / "experiments"
OUT = Path("runs/bench/reproduce_quick")


def experiment_names() -> list[str]:
    return sorted(path.stem for path in EXPERIMENTS_DIR.glob("*.toml"))


def run(quick: bool = False, experiments: list[str] | None = None) -> dict[str, Any]:
    """Every experiment's quick variant (or those named), one sweep each, one after another.
    `quick` changes nothing: the quick variants are the smallest runs of the experiments."""
    known = experiment_names()
    names = experiments or known
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(
            f"unknown experiment(s) {', '.join(unknown)}; {EXPERIMENTS_DIR} has {', '.join(known)}"
        )
    results = {name: sweep(name) for name in names}
    total = sum(r["wall_s"] for r in results.values())
    return {
        "command": "pddemu sweep --experiment experiments/<name>.toml --quick --out "
        f"{OUT}/<name>, one experiment after another",
        "experiments": results,
        "total_wall_s": round(total, 1),
        "total_points": sum(r["points"] for r in results.values()),
        "targets": {
            "every_point_has_results": all(
                r["points_done"] == r["points"] for r in results.values()
            ),
            "no_token_mismatch": all(r["exit_status"] != 3 for r in results.values()),
        },
    }


def sweep(name: str) -> dict[str, Any]:
    """One experiment's quick variant as one job: its exit status, wall time and host load,
    and its points from the sweep.json files it wrote."""
    out = OUT / name
    shutil.rmtree(out, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "pddemu.cli",
        "sweep",
        "--experiment",
        str(EXPERIMENTS_DIR / f"{name}.toml"),
        "--quick",
        "--out",
        str(out),
    ]
    print(f"bench reproduce_quick: {name} ...", file=sys.stderr, flush=True)
    load_before = os.getloadavg()
    started = time.monotonic()
    status = subprocess.run(command, check=False).returncode
    wall = time.monotonic() - started
    entries = [e for path in sorted(out.rglob(SWEEP_JSON)) for e in points_of(path)]
    return {
        "exit_status": status,
        "wall_s": round(wall, 1),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        **point_figures(entries),
        "results": str(out),
    }


def points_of(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["points"]


def point_figures(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Points asked for and finished, those the emulator kept valid, each point's wall time,
    and the mean over finished points of the clock's speed-up (modelled seconds per wall
    second: summary.json's `scale.time_scale`)."""
    finished = [e for e in entries if e["point"]["status"] == "done"]
    walls = [e["point"]["wall_s"] for e in finished if e["point"].get("wall_s") is not None]
    speeds = [metric(e, "scale.time_scale") for e in finished]
    speeds = [float(s) for s in speeds if s is not None]
    return {
        "points": len(entries),
        "points_done": len(finished),
        "points_valid": sum(1 for e in finished if e.get("valid") is True),
        "point_wall_s": {
            "min": round(min(walls), 1) if walls else None,
            "mean": round(statistics.fmean(walls), 1) if walls else None,
            "max": round(max(walls), 1) if walls else None,
        },
        "mean_speedup": round(statistics.fmean(speeds), 3) if speeds else None,
    }
