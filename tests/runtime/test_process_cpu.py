"""The CPU a run's processes use (summary.json's `cpu`) and the speed-up the host's cores allow
at it: read from /proc for every participant on the clock page."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from netem.clock import SharedClock
from pddemu.metrics.timing import cpu_summary
from pddemu.runtime.timekeeping import cpu_difference, processes_cpu

PARTICIPANT = """
import sys, time
from netem.clock import SharedClock
page = SharedClock(sys.argv[1])
page.claim(sys.argv[2])
page.claim(sys.argv[2] + "/instant")
page.claim(sys.argv[2] + " reads/instant")  # a sender's, holding until its messages are read
print("ready", flush=True)
sys.stdin.readline()
end = time.process_time() + float(sys.argv[3])
while time.process_time() < end:  # a forced busy loop (0: none)
    pass
print("done", flush=True)
sys.stdin.readline()
"""


def test_a_busy_participant_shows_its_cpu_and_the_ceiling_follows(tmp_path: Path) -> None:
    page = SharedClock.create(tmp_path / "clock")
    children = {
        name: subprocess.Popen(
            [sys.executable, "-c", PARTICIPANT, str(page.path), name, busy],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name, busy in (("P0", "0.4"), ("FE0", "0"))
    }
    try:
        for child in children.values():
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
        before = processes_cpu(page, shaper_pid=None)
        started = time.monotonic()
        for child in children.values():
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children.values():
            assert child.stdout is not None and child.stdout.readline() == "done\n"
        after = processes_cpu(page, shaper_pid=None)
        wall = time.monotonic() - started
    finally:
        for child in children.values():
            child.kill()
            child.wait()
        page.close()
    used = cpu_difference(after, before)
    assert set(used) == {"P0", "FE0", "replayer"}  # a slot's twins are the same process
    assert used["P0"] >= 0.35 and used["FE0"] < 0.1
    summary = cpu_summary(used, {"P0": "P", "FE0": "FE"}, modelled_s=2.0, wall_s=wall, cores=2)
    assert summary["roles_s"] == used["P0"] and summary["frontend_s"] == used["FE0"]
    assert summary["total_s"] == sum(used.values())
    assert 0 < summary["ceiling_speedup"] == 2.0 * 2 / summary["total_s"]
    assert summary["by_process_s"]["P0"] >= 0.35
    assert cpu_summary({}, {}, 1.0, 1.0)["ceiling_speedup"] is None  # nothing measured
