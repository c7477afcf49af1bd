"""Time dilation under a CPU hog: beside a process that takes a core, the shared clock slows
down, holds stand it still for genuine work, and the run's validity follows the lag it
measured."""

from __future__ import annotations

import random
import subprocess
import sys
import uuid
from pathlib import Path

import uvloop

from pddemu.config import config_from_json, config_to_json
from pddemu.emulate import run_system
from pddemu.emulated_network import network_for, scale_model
from pddemu.runtime.dilation import AUTO_START
from tests.conftest import require_namespaces
from tests.roles.harness import make_request, random_tokens, scenario_config
from tests.run_logs import record_run

HOG = "while True: pass"


def test_a_cpu_hog_dilates_the_clock_and_the_run_judges_its_lag(tmp_path: Path) -> None:
    require_namespaces()
    data = config_to_json(scenario_config())
    # auto, the real bound, the default share of frozen time
    data["scale"] = {**data["scale"], "time_scale": None, "max_lag": 0.05, "frozen_share": 0.01}
    config = config_from_json(data)
    rng = random.Random(7)
    requests = [
        make_request(f"h{i}", 0.5 * i, 8192, 97, f"h{i}", random_tokens(rng, 512)) for i in range(6)
    ]
    hogs = [subprocess.Popen([sys.executable, "-c", HOG])]  # a core of two taken
    try:
        name = "t" + uuid.uuid4().hex[:10]
        record_run(tmp_path)  # a failure shows its role logs (tests/run_logs.py)
        with network_for(config, scale_model(config), name=name) as network:
            run = uvloop.run(run_system("pdd", config, network, requests, tmp_path))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    timing = run.timing
    assert all(r.state == "completed" for r in run.records)
    dilation = timing["dilation"]
    # slowed down from where a run starts (AUTO_START modelled s a wall second) at least once
    assert dilation["max"] > 1.2 / AUTO_START, dilation
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
    bound = timing["lag"]["bound_s"]
    means = timing["lag"]["mean_by_kind"]
    worst = max(means, key=means.get)
    if timing["valid"]:
        assert means[worst] <= bound, means
    else:
        assert means[worst] > bound, means
        assert timing["invalid_reason"].startswith(f"mean {worst} lag"), timing["invalid_reason"]
