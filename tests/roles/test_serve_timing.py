"""`pddemu serve` in real time: no instance yields its core to the host's other processes, each
request carries the lateness of the steps it was in, and serve judges its lag by emulate's rule."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web

from pddemu import serve
from pddemu.config import load_config
from pddemu.roles.__main__ import NICE, niceness
from pddemu.roles.base import Instance
from pddemu.roles.carried_lag import CarriedLag
from pddemu.roles.frontend import Frontend
from pddemu.runtime.clock import ModelledClock
from pddemu.runtime.timekeeping import expected_tpot
from pddemu.serve import lag_verdict, served_summary


def test_instances_are_niced_only_where_a_hold_covers_their_work() -> None:
    assert all(niceness(role, shared_clock=True) == nice for role, nice in NICE.items())
    assert {niceness(role, shared_clock=False) for role in (*NICE, "FE")} == {0}


def test_a_late_step_is_carried_by_each_of_its_requests_and_an_on_time_one_by_none() -> None:
    instance = SimpleNamespace(
        clock=ModelledClock.fixed(time.monotonic(), 1.0),
        resumed_at=float("-inf"),
        lag_samples_s=[],
        carried_lag_s=CarriedLag(),
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


STEP_S = expected_tpot(load_config(), "pdd")  # serve's bound while no request has a TPOT


def _stats(step_lags: list[float], carried: dict[str, float]) -> dict[str, dict[str, Any]]:
    door = {"chunks_written": 10, "late_writes": 0, "completed": 3, "tpot_p50_s": 0.010}
    return {
        "FE0": {"role": "FE", "lags_s": {"delivery": [0.0001]}, "door": door, "errors": []},
        "P0": {"role": "P", "lags_s": {"step": step_lags}, "carried_lag_s": carried},
        "MD0": {"role": "MD", "lags_s": {"step": [0.0]}, "carried_lag_s": {"r2": 0.0002}},
    }


def test_serve_judges_its_lag_by_emulates_rule_and_counts_the_late_requests() -> None:
    late = served_summary(_stats([0.05, 0.0], {"r1": 0.05, "r2~1": 0.0002}), 0.05, STEP_S)
    assert late["lag"]["bound_s"] == 0.05 * 0.010
    # the mean over every instance's steps (P's two and MD's one), as emulate takes it
    assert late["valid"] is False and "mean step lag 16.67 ms" in late["invalid_reason"]
    # r1 carries 50 ms; r2 0.4 ms over its two legs and two instances, within the 0.5 ms bound
    assert late["late_requests"] == {
        "count": 1,
        "of": 3,
        "max_carried_s": 0.05,
        "dropped_legs": 0,
    }
    on_time = served_summary(_stats([0.0002, 0.0], {"r1": 0.0002}), 0.05, STEP_S)
    assert on_time["valid"] is True and on_time["invalid_reason"] is None
    assert on_time["late_requests"]["count"] == 0


def test_serve_says_whose_lag_makes_it_not_valid_and_that_real_time_cannot_hold_it() -> None:
    """The routing exchange's reads (FE's and P's `handler` lag), held in `pddemu emulate`,
    take their handling time in real time: the verdict names who lags, most first."""
    stats = _stats([0.0, 0.0], {})
    stats["P0"]["lags_s"]["handler"] = [0.0004, 0.0014]
    stats["FE0"]["lags_s"]["handler"] = [0.0006, 0.0002]
    verdict = served_summary(stats, 0.05, STEP_S)
    assert verdict["valid"] is False
    assert verdict["invalid_reason"] == (
        "mean handler lag 0.65 ms is over its bound 0.50 ms (5% of TPOT p50 10.00 ms); "
        "handler lag of P0 0.90 ms mean over 2, FE0 0.40 ms mean over 2: in real time nothing "
        "holds the clock while a message or step is handled, so what a client measures "
        "carries it too"
    )
    assert verdict["lag"]["by_participant"]["P0"]["handler"]["mean"] == pytest.approx(0.0009)


def test_serve_judges_a_run_without_a_tpot_against_the_modelled_decode_step() -> None:
    """No request served has a TPOT yet (none completed, or single-token ones): serve judges
    the lag against the modelled decode step, as emulate does (`timing_summary`'s
    decode_step_s). On the code before, it was 'no TPOT to bound the lag by': invalid."""
    stats = _stats([0.0002, 0.0], {"r1": 0.0002})
    stats["FE0"]["door"] = {**stats["FE0"]["door"], "tpot_p50_s": None}
    verdict = served_summary(stats, 0.05, STEP_S)
    assert (verdict["valid"], verdict["invalid_reason"]) == (True, None)
    assert verdict["lag"]["bound_s"] == pytest.approx(0.05 * STEP_S)
    assert verdict["lag"]["bound_from"] == "decode_step"
    assert verdict["late_requests"]["count"] == 0


def test_an_instance_keeps_the_carried_lag_of_its_most_recent_legs_only() -> None:
    carried = CarriedLag(capacity=3)
    carried.carry(["a", "b"], 0.01)
    carried.carry(["c", "a"], 0.02)  # a carried again: now the most recent
    carried.carry(["d"], 0.03)  # over the capacity: b, touched longest ago, goes
    assert dict(carried) == {"c": 0.02, "a": 0.03, "d": 0.03}
    assert carried.dropped == 1
    for leg in range(1000):
        carried.carry([f"r{leg}"], 0.001)
    assert len(carried) == 3 and carried.dropped == 1001
    with pytest.raises(ValueError):
        CarriedLag(capacity=0)


class _Serving:
    """What `keep_verdict_live` uses of a Deployment: canned stats, and a frontend's verdict
    route on a real HTTP server."""

    def __init__(self, stats: dict[str, dict[str, Any]], port: int, failures: int = 0) -> None:
        self.config = load_config()  # max_lag 0.05
        self.system = "pdd"
        self.headers: dict[str, str] = {}
        self._stats = stats
        self._port = port
        self.gathered = 0
        self.failures = failures  # the first gatherings that raise
        self.missing_stats = {"RLD0": "stats unreadable: TimeoutError: "}
        self.network = SimpleNamespace(record=None, flow_window_s=None)  # the kernel's netem

    async def stats(self) -> dict[str, dict[str, Any]]:
        self.gathered += 1
        if self.gathered <= self.failures:
            raise RuntimeError("the instances' stats came back mangled")
        return self._stats

    def url(self, name: str, path: str) -> str:
        assert name == "FE0"
        return f"http://127.0.0.1:{self._port}{path}"


@pytest.fixture
def quick_verdicts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(serve, "VERDICT_PERIOD_S", 0.02)
    # every 0.02 s however long a gathering takes (at the default share, one slow round on a
    # busy host would put the next one seconds away)
    monkeypatch.setattr(serve, "VERDICT_SHARE", 1.0)
    yield


@pytest.mark.parametrize("failures", [0, 2])
def test_the_frontends_stats_carry_serves_verdict_so_far(
    quick_verdicts: None, failures: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the instances whose stats are missing; a round that raises is logged (one line)
    and the watch goes on."""
    stats = _stats([0.05, 0.0], {"r1": 0.05})
    frontend = SimpleNamespace(verdict=None)

    async def watch() -> tuple[dict[str, Any] | None, int]:
        async def admin_verdict(request: web.Request) -> web.Response:
            return await Frontend._admin_verdict(frontend, request)  # type: ignore[arg-type]

        app = web.Application()
        app.router.add_post("/admin/verdict", admin_verdict)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        serving = _Serving(stats, port, failures)
        task = asyncio.create_task(serve.keep_verdict_live(serving, time.monotonic(), None))  # type: ignore[arg-type]
        try:
            for _ in range(1000):  # 10 s at most: a busy host may be slow to answer
                await asyncio.sleep(0.01)
                if serving.gathered >= 2 + failures and frontend.verdict is not None:
                    break
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await runner.cleanup()
        return frontend.verdict, serving.gathered

    verdict, gathered = asyncio.run(watch())
    assert gathered >= 2 + failures and verdict is not None
    logged = capsys.readouterr().err.splitlines()
    assert logged == failures * [
        "pddemu serve: verdict not updated: RuntimeError: the instances' stats came back mangled"
    ]
    # the judgement of serve's last line, by the same code, dated, with what it could not read
    assert verdict.pop("as_of_s") > 0
    assert verdict.pop("missing_stats") == {"RLD0": "stats unreadable: TimeoutError: "}
    assert verdict == json.loads(json.dumps(lag_verdict(stats, 0.05, STEP_S)))
    assert verdict["valid"] is False and verdict["late_requests"]["count"] == 1


