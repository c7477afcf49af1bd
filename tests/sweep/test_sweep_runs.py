"""`pddemu sweep` running real emulations in real namespaces: the local and Ray executors give
the same token streams and summaries, a rerun skips what is finished, the goodput search runs
on a real (tiny) system, and an interrupted sweep leaves nothing behind.

The points are tiny (one instance per role, three or four short requests, a short trace file
written here), so a point takes some 15 s, most of it starting the instances."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netem.registry import list_namespaces
from pddemu.sweep.executors import host_cpus
from pddemu.sweep.provenance import code_version
from tests.conftest import require_namespaces, require_ray

SWEEP = [sys.executable, "-m", "pddemu.cli", "sweep"]
TIMEOUT_S = 600


def write_trace(
    path: Path, requests: list[tuple[int, int, list[int]]], spacing_ms: int = 1000
) -> Path:
    """A Mooncake trace: (input tokens, output tokens, block ids) per request, evenly spaced."""
    lines = [
        json.dumps(
            {
                "timestamp": spacing_ms * i,
                "input_length": n_in,
                "output_length": n_out,
                "hash_ids": ids,
            }
        )
        for i, (n_in, n_out, ids) in enumerate(requests)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_config(path: Path, trace: Path, extra: str = "") -> Path:
    path.write_text(
        f"""
[scale]
time_scale = 4.0
max_lag = 1000  # these runs check the sweep, not timing: a loaded host must not make them invalid
frozen_share = 0.5  # ... nor its holds slow them down
[wan]
jitter = "0ms"
[systems.naive]
P = 1
MD = 1
[systems.indc]
P = 1
D = 1
[workload]
trace = "{trace}"
{extra}
"""
    )
    return path


def sweep(*args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SWEEP, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def entries(out: Path) -> dict[str, dict]:
    return {e["point"]["id"]: e for e in json.loads((out / "sweep.json").read_text())["points"]}


def leftovers(out: Path) -> tuple[list[int], list[str]]:
    """Instance processes and namespaces of the sweep's points still there."""
    processes = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"pddemu" in cmdline and str(out).encode() in cmdline:
                processes.append(int(entry.name))
    namespaces = {json.loads(p.read_text())["netns"] for p in out.glob("points/*/specs/*/*.json")}
    return processes, sorted(namespaces & set(list_namespaces()))


@pytest.fixture
def small_scenario(tmp_path: Path) -> Path:
    require_namespaces()
    trace = write_trace(
        tmp_path / "trace.jsonl",
        [
            (2048, 64, list(range(4))),  # the warm-up of the sweeps run with --warmup 1
            (4096, 128, list(range(8))),  # shares the warm-up's 4 blocks
            (6144, 128, list(range(12))),  # shares the first's 8 blocks
            (4096, 96, list(range(100, 108))),
        ],
        spacing_ms=4000,
    )
    # the trace's own arrivals, 4 modelled s apart: each request is done before the next
    # arrives, so what it hits in the caches (and so its WAN bytes) does not depend on timing
    return write_config(tmp_path / "small.toml", trace, 'arrival_rate = "trace"')


