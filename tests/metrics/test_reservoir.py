"""What a long `pddemu serve` keeps of its lag samples, TPOTs and timeline events is bounded,
and what it reports from them keeps exact means, maxima and counts."""

from __future__ import annotations

import copy
import json
import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from pddemu.metrics.reservoir import Reservoir
from pddemu.metrics.tcp_totals import TcpTotals
from pddemu.metrics.timing import timing_summary
from pddemu.roles.openai_api import OpenAIFrontDoor
from pddemu.runtime.clock import FixedRate, ModelledClock
from pddemu.runtime.events import EventLog


def test_below_its_capacity_a_reservoir_is_every_value_in_order() -> None:
    kept = Reservoir([0.3, 0.1], capacity=4)
    kept.append(0.2)
    assert kept == [0.3, 0.1, 0.2] and kept.totals() == [3, pytest.approx(0.6), 0.3]
    assert json.loads(json.dumps(kept)) == [0.3, 0.1, 0.2]
    with pytest.raises(ValueError):
        Reservoir(capacity=0)


def test_above_it_a_uniform_sample_of_fixed_size_with_exact_totals() -> None:
    values = list(np.linspace(0, 1, 20_001))
    kept = Reservoir(values, capacity=500)
    assert len(kept) == 500 and set(kept) <= set(values)
    assert kept.seen == 20_001 and kept.largest == 1.0
    assert kept.mean() == pytest.approx(0.5) and kept.total == pytest.approx(sum(values))
    # uniform: the sample's quartiles within 5 standard deviations of the rank (2.2 points)
    assert np.percentile(kept, [25, 50, 75]) == pytest.approx([0.25, 0.5, 0.75], abs=0.05)
    for copied in (pickle.loads(pickle.dumps(kept)), copy.deepcopy(kept)):
        assert copied == kept and copied.totals() == kept.totals()
        assert copied.capacity == 500
    late = Reservoir(capacity=10, seed=0)
    late.extend([0.0] * 1000 + [1.0] * 1000)  # the later half is sampled as the earlier
    assert 2 <= sum(late) <= 8


def test_what_the_stats_report_keeps_the_exact_mean_max_and_count() -> None:
    """An instance's /stats send the sample and its totals; the lag judged and reported uses
    the totals (here the sample kept only the smallest of three)."""
    stats = {
        "P0": {"lags_s": {"step": [0.001]}, "lag_totals_s": {"step": [3, 0.3, 0.2]}},
        "MD0": {"lags_s": {"step": [0.0]}},  # a plain list: every value
    }
    summary = timing_summary(stats, {"send": Reservoir([0.0, 0.002])}, None, {}, 0.01, 0.05)
    assert summary["lag"]["mean_by_kind"] == {"step": pytest.approx(0.3 / 4), "send": 0.001}
    assert summary["lag"]["by_participant"]["P0"]["step"]["count"] == 3
    assert summary["lag"]["by_kind"]["step"]["max"] == 0.2
    assert summary["emulator_lag_s"]["samples"] == 6
    assert summary["emulator_lag_s"]["max"] == 0.2


def test_the_clock_the_events_and_the_door_keep_bounded_samples() -> None:
    clock = ModelledClock.fixed(0.0, 1.0)
    for lag in range(100):
        clock.count_lag("handler", lag * 1e-3)
        clock.count_lag("handler_wan", 1e-3)  # a kind the clock did not start with
    assert all(isinstance(samples, Reservoir) for samples in clock.lags.values())
    assert {clock.lags[k].seen for k in ("handler", "handler_wan")} == {100}
    assert clock.lags["handler"].largest == 0.099

    log = EventLog(capacity=3)
    for i in range(5):
        log.record("decode", f"r{i}", i, i + 1)
        log.begin("decode", f"open{i}", i)  # never ended (its request failed)
    assert [e["rid"] for e in log.events] == ["r2", "r3", "r4"] and log.dropped == 2
    assert len(log._open) == 3

    door = OpenAIFrontDoor.__new__(OpenAIFrontDoor)
    door.tpots_s, door.ttfts_s, door.completed = Reservoir(capacity=100), Reservoir(), 0
    for i in range(1000):
        door._completed(SimpleNamespace(tpot_s=0.01 + (i % 2) * 0.01, ttft_s=0.1 + i * 1e-4))
    assert len(door.tpots_s) == 100 and door.completed == 1000
    assert door.ttfts_s.seen == 1000


