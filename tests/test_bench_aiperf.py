"""AIPerf runs with a temporary directory of its own, removed after, also on failure (each
AIPerf run leaves an empty `aiperf_mmap_<id>` directory, and ZeroMQ's, in its TMPDIR); the
difference of the TTFT p50s is divided into parts that sum to it."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pddemu.bench.aiperf import p50_steps_ms, run_aiperf

# What AIPerf does with its temporary directory: makes its scratch directory there, leaves it.
LEAVES_SCRATCH = (
    "import os, sys, tempfile\n"
    "print(tempfile.gettempdir())\n"
    "os.mkdir(os.path.join(tempfile.gettempdir(), 'aiperf_mmap_' + sys.argv[1]))\n"
    "raise SystemExit(int(sys.argv[2]))\n"
)


@pytest.mark.parametrize("code", [0, 3])
def test_aiperfs_temporary_directory_is_its_own_and_removed(tmp_path: Path, code: int) -> None:
    done, left = run_aiperf([sys.executable, "-c", LEAVES_SCRATCH, tmp_path.name, str(code)])
    assert done.returncode == code
    assert left == [f"aiperf_mmap_{tmp_path.name}"]
    scratch = Path(done.stdout.strip())
    assert scratch != Path(tempfile.gettempdir()) and not scratch.exists()
    assert not (Path(tempfile.gettempdir()) / left[0]).exists()


def test_it_is_removed_when_aiperf_times_out(tmp_path: Path) -> None:
    names = tmp_path / "scratch"
    sleeps = (
        "import sys, tempfile, time\n"
        f"open({str(names)!r}, 'w').write(tempfile.gettempdir())\n"
        "time.sleep(30)\n"
    )
    ours = "pddemu-aiperf-*"
    before = set(Path(tempfile.gettempdir()).glob(ours))
    with pytest.raises(subprocess.TimeoutExpired):
        run_aiperf([sys.executable, "-c", sleeps], timeout_s=2.0)
    assert set(Path(tempfile.gettempdir()).glob(ours)) <= before  # its directory is gone
    if names.exists():  # the child got as far as saying where (a loaded host may not)
        assert not Path(names.read_text()).exists()


def test_a_timeout_kills_the_children_it_started_too(tmp_path: Path) -> None:
    """AIPerf starts service processes: a timeout must not leave them running."""
    pid_file = tmp_path / "child.pid"
    parent = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        run_aiperf([sys.executable, "-c", parent], timeout_s=5.0)
    pid = int(pid_file.read_text())  # two Python start-ups fit in 5 s on a loaded host
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rpartition(")")[2].split()[0] == "Z"


def test_the_p50_difference_is_divided_into_parts_that_sum_to_it() -> None:
    """Five requests (record, in the frontend, after the door, before the door), seconds: each
    part's median is 1 ms, but the request at the median's rank waited 6 ms before the door,
    so the p50s are 7 ms apart, and the steps say where the 7 ms went."""
    ms = 1e-3
    parts = [
        (100 * ms, 1 * ms, 1 * ms, 1 * ms),
        (110 * ms, 1 * ms, 1 * ms, 1 * ms),
        (120 * ms, 1 * ms, 1 * ms, 6 * ms),  # the median's rank
        (130 * ms, 1 * ms, 1 * ms, 1 * ms),
        (140 * ms, 1 * ms, 1 * ms, 1 * ms),
    ]
    steps = p50_steps_ms(parts)
    assert steps == pytest.approx(
        {"in_the_frontend": 1.0, "after_the_door": 1.0, "before_the_door": 6.0}
    )
    client = sorted(sum(request) for request in parts)[2] * 1e3
    assert sum(steps.values()) == pytest.approx(client - 120.0)
