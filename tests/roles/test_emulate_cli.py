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
from pddemu.cli import main
from tests.conftest import require_namespaces
from tests.metrics.trace_events import check_opens
from tests.run_logs import record_run

# These tests check files, exit paths and what is left behind, not timing: a loaded host's lag
# must not make their runs invalid (exit 4). Timing is judged by tests/roles/test_dilation.py.
EMULATE_UNJUDGED = [sys.executable, "-m", "pddemu.cli", "emulate", "--set", "scale.max_lag=1000"]
# ... nor their holds slow them down, where no wall-time timeout meets the faster clock
EMULATE = [*EMULATE_UNJUDGED, "--set", "scale.frozen_share=0.5"]
DESIGN_KEYS = {
    "system",
    "requests",
    "ttft_s",
    "tpot_s",
    "itl_s",
    "e2el_s",
    "goodput_rps",
    "slo",
    "pipelines",
    "rld_token_share",
    "handoffs",
    "wan_bytes",
    "hit_rate",
    "token_mismatches",
    "emulator_lag_s",
    "cost_per_hour",
    "bcr",
    "scale",
}


def role_processes(out: Path) -> list[int]:
    """Instance processes of the run writing to `out` (their spec files live there), found by
    the command line each writes over the launcher's: where that write was refused (the .err
    files say so), none would be found and no leftover seen, so that fails instead."""
    unnamed = [
        str(err.relative_to(out))
        for err in sorted((out / "logs").rglob("*.err"))
        if "was not set" in err.read_text(errors="replace")
    ]
    assert not unnamed, f"processes kept the launcher's command line, leftovers unseen: {unnamed}"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"pddemu.roles" in cmdline and str(out).encode() in cmdline:
                found.append(int(entry.name))
    return found


def test_instances_that_kept_the_launchers_command_line_are_not_taken_for_none(
    tmp_path: Path,
) -> None:
    """A host refusing the command line's rewrite: `role_processes` cannot find the instances,
    and says so rather than answering none (which no leftover check could fail on)."""
    logs = tmp_path / "logs" / "pdd"
    logs.mkdir(parents=True)
    (logs / "P0.err").write_text(
        "pddemu: the command line python -m pddemu.roles P0.json was not set: [Errno 13]\n"
    )
    with pytest.raises(AssertionError, match="kept the launcher's command line"):
        role_processes(tmp_path)


def run_namespaces(out: Path) -> set[str]:
    """The namespaces the run's instances were placed in, from their spec files."""
    return {json.loads(p.read_text())["netns"] for p in out.glob("specs/*/*.json")}


def wait_clean(out: Path, timeout: float = 20.0) -> tuple[list[str], list[int]]:
    namespaces_of_run = run_namespaces(out)
    assert namespaces_of_run, "the run never placed an instance"
    deadline = time.monotonic() + timeout
    while True:
        namespaces = sorted(namespaces_of_run & set(list_namespaces()))
        processes = role_processes(out)
        if (not namespaces and not processes) or time.monotonic() > deadline:
            return namespaces, processes
        time.sleep(0.2)


@pytest.fixture
def clean_start() -> None:
    require_namespaces()


