"""Time dilation: the controller that sets the shared clock's rate.

It runs beside the replayer and reads every participant's slot of the clock page (netem.clock)
twenty times a second. When the participants' lag of the last half second averaged more than
the target the page publishes, in any one kind (handler, send, step, release: messages handled
late, requests sent late, steps whose work began after their end, packets the shaper let out
late; each is judged on its own mean, as validity judges it, so frequent messages on time
cannot hide late requests, once the window holds `min_samples` of it or its total alone is
that many targets: one sample of a rare kind a little late is noise, not a trend), or
genuine work held the clock still for more of the wall time than a slow-down could win back
(`FROZEN_OK`), the clock slows down at once (multiplicative decrease, harder when far
behind); when the last half second had enough samples and they averaged well within the
target, it speeds up gently (multiplicative increase), but while a kind's mean over the run
so far, which validity judges, is over the target, no faster than one slow-down below the rate
at which it went over (`_run_limit`): not back into the rate that made the burst; with too few
samples to tell (an idle system, or a clock so slow it hears few messages) it goes back towards
the rate it started at, no further. Never beyond the
ceiling: `scale.time_scale`, or, for `time_scale = "auto"`, `AUTO_CEILING`. Results stay the
modelled system's because everything (compute, network, arrivals) reads the same clock; only
the wall time a run takes changes.

It records the rate over the run so summary.json can say how much the run was dilated (wall
seconds per modelled second) and how fast it really ran, and what made it slow down: each
decrease is charged to the kind of lag (or the holds) that caused it and the participant that
contributed most to it (`slowed_by`: "lag <kind> <name>", e.g. "lag handler P0", or
"hold <name>"), which says which process, and what of its work, bounds the run's speed; the
timeline marks each decrease with that cause.

Instant holds (`pddemu.runtime.clock.INSTANT`: the router's, around an exchange that takes no
modelled time) stand the clock still by design, whatever its rate: their frozen time is not
a sign of a host too slow for the rate, and does not slow the clock down.
"""

from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from netem.clock import (
    LAG_COUNTERS,
    ROUTING_ENDED_SLOT,
    ROUTING_SLOT_PREFIX,
    SharedClock,
    SlotReport,
)
from pddemu.runtime.clock import CONTROLLED_KINDS, INSTANT

AUTO_CEILING = 64.0  # the fastest "auto" may run: a bound, far beyond what a laptop reaches
AUTO_START = 2.0  # where a run begins, at most: low, so a loaded host is not late at first
TIMELINE_STEP_S = 5.0  # modelled seconds between kept timeline points at a steady rate
TIMELINE_CHANGE = 0.1  # a rate this much away from the last kept point is kept too
# A hold stands the clock still while genuine work finishes, so results stay exact however long
# it holds; it costs speed only: a run advances rate x (1 - frozen share) modelled seconds per
# wall second. Slowing by the policy's `decrease` (0.8) can raise that only where holds stood
# the clock still for more than 1 - 0.8 of the wall time, even if it ended them all; below that
# share a slow-down costs more than the holds it saves. The configured default
# (`scale.frozen_share`) is higher, 0.35, measured: holds are left to stand where the lag the
# controller watches (every judged kind) allows the rate (docs/validation.md, 'Out of the bound').
FROZEN_OK = 0.2


