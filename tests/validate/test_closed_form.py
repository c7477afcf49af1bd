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