DETERMINED = ("requests", "tokens", "pipelines", "wan_bytes", "hit_rate", "cost_per_hour")
TIMED = ("ttft_s.mean", "tpot_s.mean", "e2el_s.mean")
# What the local/Ray comparison judges. Exact: the token streams and the fields the workload
# determines (DETERMINED), per point and across the two seeds. Timed fields are not exact:
# the seeds here differ only in the tokens' values (the trace fixes lengths, arrivals and
# blocks; no jitter, no cross-traffic), so both seeds model the same timing and what their
# timed fields differ by is the host's run-to-run variation alone: the seed spread. Ray's
# points are judged against it, taken from the local (reference) seed pair, with a floor of
# TIMED_DRIFT of the value: a spread from two seeds is no bar on its own: with normal noise
# and nothing else differing, a third run falls outside the larger of two such spreads for
# one of the two points about half the time (a simulation of 10^6 draws: 50 %; the mean of
# the two executor differences outside it, 22 %), and one locked run at ad1fd55 (load 0.53 ->
# 1.08) read TTFT means of 278.9 / 278.6 ms locally and 276.3 / 278.0 ms on Ray: seed 0's
# difference, 2.6 ms, over the larger seed spread, 1.75 ms (TPOT and E2EL within theirs).
# The floor: these runs do not judge lag
# (max_lag 1000; judged, this scenario's naive points are flagged not valid even on a quiet
# host, by FE0's delivery lag, the frontend's own read delay, mean 0.51 ms against a bound
# of 0.32 ms, one unlocked run at load 7), so the host's load reaches their timing, Ray's
# own processes beside a point included: one CI run read Ray's mean TTFT 14 % above the
# local run's (0.375 against 0.329 s) with its points one at a time. So this part catches
# an executor that changes what a point models (its settings, its time scale, points run
# side by side: 20-31 % above, at --cpus-per-point below), not small timing differences.
TIMED_DRIFT = 0.25


def seed_spread(by_id: dict[str, dict], name: str) -> float:
    first, second = (field(e, name) for e in by_id.values())
    return abs(first - second)


def field(entry: dict, name: str) -> float:
    section, key = name.split(".")
    return entry[section][key]


def test_local_and_ray_give_the_same_streams_and_summaries(
    small_scenario: Path, tmp_path: Path
) -> None:
    require_ray()
    # the first request is a warm-up: the next two meet its blocks and each other's in the caches
    common = ["--config", str(small_scenario), "--system", "naive", "--seeds", "2", "--warmup", "1"]
    # every CPU per point: Ray runs its points one at a time, as the local executor does, so
    # the two compare like with like (with 1 CPU each, Ray ran both points at once on 2 cores
    # and their mean TTFT came out 20-31 % above the local runs': these runs do not judge lag)
    common += ["--cpus-per-point", str(host_cpus())]
    local, ray = tmp_path / "local", tmp_path / "ray"
    ran = sweep(*common, "--out", str(local))
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "2/2 points (0 skipped, 0 failed)" in ran.stderr

    rerun = sweep(*common, "--out", str(local))  # resumed: nothing left to run
    assert rerun.returncode == 0 and "2/2 points (2 skipped, 0 failed)" in rerun.stderr

    ray_temp_before = set(Path("/tmp").glob("pddemu-ray-*"))
    # --rootless: each Ray worker's point enters its own user namespace (a worker runs many
    # threads and could not itself), the path a cluster of non-root nodes takes
    on_ray = sweep(*common, "--out", str(ray), "--executor", "ray", "--rootless")
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]
    assert set(Path("/tmp").glob("pddemu-ray-*")) == ray_temp_before

    by_local, by_ray = entries(local), entries(ray)
    assert set(by_local) == set(by_ray) and len(by_local) == 2
    for point_id, entry in by_local.items():
        other = by_ray[point_id]
        assert entry["seed"] == other["seed"] and entry["token_mismatches"] == 0
        streams = [d / "points" / point_id / "outputs-naive.json" for d in (local, ray)]
        assert json.loads(streams[0].read_text()) == json.loads(streams[1].read_text())
        assert len(json.loads(streams[0].read_text())) == 4  # the warm-up's stream too
        # the warm-up is kept apart; the measured requests met the caches it left
        assert entry["warmup"]["requests"]["total"] == 1 and entry["requests"]["total"] == 3
        assert entry["warmup"]["hit_rate"]["p_side_mean"] == 0
        hits = (2048 / 4096 + 4096 / 6144 + 0) / 3
        assert entry["hit_rate"]["p_side_mean"] == pytest.approx(hits)
        for name in DETERMINED:
            assert entry[name] == other[name], name
    first, second = by_local.values()
    for name in DETERMINED:  # so the seeds model the same run, and their spread is the host's
        assert first[name] == second[name], name
    for name in TIMED:
        # the reference's spread only: Ray's own would widen the bar by what it distorts
        spread = seed_spread(by_local, name)
        for point_id, entry in by_local.items():
            on_ray = field(by_ray[point_id], name)
            difference = abs(field(entry, name) - on_ray)
            bar = max(spread, TIMED_DRIFT * field(entry, name))
            assert difference <= bar, (name, point_id, difference, spread, on_ray)
    # each point records the code it ran on: both executors' points ran on this checkout
    here = code_version()
    for by_id in (by_local, by_ray):
        assert [e["point"]["provenance"]["code"] for e in by_id.values()] == [here, here]
    assert leftovers(local) == ([], []) and leftovers(ray) == ([], [])