@dataclass(frozen=True)
class DilationPolicy:
    """How the controller moves the rate (modelled seconds per wall second).

    It keeps the mean lag of the last `window_periods` decisions within the page's target,
    and the share of wall time holds stood the clock still below `frozen_ok`."""

    ceiling: float
    start: float
    floor: float = 0.02
    period_s: float = 0.05  # wall seconds between decisions
    window_periods: int = 10  # decisions look at this many periods' samples
    calm_samples: int = 5  # a speed-up needs this many samples in the window
    min_samples: int = 3  # a kind's mean is judged from this many samples (or targets of lag)
    # ... averaging at most this share of the target. Lag that is a fixed wall cost (a hop
    # between processes) grows with the rate, so the rate settles where the mean reaches this
    # share: at 0.5 the fake-clock test (lag = hop x rate) settles at 2.12 of the 4 its
    # target allows, at 0.85 at 3.74 (tests/runtime; a real run's speed-up spreads too widely
    # run to run, x0.26-0.48, for one A/B to show it: docs/validation.md).
    calm_share: float = 0.85
    decrease: float = 0.8  # factor on trouble
    hard_decrease: float = 0.5  # factor when four times over the target, or frozen over half
    increase: float = 1.015  # factor per calm period (x1.35 per wall second)
    recover: float = 1.05  # factor per quiet period below the start (x2.7 per wall second)
    cooldown_periods: int = 4  # after a decrease, periods before the next one
    frozen_ok: float = FROZEN_OK  # share of wall time holds may stand the clock still

    @property
    def growth_per_s(self) -> float:
        """The most the rate rises per wall second (natural log): its largest factor per period."""
        return math.log(max(self.increase, self.recover)) / self.period_s

    @classmethod
    def for_time_scale(
        cls, time_scale: float | None, frozen_share: float = FROZEN_OK
    ) -> DilationPolicy:
        """`time_scale` is the fastest rate allowed; None is "auto". Either starts low (a
        loaded host is not late at first, which a short run's lag would show) and speeds up
        from there. `frozen_share`: `scale.frozen_share`."""
        ceiling = AUTO_CEILING if time_scale is None else time_scale
        return cls(ceiling=ceiling, start=min(ceiling, AUTO_START), frozen_ok=frozen_share)


