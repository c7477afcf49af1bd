"""The handoff rule (pddemu.policy.handoff): the stall each mode is predicted to give, the lead
(and its pace) that hides it, and the adaptive choice between one-shot and catch-up."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pddemu.config import load_config
from pddemu.policy.handoff import (
    CATCH_UP,
    ONE_SHOT,
    PACE_SLACK,
    DelayEstimate,
    HandoffOutlook,
    Lead,
    choose_mode,
    lead,
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


def test_stopping_at_once_stalls_a_round_trip_plus_md_steps_plus_absorbing() -> None:
    o = outlook()
    assert stall_s(o, 200, Lead(0, 0.0)) == pytest.approx(0.040 + 0.012 + 0.012 + 0.02)


def test_a_slower_relay_hides_the_gap_at_its_own_pace() -> None:
    slow_relay = outlook(relay_step_s=0.030)  # r - m = 18 ms
    planned = lead(slow_relay, 10, most=64)
    assert planned == Lead(math.ceil((0.040 + 0.012 + 0.013) / 0.018), 0.030)
    assert stall_s(slow_relay, 10, planned) == pytest.approx(0.030 - 0.012)  # its own pace
    assert lead(outlook(relay_step_s=0.0121), 10, most=64).tokens == 64  # capped


def test_a_faster_relay_spreads_the_gap_over_its_lead() -> None:
    o = outlook()  # r = 10 ms < m = 12 ms
    behind = 0.040 + 0.012 + 0.013
    planned = lead(o, 10, most=64)
    assert planned.tokens == math.ceil(behind / (PACE_SLACK * 0.012))
    assert planned.pace_s == pytest.approx(0.012 + behind / planned.tokens)
    # MD's first token comes one MD step after the lead's last: no stall at the switch, and
    # each of the lead's gaps is late by at most PACE_SLACK of an MD step
    assert stall_s(o, 10, planned) == pytest.approx(behind / planned.tokens)
    assert stall_s(o, 10, planned) <= PACE_SLACK * 0.012 + 1e-12
    few = lead(o, 10, most=4)  # too few positions allowed: each gap takes a larger share
    assert few.tokens == 4 and few.pace_s == pytest.approx(0.012 + behind / 4)


def test_adaptive_picks_catch_up_when_the_relay_has_room() -> None:
    for relay_step in (0.010, 0.030):  # faster or slower than MD
        o = outlook(relay_step_s=relay_step)
        stalls = predicted_stalls(o, 64)
        assert stalls[ONE_SHOT] - stalls[CATCH_UP] > o.relay_step_s
        assert choose_mode(POLICY, o) == CATCH_UP


def test_adaptive_picks_one_shot_when_catch_up_cannot_do_better() -> None:
    # no room for a lead (threshold 0): catch-up only shrinks the final part, and absorbing a
    # part costs the same whatever its size
    cheap = outlook(absorb_s=lambda k: 0.012)
    no_lead = CONFIG.with_policy(catch_up_threshold_tokens=0).policy
    stalls = predicted_stalls(cheap, 0)
    assert stalls[ONE_SHOT] == pytest.approx(stalls[CATCH_UP])
    assert choose_mode(no_lead, cheap) == ONE_SHOT


def test_adaptive_frees_a_loaded_relay_with_one_shot() -> None:
    loaded = outlook(relay_load=0.8)
    assert predicted_stalls(loaded, 64)[CATCH_UP] < predicted_stalls(loaded, 64)[ONE_SHOT]
    assert choose_mode(POLICY, loaded) == ONE_SHOT


def test_explicit_modes_are_obeyed() -> None:
    one_shot = CONFIG.with_policy(handoff_mode="one-shot").policy
    catch_up = CONFIG.with_policy(handoff_mode="catch-up").policy
    assert choose_mode(one_shot, outlook()) == ONE_SHOT
    assert choose_mode(catch_up, outlook(relay_load=0.9)) == CATCH_UP


def test_delay_estimate_follows_samples_with_a_margin() -> None:
    estimate = DelayEstimate(0.020, 0.002)
    for _ in range(200):
        estimate.observe(0.050)
    assert estimate.mean_s == pytest.approx(0.050, abs=1e-4)
    assert estimate.margin() == pytest.approx(0.050, abs=1e-3)
    for sample in (0.040, 0.060) * 50:
        estimate.observe(sample)
    assert estimate.margin() > estimate.mean_s + 0.01
