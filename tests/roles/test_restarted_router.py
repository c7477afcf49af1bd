"""A router restarted into a running deployment (`Deployment.restart("FE0")`) has heard from
nobody: an instance paused (or cut off) at its restart must still be judged, from the router's
own start, or it stays routable for good. A router started with the deployment does not judge
an instance before hearing from it (it may still be starting). Driven in-process on real time:
the instances' heartbeats are made up, MD0 sends none."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from pddemu.config import load_config
from pddemu.roles.frontend import Frontend
from pddemu.runtime.liveness import DOWN, SUSPECT, Liveness
from tests.roles.in_process import instance

PERIOD_S, SUSPECT_S, DOWN_S = 0.02, 0.1, 0.3  # modelled, and real time in-process
WALL_BOUND_S = 10.0  # on a starved host late checks judge nobody: the test waits longer then
ON_TIME_CHECKS = 30  # the checks run on time without a restart's judgement (> DOWN_S)


async def watched(restarted: bool) -> Frontend:
    """A router routing to P0 and MD0, started (as restarted or with the deployment), hearing
    P0's heartbeats and nothing from MD0 until MD0 is down or the checks have had time."""
    config = load_config()
    config = config.model_copy(
        update={
            "faults": config.faults.model_copy(
                update={
                    "heartbeat_period_s": PERIOD_S,
                    "suspect_after_s": SUSPECT_S,
                    "down_after_s": DOWN_S,
                }
            )
        }
    )
    fe = instance(Frontend, "FE", config)
    fe.spec = dataclasses.replace(fe.spec, restarted=restarted)
    fe.load = {"P0": 0, "MD0": 0}
    fe.liveness = Liveness(list(fe.load), SUSPECT_S, DOWN_S)
    await fe.start()
    deadline = time.monotonic() + WALL_BOUND_S
    try:
        while time.monotonic() < deadline and not fe.liveness.down("MD0"):
            checks = fe.liveness.checks
            if not restarted and checks["run"] - checks["late"] >= ON_TIME_CHECKS:
                break
            fe.heard_from("P0")
            await asyncio.sleep(PERIOD_S / 2)
    finally:
        await fe.end_tasks()
    return fe


@pytest.mark.parametrize("restarted", [True, False])
def test_a_restarted_router_judges_the_instances_it_has_not_heard_from(restarted: bool) -> None:
    """Restarted: MD0, never heard, is suspect then down, P0 left up. Started with the
    deployment: MD0 is never judged. On the code before, a restarted router never judged
    MD0 either (it stayed routable)."""
    fe = asyncio.run(watched(restarted))
    seen = [(change.instance, change.state) for change in fe.liveness_changes]
    if restarted:
        assert seen == [("MD0", SUSPECT), ("MD0", DOWN)], fe.liveness.view(fe.clock.now())
        suspect, down = (change.at_s - fe.liveness.unheard_since for change in fe.liveness_changes)
        assert SUSPECT_S < suspect and DOWN_S < down  # silent since the router's start
    else:
        assert seen == [] and fe.liveness.routable("MD0")
    assert fe.liveness.routable("P0")
