"""The closed-form model of an idle system: its parts add up as docs/hardware.md says."""

from __future__ import annotations

import numpy as np
import pytest

from pddemu.config import load_config
from pddemu.roles.sizing import cost_model
from pddemu.validate.closed_form import ClosedForm, Request, WanLink


def test_the_link_carries_tcp_payload_at_its_share_of_the_rate() -> None:
    link = WanLink(rate_bps=1e6, delay_s=0.02, mtu=1500)
    assert link.payload_bps == pytest.approx(1e6 * 1448 / 1500)
    assert link.serialise(1448) == pytest.approx(1448 * 8 / link.payload_bps)


def test_each_pipeline_adds_up_its_parts() -> None:
    config = load_config()
    model = ClosedForm(config)
    prefill = cost_model(config, "pdd", "P")
    # 8192 tokens, nothing cached: one chunk, one step of P
    relay = model.predict(Request("pdd", "P-RLD-MD", 8192, 0, 65))
    assert relay.ttft_s == pytest.approx(prefill.prefill_step([(8192, 0)]))
    direct = model.predict(Request("pdd", "P-MD", 8192, 0, 65))
    assert direct.kv_transfer_s == relay.kv_transfer_s  # the same WAN transfer
    # the KV leaves when the step ends: delay + every byte at the payload rate, after it
    wan = model.wan
    kv_bytes = 256 * 1024  # 256 genuine tokens of the tiny model's KV
    assert direct.kv_transfer_s > wan.delay_s + wan.serialise(kv_bytes)
    assert direct.ttft_s == pytest.approx(
        direct.kv_transfer_s
        + model._route_time(Request("pdd", "P-MD", 8192, 0, 65), 256)
        + wan.delay_s
        + wan.serialise(model._tokens_frame("r0", [0.0]))
    )
    decode = cost_model(config, "pdd", "MD")
    steps = [decode.decode_step([8192 + i]) for i in range(1, 65)]
    assert direct.tpot_s == pytest.approx(float(np.mean(steps)))
    indc = model.predict(Request("indc", "P-D", 8192, 0, 65))
    assert indc.ttft_s == pytest.approx(relay.ttft_s)  # D sits in DC A: no WAN on its path


def test_a_cached_prefix_is_neither_computed_nor_sent() -> None:
    model = ClosedForm(load_config())
    cold = model.predict(Request("naive", "P-MD", 65536, 0, 2))
    warm = model.predict(Request("naive", "P-MD", 65536, 58880, 2))
    assert warm.ttft_s < cold.ttft_s / 4 and warm.kv_transfer_s < cold.kv_transfer_s / 4
    assert cold.tpot_s == warm.tpot_s


