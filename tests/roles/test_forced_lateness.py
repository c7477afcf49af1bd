"""Which of the emulator's lag reaches a result, shown by forcing it (`PDDEMU_STALL`: an
instance's event loop blocked before it handles messages of some kinds, as a host busy
elsewhere would), on pdd's P-MD against the closed form of an idle system.

- The routing exchange (the frontend reading P's hit and P's receipt of the route; P reading the
  prompt and the route) is covered by instant holds: 50 ms of wall time at each of those steps
  moves neither the route nor TTFT nor the KV transfer beyond the analytic check's 2 %.
- The frontend's lateness in reading MD's tokens (across the WAN) does not reach their times:
  they are dated by their arrival in the kernel (`pddemu.runtime.arrival`). Before, blocked
  50 ms before each token message, the run was flagged not valid on `delivery`."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import uvloop

from pddemu.config import Config, config_from_json, config_to_json
from pddemu.emulate import run_system
from pddemu.emulated_network import network_for, scale_model
from pddemu.roles.base import STALL_ENV
from pddemu.validate import analytic
from tests.conftest import require_namespaces
from tests.roles.harness import scenario_config

SIZE = 8192  # modelled prompt tokens


def _config() -> Config:
    data = config_to_json(scenario_config())
    data["scale"] = {**data["scale"], "max_lag": 0.05, "frozen_share": 0.01}  # the real bounds
    return analytic.scenario(config_from_json(data), "pdd", "never-relay", SIZE)


def _one_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stall: str
) -> tuple[analytic.Outcome, dict]:
    """One P-MD request on an idle pdd (the analytic check's, after one that opens the
    connections), with `stall` forced."""
    require_namespaces()
    config = _config()
    probes = analytic.probes(config, "pdd", "P-MD", (SIZE,), (0.0,))
    monkeypatch.setenv(STALL_ENV, stall)
    name = "t" + uuid.uuid4().hex[:10]
    with network_for(config, scale_model(config), name=name) as network:
        run = uvloop.run(run_system("pdd", config, network, probes, tmp_path))
    probe = probes[-1]
    record = next(r for r in run.records if r.request_id == probe.request_id)
    assert record.state == "completed", record.failure_reason
    return analytic.judge(probe, record), run.timing


def test_lateness_on_the_routing_exchange_moves_no_recorded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stall_s = 0.05
    stall = f"FE0:p_hit,routed:{stall_s};P0:prefill,route:{stall_s}"
    outcome, timing = _one_request(tmp_path, monkeypatch, stall)
    # Unheld, the four stalls would add their wall time times the clock's rate, at least its
    # slowest, to the route and TTFT; held, the route is the closed form's but for the
    # frontend's reading of MD's answer (across the WAN: not held), a few ms.
    slowest_rate = 1 / timing["dilation"]["max"]
    assert outcome.route_excess_s < 0.25 * 4 * stall_s * slowest_rate, (outcome.measured, timing)
    assert abs(outcome.errors["ttft_s"]) <= analytic.TOLERANCE, outcome.to_dict()
    assert abs(outcome.errors["kv_transfer_s"]) <= analytic.TOLERANCE, outcome.to_dict()
    by_participant = timing["lag"]["by_participant"]
    assert by_participant["FE0"]["handler"]["max"] < 0.001  # its p_hit and routed, held
    assert by_participant["P0"]["handler"]["max"] < 0.001  # its prompt and route, held


def test_lateness_in_reading_tokens_moves_no_token_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocked before each token message (MD's, across the WAN, dated by their arrival in the
    kernel) for 50 modelled ms (more than a TPOT; wall time at the clock's rate, so slowing the
    clock does not shrink it), the frontend reads them late, but their times stay the closed
    form's: TTFT and TPOT within the analytic check's 2 % (dated when read, they were not).
    The lateness shows as `read` (reported, not judged); `delivery`, what the kernel's stamps
    leave uncertain (receive coalescing of messages that queued while it was blocked), is
    judged and within its bound. (Other kinds, a step's on a starved host, may still make the
    run not valid: not asserted.)"""
    stall_s = 0.05
    outcome, timing = _one_request(tmp_path, monkeypatch, f"FE0:tokens:{stall_s}m")
    lag = timing["lag"]
    assert lag["by_participant"]["FE0"]["read"]["max"] >= 0.9 * stall_s, lag
    assert abs(outcome.errors["ttft_s"]) <= analytic.TOLERANCE, outcome.to_dict()
    assert abs(outcome.errors["tpot_s"]) <= analytic.TOLERANCE, outcome.to_dict()
    assert lag["mean_by_kind"].get("delivery", 0.0) <= lag["bound_s"], lag
    assert "delivery" not in (timing["invalid_reason"] or ""), timing["invalid_reason"]
