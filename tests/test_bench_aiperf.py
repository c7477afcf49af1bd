"""AIPerf runs with a temporary directory of its own, removed after, also on failure (each
AIPerf run leaves an empty `aiperf_mmap_<id>` directory, and ZeroMQ's, in its TMPDIR)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pddemu.bench.aiperf import run_aiperf

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