def test_reservoirs_fed_in_step_keep_different_samples() -> None:
    """Each kind of lag is appended together: from one seed they would keep the same slots (the
    same appends' values). Each draws from its own name's seed, or, unnamed, its order of making;
    the same name keeps the same sample (a run's sample is reproducible)."""
    named = [Reservoir(capacity=50, seed=f"lag:{kind}") for kind in ("handler", "step", "step")]
    unnamed = [Reservoir(capacity=50) for _ in range(2)]
    for index in range(5000):
        for reservoir in named + unnamed:
            reservoir.append(float(index))
    handler, step, step_again = named
    assert step == step_again
    assert len(set(handler) & set(step)) < 25 and len(set(unnamed[0]) & set(unnamed[1])) < 25
    clock = ModelledClock.fixed(0.0, 1.0)
    for lag in range(1000):
        for kind in ("handler", "step"):
            clock.lags[kind].capacity = 50
            clock.count_lag(kind, lag * 1e-3)
    assert clock.lags["handler"] != clock.lags["step"]


def test_participants_fed_in_step_keep_different_samples_of_one_kind() -> None:
    """Every participant and every sender counts the same kinds, often in step (a step's lag
    on each decode instance, a transfer's RTT on each prefill), and the summaries pool them:
    from one seed per kind they would keep the same slots. The participant's or sender's name
    is in the seed."""
    clocks = [ModelledClock(FixedRate(0.0, 1.0), name=name) for name in ("D0", "D1", "D1")]
    senders = [TcpTotals(name) for name in ("P0", "P1")]
    for clock in clocks:
        clock.lags["step"].capacity = 50
    for sender in senders:
        sender.min_rtt_s["wan"].capacity = sender.delivery_rate_bps["wan"].capacity = 50
    for index in range(5000):
        for clock in clocks:
            clock.count_lag("step", index * 1e-3)
        for sender in senders:
            sender.add(
                {
                    "wan": True,
                    "bytes": 1,
                    "retransmits": 0,
                    "rto_events": 0,
                    "min_rtt_s": 1.0 + index,
                    "delivery_rate_Bps": 1.0 + index,
                }
            )
    d0, d1, d1_again = (set(clock.lags["step"]) for clock in clocks)
    assert len(d0 & d1) < 25 and d1 == d1_again
    p0, p1 = senders
    assert len(set(p0.min_rtt_s["wan"]) & set(p1.min_rtt_s["wan"])) < 25
    assert len(set(p0.delivery_rate_bps["wan"]) & set(p1.delivery_rate_bps["wan"])) < 25


def test_pooled_percentiles_weigh_each_part_by_what_it_saw() -> None:
    """One part sampled down from 200,000 values (2 % of them 10 ms, the rest 0.1 ms) pooled
    with a whole part of 60,000 zeros: the pool's p99 is the true one (10 ms), not the 0.1 ms
    that pooling the kept values alike gives."""
    sampled = Reservoir(capacity=4096)
    for index in range(200_000):
        sampled.append(0.010 if index % 50 == 0 else 0.0001)
    zeros = Reservoir([0.0] * 60_000)
    pool = Reservoir.pooled([sampled, zeros])
    assert pool.seen == 260_000
    share_of_sampled = sum(1 for value in pool if value > 0) / len(pool)
    assert share_of_sampled == pytest.approx(200_000 / 260_000, abs=0.02)
    assert np.percentile(pool, 99) == pytest.approx(0.010)
    assert pool.mean() == pytest.approx((4000 * 0.010 + 196_000 * 0.0001) / 260_000)
    whole = Reservoir.pooled([Reservoir([1.0, 2.0]), Reservoir([3.0])])
    assert list(whole) == [1.0, 2.0, 3.0]  # nothing sampled down: every value, in order
