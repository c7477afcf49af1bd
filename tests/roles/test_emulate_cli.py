"""`pddemu emulate` as a user runs it: its files, and nothing left behind after a normal exit,
a Ctrl-C or a crash."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netem.registry import list_namespaces
from tests.conftest import require_namespaces

EMULATE = [sys.executable, "-m", "pddemu.cli", "emulate"]
DESIGN_KEYS = {
    "system", "requests", "ttft_s", "tpot_s", "itl_s", "e2el_s", "goodput_rps", "slo", "pipelines",
    "rld_token_share", "handoffs", "wan_bytes", "hit_rate", "token_mismatches", "emulator_lag_s",
    "cost_per_hour", "bcr", "scale",
}


def role_processes() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"pddemu.roles" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def wait_clean(before: set[str], timeout: float = 20.0) -> tuple[list[str], list[int]]:
    deadline = time.monotonic() + timeout
    while True:
        namespaces = sorted(set(list_namespaces()) - before)
        processes = role_processes()
        if (not namespaces and not processes) or time.monotonic() > deadline:
            return namespaces, processes
        time.sleep(0.2)


@pytest.fixture
def clean_start() -> set[str]:
    require_namespaces()
    return set(list_namespaces())


def test_a_small_run_writes_every_file(clean_start: set[str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run(
        [*EMULATE, "--out", str(out), "--system", "pdd", "--requests", "6", "--set", "workload.arrival_rate=2.0"],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    pdd = summary["systems"]["pdd"]
    assert DESIGN_KEYS <= set(pdd)
    assert pdd["requests"]["completed"] == 6 and pdd["token_mismatches"] == 0
    assert pdd["scale"]["token_scale"] == 1 / 32 and pdd["scale"]["wan_rate_emulated_bps"] > 0
    with open(out / "requests.csv") as handle:
        assert len(list(csv.DictReader(handle))) == 6
    assert (out / "report.md").read_text().count("|") > 20
    assert all((out / name).stat().st_size > 1000 for name in ("ttft_cdf.png", "hit_rate_buckets.png"))
    assert "TTFT p99" in done.stdout
    assert wait_clean(clean_start) == ([], [])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_or_killed_run_leaves_nothing(clean_start: set[str], tmp_path: Path, signum: int) -> None:
    process = subprocess.Popen(
        [*EMULATE, "--out", str(tmp_path / "run"), "--system", "naive", "--requests", "40"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    for line in process.stderr:  # wait until requests are flowing
        if "in flight" in line:
            break
    assert role_processes(), "the run should have instances by now"
    os.kill(process.pid, signum)
    process.wait(60)
    if signum == signal.SIGINT:
        assert process.returncode == 130
    assert wait_clean(clean_start) == ([], [])