def test_a_small_rootless_run_writes_every_file(clean_start: None, tmp_path: Path) -> None:
    """The path a non-root user takes, as root with --rootless: the instances run in a private
    user namespace and the run's network namespaces never appear on the host; the run writes
    every file as any run does (the whole command runs in that user namespace)."""
    out = tmp_path / "run"
    record_run(out)  # a failure shows its role logs (tests/run_logs.py)
    stdout = tmp_path / "stdout"
    with stdout.open("w") as writes:
        process = subprocess.Popen(
            [
                *EMULATE,
                "--rootless",
                "--out",
                str(out),
                "--system",
                "pdd",
                "--requests",
                "6",
                "--set",
                "workload.arrival_rate=2.0",
            ],
            stdout=writes,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen = []
        for line in process.stderr:  # requests are flowing: every instance is up
            seen.append(line)
            if "in flight" in line:
                break
        instances = role_processes(out)
        assert instances, f"no instance processes; the run said: {''.join(seen)[-2000:]}"
        own = os.readlink("/proc/self/ns/user")
        assert all(os.readlink(f"/proc/{pid}/ns/user") != own for pid in instances)
        assert run_namespaces(out) and not run_namespaces(out) & set(list_namespaces())
        seen += process.stderr.readlines()
        assert process.wait(600) == 0, "".join(seen)[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    pdd = summary["systems"]["pdd"]
    assert DESIGN_KEYS <= set(pdd)
    assert pdd["requests"]["completed"] == 6 and pdd["token_mismatches"] == 0
    assert pdd["scale"]["token_scale"] == 1 / 32 and pdd["scale"]["wan_rate_emulated_bps"] > 0
    with open(out / "requests.csv") as handle:
        assert len(list(csv.DictReader(handle))) == 6
    assert (out / "report.md").read_text().count("|") > 20
    assert all(
        (out / name).stat().st_size > 1000 for name in ("ttft_cdf.png", "hit_rate_buckets.png")
    )
    printed = stdout.read_text()
    assert "TTFT p99" in printed and "speed-up the cores allow" in printed
    assert pdd["cpu"]["ceiling_speedup"] > 0 and pdd["cpu"]["frontend_s"] > 0
    assert len(pdd["cpu"]["host_steal_s"]) == os.cpu_count()
    assert wait_clean(out) == ([], [])
    assert pdd["output_tokens_total"] > 0 and pdd["output_throughput_tps"] > 0
    check_exports(out, tmp_path)


def check_exports(out: Path, tmp_path: Path) -> None:
    """The instances' timeline events of a real run reach every request's track."""
    for kind in ("vllm", "perfetto"):
        assert main(["export", str(out), "--format", kind, "--out", str(tmp_path / kind)]) == 0
    assert main(["export", str(out), "--format", "aiperf", "--out", str(tmp_path / "ai")]) == 0
    vllm = json.loads((tmp_path / "vllm").read_text())
    assert vllm["completed"] == 6 and len(vllm["itls"]) == 6
    trace = json.loads((tmp_path / "perfetto").read_text())
    check_opens(trace)
    events = trace["traceEvents"]
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    names: dict[str, set[str]] = {}
    for event in events:
        if event["ph"] == "X":
            track = threads[(event["pid"], event["tid"])]
            names.setdefault(track.split(" ")[0], set()).add(event["name"].split(" ")[0])
    requests = [track for track in names if track.startswith("pdd-janfeb:")]
    assert len(requests) == 6
    for track in requests:
        assert {"queued", "prefill", "KV"} <= names[track], (track, names[track])
        assert {"decode", "relay"} & names[track], (track, names[track])
    assert "prefill" in names["P0"]


@pytest.mark.parametrize(
    ("system", "signum"),
    [("naive", signal.SIGINT), ("naive", signal.SIGKILL), ("all", signal.SIGINT)],
)
def test_interrupted_or_killed_run_leaves_nothing(
    clean_start: None, tmp_path: Path, system: str, signum: int
) -> None:
    """`--system all` runs its systems at once: a Ctrl-C ends every one of them, each keeping
    the requests it had sent."""
    out = tmp_path / "run"
    record_run(out)  # a failure shows its role logs (tests/run_logs.py)
    process = subprocess.Popen(
        [*EMULATE, "--out", str(out), "--system", system, "--requests", "40"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    systems = ["pdd", "naive", "indc"] if system == "all" else [system]
    seen = []
    flowing: set[str] = set()
    for line in process.stderr:  # wait until requests are flowing in every system
        seen.append(line)
        flowing |= {s for s in systems if f"{s}] [" in line and "in flight" in line}
        if flowing == set(systems):
            break
    assert role_processes(out), (
        f"the run should have instances by now; it said: {''.join(seen)[-2000:]}"
    )
    os.kill(process.pid, signum)
    process.wait(60)
    if signum == signal.SIGINT:
        assert process.returncode == 130
        summary = json.loads((out / "summary.json").read_text())
        assert summary["partial"] is True and list(summary["systems"]) == systems
        total = 0
        for run in summary["systems"].values():
            assert run["partial"] is True
            assert "interrupted" in run["partial_reasons"][0]
            assert (
                0 < run["requests"]["total"] <= 40
                and run["requests"]["total"]
                == run["requests"]["completed"] + run["requests"]["failed"]
            )
            total += run["requests"]["total"]
        with open(out / "requests.csv") as handle:
            assert len(list(csv.DictReader(handle))) == total
        assert "Partial run" in (out / "report.md").read_text()
    assert wait_clean(out) == ([], [])


def instance_pid(out: Path, name: str) -> int:
    for pid in role_processes(out):
        if f"/{name}.json".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError(f"no process for {name}")


def test_an_instance_dying_unplanned_keeps_the_results_and_says_so(
    clean_start: None, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    record_run(out)  # a failure shows its role logs (tests/run_logs.py)
    process = subprocess.Popen(
        [
            *EMULATE,
            "--out",
            str(out),
            "--system",
            "naive",
            "--requests",
            "12",
            "--set",
            "workload.arrival_rate=2.0",
            "--set",
            "request_timeout_s=30",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = []
    for line in process.stderr:
        seen.append(line)
        if "in flight" in line:
            break
    os.kill(instance_pid(out, "MD1"), signal.SIGKILL)
    seen += process.stderr.readlines()
    assert process.wait(600) == 5, "".join(seen)[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    naive = summary["systems"]["naive"]
    assert summary["partial"] is True
    assert any(r.startswith("MD1 died") and "SIGKILL" in r for r in naive["partial_reasons"])
    assert naive["requests"]["total"] == 12
    (event,) = naive["instance_events"]
    assert (event["instance"], event["kind"], event["planned"]) == ("MD1", "died", False)
    assert "MD1" in (out / "report.md").read_text()
    assert wait_clean(out) == ([], [])
