"""Instance faults in a short emulation in namespaces: every request ends, each one completed
delivers exactly the single-process reference's tokens (whatever moved it), the router sees
each fault within a modelled second, and each failover path is taken."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from pddemu.config import Config
from pddemu.faults import InstanceFault
from pddemu.model import ModelConfig
from pddemu.reference import reference_outputs
from tests.conftest import require_namespaces
from tests.roles.harness import Emulation, make_request, random_tokens, scenario_config
from tests.roles.idle_reference import IdleReference

DETECT_WITHIN_S = 1.0


def with_systems(config: Config, **policy: Any) -> Config:
    systems = {**config.systems, "pdd": {"P": 2, "RLD": 1, "MD": 2}, "naive": {"P": 1, "MD": 2}}
    changed = config.model_copy(update={"systems": systems})
    return changed.with_policy(**policy) if policy else changed


def workload(seed: int, count: int = 8, sessions: bool = True) -> list[Any]:
    """Without sessions the router spreads requests by load: MD0 gets the first one."""
    rng = random.Random(seed)
    return [
        make_request(
            f"f{seed}-{i}",
            0.8 * i,
            genuine * 16,
            rng.choice([700, 1000, 1300]),
            f"s{seed}-{i}" if sessions else None,
            random_tokens(rng, genuine),
        )
        for i, genuine in enumerate(rng.choice([256, 1024, 2048]) for _ in range(count))
    ]


@pytest.fixture(scope="module")
def emulation(tmp_path_factory):
    require_namespaces()
    base = scenario_config()
    with Emulation("f" + uuid.uuid4().hex[:10], base, tmp_path_factory.mktemp("faults")) as made:
        yield made


def run(
    emulation: Emulation,
    system: str,
    config: Config,
    faults: tuple,
    seed: int,
    sessions: bool = True,
) -> dict:
    requests = workload(seed, sessions=sessions)
    with IdleReference(
        requests, config.model, emulation.run_dir / f"reference-{seed}"
    ) as computing:
        records, outputs, stats, deployment = emulation.run_with_faults(
            system, requests, faults, config
        )
        reference = computing.outputs()
    return {
        "records": {r.request_id: r for r in records},
        "outputs": outputs,
        "reference": reference,
        "stats": stats,
        "events": deployment.events,
    }


def check_every_request(result: dict, total: int = 8) -> None:
    records = result["records"]
    assert len(records) == total
    failed = {rid: r.failure_reason for rid, r in records.items() if r.state != "completed"}
    assert not failed
    for rid in records:
        assert result["outputs"][rid] == result["reference"][rid], rid
        assert records[rid].gap_tokens == 0


def seen_within(result: dict, instance: str, kind: str, states: set[str]) -> float:
    """Modelled seconds from the fault to the router's first change of the instance to one of
    `states` ({"suspect", "down"}: out of routing; {"up"}: back)."""
    (fault,) = [e for e in result["events"] if e.instance == instance and e.kind == kind]
    changes = [
        c["at_s"]
        for c in result["stats"]["FE0"]["liveness"]
        if c["instance"] == instance and c["state"] in states and c["at_s"] >= fault.at_s
    ]
    assert changes, f"the router never saw {instance} {states}"
    return changes[0] - fault.at_s


OUT = {"suspect", "down"}


def actions(result: dict, instance: str) -> set[str]:
    return {
        f["action"].split(" ")[0]
        for f in result["stats"]["FE0"]["failovers"]
        if f["instance"] == instance
    }


def test_p_and_md_killed_mid_run(emulation: Emulation) -> None:
    config = with_systems(emulation.config)
    faults = (InstanceFault(1.5, "kill", "P0"), InstanceFault(4.0, "kill", "MD0"))
    result = run(emulation, "pdd", config, faults, seed=1)
    check_every_request(result)
    assert seen_within(result, "P0", "killed", OUT) < DETECT_WITHIN_S
    assert seen_within(result, "MD0", "killed", OUT) < DETECT_WITHIN_S
    records = result["records"].values()
    assert any(r.retries for r in records) or actions(result, "P0")
    assert actions(result, "MD0") & {"moved", "finished"}


def test_p_killed_mid_prefill_is_retried_once_on_the_other_p(emulation: Emulation) -> None:
    """The first request (the least-loaded pick: P0) is in its 32K-token prefill (4 chunks,
    ending 0.096, 0.207, 0.335 and 0.478 modelled s after its arrival) when P0 dies: it is
    routed again from the start on P1 (one retry), and what P0 had begun sending is cut on
    the receiving side and counted there. The kill lands at exactly 0.3 modelled s, once the
    relay has begun taking in P0's transfer (`land`: time held there until then), so P0 is
    mid-prefill by construction. Left to the clock alone, it landed late by this process's
    wake-up times the clock's rate (up to 8 here: 25 ms of wall time is past the prefill's
    end), and before the route when the frontend read MD's match answer late: both on a
    loaded host. Whether MD0, across the WAN, had taken in P0's transfer by the kill still
    depends on the host (its beginning crosses the WAN, which stands still while time is
    held): its cut is 0 or 1, the relay's (same DC) is 1."""
    config = with_systems(emulation.config)
    config = config.model_copy(
        update={"scale": config.scale.model_copy(update={"frozen_share": 0.01})}
    )
    rng = random.Random(5)
    requests = [make_request("long", 0.0, 2048 * 16, 320, None, random_tokens(rng, 2048))]

    def relay_taking_in(stats: dict) -> bool:
        return stats["RLD0"]["kv_reserved_tokens"] > 0

    records, outputs, stats, deployment = emulation.run_with_faults(
        "pdd", requests, (InstanceFault(0.3, "kill", "P0"),), config, relay_taking_in
    )
    reference = reference_outputs(requests, ModelConfig(**config.model), 512)
    by_id = {r.request_id: r for r in records}
    assert by_id["long"].state == "completed" and outputs == reference
    assert by_id["long"].retries == 1
    result = {"stats": stats, "events": deployment.events}
    assert actions(result, "P0") == {"routed"}
    assert seen_within(result, "P0", "killed", OUT) < DETECT_WITHIN_S
    cut = {name: stats[name]["transfers_cut"] for name in ("RLD0", "MD0", "MD1")}
    # P0 was streaming the KV to the relay and maybe already to MD0; P1's all finished
    assert cut["RLD0"] == 1 and cut["MD0"] in (0, 1) and cut["MD1"] == 0, cut


