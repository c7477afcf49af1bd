"""`pddemu serve` in real time: no instance yields its core to the host's other processes, each
request carries the lateness of the steps it was in, and serve judges its lag by emulate's rule."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from pddemu.roles.__main__ import NICE, niceness
from pddemu.roles.base import Instance
from pddemu.runtime.clock import ModelledClock
from pddemu.serve import served_summary


def test_instances_are_niced_only_where_a_hold_covers_their_work() -> None:
    assert all(niceness(role, shared_clock=True) == nice for role, nice in NICE.items())
    assert {niceness(role, shared_clock=False) for role in (*NICE, "FE")} == {0}


def test_a_late_step_is_carried_by_each_of_its_requests_and_an_on_time_one_by_none() -> None:
    instance = SimpleNamespace(
        clock=ModelledClock.fixed(time.monotonic(), 1.0),
        resumed_at=float("-inf"),
        lag_samples_s=[],
        carried_lag_s={},
        steps=0,
        busy_s=0.0,
    )

    async def steps() -> None:
        now = instance.clock.now()
        await Instance.finish_step(instance, now - 0.05, 0.01, ["a", "b~1"])  # 40 ms late
        now = instance.clock.now()
        await Instance.finish_step(instance, now, 0.005, ["a", "c"])  # on time

    asyncio.run(steps())
    assert set(instance.carried_lag_s) == {"a", "b~1"}
    assert instance.carried_lag_s["a"] == instance.carried_lag_s["b~1"] >= 0.04
    assert instance.steps == 2


def _stats(step_lags: list[float], carried: dict[str, float]) -> dict[str, dict[str, Any]]:
    door = {"chunks_written": 10, "late_writes": 0, "completed": 3, "tpot_p50_s": 0.010}
    return {
        "FE0": {"role": "FE", "lags_s": {"delivery": [0.0001]}, "door": door, "errors": []},
        "P0": {"role": "P", "lags_s": {"step": step_lags}, "carried_lag_s": carried},
        "MD0": {"role": "MD", "lags_s": {"step": [0.0]}, "carried_lag_s": {"r2": 0.0002}},
    }


def test_serve_judges_its_lag_by_emulates_rule_and_counts_the_late_requests() -> None:
    late = served_summary(_stats([0.05, 0.0], {"r1": 0.05, "r2~1": 0.0002}), max_lag=0.05)
    assert late["lag"]["bound_s"] == 0.05 * 0.010
    # the mean over every instance's steps (P's two and MD's one), as emulate takes it
    assert late["valid"] is False and "mean step lag 16.67 ms" in late["invalid_reason"]
    # r1 carries 50 ms; r2 0.4 ms over its two legs and two instances, within the 0.5 ms bound
    assert late["late_requests"] == {"count": 1, "of": 3, "max_carried_s": 0.05}
    on_time = served_summary(_stats([0.0002, 0.0], {"r1": 0.0002}), max_lag=0.05)
    assert on_time["valid"] is True and on_time["invalid_reason"] is None
    assert on_time["late_requests"]["count"] == 0
