"""One point as a `pddemu emulate` child process writing into a directory.

A child process, not a call: each emulation gets a fresh single-threaded process that can enter
its own user namespace where the sweep (or a Ray worker, which runs many threads) is not root,
its own signal handling and its own cleanup, and whatever `pddemu emulate` grows (validity,
partial results) comes with it. Its stdout and stderr go to `emulate.log` in its directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pddemu.sweep.points import Point
from pddemu.sweep.provenance import after_point, before_point

EMULATE_LOG = "emulate.log"
STOP_TIMEOUT_S = 60.0  # what an interrupted emulation may take to remove what it made


@dataclass
class RunningPoint:
    point: Point
    out: Path
    process: subprocess.Popen
    started: float
    before: dict[str, Any]  # provenance.before_point(), taken as it started

    def finished(self) -> bool:
        return self.process.poll() is not None

    @property
    def exit_status(self) -> int:
        return self.process.returncode

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self.started

    def provenance(self) -> dict[str, Any]:
        """What it ran on (its code, the host's load before and now); called as it ends."""
        return after_point(self.before)

    def stop(self) -> None:
        """Ask the emulation to clean up and end (SIGTERM); kill it if it does not."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def point_environment() -> dict[str, str]:
    """The environment of a point's processes: PYTHONSAFEPATH keeps the working directory off
    sys.path in the child and in every `python -m` it starts (roles, shaper, guardian,
    cross-traffic, nsexec), so all of them import this pddemu and netem, not a checkout that
    happens to be where the point runs."""
    return {**os.environ, "PYTHONSAFEPATH": "1"}


def start_point(
    point: Point,
    out: Path,
    rootless: bool = False,
    config_path: Path | None = None,
    cwd: Path | None = None,
) -> RunningPoint:
    """Start `point`'s emulation into `out` (created), in `cwd` (relative paths of the config
    are read from there). Its own session: a Ctrl-C at the terminal reaches the sweep alone,
    which stops its points one by one."""
    out.mkdir(parents=True, exist_ok=True)
    before = before_point()
    args = point.emulate_args(out, config_path) + (["--rootless"] if rootless else [])
    with open(out / EMULATE_LOG, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "pddemu.sweep.child", *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
            env=point_environment(),
        )
    return RunningPoint(point, out, process, time.monotonic(), before)


def run_point(
    point: Point,
    out: Path,
    rootless: bool = False,
    config_path: Path | None = None,
    cwd: Path | None = None,
) -> tuple[int, float, dict[str, Any]]:
    """Run `point` to its end: (exit status, wall seconds, provenance). Interrupted, it stops the emulation
    first, then lets the interruption through."""
    running = start_point(point, out, rootless, config_path, cwd)
    try:
        running.process.wait()
    except BaseException:
        running.stop()
        raise
    return running.exit_status, running.wall_s, running.provenance()