@dataclass
class Dilation:
    clock: SharedClock
    policy: DilationPolicy
    # wall, modelled, rate, and the cause of a decrease that set the rate (else None)
    timeline: list[tuple[float, float, float, str | None]] = field(default_factory=list)
    decreases: int = 0
    slowed_by: dict[str, int] = field(default_factory=dict)  # decreases by cause and participant
    _last: dict[int, SlotReport] = field(default_factory=dict)
    _frozen: float = 0.0
    _wall: float = 0.0
    _cooldown: int = 0
    _window: deque[tuple[tuple[int, ...], tuple[float, ...], float, float]] = field(
        default_factory=deque
    )  # per period: lag samples and sums by kind, frozen wall seconds, wall seconds
    _by_slot: deque[dict[str, tuple[tuple[float, ...], float]]] = field(default_factory=deque)
    # each kind's lag since the controller began (samples, sum): the run's mean, which judges it
    _run_counts: list[int] = field(default_factory=lambda: [0] * LAG_COUNTERS)
    _run_sums: list[float] = field(default_factory=lambda: [0.0] * LAG_COUNTERS)
    _over_at: float | None = None  # the rate at which a kind's run mean went over (None: within)

    def __post_init__(self) -> None:
        if self.clock.rate > self.policy.ceiling:
            self.clock.set_rate(self.policy.ceiling)
        self.clock.set_ceiling(self.policy.ceiling)
        self.clock.set_rate(self.policy.start)
        # The promise sleepers nap by: the rate rises at most by the policy's largest factor
        # per period (netem.clock, `set_growth`; renewed at each decision).
        self.clock.set_growth(self.policy.growth_per_s)
        self._wall = self.clock.monotonic()
        self._frozen = self.clock.frozen_wall_s
        self._last = {r.index: r for r in self.clock.slots()}
        self._note(self.policy.start)

    def step(self) -> float:
        """One decision from what the participants reported lately; returns the rate."""
        wall = self.clock.monotonic()
        frozen = self.clock.frozen_wall_s
        reports = self.clock.slots()
        counts = [0] * LAG_COUNTERS
        sums = [0.0] * LAG_COUNTERS
        by_slot = {}
        instant = 0.0  # wall seconds instant holds stood the clock still
        for report in reports:
            before = self._last.get(report.index)
            if before is None or before.name != report.name or before.pid != report.pid:
                before = None  # claimed since the last decision: its counters began at zero
            then_lags = before.lag_by_kind if before else ((0, 0.0),) * LAG_COUNTERS
            added = [
                (now[0] - then[0], now[1] - then[1])
                for now, then in zip(report.lag_by_kind, then_lags, strict=True)
            ]
            for kind, (count, total) in enumerate(added):
                counts[kind] += count
                sums[kind] += total
            stood_here = report.frozen_wall_s - (before.frozen_wall_s if before else 0.0)
            by_slot[report.name] = (tuple(total for _, total in added), stood_here)
            if report.name.endswith(INSTANT):
                instant += stood_here
        instant -= self._given_back_frozen(reports)
        stood_wall = max(0.0, frozen - self._frozen - instant)
        for kind in range(LAG_COUNTERS):
            self._run_counts[kind] += counts[kind]
            self._run_sums[kind] += sums[kind]
        rate = self.clock.rate  # the rate the period's samples were taken at
        policy, target = self.policy, self.clock.lag_target
        if not self._run_over(target):
            self._over_at = None
        elif self._over_at is None:
            self._over_at = rate
        self._window.append((tuple(counts), tuple(sums), stood_wall, wall - self._wall))
        self._by_slot.append(by_slot)
        while len(self._window) > self.policy.window_periods:
            self._window.popleft()
        while len(self._by_slot) > self.policy.window_periods:
            self._by_slot.popleft()
        self._wall, self._frozen = wall, frozen
        self._last = {r.index: r for r in reports}
        samples = sum(sum(w[0]) for w in self._window)
        kind_means = {}
        for kind in range(LAG_COUNTERS):
            count = sum(w[0][kind] for w in self._window)
            total = sum(w[1][kind] for w in self._window)
            if count >= policy.min_samples or (count and total >= policy.min_samples * target):
                kind_means[kind] = total / count
        worst_kind = max(kind_means, key=kind_means.__getitem__, default=None)
        mean = kind_means[worst_kind] if worst_kind is not None else 0.0  # each kind on its own
        elapsed = sum(w[3] for w in self._window)
        stood = sum(w[2] for w in self._window) / elapsed if elapsed > 0 else 0.0
        cause = None
        if self._cooldown:
            self._cooldown -= 1
        elif mean > target or stood > policy.frozen_ok:
            # Halving pays for holds only where they stood the clock still over half the time.
            hard = mean > 4 * target or stood > max(policy.frozen_ok, 1 - policy.hard_decrease)
            rate = max(policy.floor, rate * (policy.hard_decrease if hard else policy.decrease))
            self.decreases += 1
            cause = self._culprit(worst_kind if mean > target else None)
            self.slowed_by[cause] = self.slowed_by.get(cause, 0) + 1
            self._cooldown = policy.cooldown_periods
            self._window.clear()  # what comes next is the new rate's
            self._by_slot.clear()
        elif samples >= policy.calm_samples and mean <= policy.calm_share * target:
            rate = max(rate, min(self._run_limit(), rate * policy.increase))
        elif samples < policy.calm_samples and stood <= policy.frozen_ok and rate < policy.start:
            # Too few samples to tell (a slow clock hears few messages): back towards the
            # start, or a clock slowed by a loaded moment would stay slow for good.
            rate = min(policy.start, rate * policy.recover)
        rate = self.clock.set_rate(rate)  # set each period: the promise grows from here
        self._note(rate, cause)
        return rate

    def _run_limit(self) -> float:
        """The fastest a calm window may speed the clock up to. Lag that comes in rare bursts
        (a step begun several ms late among thousands on time) leaves most windows calm, and a
        rate that rose past the burst's in each of them made the next burst larger: the run's
        mean, which validity judges, ended over its bound though every window that saw a burst
        was answered with a slow-down. So while a kind's run mean is over the target, the rate
        rises no higher than one slow-down (`decrease`) below the rate it went over at. Below it
        may rise: a burst's lag is a wall-time stall times the rate, so the next one at the
        lower rate is smaller, and a clock kept slower still (the run mean may never come back
        within, on a kind with few samples) would only stretch the run. Measured
        (docs/validation.md, "The run-mean rule as a limit, not a pin"): a 10-request pdd
        run at x1.61-1.83, valid, three times on 1bca0eb under the CPU lock."""
        if self._over_at is None:
            return self.policy.ceiling
        return min(self.policy.ceiling, self.policy.decrease * self._over_at)

    def _given_back_frozen(self, reports: list[SlotReport]) -> float:
        """Wall seconds counted at earlier decisions of the routing slots the shaper gave back
        since the last one: their counters went into ROUTING_ENDED_SLOT's
        (`SharedClock.free_into`), whose growth counts them again."""
        if not any(report.name == ROUTING_ENDED_SLOT for report in reports):
            return 0.0  # (the shaper's slots freed with it: nothing was added)
        present = {(report.index, report.name, report.pid) for report in reports}
        return sum(
            last.frozen_wall_s
            for last in self._last.values()
            if last.name.startswith(ROUTING_SLOT_PREFIX)
            and last.name != ROUTING_ENDED_SLOT
            and (last.index, last.name, last.pid) not in present
        )

    def _run_over(self, target: float) -> bool:
        """Whether any kind's mean since the controller began is over `target`."""
        return any(
            count >= self.policy.min_samples and total > target * count
            for count, total in zip(self._run_counts, self._run_sums, strict=True)
        )

    def _culprit(self, kind: int | None) -> str:
        """Who contributed most to the window's lag of `kind`, or (None) to its frozen time."""
        totals: dict[str, float] = {}
        for period in self._by_slot:
            for name, (lag_sums, frozen) in period.items():
                if kind is None and name.endswith(INSTANT):
                    continue  # instant holds do not slow the clock
                totals[name] = totals.get(name, 0.0) + (
                    lag_sums[kind] if kind is not None else frozen
                )
        name = max(totals, key=totals.__getitem__, default="?")
        return f"hold {name}" if kind is None else f"lag {CONTROLLED_KINDS[kind]} {name}"

    def release_dead(self) -> list[str]:
        """Free the slots of participants that died (a hold of theirs would stop the run), and
        mend what one of them left half-written on the page (`SharedClock.recover`)."""
        self.clock.recover()
        freed = []
        for report in self.clock.slots():
            try:
                os.kill(report.pid, 0)
            except ProcessLookupError:
                self.clock.free(report.index)
                freed.append(report.name)
            except PermissionError:
                pass
        return freed

    def _note(self, rate: float, cause: str | None = None) -> None:
        modelled = self.clock.now()
        if self.timeline and cause is None:
            _, last_modelled, last_rate, _ = self.timeline[-1]
            changed = abs(rate - last_rate) > TIMELINE_CHANGE * last_rate
            if not changed and modelled - last_modelled < TIMELINE_STEP_S:
                return
        self.timeline.append((self.clock.monotonic(), modelled, rate, cause))

    def summary(self, wall: tuple[float, float], modelled: tuple[float, float]) -> dict[str, Any]:
        """The dilation of a span that started at (wall[0], modelled[0]) and ended at
        (wall[1], modelled[1]): wall seconds per modelled second, its least, mean (the span's
        wall time over its modelled length, holds included) and most, and its timeline."""
        start, end = modelled
        slowed_by = dict(sorted(self.slowed_by.items(), key=lambda item: -item[1]))
        if end <= start:
            return {
                "min": None,
                "mean": None,
                "max": None,
                "speedup": None,
                "slowed_by": slowed_by,
                "timeline": [],
            }
        before = [p for p in self.timeline if p[1] <= start]
        points = before[-1:] + [p for p in self.timeline if start < p[1] <= end]
        mean = (wall[1] - wall[0]) / (end - start)
        dilations = [1 / rate for _, _, rate, _ in points] or [mean]
        return {
            "min": min(dilations),
            "mean": mean,
            "max": max(dilations),
            "speedup": 1 / mean if mean > 0 else None,
            "slowed_by": slowed_by,
            "timeline": [
                {
                    "modelled_s": round(max(0.0, at - start), 3),
                    "wall_per_modelled_s": round(1 / rate, 6),
                    **({"slowed_by": cause} if cause else {}),
                }
                for _, at, rate, cause in points
            ],
        }
