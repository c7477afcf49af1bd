"""Running a deployment in real namespaces for the tests, on a small synthetic workload."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from pddemu.config import Config, config_from_dict, load_config
from pddemu.deployment import Deployment
from pddemu.emulated_network import network_for, scale_model
from pddemu.metrics.records import RequestRecord
from pddemu.replay import replay
from pddemu.roles.launcher import Launcher
from pddemu.runtime.clock import INSTANT, ModelledClock
from pddemu.runtime.timekeeping import RunTiming
from pddemu.workload.expansion import genuine_output_length
from tests.run_logs import record_run

LANDING_WAIT_S = 60.0  # wall seconds a fault waits for the state it is meant to land in


@dataclass(frozen=True)
class Request:
    request_id: str
    arrival_s: float
    input_tokens: int
    output_tokens: int
    session: str | None
    prompt_ids: list[int]
    genuine_output_tokens: int


def scenario_config(**policy: Any) -> Config:
    """The default config on a smaller, faster scenario: 8K-48K prompts over a 2 Gbit/s WAN."""
    base = load_config()
    data = {
        # These scenarios test what the roles do, not timing (tests/roles/test_dilation.py
        # does): up to 8 modelled s a wall second, holds standing the clock still
        # for genuine work, and a lag bound that does not slow the clock for a loaded host.
        "scale": {"token_scale": 16, "time_scale": 8.0, "max_lag": 1000.0, "frozen_share": 0.5},
        "target": {"model": base.target},
        "wan": {"rate": "2gbit", "delay": "20ms", "jitter": "2ms"},
        "hardware": {role: vars(hw) for role, hw in base.hardware.items()},
        "systems": {
            "pdd": {"P": 1, "RLD": 1, "MD": 1},
            "naive": {"P": 1, "MD": 1},
            "indc": {"P": 1, "D": 1},
        },
        "policy": {"wan_time_threshold_s": 0.5, "anomaly_min_input_tokens": 16384, **policy},
        "decode": {"max_batch": 16},
        "request_timeout_s": 300.0,
    }
    return config_from_dict(data, "<test config>")


def make_request(
    rid: str,
    arrival: float,
    input_tokens: int,
    output_tokens: int,
    session: str | None,
    prompt: list[int],
    scale: int = 16,
) -> Request:
    genuine_output = genuine_output_length(output_tokens, scale)
    return Request(rid, arrival, input_tokens, output_tokens, session, prompt, genuine_output)


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(256) for _ in range(n)]


class Emulation:
    """One network, deployments of one system after another, requests sent with the replayer.
    Each deployment gets a directory of its own under `run_dir` (a later one never adds to an
    earlier one's logs), recorded for a failed test's report (tests/run_logs.py). One launcher
    forks every deployment's instances (their code imported once)."""

    def __init__(self, name: str, config: Config, run_dir: Path) -> None:
        self.config = config
        self.run_dir = run_dir
        self.runs = 0
        self.network = network_for(
            config, scale_model(config), name=name, seed=config.workload.seed
        )

    def __enter__(self) -> Emulation:
        self.launcher = Launcher(self.run_dir / "launcher.err")
        try:
            self.network.up()
        except BaseException:
            self.launcher.close()
            raise
        return self

    def next_run_dir(self, system: str) -> Path:
        """A fresh directory for a deployment of `system` on this network."""
        self.runs += 1
        path = self.run_dir / f"run{self.runs}-{system}"
        record_run(path)
        return path

    def __exit__(self, *exc: object) -> None:
        try:
            self.network.down()
        finally:
            self.launcher.close()

    def run(
        self, system: str, phases: list[tuple[dict[str, Any], list[Request]]]
    ) -> tuple[list[RequestRecord], dict[str, list[int]], dict]:
        """Run `system`; each phase first sets policy fields live, then replays its requests."""
        return uvloop.run(self._run(system, phases))

    async def _run(self, system: str, phases: list[tuple[dict[str, Any], list[Request]]]):
        epoch = time.monotonic()
        run_dir = self.next_run_dir(system)
        deployment = Deployment(
            system, self.config, self.network, run_dir, epoch, launcher=self.launcher
        )
        records: list[RequestRecord] = []
        outputs: dict[str, list[int]] = {}
        timing = RunTiming(self.network, self.config, system)
        try:
            await deployment.start()
            async with timing as clock:
                for policy, requests in phases:
                    if policy:
                        async with aiohttp.ClientSession(headers=deployment.headers) as session:
                            for name in deployment.specs:
                                async with session.post(
                                    deployment.url(name, "/admin/policy"), json=policy
                                ) as reply:
                                    assert reply.status == 200, await reply.text()
                    result = await replay(
                        deployment.frontend_url,
                        requests,
                        clock,
                        system,
                        clock.now() + 0.5,
                        headers=deployment.headers,
                    )
                    records += result.records
                    outputs.update(result.outputs)
            stats = await deployment.stats()
        finally:
            await deployment.stop()
        return records, outputs, stats

    def run_with_faults(
        self,
        system: str,
        requests: list[Request],
        faults: tuple[Any, ...],
        config: Config,
        landing: Callable[[dict], bool] | None = None,
    ) -> tuple[list[RequestRecord], dict[str, list[int]], dict, Deployment]:
        """Replay `requests` on `system` (with `config`) while `faults` (pddemu.faults) happen
        at their modelled times from the replay's start. `landing`: a single fault that must
        land in a given state of the deployment (`landing(stats)` true of the instances'
        stats) lands at exactly its modelled time in that state (`land`)."""
        return uvloop.run(self._run_with_faults(system, requests, faults, config, landing))

    async def _run_with_faults(self, system, requests, faults, config, landing=None):
        from pddemu.faults import inject

        epoch = time.monotonic()
        run_dir = self.next_run_dir(system)
        deployment = Deployment(
            system, config, self.network, run_dir, epoch, launcher=self.launcher
        )
        timing = RunTiming(self.network, config, system)
        try:
            await deployment.start()
            async with timing as clock:
                start = clock.now() + 0.5
                injecting = asyncio.ensure_future(
                    inject(faults, deployment, clock.now, clock.sleep_until, start, [])
                    if landing is None
                    else land(faults, deployment, self.network.clock_path, start, landing)
                )
                result = await replay(
                    deployment.frontend_url,
                    requests,
                    clock,
                    system,
                    start,
                    headers=deployment.headers,
                )
                await injecting
            stats = await deployment.stats()
        finally:
            await deployment.stop()
        return result.records, result.outputs, stats, deployment


async def land(
    faults: tuple[Any, ...],
    deployment: Deployment,
    page: Path,
    start: float,
    landing: Callable[[dict], bool],
) -> None:
    """Carry out a single fault at exactly its modelled time, once the deployment is in the
    state it is meant to land in: modelled time is held at the fault's time (by a participant
    of the run's clock `page` of its own, whose frozen time does not slow the clock) until
    `landing(stats)` is true of the instances' stats (read in wall time: what the instances
    do meanwhile on paths without modelled time goes on) and the fault is done. Neither this
    process's wake-up nor the instances' lateness on a loaded host moves it, as each would,
    times the clock's rate, with `pddemu.faults.inject` alone."""
    from pddemu.faults import inject

    (fault,) = faults
    if fault.duration_s is not None:  # its end would wait for time the hold stands still
        raise ValueError(f"{fault.action} of {fault.instance} for a duration cannot land held")
    at = start + fault.at_s
    clock = ModelledClock.attach(page, f"fault-landing{INSTANT}")
    try:
        with clock.holding(at):
            await clock.sleep_until(at)
            deadline = time.monotonic() + LANDING_WAIT_S
            while not landing(await deployment.stats()):
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{fault.action} of {fault.instance}: the deployment was not in the "
                        f"state it is meant to land in within {LANDING_WAIT_S:g} wall s"
                    )
                await asyncio.sleep(0.05)
            await inject(faults, deployment, clock.now, clock.sleep_until, start, [])
    finally:
        clock.close()


def run_async(coroutine: Any) -> Any:
    return asyncio.run(coroutine)