def test_relay_killed_mid_stream_md_resumes(emulation: Emulation) -> None:
    config = with_systems(emulation.config, routing="always-relay")
    result = run(emulation, "pdd", config, (InstanceFault(3.0, "kill", "RLD0"),), seed=2)
    check_every_request(result)
    assert seen_within(result, "RLD0", "killed", OUT) < DETECT_WITHIN_S
    assert actions(result, "RLD0") & {"resumed", "moved"}
    resumed = sum(result["stats"][md].get("resumed", 0) for md in ("MD0", "MD1"))
    assert resumed >= 1


def test_md_paused_for_3_s_fails_over_and_rejoins(emulation: Emulation) -> None:
    config = with_systems(emulation.config, routing="never-relay")
    faults = (InstanceFault(2.0, "pause", "MD0", 3.0),)
    result = run(emulation, "pdd", config, faults, seed=3)
    check_every_request(result)
    assert seen_within(result, "MD0", "paused", OUT) < DETECT_WITHIN_S
    assert seen_within(result, "MD0", "resumed", {"up"}) < DETECT_WITHIN_S
    lags = result["stats"]["MD0"]["lags_s"]  # the 3 s stall is the fault's, not step lag
    assert max(lags.get("step") or [0.0]) < 1.0


def test_md_killed_and_restarted_in_naive_rejoins(emulation: Emulation) -> None:
    config = with_systems(emulation.config)
    faults = (InstanceFault(2.0, "kill", "MD0"), InstanceFault(4.0, "restart", "MD0"))
    result = run(emulation, "naive", config, faults, seed=4, sessions=False)
    check_every_request(result)
    assert seen_within(result, "MD0", "killed", OUT) < DETECT_WITHIN_S
    assert seen_within(result, "MD0", "restarted", {"up"}) >= 0  # back (its start is wall time)
    assert "moved" in actions(result, "MD0")