def test_serve_judges_requests_routed_unmatched_as_emulate_does() -> None:
    """The frontend routed requests with no decode-side hit, their match answered later than
    the WAN can hold it (its stats' `unmatched`, `Frontend.decode_side_hit`): serve's verdict
    is not valid, its lag within bounds or not, as emulate's `judge_unmatched` judges. On the
    code before, serve judged the lag only and said valid."""
    stats = _stats([0.0002, 0.0], {"r1": 0.0002})
    stats["FE0"]["unmatched"] = 2
    verdict = served_summary(stats, 0.05, STEP_S)
    assert verdict["valid"] is False and verdict["unmatched"] == 2
    assert verdict["invalid_reason"].startswith("2 requests routed with no decode-side hit")
    late = _stats([0.05, 0.0], {"r1": 0.05})
    late["FE0"]["unmatched"] = 1
    both = served_summary(late, 0.05, STEP_S)["invalid_reason"]
    assert both.startswith("mean step lag") and both.endswith(
        "; 1 requests routed with no decode-side hit: MD's answer to their match came later "
        "than the WAN can hold it (unmatched)"
    )
    on_time = served_summary(_stats([0.0002, 0.0], {"r1": 0.0002}), 0.05, STEP_S)
    assert (on_time["valid"], on_time["unmatched"]) == (True, 0)


