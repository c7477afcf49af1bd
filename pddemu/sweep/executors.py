"""Where a sweep's points run: here (one after another, or K at once), or as Ray tasks.

An executor is given jobs (a point and the directory its run goes to) and calls `done(job,
exit_status, wall_s, provenance)` as each ends, in the order they end (`provenance`: what the
point ran on, recorded where it ran: pddemu.sweep.provenance; None when that is unknown). Interrupted (Ctrl-C, SIGTERM), it
stops every running emulation, which removes what it made, before letting the interruption
through.

Ray: each point is one task reserving `cpus_per_point` CPUs; the task runs the point's
`pddemu emulate` on its node in a temporary directory and returns its files, which are written
into the sweep directory here, so the nodes need no shared file system. A node needs pddemu
installed (with the same configs), root or unprivileged user namespaces, and /dev/net/tun.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pddemu.config import ConfigError
from pddemu.sweep.points import Point
from pddemu.sweep.runner import EMULATE_LOG, RunningPoint, run_point, start_point

POLL_S = 0.2


class SweepError(RuntimeError):
    """The sweep cannot run as asked (an executor that is not available, too few CPUs, a
    sweep directory whose records cannot be read)."""


@dataclass(frozen=True)
class Job:
    point: Point
    out: Path


Done = Callable[[Job, int, float, dict[str, Any] | None], None]
Tick = Callable[[int], None]  # called now and then with the number of points running


def host_cpus() -> int:
    return len(os.sched_getaffinity(0))


class LocalExecutor:
    """Points as child processes of this one, at most `parallel` at once."""

    def __init__(self, parallel: int = 1, rootless: bool = False) -> None:
        if parallel < 1:
            raise ConfigError("--parallel must be at least 1")
        self.parallel = parallel
        self.rootless = rootless

    def run(self, jobs: list[Job], done: Done, tick: Tick) -> None:
        waiting = deque(jobs)
        running: dict[Job, RunningPoint] = {}
        try:
            while waiting or running:
                while waiting and len(running) < self.parallel:
                    job = waiting.popleft()
                    running[job] = start_point(job.point, job.out, self.rootless)
                tick(len(running))
                for job, point in list(running.items()):
                    if point.finished():
                        del running[job]
                        done(job, point.exit_status, point.wall_s, point.provenance())
                time.sleep(POLL_S)
        finally:
            for point in running.values():
                point.stop()


class RayExecutor:
    """Points as Ray tasks, on the cluster at `address` or on a local one started for the
    sweep (and shut down after it)."""

    def __init__(self, address: str | None, cpus_per_point: float, rootless: bool = False) -> None:
        try:
            import ray
        except ImportError:
            raise SweepError(
                "the ray executor needs Ray: pip install 'pddemu[ray]' (on every node)"
            ) from None
        self.ray = ray
        self.address = address
        self.cpus_per_point = cpus_per_point
        self.rootless = rootless

    def run(self, jobs: list[Job], done: Done, tick: Tick) -> None:
        if not jobs:
            return
        ray = self.ray
        temp_dir = None
        if self.address:
            ray.init(address=self.address, log_to_driver=False)
        else:
            temp_dir = tempfile.mkdtemp(prefix="pddemu-ray-")
            ray.init(
                num_cpus=host_cpus(),
                include_dashboard=False,
                log_to_driver=False,
                _temp_dir=temp_dir,
            )
        pending: dict[Any, Job] = {}
        try:
            self._check_capacity()
            task = ray.remote(num_cpus=self.cpus_per_point, max_retries=0)(run_point_on_node)
            for job in jobs:
                ref = task.remote(job.point, _config_file(job.point), self.rootless, Path.cwd())
                pending[ref] = job
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                tick(min(len(pending), self._slots()))
                for ref in ready:
                    job = pending.pop(ref)
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayError as error:
                        (job.out / EMULATE_LOG).write_text(f"the Ray task failed: {error}\n")
                        done(job, -1, 0.0, None)
                        continue
                    _write_files(job.out, result["files"])
                    provenance = result.get("provenance")  # an older node sends none
                    done(job, result["exit_status"], result["wall_s"], provenance)
        finally:
            for ref in pending:
                ray.cancel(ref)  # the task stops its emulation, which cleans up
            if pending:
                ray.wait(list(pending), num_returns=len(pending), timeout=60)
            ray.shutdown()
            if temp_dir:
                shutil.rmtree(temp_dir, ignore_errors=True)

    def _check_capacity(self) -> None:
        largest = max(
            (node["Resources"].get("CPU", 0) for node in self.ray.nodes() if node["Alive"]),
            default=0,
        )
        if largest < self.cpus_per_point:
            raise SweepError(
                f"no Ray node has {self.cpus_per_point:g} CPUs for a point (the largest has "
                f"{largest:g}); lower --cpus-per-point"
            )

    def _slots(self) -> int:
        cpus = self.ray.cluster_resources().get("CPU", 0)
        return max(1, int(cpus // self.cpus_per_point))


def _config_file(point: Point) -> tuple[str, bytes] | None:
    """The point's config file, sent along with the task (a node may not have it)."""
    if point.config_path is None:
        return None
    return point.config_path.name, point.config_path.read_bytes()


def _write_files(out: Path, files: dict[str, bytes]) -> None:
    for name, content in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


def run_point_on_node(
    point: Point, config_file: tuple[str, bytes] | None, rootless: bool, cwd: Path
) -> dict[str, Any]:
    """A Ray task: run `point` here in a temporary directory; its files, status, wall time and
    provenance (this node's code and load).
    The config file is used where it is on this node with the same content, else a copy;
    relative paths (a trace) are read from the sweep's working directory where the node has
    it."""
    with tempfile.TemporaryDirectory(prefix="pddemu-point-") as temp:
        config_path = None
        if config_file is not None and point.config_path is not None:
            name, content = config_file
            here = point.config_path
            if not (here.is_file() and here.read_bytes() == content):
                config_path = Path(temp) / name
                config_path.write_bytes(content)
        out = Path(temp) / "run"
        workdir = cwd if cwd.is_dir() else None
        exit_status, wall_s, provenance = run_point(point, out, rootless, config_path, workdir)
        files = {
            str(path.relative_to(out)): path.read_bytes()
            for path in sorted(out.rglob("*"))
            if path.is_file()
        }
    return {"exit_status": exit_status, "wall_s": wall_s, "provenance": provenance, "files": files}
