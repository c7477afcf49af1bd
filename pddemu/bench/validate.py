"""Results that do not depend on the host, and how fast they come: `pddemu validate` (the
analytic check within 2 %, invariance within 3 %) and `make emulate` as a user runs it (its
wall time, each system's effective speed-up and where its wall time went, whether each run is
valid, whether the systems ran at once).

Goals: `make emulate` in at most 120 s of wall time on two cores, an effective speed-up of at
least 8 modelled seconds per wall second, with every run valid and the checks within their
bounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pddemu.config import SYSTEMS

EMULATE_WALL_GOAL_S = 120.0
SPEEDUP_GOAL = 8.0
KEEP_ENV = "PDDEMU_BENCH_VALIDATE_RUNS"  # a directory to keep both runs' files in (a reference run)


def run(quick: bool) -> dict[str, Any]:
    load_before = _loadavg()
    keep = os.environ.get(KEEP_ENV)
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(keep or scratch)
        started = time.monotonic()
        validate = _pddemu("validate", "--out", str(out / "validate"))
        validate_wall = time.monotonic() - started
        result_file = out / "validate" / "validation.json"
        validation = json.loads(result_file.read_text()) if result_file.exists() else None
        started = time.monotonic()
        emulate = _pddemu(
            "emulate", "--out", str(out / "emulate"), *(["--requests", "20"] if quick else [])
        )
        emulate_wall = time.monotonic() - started
        summary_file = out / "emulate" / "summary.json"
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
    systems = summary["systems"] if summary else {}
    runs = {
        name: {
            "speedup": s["dilation"]["speedup"],
            "dilation": {k: s["dilation"][k] for k in ("min", "mean", "max")},
            "valid": s["valid"],
            "invalid_reason": s["invalid_reason"],
            "lag_mean_by_kind_s": s["lag"]["mean_by_kind"],
            "ttft_p50_s": s["ttft_s"]["p50"],
            "tpot_p50_s": s["tpot_s"]["p50"],
            "phases_wall_s": s.get("phases_wall_s"),  # where its wall time went
        }
        for name, s in systems.items()
    }
    speedups = [r["speedup"] for r in runs.values() if r["speedup"]]
    return {
        "loadavg": {"before": load_before, "after": _loadavg()},  # /proc/loadavg's 1, 5, 15 min
        "validate": {"exit": validate, "wall_s": validate_wall, "result": validation},
        "emulate": {
            "exit": emulate,
            "wall_s": emulate_wall,
            "requests": 20 if quick else 100,
            # whether the systems ran at once (the default) or one after another
            "systems_at_once": summary.get("systems_at_once") if summary else None,
            "systems": runs,
        },
        "targets": {
            "analytic within 2 %": bool(validation and validation["analytic"]["passed"]),
            "invariance within 3 %": bool(validation and validation["invariance"]["passed"]),
            f"make emulate within {EMULATE_WALL_GOAL_S:.0f} s": emulate_wall <= EMULATE_WALL_GOAL_S,
            f"speed-up at least {SPEEDUP_GOAL:g}": bool(speedups) and min(speedups) >= SPEEDUP_GOAL,
            "every emulate run valid": emulate in (0, 4)  # ran to its end (4: not valid)
            and set(runs) == set(SYSTEMS)
            and all(r["valid"] for r in runs.values()),
        },
    }


def _loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _pddemu(*args: str) -> int:
    """Run a pddemu command as a user would; its exit status."""
    return subprocess.run([sys.executable, "-m", "pddemu.cli", *args], check=False).returncode