@pytest.mark.parametrize(
    ("schedule", "faults", "judged"),
    [
        (None, None, True),
        ("10 link=down\n12 link=up\n", None, False),
        (None, "5 kill=MD0\n", False),
    ],
)
def test_serve_leaves_unmatched_requests_unjudged_when_it_schedules_faults_or_link_events(
    tmp_path: Any, schedule: str | None, faults: str | None, judged: bool
) -> None:
    """As emulate's `judge_unmatched`: an outage or a slower link the run schedules may hold
    MD's answer in the modelled system too, so its unmatched requests are counted, not judged."""
    config = load_config()
    files = {}
    for name, text in (("wan.txt", schedule), ("faults.txt", faults)):
        if text is not None:
            (tmp_path / name).write_text(text)
            files[name] = str(tmp_path / name)
    config = config.model_copy(
        update={
            "wan": config.wan.model_copy(update={"schedule": files.get("wan.txt")}),
            "faults": config.faults.model_copy(update={"schedule": files.get("faults.txt")}),
        }
    )
    assert serve.unmatched_judged(config) is judged
    stats = _stats([0.0002, 0.0], {"r1": 0.0002})
    stats["FE0"]["unmatched"] = 1
    verdict = served_summary(stats, 0.05, STEP_S, serve.unmatched_judged(config))
    assert (verdict["valid"], verdict["unmatched"]) == (not judged, 1)


def test_serve_judges_the_wans_flows_as_emulate_does(tmp_path: Any) -> None:
    """The WAN's flows left each under 4 packets, with losses, over more of the time than
    `judge_wan_flows` allows: serve's verdict is not valid, with emulate's reason; not judged
    (None given) when the run schedules link events."""
    flows = {
        "flows_peak": 30,
        "path_packets": 42.0,
        "bound_packets": 4,
        "share_min_packets": 1.4,
        "starved_share": 0.2,
        "starved_s": 3.0,
    }
    stats = _stats([0.0002, 0.0], {"r1": 0.0002})
    verdict = served_summary(stats, 0.05, STEP_S, True, flows)
    assert verdict["valid"] is False and verdict["wan_flows"] == flows
    assert verdict["invalid_reason"].startswith("the emulated WAN left TCP too few packets")
    fine = served_summary(stats, 0.05, STEP_S, True, {**flows, "starved_share": 0.0})
    assert (fine["valid"], fine["invalid_reason"]) == (True, None)
    assert serve.flows_judged(load_config(), "pdd")
    assert not serve.flows_judged(load_config(), "indc")  # no KV of its own on the WAN
    (tmp_path / "wan.txt").write_text("10 a2b.rate=1gbit\n")
    config = load_config()
    config = config.model_copy(
        update={"wan": config.wan.model_copy(update={"schedule": str(tmp_path / "wan.txt")})}
    )
    assert not serve.flows_judged(config, "pdd")
