"""The handoff rule (pddemu.policy.handoff): the stall each mode is predicted to give, the lead
that hides it, and the adaptive choice between one-shot and catch-up."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pddemu.config import load_config
from pddemu.policy.handoff import (
    CATCH_UP,
    ONE_SHOT,
    DelayEstimate,
    HandoffOutlook,
    choose_mode,
    lead_tokens,
    predicted_stalls,
    stall_s,
)

CONFIG = load_config()
POLICY = CONFIG.policy  # adaptive, threshold 64, load threshold 0.75


def outlook(**changes: object) -> HandoffOutlook:
    """A relay at 10 ms a step, MD at 12 ms, a 40 ms round trip, MD absorbing a part in one of
    its steps plus 0.1 ms per token, 200 tokens pending, a quarter-full relay."""
    base = HandoffOutlook(
        pending_tokens=200,
        relay_step_s=0.010,
        md_step_s=0.012,
        round_trip_s=0.040,
        absorb_s=lambda k: 0.012 + 0.0001 * k,
        relay_load=0.25,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_stall_is_round_trip_plus_md_steps_plus_absorbing_the_part() -> None:
    o = outlook()
    assert stall_s(o, 200, 0) == pytest.approx(0.040 + 0.012 + 0.012 + 0.02)
    # each position of lead costs (m - r) more when MD is the slower decoder
    assert stall_s(o, 200, 10) == pytest.approx(0.084 + 10 * 0.002)


def test_a_lead_hides_the_stall_only_when_the_relay_is_slower() -> None:
    slow_relay = outlook(relay_step_s=0.030)  # r - m = 18 ms
    lead = lead_tokens(slow_relay, 10, most=64)
    assert lead == math.ceil((0.040 + 0.012 + 0.013) / 0.018)
    assert stall_s(slow_relay, 10, lead) == 0.0
    assert lead_tokens(outlook(), 10, most=64) == 0  # a faster relay: no lead helps
    assert lead_tokens(outlook(relay_step_s=0.0121), 10, most=64) == 64  # capped


def test_adaptive_picks_catch_up_when_the_relay_is_the_slower_decoder() -> None:
    slow_relay = outlook(relay_step_s=0.030)
    stalls = predicted_stalls(slow_relay, 64)
    assert stalls[CATCH_UP] == 0.0 < stalls[ONE_SHOT]
    assert choose_mode(POLICY, slow_relay) == CATCH_UP


def test_adaptive_picks_one_shot_when_catch_up_saves_less_than_a_relay_step() -> None:
    cheap_parts = outlook(absorb_s=lambda k: 0.012)  # absorbing costs the same whatever k
    stalls = predicted_stalls(cheap_parts, 64)
    assert stalls[ONE_SHOT] == pytest.approx(stalls[CATCH_UP])
    assert choose_mode(POLICY, cheap_parts) == ONE_SHOT


def test_adaptive_picks_catch_up_when_a_big_part_is_slow_to_absorb() -> None:
    # a KV-delta part: every token's KV crosses the WAN before MD has it
    heavy_parts = outlook(absorb_s=lambda k: 0.005 + 0.0004 * k)
    stalls = predicted_stalls(heavy_parts, 64)
    assert stalls[ONE_SHOT] - stalls[CATCH_UP] > heavy_parts.relay_step_s
    assert choose_mode(POLICY, heavy_parts) == CATCH_UP


def test_adaptive_frees_a_loaded_relay_with_one_shot() -> None:
    loaded = outlook(relay_step_s=0.030, relay_load=0.8)
    assert predicted_stalls(loaded, 64)[CATCH_UP] < predicted_stalls(loaded, 64)[ONE_SHOT]
    assert choose_mode(POLICY, loaded) == ONE_SHOT


def test_explicit_modes_are_obeyed() -> None:
    slow_relay = outlook(relay_step_s=0.030)
    one_shot = CONFIG.with_policy(handoff_mode="one-shot").policy
    catch_up = CONFIG.with_policy(handoff_mode="catch-up").policy
    assert choose_mode(one_shot, slow_relay) == ONE_SHOT
    assert choose_mode(catch_up, outlook()) == CATCH_UP


def test_delay_estimate_follows_samples_with_a_margin() -> None:
    estimate = DelayEstimate(0.020, 0.002)
    for _ in range(200):
        estimate.observe(0.050)
    assert estimate.mean_s == pytest.approx(0.050, abs=1e-4)
    assert estimate.margin() == pytest.approx(0.050, abs=1e-3)
    for sample in (0.040, 0.060) * 50:
        estimate.observe(sample)
    assert estimate.margin() > estimate.mean_s + 0.01