def test_the_analytic_scenario_queues_the_largest_transfer_without_loss() -> None:
    from pddemu.emulated_network import queue_bytes, scale_model
    from pddemu.validate.analytic import scenario

    config = scenario(load_config(), "pdd", "never-relay", 65536)
    assert config.wan.qdisc == "fifo" and config.wan.jitter_s == 0 and config.systems["pdd"]
    largest = ClosedForm(config)._kv_chunk("r0", 0, 65536 // config.scale.token_scale)
    genuine = largest.data.nbytes
    assert queue_bytes(config, scale_model(config)) >= 2 * genuine * 0.99


def test_a_probe_without_a_record_is_judged_missing_not_a_crash() -> None:
    from pddemu.validate.analytic import Probe, judge

    model = ClosedForm(load_config())
    request = Request("pdd", "P-MD", 8192, 0, 65)
    probe = Probe("r0", 0.0, 8192, 65, None, [1] * 256, request, model.predict(request))
    outcome = judge(probe, None)
    assert outcome.errors == {"ttft_s": None, "kv_transfer_s": None, "tpot_s": None}
    assert outcome.route_excess_s is None


def _record(rid: str, arrival: float, finish: float | None, kv: float | None = None):
    from pddemu.metrics.records import RequestRecord

    return RequestRecord(
        rid, "pdd", arrival, 8192, 2, state="completed", finish_s=finish, kv_arrived_s=kv
    )


def test_idleness_is_shown_from_every_earlier_request_s_last_token_and_kv() -> None:
    from pddemu.validate.analytic import idleness

    idle = idleness(
        [
            _record("b", 2.0, 2.5, kv=3.0),  # its KV reached MD after its last token
            _record("a", 0.0, 1.0),
            _record("c", 3.5, 4.0),
            _record("d", 3.9, None),  # arrived while c was still going; never ended
            _record("e", 9.0, 9.5),
        ]
    )
    assert idle["a"] == float("inf")
    assert idle["b"] == pytest.approx(1.0)
    assert idle["c"] == pytest.approx(0.5)  # after b's KV, not its last token
    assert idle["d"] == pytest.approx(-0.1)
    assert idle["e"] is None  # d never ended: nothing shows the system idle


def test_a_probe_that_found_the_system_busy_fails_the_check() -> None:
    from pddemu.validate.analytic import Probe, judge, summarise

    model = ClosedForm(load_config())
    request = Request("indc", "P-D", 8192, 0, 65)
    expected = model.predict(request)
    probe = Probe("r0", 0.0, 8192, 65, None, [1] * 256, request, expected)
    exact = _record("r0", 0.0, expected.ttft_s + 64 * (expected.tpot_s or 0.0))
    exact.first_token_s = expected.ttft_s
    exact.routed_s = expected.route_s
    exact.kv_arrived_s = expected.route_s + (expected.kv_transfer_s or 0.0)
    exact.output_tokens = 65
    assert summarise([judge(probe, exact, 0.5)], 0.02)["passed"]
    busy = summarise([judge(probe, exact, -0.1)], 0.02)
    assert not busy["passed"] and busy["not_idle"] == ["r0"]
    assert not summarise([judge(probe, exact, None)], 0.02)["passed"]


def test_a_cell_over_its_bound_says_how_late_its_route_was_and_its_error_without_that() -> None:
    """A 64K-token prompt with a 90 % hit whose route came 10 ms late, its KV on time: the KV
    transfer (timed from the route) is 2.1 % short, over the bound. validation.json's `over`
    and validation.md name the cell, the route's lateness and the error with the route on
    time (0 %): the routing exchange's lateness put it over, not the rest of the pipeline."""
    from pddemu.validate.analytic import Probe, judge, summarise
    from pddemu.validate.cli import markdown
    from pddemu.validate.invariance import METRICS

    model = ClosedForm(load_config())
    request = Request("pdd", "P-MD", 65536, 58944, 2)
    expected = model.predict(request)
    probe = Probe("r0", 0.0, 65536, 2, None, [1] * 2048, request, expected)
    record = _record("r0", 0.0, expected.ttft_s + (expected.tpot_s or 0.0))
    record.first_token_s = expected.ttft_s
    record.routed_s = expected.route_s + 0.010
    record.kv_arrived_s = expected.route_s + (expected.kv_transfer_s or 0.0)
    record.output_tokens = 2
    result = summarise([judge(probe, record, 0.5)], 0.02)
    assert not result["passed"]
    (cell,) = result["over"]
    assert (cell["pipeline"], cell["metric"]) == ("pdd P-MD", "kv_transfer_s")
    assert cell["relative_error"] == pytest.approx(-0.010 / (expected.kv_transfer_s or 1.0))
    assert cell["route_excess_s"] == pytest.approx(0.010)
    assert cell["relative_error_without_late_route"] == pytest.approx(0.0, abs=1e-9)
    nothing = _no_variants(METRICS)
    table = markdown({"analytic": result, "invariance": {"time": nothing, "tokens": nothing}})
    assert "- pdd P-MD 65536 tokens, 58944 hit, kv_transfer_s: -2.1%; route +10.0 ms; " in table
    assert "+0.0% with it on time" in table
    # an estimate under its assumption, said so in both (not a measurement)
    assert result["without_late_route_is"].startswith("an estimate, not a measurement")
    assert f"The error with the route on time is {result['without_late_route_is']}." in table


def _no_variants(metrics: dict) -> dict:
    """An invariance block with no variant (the markdown's analytic part is what is read)."""
    spread = dict.fromkeys(metrics)
    return {"measured": {"ref": {}}, "reference": "ref", "tolerance": 0.03, "variants": {},
            "seed_spread": spread}  # fmt: skip
