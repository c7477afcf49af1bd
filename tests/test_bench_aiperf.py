"""AIPerf runs with a temporary directory of its own, removed after, also on failure (each
AIPerf run leaves an empty `aiperf_mmap_<id>` directory, and ZeroMQ's, in its TMPDIR); the
difference of the TTFT p50s is divided into parts that sum to it; the records timed from
AIPerf's stamp leave out the wait before the door."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from pddemu.bench.aiperf import Profile, compare, p50_steps_ms, run_aiperf

# What AIPerf does with its temporary directory: makes its scratch directory there, leaves it.
LEAVES_SCRATCH = (
    "import os, sys, tempfile\n"
    "print(tempfile.gettempdir())\n"
    "os.mkdir(os.path.join(tempfile.gettempdir(), 'aiperf_mmap_' + sys.argv[1]))\n"
    "raise SystemExit(int(sys.argv[2]))\n"
)


MS = 1e-3
# Five requests (modelled TTFT, in the frontend, after the door, before the door), seconds: each
# part's median is 1 ms, but the request at the median's rank waited 6 ms before the door.
MEDIAN_WAITED_BEFORE_THE_DOOR = [
    (100 * MS, 1 * MS, 1 * MS, 1 * MS),
    (110 * MS, 1 * MS, 1 * MS, 1 * MS),
    (120 * MS, 1 * MS, 1 * MS, 6 * MS),  # the median's rank
    (130 * MS, 1 * MS, 1 * MS, 1 * MS),
    (140 * MS, 1 * MS, 1 * MS, 1 * MS),
]


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
    parts = MEDIAN_WAITED_BEFORE_THE_DOOR
    steps = p50_steps_ms(parts)
    assert steps == pytest.approx(
        {"in_the_frontend": 1.0, "after_the_door": 1.0, "before_the_door": 6.0}
    )
    client = sorted(sum(request) for request in parts)[2] * 1e3
    assert sum(steps.values()) == pytest.approx(client - 120.0)


def _profile(parts: list[tuple[float, float, float, float]]) -> Profile:
    """A profile of requests given as (modelled TTFT, in the frontend, after the door, before
    the door), seconds, AIPerf stamping them 10 s apart on the shared clock."""
    profile = Profile.__new__(Profile)
    profile.ours, profile.measured, profile.raw = {}, {}, {}
    client_ms = []
    for i, (modelled, inside, after, before) in enumerate(parts):
        key, sent = f"r{i}", 10.0 * i
        received = sent + before
        first_chunk = received + modelled + inside
        client_ms.append((first_chunk + after - sent) * 1e3)
        late = {"first_token_late_s": inside, "first_token_sent_late_s": 0.0}
        profile.ours[key] = {
            "arrival_s": received,
            "first_token_s": received + modelled,
            "pipeline": "P-MD",
            "door": {"received_s": received, "first_chunk_s": first_chunk, **late},
        }
        profile.ours[key]["door"]["ttft_s"] = first_chunk - received
        profile.raw[key] = {"start_perf_ns": sent * 1e9}
        profile.measured[key] = {
            "metrics": {
                "time_to_first_token": {"value": client_ms[-1]},
                "http_req_sending": {"value": 0.2},
                "http_req_connection_reused": {"value": 1},
            }
        }
    ttft = {f"p{q}": float(np.percentile(client_ms, q)) for q in (50, 90)}
    profile.summary = {"time_to_first_token": ttft}
    return profile


def test_the_records_timed_from_aiperfs_stamp_leave_out_the_wait_before_the_door() -> None:
    """The request at the median's rank waited 6 ms before the door (AIPerf's own write, the
    loopback, the door's read): the served p50 is 7 ms from AIPerf's, the door's first write
    timed from AIPerf's stamp 1 ms (the chunk's way back), whatever the wait before."""
    parts = MEDIAN_WAITED_BEFORE_THE_DOOR
    compared = compare(_profile(parts), 1.0)
    assert compared["difference_served_ms"]["p50"] == pytest.approx(7.0)
    assert compared["pddemu_first_chunk_from_send_ms"]["p50"] == pytest.approx(127.0)
    assert compared["difference_from_send_ms"]["p50"] == pytest.approx(1.0)
    # a first chunk slow on its way back to AIPerf is not left out
    slow_back = [(m, i, a + (5 * MS if k == 2 else 0.0), b) for k, (m, i, a, b) in enumerate(parts)]
    assert compare(_profile(slow_back), 1.0)["difference_from_send_ms"]["p50"] == pytest.approx(6.0)
