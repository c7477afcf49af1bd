"""A participant's view of the shared clock (sleeps that follow the rate, holds, lag) and the
dilation controller's decisions, on a fake wall clock where timing does not matter."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from pathlib import Path

import pytest

from netem.clock import ROUTING_ENDED_SLOT, ClockError, SharedClock, routing_slot
from pddemu.runtime.clock import CONTROLLED_KINDS, PRECISE_WALL_S, SHORT_NAP_S, ModelledClock
from pddemu.runtime.dilation import AUTO_CEILING, AUTO_START, Dilation, DilationPolicy
from tests.netem.test_clock import FakeWall
from tests.netem.test_routing_hold import DELAY_S, shaper_on


def test_sleep_until_follows_a_speed_up_while_sleeping(tmp_path: Path) -> None:
    """Asleep at rate 1 for a modelled second, the clock speeds up 100-fold after 50 ms: the
    sleeper wakes within a few wall ms of the new deadline, not a second later."""
    shared = SharedClock.create(tmp_path / "clock", rate=1.0, ceiling=100.0)
    clock = ModelledClock(shared, shared.claim("sleeper"))
    controller = SharedClock(tmp_path / "clock")

    async def scenario() -> tuple[float, float]:
        async def speed_up() -> None:
            await asyncio.sleep(0.05)
            controller.set_rate(100.0)

        task = asyncio.ensure_future(speed_up())
        started = time.monotonic()
        late = await clock.sleep_until(clock.now() + 1.0)
        await task
        return time.monotonic() - started, late

    wall, late = asyncio.run(scenario())
    assert 0.05 < wall < 0.2  # 50 ms at rate 1, then ~9.5 ms at rate 100
    assert late < 0.05 * 100  # modelled: at most a few wall ms late at rate 100
    assert clock.now() >= 1.0


def _sleep_under_the_fastest_rise(
    tmp_path: Path, naps: list[float], nap_at_present_rate: bool = False
) -> tuple[float, float]:
    """A sleeper on a fake wall clock (its naps recorded) for 2 modelled seconds, while a
    controller raises the rate every wall millisecond as far as the promise allows. Returns
    how late it woke (modelled s) and the rate at its end."""
    tmp_path.mkdir(exist_ok=True)
    wall = FakeWall()
    shared = SharedClock.create(tmp_path / "clock", rate=1.0, monotonic=wall, ceiling=64.0)
    policy = DilationPolicy(ceiling=64.0, start=1.0)
    shared.set_growth(policy.growth_per_s)
    clock = ModelledClock(shared, shared.claim("sleeper"))

    test_thread = threading.get_ident()
    real_sleep = asyncio.sleep

    async def fake_sleep(seconds: float) -> None:
        if threading.get_ident() != test_thread:  # another test's leftover loop: not ours
            return await real_sleep(seconds)
        naps.append(seconds)
        while seconds > 0:
            step = min(seconds, 0.001)
            wall.advance(step)
            seconds -= step
            shared.set_rate(min(64.0, 1e9 * shared.rate))  # clamped to the promise

    async def scenario() -> float:
        asyncio.sleep = fake_sleep  # type: ignore[assignment]
        try:
            if nap_at_present_rate:  # what ignoring the promise would do: one nap
                target = clock.now() + 2.0
                await fake_sleep(shared.wall_delay(target))
                return clock.now() - target
            return await clock.sleep_until(clock.now() + 2.0)
        finally:
            asyncio.sleep = real_sleep

    late = asyncio.run(scenario())
    print(f"naps {len(naps)}, late {late:.3g} s, rate {shared.rate:.3g}")
    return late, shared.rate


def test_a_sleeper_naps_long_under_a_promise_and_a_rise_never_makes_it_late(
    tmp_path: Path,
) -> None:
    """Under the controller's promise on the rate's rise, a sleeper naps until its time at
    that bound: a handful of naps for 2 modelled seconds (at 2 ms naps: hundreds), and the
    fastest rise allowed makes it late by at most SHORT_NAP_S x the rise within one nap."""
    naps: list[float] = []
    late, rate = _sleep_under_the_fastest_rise(tmp_path, naps)
    assert rate > 1.5  # the rate did rise, as fast as promised
    assert len(naps) <= 25
    growth = DilationPolicy(ceiling=64.0, start=1.0).growth_per_s
    tolerance = SHORT_NAP_S * rate * (math.exp(growth * 2 * SHORT_NAP_S) - 1)
    assert 0 <= late <= tolerance
    # The same rise against one nap at the present rate: late by far more (what the test
    # would catch in a sleeper ignoring the bound).
    naps_ignoring: list[float] = []
    late_ignoring, _ = _sleep_under_the_fastest_rise(
        tmp_path / "ignoring", naps_ignoring, nap_at_present_rate=True
    )
    assert late_ignoring > 100 * tolerance


def test_the_page_keeps_the_promise_on_the_rates_rise(tmp_path: Path) -> None:
    wall = FakeWall()
    shared = SharedClock.create(tmp_path / "clock", rate=1.0, monotonic=wall, ceiling=64.0)
    assert shared.set_rate(8.0) == 8.0  # no promise yet: up to the ceiling
    shared.set_growth(math.log(2.0))  # at most doubling per wall second
    assert shared.fastest_rate() == pytest.approx(8.0)
    wall.advance(1.0)
    assert shared.set_rate(64.0) == pytest.approx(16.0)  # clamped: doubled in that second
    assert shared.set_rate(4.0) == 4.0  # down at once
    assert shared.fastest_rate() == pytest.approx(4.0)  # and the promise grows from there
    with pytest.raises(ClockError, match="promise"):
        shared.set_growth(math.log(3.0))  # a promise is never loosened
    shared.set_growth(math.log(1.5))
    wall.advance(1.0)
    assert shared.fastest_rate() == pytest.approx(6.0)
    # 1.5 modelled seconds away, the rate 4 but allowed 6 now and rising: a nap just under
    # 1.5 / 6 (at 6 throughout: 0.25 s; at the promise's rise: 0.238 s), over 1.5 / 64
    assert 0.23 < shared.earliest_wall_delay(shared.now() + 1.5) < 0.25


def test_sleep_until_waits_behind_a_hold_and_wakes_at_its_release(tmp_path: Path) -> None:
    shared = SharedClock.create(tmp_path / "clock", rate=50.0)
    sleeper = ModelledClock(shared, shared.claim("sleeper"))
    worker = ModelledClock(SharedClock(tmp_path / "clock"), shared.claim("worker"))

    async def scenario() -> float:
        target = sleeper.now() + 1.0  # 20 ms away at rate 50
        with worker.holding(sleeper.now() + 0.5) as held:
            assert held == pytest.approx(sleeper.now() + 0.5, abs=0.05)
            sleep = asyncio.ensure_future(sleeper.sleep_until(target))
            await asyncio.sleep(0.1)  # genuine work five times longer than the step
            assert not sleep.done()
            assert sleeper.now() == pytest.approx(held)  # time stands at the hold
        return await sleep

    late = asyncio.run(scenario())
    assert late < 0.5  # woke within a few wall ms of the release + 10 ms
    assert shared.slots()[1].holds_binding == 1


def test_lag_is_recorded_by_kind_and_counted_in_the_slot(tmp_path: Path) -> None:
    shared = SharedClock.create(tmp_path / "clock")
    shared.set_lag_target(0.01)
    clock = ModelledClock.attach(tmp_path / "clock", "FE0")
    assert clock.count_lag("send", 0.02) == 0.02
    assert clock.count_lag("handler", -1.0) == 0.0
    assert clock.count_lag("delivery", 0.5) == 0.5  # the frontend's reading: reported only
    assert clock.lags["send"] == [0.02] and clock.lags["handler"] == [0.0]
    assert clock.lags["delivery"] == [0.5]
    (report,) = shared.slots()  # the controller sees the controlled kinds alone
    assert report.lags == 2 and report.lag_max_s == 0.02
    clock.close()
    assert shared.slots() == []


def test_a_fixed_rate_clock_needs_no_page() -> None:
    clock = ModelledClock.fixed(time.monotonic(), 1000.0)
    with clock.holding(5.0) as held:
        assert held == 5.0
    assert asyncio.run(clock.sleep_until(clock.now() + 1.0)) < 20.0  # 1 ms of wall time


def _dilation(
    tmp_path: Path, policy: DilationPolicy, *participants: str
) -> tuple[Dilation, SharedClock, FakeWall]:
    wall = FakeWall()
    shared = SharedClock.create(tmp_path / "clock", monotonic=wall, ceiling=policy.ceiling)
    shared.set_lag_target(0.001)
    for name in participants:
        shared.claim(name)
    return Dilation(shared, policy), shared, wall


def test_the_controller_slows_down_on_lag_and_speeds_up_when_calm(tmp_path: Path) -> None:
    policy = DilationPolicy(ceiling=16.0, start=8.0, cooldown_periods=0)
    dilation, shared, wall = _dilation(tmp_path, policy, "MD0")  # the target: 1 ms
    md = 0
    for _ in range(40):
        shared.count_lag(md, 0.0002)  # well within the target
    wall.advance(0.05)
    assert dilation.step() == pytest.approx(8.0 * policy.increase)
    for _ in range(40):
        shared.count_lag(md, 0.0017)  # the window's mean is now 0.95 ms: within, not calm
    wall.advance(0.05)
    assert dilation.step() == pytest.approx(8.0 * policy.increase)
    for _ in range(20):
        shared.count_lag(md, 0.003)  # the mean is over the target
    wall.advance(0.05)
    assert dilation.step() == pytest.approx(8.0 * policy.increase * policy.decrease)
    shared.count_lag(md, 0.05)  # fifty times over: the cut is harder
    wall.advance(0.05)
    rate = dilation.step()
    assert rate == pytest.approx(8.0 * policy.increase * policy.decrease * policy.hard_decrease)
    for _ in range(200):
        wall.advance(0.05)
        rate = dilation.step()  # no news: back towards where it started, no further
    assert rate == pytest.approx(8.0)
    for _ in range(200):
        for _ in range(policy.calm_samples):
            shared.count_lag(md, 0.0)
        wall.advance(0.05)
        rate = dilation.step()
    assert rate == 16.0  # calm: faster, never beyond the ceiling
    assert shared.rate == 16.0
    assert dilation.slowed_by == {"lag handler MD0": 2}  # both cuts charged to the one who lagged


def test_lag_that_grows_with_the_rate_settles_near_the_target_never_over_it(
    tmp_path: Path,
) -> None:
    """A participant whose every message costs a fixed wall time (a hop between processes)
    lags that cost times the rate: the rate settles just under target / cost, and the mean
    lag stays within the target (at a calm share of 0.5 it settled at half that rate)."""
    policy = DilationPolicy(ceiling=64.0, start=2.0)
    dilation, shared, wall = _dilation(tmp_path, policy, "FE0")  # the target: 1 ms
    hop_s = 0.00025  # wall seconds a message takes: 1 ms of modelled lag at x4
    rates, lags = [], []
    for _ in range(2000):  # 100 wall seconds
        rate = shared.rate
        for _ in range(10):
            lag = hop_s * rate * (1.2 if len(rates) % 7 == 0 else 0.95)  # some noise
            shared.count_lag(0, lag, kind=1)
            lags.append(lag)
        wall.advance(policy.period_s)
        rates.append(dilation.step())
    settled = rates[len(rates) // 2 :]
    assert 0.7 * 4.0 <= sum(settled) / len(settled) <= 4.0
    assert sum(lags[len(lags) // 2 :]) / (len(lags) // 2) <= 0.001


def test_a_late_rare_kind_is_not_hidden_by_a_frequent_one_on_time(tmp_path: Path) -> None:
    policy = DilationPolicy(ceiling=16.0, start=8.0, cooldown_periods=0)
    dilation, shared, wall = _dilation(tmp_path, policy, "replayer", "P0")  # the target: 1 ms
    replayer, p = 0, 1
    for _ in range(100):
        shared.count_lag(replayer, 0.0, kind=1)  # requests sent on time
    for _ in range(policy.min_samples):
        shared.count_lag(p, 0.002, kind=0)  # messages handled 2 ms late: over the target
    wall.advance(0.05)
    assert dilation.step() == pytest.approx(8.0 * policy.decrease)  # pooled: 0.06 ms, calm
    assert dilation.slowed_by == {"lag handler P0": 1}
    report = next(r for r in shared.slots() if r.name == "P0")
    assert report.lag_by_kind[0] == (3, 0.006) and report.lags == 3


def test_each_slow_down_names_its_kind_and_participant_in_the_timeline(tmp_path: Path) -> None:
    """What held the clock back is in summary.json twice: counted by cause ("lag <kind>
    <name>", "hold <name>") and marked on the timeline point the decrease set."""
    policy = DilationPolicy(ceiling=16.0, start=8.0, cooldown_periods=0, increase=1.0, recover=1.0)
    dilation, shared, wall = _dilation(tmp_path, policy, "replayer", "P0")  # the target: 1 ms
    replayer, p = 0, 1
    start = (wall.t, shared.now())
    for _ in range(policy.min_samples):
        shared.count_lag(replayer, 0.002, kind=CONTROLLED_KINDS.index("send"))
        shared.count_lag(p, 0.0001, kind=CONTROLLED_KINDS.index("handler"))
    wall.advance(0.05)
    assert dilation.step() == pytest.approx(8.0 * policy.decrease)
    wall.advance(0.05)
    assert dilation.step() == pytest.approx(8.0 * policy.decrease)  # nothing new: no cause
    shared.hold(p, shared.now() + 0.01)
    wall.advance(0.1)  # the hold stands the clock still for most of the window's 0.15 s
    shared.release(p)
    assert dilation.step() == pytest.approx(8.0 * policy.decrease * policy.hard_decrease)
    assert dilation.slowed_by == {"lag send replayer": 1, "hold P0": 1}
    summary = dilation.summary((start[0], wall.t), (start[1], shared.now()))
    marked = [(p["wall_per_modelled_s"], p.get("slowed_by")) for p in summary["timeline"]]
    assert marked == [
        (pytest.approx(1 / 8.0), None),
        (pytest.approx(1 / (8.0 * policy.decrease)), "lag send replayer"),
        (pytest.approx(1 / (8.0 * policy.decrease * policy.hard_decrease)), "hold P0"),
    ]


def test_late_steps_slow_the_clock_while_holds_stand_within_their_share(tmp_path: Path) -> None:
    """A step whose work began after its end lags (a late wake-up times the rate) and holds do
    not cover it: at a frozen share of 0.2, where the holds alone leave the rate be, the
    controller slows down for step lag over the target, as for late messages (before, the page
    did not count steps, and such a run was judged not valid on its step lag)."""
    policy = DilationPolicy(ceiling=AUTO_CEILING, start=8.0, frozen_ok=0.2, cooldown_periods=0)
    dilation, shared, wall = _dilation(tmp_path, policy)  # the target: 1 ms
    rld = ModelledClock(shared, shared.claim("RLD0"), "RLD0")
    for _ in range(20):
        rld.count_lag("step", 0.0002)  # steps on time (or nearly), with holds of 10 %
    shared.hold(rld.slot, shared.now())
    wall.advance(0.005)
    shared.release(rld.slot)
    wall.advance(0.045)
    assert dilation.step() == pytest.approx(8.0 * policy.increase)
    for _ in range(40):
        rld.count_lag("step", 0.003)  # the window's mean is now over the target
    wall.advance(0.05)
    assert dilation.step() == pytest.approx(8.0 * policy.increase * policy.decrease)
    assert dilation.slowed_by == {"lag step RLD0": 1}


def test_no_climb_past_a_bursts_rate_while_the_runs_mean_of_a_kind_is_over_the_target(
    tmp_path: Path,
) -> None:
    """Steps late in rare bursts: the window that saw the burst slows the clock, and the calm
    windows after it sped it up again past the burst's rate, run mean over the target or not
    (naive's step lag ended 0.68 ms over its 0.48 ms bound so, at frozen share 0.2). While the
    run's mean of a kind is over the target the rate rises no higher than one slow-down below
    the rate at which it went over; once on-time samples bring it back, it rises past that."""
    policy = DilationPolicy(ceiling=16.0, start=8.0, cooldown_periods=0)
    dilation, shared, wall = _dilation(tmp_path, policy)  # the target: 1 ms
    md = ModelledClock(shared, shared.claim("MD0"), "MD0")
    for _ in range(10):
        md.count_lag("step", 0.0)
    md.count_lag("step", 0.05)  # a burst at rate 8: the run's mean is 4.5 ms
    wall.advance(0.05)
    assert dilation.step() == pytest.approx(8.0 * policy.hard_decrease)
    limit = 8.0 * policy.decrease
    rate = 8.0 * policy.hard_decrease
    for calm_periods in range(1, 39):  # the run's mean of steps: 0.05 s over 11 + that many
        md.count_lag("step", 0.0)  # calm: one step on time a period ...
        for _ in range(policy.calm_samples):
            md.count_lag("handler", 0.0)  # ... among messages on time
        wall.advance(0.05)
        rate = min(limit, rate * policy.increase)
        assert dilation.step() == pytest.approx(rate), calm_periods
    assert rate == limit  # reached, not passed
    md.count_lag("step", 0.0)
    md.count_lag("step", 0.0)  # 0.05 s over 51 steps: within
    for _ in range(policy.calm_samples):
        md.count_lag("handler", 0.0)
    wall.advance(0.05)
    assert dilation.step() == pytest.approx(limit * policy.increase)
    assert dilation.slowed_by == {"lag step MD0": 1}


def test_after_a_burst_a_long_calm_lets_the_rate_recover(tmp_path: Path) -> None:
    """A burst of a rare kind (a few messages handled late among many steps on time) may put
    its run mean over the target for good: too few of it come after to bring it back. Calm
    windows then let the rate rise back to one slow-down below the burst's rate, not past it
    (before, the rate stayed where the burst's slow-down left it for the rest of the run)."""
    policy = DilationPolicy(ceiling=16.0, start=8.0, cooldown_periods=0)
    dilation, shared, wall = _dilation(tmp_path, policy)  # the target: 1 ms
    rld = ModelledClock(shared, shared.claim("RLD0"), "RLD0")
    for lag in (0.0, 0.0, 0.02, 0.015, 0.015):
        rld.count_lag("handler", lag)  # handled late at rate 8: the run's mean is 10 ms
    wall.advance(0.05)
    assert dilation.step() == pytest.approx(8.0 * policy.hard_decrease)
    rates = []
    for _ in range(400):  # 20 wall seconds of steps on time, no message
        for _ in range(10):
            rld.count_lag("step", 0.0)
        wall.advance(0.05)
        rates.append(dilation.step())
    assert max(rates) == pytest.approx(8.0 * policy.decrease)  # back up, not past the burst's
    assert rates[-1] == pytest.approx(8.0 * policy.decrease)
    assert dilation.slowed_by == {"lag handler RLD0": 1}


def test_packets_the_shaper_releases_late_slow_the_clock(tmp_path: Path) -> None:
    """The shaper counts each packet's release lag on the clock page too (its "shaper" slot),
    in the batch it writes out, so the controller keeps that kind's mean within its target."""
    page = tmp_path / "clock"
    SharedClock.create(page, rate=1.0)
    shaper, link = shaper_on(page, tmp_path)
    controller = SharedClock(page)
    controller.set_lag_target(0.005)  # the packets leave 10 ms late or more: over the target
    policy = DilationPolicy(ceiling=1.0, start=1.0, cooldown_periods=0)
    dilation = Dilation(controller, policy)
    try:
        for index in range(policy.min_samples):
            link.far["a"].send(f"packet {index}".encode())
        source = shaper.routes[0].source_fd
        shaper.turn([source], shaper.now(), early=0.0)
        time.sleep(DELAY_S + 0.01)  # the shaper's turn comes 10 ms late
        shaper.turn([], shaper.now(), early=0.0)
        assert shaper.routes[0].direction.next_exit() == math.inf
        (report,) = [r for r in controller.slots() if r.name == "shaper"]
        count, total = report.lag_by_kind[CONTROLLED_KINDS.index("release")]
        assert count == policy.min_samples
        assert total == pytest.approx(shaper.release_lag.total_s)
        assert total >= policy.min_samples * 0.009
        assert dilation.step() < policy.start  # by 0.8, or 0.5 if a loaded host made it 20 ms
        assert dilation.slowed_by == {"lag release shaper": 1}
    finally:
        shaper.control.close()
        link.close()
        controller.close()


def test_one_sample_of_a_rare_kind_a_little_late_does_not_cut_the_rate(tmp_path: Path) -> None:
    """A kind is judged on its mean once the window has `min_samples` of it, or its lag alone
    adds up to that many targets: one message 2 ms late (target 1 ms) is noise; one 5 ms late,
    or a third late message, is not."""
    policy = DilationPolicy(ceiling=16.0, start=8.0, cooldown_periods=0, increase=1.0)
    dilation, shared, wall = _dilation(tmp_path, policy, "FE0", "P0")
    fe, p = 0, 1
    for _ in range(20):
        shared.count_lag(fe, 0.0, kind=1)
    shared.count_lag(p, 0.002, kind=0)
    wall.advance(0.05)
    assert dilation.step() == 8.0
    shared.count_lag(p, 0.0005, kind=0)
    wall.advance(0.05)
    assert dilation.step() == 8.0  # two samples, 2.5 ms in all: still too few to tell
    shared.count_lag(p, 0.002, kind=0)  # three: mean 1.5 ms, over the target
    wall.advance(0.05)
    assert dilation.step() == pytest.approx(8.0 * policy.decrease)
    shared.count_lag(p, 0.005, kind=0)  # alone, but five targets late: judged at once
    wall.advance(0.05)
    assert dilation.step() == pytest.approx(8.0 * policy.decrease * policy.hard_decrease)
    assert dilation.slowed_by == {"lag handler P0": 2}


def test_an_instant_hold_stands_time_still_until_its_last_holder_releases(
    tmp_path: Path,
) -> None:
    """The router's instant holds: several at once hold one instant, time goes on when the
    last is released, or by itself after the cap; and their frozen time does not slow the
    clock down (it is by design, whatever the rate)."""
    policy = DilationPolicy(ceiling=50.0, start=50.0, increase=1.0)
    shared = SharedClock.create(tmp_path / "clock", rate=50.0)
    shared.set_lag_target(0.001)
    dilation = Dilation(shared, policy)
    clock = ModelledClock.attach(tmp_path / "clock", "FE0")

    async def scenario() -> None:
        first = clock.hold_instant()
        held = clock.now()
        second = clock.hold_instant()
        await asyncio.sleep(0.02)  # a modelled second at rate 50
        assert clock.now() == held
        first.release()
        first.release()  # again: nothing
        await asyncio.sleep(0.02)
        assert clock.now() == held  # the second still holds
        second.release()
        await asyncio.sleep(0.02)
        assert clock.now() > held + 0.5
        capped = clock.hold_instant(cap_s=0.02)
        at = clock.now()
        await asyncio.sleep(0.06)
        assert capped.released and clock.now() > at + 1.0  # went on by itself

    asyncio.run(scenario())
    assert next(r for r in shared.slots() if r.name == "FE0/instant").holds_binding == 2
    assert dilation.step() == 50.0 and dilation.slowed_by == {}
    clock.close()
    assert [r.name for r in shared.slots()] == []


def test_holds_that_stand_the_clock_still_slow_it_down(tmp_path: Path) -> None:
    dilation, shared, wall = _dilation(tmp_path, DilationPolicy(ceiling=8.0, start=8.0), "P0")
    p = 0
    shared.hold(p, shared.now() + 0.01)
    wall.advance(0.05)  # reached after 1.25 ms, then stood for 48.75 ms: most of the period
    shared.release(p)
    assert dilation.step() == pytest.approx(8.0 * 0.5)
    wall.advance(0.05)
    assert dilation.step() == pytest.approx(8.0 * 0.5)  # cooling down: no second cut at once
    assert dilation.slowed_by == {"hold P0": 1}


def test_holds_slow_the_clock_only_where_a_slow_down_could_win_their_time_back(
    tmp_path: Path,
) -> None:
    """A hold keeps results exact and costs speed only: rate x (1 - frozen share) modelled
    seconds per wall second. Slowing by 0.8 can raise that only where holds stood more than
    20 % of the window's wall time, so the default policy lets shorter holds be: a step's
    10 ms hold in half a second (2 %; the 1 % of before cut the rate for it) and holds of 15 %
    leave the rate alone, 30 % slows it by 0.8, 60 % halves it."""
    policy = DilationPolicy.for_time_scale(None)  # the default policy, start 2
    dilation, shared, wall = _dilation(tmp_path, policy, "RLD0")
    rld = 0

    def window_with_a_hold(share: float) -> float:
        """A window of quiet periods (a slowed rate recovers in them), the last with a hold
        that stands the clock still for `share` of the window's wall time."""
        running_s = policy.window_periods * policy.period_s
        for _ in range(policy.window_periods - 1):
            wall.advance(policy.period_s)
            dilation.step()
        shared.hold(rld, shared.now())
        wall.advance(share * running_s / (1 - share))
        shared.release(rld)
        wall.advance(policy.period_s)
        return dilation.step()

    assert window_with_a_hold(0.02) == AUTO_START
    assert window_with_a_hold(0.15) == AUTO_START
    assert dilation.slowed_by == {}
    assert window_with_a_hold(0.3) == pytest.approx(AUTO_START * policy.decrease)
    assert window_with_a_hold(0.6) == pytest.approx(AUTO_START * policy.hard_decrease)
    assert dilation.slowed_by == {"hold RLD0": 2}


def test_auto_has_a_ceiling_and_every_run_starts_low() -> None:
    auto = DilationPolicy.for_time_scale(None)
    assert auto.ceiling == AUTO_CEILING and auto.start == AUTO_START < auto.ceiling
    fixed = DilationPolicy.for_time_scale(4.0)
    assert fixed.ceiling == 4.0 and fixed.start == AUTO_START
    slow = DilationPolicy.for_time_scale(1.0)
    assert slow.ceiling == slow.start == 1.0


def test_the_dilation_summary_is_wall_per_modelled_second(tmp_path: Path) -> None:
    policy = DilationPolicy(ceiling=4.0, start=4.0, increase=1.0, recover=1.0)
    dilation, shared, wall = _dilation(tmp_path, policy)
    start = (wall.t, shared.now())
    wall.advance(1.0)  # 4 modelled s
    shared.set_rate(2.0)
    dilation.step()
    wall.advance(1.0)  # 2 more
    summary = dilation.summary((start[0], wall.t), (start[1], shared.now()))
    assert summary["mean"] == pytest.approx(2.0 / 6.0)
    assert summary["speedup"] == pytest.approx(3.0)
    assert summary["min"] == pytest.approx(0.25) and summary["max"] == pytest.approx(0.5)
    assert summary["timeline"][0]["modelled_s"] == 0.0
    empty = dilation.summary((0.0, 0.0), (5.0, 5.0))
    assert empty["mean"] is None


def test_a_dead_participants_hold_is_released(tmp_path: Path) -> None:
    dilation, shared, wall = _dilation(tmp_path, DilationPolicy(ceiling=1.0, start=1.0))
    ghost = shared.claim("ghost", pid=2**22 + 12345)  # no such process
    shared.hold(ghost, 0.0)
    wall.advance(1.0)
    assert shared.now() == pytest.approx(0.0)
    assert dilation.release_dead() == ["ghost"]
    wall.advance(1.0)
    assert shared.now() == pytest.approx(1.0)


def test_a_precise_sleep_blocks_its_last_stretch_under_a_promise(tmp_path: Path) -> None:
    """With `precise`, the last asyncio nap ends PRECISE_WALL_S before the deadline at the
    present rate even under a promise (whose safe nap lies just under the deadline), so the
    loop's millisecond timers cannot make the replayer's requests leave late."""
    wall = FakeWall()
    shared = SharedClock.create(tmp_path / "clock", rate=1.0, monotonic=wall, ceiling=64.0)
    shared.set_growth(DilationPolicy(ceiling=64.0, start=1.0).growth_per_s)
    clock = ModelledClock(shared, shared.claim("replayer"))
    naps: list[float] = []
    blocked: list[float] = []

    test_thread = threading.get_ident()
    real_sleep, real_block = asyncio.sleep, time.sleep

    async def fake_sleep(seconds: float) -> None:
        if threading.get_ident() != test_thread:  # another test's leftover loop: not ours
            return await real_sleep(seconds)
        naps.append(seconds)
        wall.advance(seconds)

    def fake_block(seconds: float) -> None:
        if threading.get_ident() != test_thread:
            return real_block(seconds)
        blocked.append(seconds)
        wall.advance(seconds)

    async def scenario() -> float:
        asyncio.sleep, time.sleep = fake_sleep, fake_block  # type: ignore[assignment]
        try:
            return await clock.sleep_until(clock.now() + 0.005, precise=True)
        finally:
            asyncio.sleep, time.sleep = real_sleep, real_block  # type: ignore[assignment]

    asyncio.run(scenario())
    # One nap to PRECISE_WALL_S before the deadline, then the rest blocks (on the fake wall
    # a rounding residue may add a poll after it: not the loop's timers, left unchecked).
    assert naps and naps[0] == pytest.approx(0.005 - PRECISE_WALL_S, abs=1e-9)
    assert blocked and blocked[0] == pytest.approx(PRECISE_WALL_S, abs=1e-9)


def test_a_routing_slot_given_back_counts_its_frozen_time_once(tmp_path: Path) -> None:
    """The shaper gives back a connection's routing slot, its counters added to
    ROUTING_ENDED_SLOT's (`SharedClock.free_into`): the controller counts that slot's instant
    hold once, so a participant's hold in the same period still slows the clock. Counted
    twice, it would hide that hold's frozen time."""
    policy = DilationPolicy(ceiling=8.0, start=8.0, frozen_ok=0.2, cooldown_periods=0)
    dilation, shared, wall = _dilation(
        tmp_path, policy, "P0", ROUTING_ENDED_SLOT, routing_slot(bytes(4), 1, bytes(4), 2)
    )
    p, ended, connection = 0, 1, 2
    shared.hold(connection, shared.now())
    wall.advance(0.2)  # a routing hold: instant, no slow-down
    shared.release(connection)
    assert dilation.step() == 8.0
    shared.free_into(connection, ended)
    shared.hold(p, shared.now())
    wall.advance(0.3)  # P0 stands the clock still for most of the window
    shared.release(p)
    assert dilation.step() == pytest.approx(8.0 * 0.5)
    assert dilation.slowed_by == {"hold P0": 1}
