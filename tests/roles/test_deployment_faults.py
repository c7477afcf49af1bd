"""The deployment's instance faults on real processes in namespaces: kill, pause, resume and
restart, each an event; an unplanned death noticed with its status; stats that survive both."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest
import uvloop

from netem.clock import SharedClock
from pddemu.deployment import Deployment, DeploymentError, heard
from tests.conftest import require_namespaces
from tests.roles.harness import Emulation, scenario_config


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.02)


async def router_view(deployment: Deployment) -> dict:
    """FE0's liveness view (`Liveness.view`)."""
    async with aiohttp.ClientSession(headers=deployment.headers) as session:
        async with session.get(deployment.url("FE0", "/liveness")) as reply:
            return await reply.json()


def clock_state(deployment: Deployment) -> str:
    """The run's clock as the deployment reads it: now, rate and the holds standing."""
    source = deployment.clock.source
    slots = source.slots() if isinstance(source, SharedClock) else []
    holds = [(slot.name, slot.pid, slot.hold_at) for slot in slots if slot.hold_at < math.inf]
    return f"now {deployment.clock.now():.3f} s, rate {deployment.clock.rate:g}, holds {holds}"


async def until_seen(deployment: Deployment, instance: str, state: str) -> None:
    """Until the router's liveness record holds `instance` in `state`; failing, what the
    router saw and the clock's state say why."""
    deadline = time.monotonic() + 30.0
    async with aiohttp.ClientSession(headers=deployment.headers) as session:
        while True:
            async with session.get(deployment.url("FE0", "/stats")) as reply:
                changes = (await reply.json())["liveness"]
            if any(c["instance"] == instance and c["state"] == state for c in changes):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the router never saw {instance} {state}: its changes {changes}, its view "
                    f"{await router_view(deployment)}; the clock: {clock_state(deployment)}"
                )
            await asyncio.sleep(0.05)


def test_kill_pause_resume_restart_and_an_unplanned_death(tmp_path: Path) -> None:
    require_namespaces()
    base = scenario_config()
    config = base.model_copy(update={"systems": {**base.systems, "naive": {"P": 1, "MD": 2}}})
    with Emulation(f"dfault{os.getpid() % 10000}", config, tmp_path) as emulation:

        async def scenario() -> None:
            deployment = Deployment(
                "naive",
                config,
                emulation.network,
                emulation.next_run_dir("naive"),
                time.monotonic(),
            )
            try:
                await deployment.start()
                # started: the router has heard from every instance, or it would not judge the
                # one paused next (still starting, as it sees it) and never see it suspect
                view = await router_view(deployment)
                assert heard(view) == {"P0", "MD0", "MD1"}, view
                deployment.pause("MD0")
                await until(
                    lambda: process_state(deployment.processes["MD0"].pid) == "T", "stopped"
                )
                async with aiohttp.ClientSession() as session:
                    try:
                        async with session.get(
                            deployment.url("MD0", "/health"), timeout=aiohttp.ClientTimeout(total=1)
                        ):
                            raise AssertionError("a paused instance answered")
                    except TimeoutError:
                        pass
                # resumed once the router has seen the silence (not after a wall-time sleep,
                # which a slow clock or a starved host would make too short)
                await until_seen(deployment, "MD0", "suspect")
                deployment.resume("MD0")
                await deployment.wait_healthy({"MD0"})
                first = deployment.processes["P0"].pid
                deployment.kill("P0")
                await until(lambda: not deployment.alive("P0"), "P0 gone")
                await deployment.restart("P0")
                assert deployment.processes["P0"].pid != first and deployment.alive("P0")
                with pytest.raises(DeploymentError, match="P0 is not paused"):
                    deployment.resume("P0")  # no SIGCONT to a running instance
                os.kill(deployment.processes["MD1"].pid, signal.SIGKILL)  # nobody planned this
                await until(lambda: deployment.unplanned, "the death noticed")
                stats = await deployment.stats()
            finally:
                await deployment.stop()
            kinds = [(e.instance, e.kind, e.planned) for e in deployment.events]
            assert kinds == [
                ("MD0", "paused", True),
                ("MD0", "resumed", True),
                ("P0", "killed", True),
                ("P0", "restarted", True),
                ("MD1", "died", False),
            ]
            assert "SIGKILL" in deployment.events[-1].detail
            assert set(stats) == {"FE0", "P0", "MD0"}  # the restarted P0 answers
            assert deployment.missing_stats == {"MD1": "the instance is not running"}
            times = [e.at_s for e in deployment.events]
            assert times == sorted(times)
            # the router's view: each fault seen after it happened, and nothing else seen. How
            # soon is a benchmark figure (make bench-faults): on a starved host the router's
            # checks wake late and judge nobody, and it reads a closed connection late, by
            # any amount of modelled time, so no bound on it here could hold on every host
            at = {(e.instance, e.kind): e.at_s for e in deployment.events}
            seen = [(c["instance"], c["state"], c["at_s"]) for c in stats["FE0"]["liveness"]]
            first = {}
            for instance, state, when in seen:
                first.setdefault((instance, state), when)
            assert first[("MD0", "suspect")] > at[("MD0", "paused")]
            assert first[("P0", "down")] >= at[("P0", "killed")]
            assert first[("MD0", "up")] > at[("MD0", "resumed")]
            assert first[("P0", "up")] > at[("P0", "restarted")] - 1.0
            assert {instance for instance, _, _ in seen} <= {"MD0", "P0", "MD1"}

        uvloop.run(scenario())