def test_goodput_search_on_a_tiny_system(tmp_path: Path) -> None:
    """indc with one prefill instance taking one chunk slot per step: a 24K-token prompt alone
    is prefilled well within a TTFT target of 0.6 s; one queued behind another is not. So low
    rates meet the target and high ones do not, and the search must bracket the knee: here
    with its first two probes, the start and the rate it doubles or halves to, each a real
    point (how it narrows a bracket down is tests/sweep/test_search.py's)."""
    require_namespaces()
    trace = write_trace(
        tmp_path / "knee.jsonl",
        [(24576, 64, list(range(100 * i, 100 * i + 48))) for i in range(4)],
    )
    config = write_config(
        tmp_path / "knee.toml", trace, "arrival_rate = 1.0\n[prefill]\nmax_batch_chunks = 1\n"
    )
    out = tmp_path / "search"
    ran = sweep(
        "--config", str(config), "--system", "indc", "--out", str(out),
        "--search", "goodput", "--set", "slo.ttft_s=0.6", "--rate-start", "2",
        "--rate-min", "0.125", "--rate-max", "8", "--rate-tolerance", "0.5",
        "--max-probes", "2", "--cpus-per-point", "1",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    (result,) = json.loads((out / "search.json").read_text())["results"]
    assert result["status"] == "probe-limit" and result["system"] == "indc"
    assert len(result["probes"]) == 2
    passing, failing = result["bracket"]
    assert passing is not None and failing is not None and passing < failing
    assert result["arrival_rate"] == passing
    probes = {p["arrival_rate"]: p for p in result["probes"]}
    assert probes[passing]["passed"] and not probes[failing]["passed"]
    assert all(p["slo_attainment"] < 0.9 for p in probes.values() if not p["passed"])
    by_id = entries(out)
    for probe in probes.values():  # counted from the points' own summaries
        assert probe["points_not_valid"] == sum(by_id[i]["valid"] is False for i in probe["points"])
    (at_answer,) = (by_id[i] for i in probes[passing]["points"])
    assert at_answer["values"]["workload.arrival_rate"] == passing
    assert result["goodput_rps"] == at_answer["goodput_rps"] > 0
    assert result["bcr"] == pytest.approx(at_answer["goodput_rps"] / at_answer["cost_per_hour"])
    assert at_answer["cost_per_hour_by_role"].keys() == {"P", "D"}  # in-DC: no leased line
    assert "| indc |" in ran.stdout and leftovers(out) == ([], [])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
def test_a_stopped_sweep_leaves_nothing_behind(
    small_scenario: Path, tmp_path: Path, signum: int
) -> None:
    """Ctrl-C stops the running point (which removes what it made); a SIGKILLed sweep's
    points get SIGTERM from the kernel and do the same."""
    out = tmp_path / "stopped"
    process = subprocess.Popen(
        [*SWEEP, "--config", str(small_scenario), "--system", "naive", "--out", str(out)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not list(out.glob("points/*.partial/logs/naive/*.log")):  # instances are starting
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.2)
    time.sleep(1.0)
    os.kill(process.pid, signum)
    process.wait(90)
    if signum == signal.SIGINT:
        assert process.returncode == 130
    deadline = time.monotonic() + 60
    while leftovers(out) != ([], []) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(out) == ([], [])
    assert list(out.glob("points/*.partial")), "the interrupted point is left to be redone"
