"""Time dilation under a CPU hog: the same short replay, beside a companion process that
sleeps and then beside hogs, two for every core the run may use, dilates the clock more
with the hogs, and gives the same results (token streams, TTFT within the lag
bound): only the wall time a run takes changes. A run's own load dilates the clock too, so
the hog is judged against the idle companion's run, not against a fixed rate."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import uvloop

from pddemu.config import Config, config_from_json, config_to_json
from pddemu.deployment import Deployment
from pddemu.emulate import SystemRun, run_system
from pddemu.emulated_network import network_for, scale_model
from tests.conftest import require_namespaces
from tests.roles.harness import Request, make_request, random_tokens, scenario_config
from tests.run_logs import record_run

HOG = "while True: pass"
IDLE = "import time; time.sleep(3600)"
DILATED_MORE = 1.5  # the hogged replay's mean wall seconds per modelled second, at least this
# many times the idle companion's


def _config() -> Config:
    data = config_to_json(scenario_config())
    # auto, the real bound, the share of frozen time the test was written against (the
    # default); a WAN without jitter, so the
    # two runs' packets are delayed alike
    data["scale"] = {**data["scale"], "time_scale": None, "max_lag": 0.05, "frozen_share": 0.01}
    data["wan"] = {**data["wan"], "jitter_s": 0.0}
    return config_from_json(data)


def _requests() -> list[Request]:
    rng = random.Random(7)
    return [
        make_request(f"h{i}", 0.5 * i, 8192, 97, f"h{i}", random_tokens(rng, 512)) for i in range(4)
    ]


def _replay_beside(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[SystemRun, list[subprocess.Popen]]:
    """One pdd replay with two processes running `code` per core the run may use, from when
    the instances are up until the replay is over (the deployment's stats read): the clock
    runs, and is judged, in that time only."""
    config = _config()
    companions: list[subprocess.Popen] = []
    start, stats = Deployment.start, Deployment.stats

    async def start_then_companions(self: Deployment) -> None:
        await start(self)
        for _ in range(2 * len(os.sched_getaffinity(0))):
            companions.append(subprocess.Popen([sys.executable, "-c", code]))

    async def stop_companions_then_stats(self: Deployment, *args: Any) -> dict:
        _stop(companions)
        return await stats(self, *args)

    with monkeypatch.context() as patch:
        patch.setattr(Deployment, "start", start_then_companions)
        patch.setattr(Deployment, "stats", stop_companions_then_stats)
        try:
            record_run(tmp_path)  # a failure shows its role logs (tests/run_logs.py)
            name = "t" + uuid.uuid4().hex[:10]
            with network_for(config, scale_model(config), name=name) as network:
                run = uvloop.run(run_system("pdd", config, network, _requests(), tmp_path))
        finally:
            _stop(companions)
    return run, companions


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.kill()
        process.wait()


def test_a_cpu_hog_dilates_the_clock_and_leaves_the_results_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_namespaces()
    idle, sleepers = _replay_beside(IDLE, tmp_path / "idle", monkeypatch)
    hogged, hogs = _replay_beside(HOG, tmp_path / "hogged", monkeypatch)
    assert sleepers and len(hogs) == len(sleepers)  # the companions ran
    for run in (idle, hogged):
        assert all(r.state == "completed" for r in run.records), run.records
    # the hog, and not the run's own load, slowed the clock down
    slow, fast = hogged.timing["dilation"], idle.timing["dilation"]
    assert slow["mean"] > DILATED_MORE * fast["mean"], (slow, fast)
    assert slow["max"] > fast["max"], (slow, fast)
    # ... and left the results alone: the same tokens, and where both runs say their lag kept
    # within the bound, each first token at the same modelled time within it (but the first
    # request's, which opens the connections); a run over the bound says so (below)
    assert hogged.outputs == idle.outputs
    bound = hogged.timing["lag"]["bound_s"]
    if idle.timing["valid"] and hogged.timing["valid"]:
        ttft = {r.request_id: r.ttft_s for r in idle.records}
        late = {
            r.request_id: r.ttft_s - ttft[r.request_id]
            for r in hogged.records
            if r.request_id != "h0"
        }
        assert all(abs(by) <= bound for by in late.values()), (late, bound)
    timing = hogged.timing
    # holds stood the clock still for genuine work, and the run says whether its lag kept
    # within the bound, naming the worst kind when it did not (a step handed from one instance
    # to another, or a message, can still be late on a loaded host: that is what it reports)
    assert timing["holds"]["posted"] > 0
    # what the run's processes used, and the speed-up the cores allow at it
    cpu = timing["cpu"]
    assert {"P0", "RLD0", "MD0", "FE0", "replayer", "shaper"} <= set(cpu["by_process_s"])
    assert cpu["roles_s"] > 0 and cpu["frontend_s"] > 0 and cpu["cores"] >= 1
    assert cpu["total_s"] >= cpu["roles_s"] + cpu["frontend_s"]
    assert cpu["ceiling_speedup"] >= 0
    means = timing["lag"]["mean_by_kind"]
    worst = max(means, key=means.get)
    if timing["valid"]:
        assert means[worst] <= bound, means
    else:
        assert means[worst] > bound, means
        assert timing["invalid_reason"].startswith(f"mean {worst} lag"), timing["invalid_reason"]
