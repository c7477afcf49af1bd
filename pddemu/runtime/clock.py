"""Modelled time as every process of an emulation sees it: the run's shared clock
(`netem.clock`), with asyncio sleeps that follow its rate, holds around genuine work, and the
lag each participant counts.

One clock for the whole run: the controller makes the page, the roles, the frontend, the
replayer and the shaper read it, and a controller (`pddemu.runtime.dilation`) slows it down
when a participant falls behind (time dilation) instead of letting results drift. Steps are
scheduled on the modelled time line (start + modelled duration), never on "now + duration":
a late wake-up does not push later steps back; it shows as lag.

A participant about to do the genuine work of a step that ends at modelled time T holds the
clock at T (`holding`): whatever the host's speed, no one sees T pass before that work is
done. Lag is counted by kind (`LAG_KINDS`), in modelled seconds.

An exchange between participants that the modelled system does in no time (the router's: the
prompt to P, P's hit back, the route to P and P's first bytes on their way) is covered by an
*instant hold* (`hold_instant`): the present held from before the first message until the
last is handled, so neither end's lateness in handling them moves a modelled time. A message
on such a path whose reading moves a modelled time (P's `kv_end`: when the request joins the
decode batch) is held by its sender until read (`hold_until_read`).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from netem.clock import (
    INGRESS_SLOT,
    INSTANT,
    LAG_COUNTED_KINDS,
    Anchor,
    SharedClock,
)
from pddemu.metrics.reservoir import Reservoir

T = TypeVar("T")

# A sleeper naps as long as the clock needs to reach its time at the fastest the rate may rise
# to meanwhile (the ceiling, or the controller's promise: netem.clock, `set_growth`); only when
# that is shorter than this (wall seconds) does it nap this long, or its time at the present
# rate if sooner: a speed-up within that nap makes it late by at most SHORT_NAP_S x (the
# fastest rate allowed - the rate) modelled seconds.
SHORT_NAP_S = 0.002
HOLD_POLL_S = 0.005  # a sleeper whose time is due but behind a hold looks again this often
PRECISE_WALL_S = 0.002  # a precise sleep blocks for at most this much of its end
# Lag of what the emulator knows the exact modelled time of: a step's end, a message's arrival
# on a path without modelled time (within a host, the unshaped intra-DC path), a request's
# arrival, a packet's exit from the shaper.
LAG_KINDS = ("step", "handler", "send", "release")
# Of those, what the controller watches, each kind on its own mean (the clock page counts them
# apart): all of them, since validity judges each. A step's lag grows with the rate like a
# message's (a wake-up's wall latency times the rate) and holds do not cover it (a step whose
# work begins after its end holds the present, not its end).
CONTROLLED_KINDS = LAG_COUNTED_KINDS
if set(CONTROLLED_KINDS) != set(LAG_KINDS):
    raise ImportError("the clock page's lag counters do not match LAG_KINDS")
# Lag that provably reaches no result, reported, never judged: the frontend reading a report
# that carries its own times (a transfer's end, the KV's arrival, a handoff's start), and its
# lateness in reading tokens and heartbeats (tokens are dated by their send or the kernel's
# receive time, the relay holds the clock at an end the frontend must act on, and a heartbeat
# read late only delays failure detection by as much: docs/validation.md, "Which lag counts").
REPORT_KIND = "report"
DELIVERY_KIND = "delivery"
INSTANT_HOLD_CAP_S = 0.25  # wall seconds an instant hold stands at most (a peer never answers)
# The name suffix of a sender's slot that holds the present until its messages on a path without
# modelled time are read (`ModelledClock.hold_until_read`): "P0 reads/instant".
READS = " reads" + INSTANT
STOP_TIMEOUT_S = 5.0  # wall seconds a paused process is waited for to stop (not in a syscall)
# Across the WAN a message's modelled transit (queueing included) is unknown to its receiver:
# its lag is known only as a bound (now - sent - least transit), recorded as `<kind>_wan`.


def abandon(task: asyncio.Future[T], discard: Callable[[T], object] | None) -> None:
    """Cancel `task`, whose outcome no one will take: a result it comes to all the same (it
    was done already, or ends before it reads the cancel) goes to `discard`."""
    task.cancel()
    if discard is None:
        return

    def dropped(done: asyncio.Future[T]) -> None:
        if not done.cancelled() and done.exception() is None:
            discard(done.result())

    task.add_done_callback(dropped)


def participant_of(slot_name: str) -> str:
    """The participant a slot of the clock page belongs to: its name without the suffix of an
    instant hold's slot or of a sender's reads slot (one process may claim all three)."""
    return slot_name.removesuffix(READS).removesuffix(INSTANT)


class FixedRate:
    """A clock of one process that runs at a fixed rate from an epoch: what a participant
    without a shared page (a unit test, an instance driven in-process) reads."""

    def __init__(
        self, epoch: float, rate: float, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        if not rate > 0:
            raise ValueError(f"time_scale must be positive, got {rate}")
        self._anchor = Anchor(epoch, 0.0, float(rate), math.inf)
        self.monotonic = monotonic

    def anchor(self) -> Anchor:
        return self._anchor

    def now(self) -> float:
        return self._anchor.at(self.monotonic())

    def wall_delay(self, modelled: float) -> float:
        return max(0.0, self._anchor.wall_at(modelled) - self.monotonic())

    earliest_wall_delay = wall_delay

    def modelled_at(self, wall: float) -> float:
        return self._anchor.at(wall)

    @property
    def rate(self) -> float:
        return self._anchor.rate


class ModelledClock:
    """Modelled time for one participant: now(), sleep_until(), holds and its lag book."""

    def __init__(
        self, source: SharedClock | FixedRate, slot: int | None = None, name: str = ""
    ) -> None:
        self.source = source
        self.slot = slot
        self.name = name  # the participant's, when it has a slot
        # each kind's samples: a bounded sample with exact totals (a serve runs without end),
        # seeded by participant and kind so that participants fed in step keep other slots
        self.lags: dict[str, Reservoir] = {kind: self._reservoir(kind) for kind in LAG_KINDS}
        self._holding = False
        self._instant_slot: int | None = None
        self._instant_holders = 0
        self._reads_slot: int | None = None
        self._reads_posted: deque[float] = deque()  # wall times of holds not yet let go
        self._reads_timer: asyncio.TimerHandle | None = None

    @classmethod
    def fixed(cls, epoch: float, time_scale: float) -> ModelledClock:
        return cls(FixedRate(epoch, time_scale))

    @classmethod
    def reading(cls, page: str | Path | None, epoch: float) -> ModelledClock:
        """A clock that only reads (no slot): the run's page, or, without one, real time from
        `epoch` (a network without a page runs its links in wall time)."""
        if page is None:
            return cls.fixed(epoch, 1.0)
        return cls(SharedClock(page))

    @classmethod
    def attach(cls, page: str | Path, name: str) -> ModelledClock:
        """Read the run's clock page as participant `name` (which gets a slot of its own)."""
        shared = SharedClock(page)
        return cls(shared, shared.claim(name), name)

    def close(self) -> None:
        """Give the slot back (releasing any hold) and unmap the page."""
        if self._reads_timer is not None:
            self._reads_timer.cancel()
        if isinstance(self.source, SharedClock):
            for slot in (self.slot, self._instant_slot, self._reads_slot):
                if slot is not None:
                    self.source.free(slot)
            self.slot = self._instant_slot = self._reads_slot = None
            self.source.close()

    # -- reading --------------------------------------------------------------------------

    def now(self) -> float:
        """Modelled seconds since the run's origin."""
        return self.source.now()

    @property
    def shared(self) -> bool:
        """Whether this reads a run's clock page (which dilates and holds), not real time."""
        return isinstance(self.source, SharedClock)

    @property
    def rate(self) -> float:
        """Modelled seconds per wall second, now."""
        return self.source.rate

    async def sleep_until(self, modelled: float, precise: bool = False) -> float:
        """Sleep until modelled time `modelled`; returns how late (modelled seconds) it woke.

        The clock is re-read after every wake-up, since its rate may have changed or a hold
        may have stopped it meanwhile. Each nap lasts as long as the clock could take at the
        fastest rate allowed meanwhile (`earliest_wall_delay`), so no speed-up makes it late,
        but at least SHORT_NAP_S (or until its time at the present rate, if sooner): late by
        at most SHORT_NAP_S x (fastest - rate) for a speed-up, besides the host's own wake-up
        latency. The event loop's timers are millisecond-grained: with `precise`, the last
        PRECISE_WALL_S of the wait block the loop instead (what the replayer does, so
        requests leave on time).
        """
        while True:
            now = self.now()
            if now >= modelled:
                return now - modelled
            delay = self.source.wall_delay(modelled)  # at the present rate
            if delay <= 0:  # due, but a hold stands before it: look again soon
                nap = HOLD_POLL_S
            elif precise and delay <= PRECISE_WALL_S:
                time.sleep(delay)
                continue
            else:
                nap = max(self.source.earliest_wall_delay(modelled), min(delay, SHORT_NAP_S))
                if precise:  # the last stretch blocks, whatever the nap's bound
                    nap = min(nap, delay - PRECISE_WALL_S)
            await asyncio.sleep(nap)

    def modelled_at(self, wall: float) -> float | None:
        """Modelled time at a past monotonic time `wall`, as the clock read then (holds and
        rate changes since included); None if too long ago for the page to tell."""
        return self.source.modelled_at(wall)

    def wall_delay(self, modelled: float) -> float:
        """Wall seconds until `modelled` at the present rate (an estimate, for progress)."""
        return self.source.wall_delay(modelled)

    async def within(
        self,
        awaitable: Awaitable[T],
        seconds: float,
        discard: Callable[[T], object] | None = None,
    ) -> T:
        """`awaitable`'s result, or TimeoutError (and it cancelled) once `seconds` of modelled
        time have passed: asyncio.wait_for on the modelled clock. A result that comes when it
        can no longer be returned (this wait was cancelled, or timed out, as it came) is handed
        to `discard` (a connection made, to close), not dropped."""
        task = asyncio.ensure_future(awaitable)
        timer = asyncio.ensure_future(self.sleep_until(self.now() + seconds))
        try:
            await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            abandon(task, discard)
            raise
        finally:
            timer.cancel()
        if task.done():
            return task.result()
        abandon(task, discard)
        try:
            await task
        except asyncio.CancelledError:
            pass
        raise TimeoutError(f"not done within {seconds:g} modelled seconds")

    # -- holds ----------------------------------------------------------------------------

    @contextmanager
    def holding(self, until: float) -> Iterator[float]:
        """Hold modelled time at `until` while the body runs (genuine work that must be done
        by then); yields where it holds (the present, if `until` has passed)."""
        if not isinstance(self.source, SharedClock) or self.slot is None:
            yield max(until, self.now())
            return
        if self._holding:
            raise RuntimeError("a participant holds one time at most")
        self._holding = True
        try:
            yield self.source.hold(self.slot, until)
        finally:
            self._holding = False
            self.source.release(self.slot)

    def hold_instant(self, cap_s: float = INSTANT_HOLD_CAP_S) -> InstantHold:
        """Hold modelled time at the present until the hold's `release()`: for an exchange the
        modelled system does in no time, whose messages take none on their paths (within a
        host, or the unshaped intra-DC path; a path with modelled time would never deliver
        them). Several tasks of the participant may hold at once (time stands still, so all
        hold the same instant); it goes on when the last releases. Each hold ends by itself
        after `cap_s` wall seconds: a peer that never answers (lost, or paused) stops time no
        longer than that, and its lateness then shows as lag."""
        hold = InstantHold(self, time.monotonic() + cap_s)
        if not isinstance(self.source, SharedClock) or self.slot is None:
            hold.released = True  # real time: nothing to hold
            return hold
        if self._instant_slot is None:
            self._instant_slot = self.source.claim(f"{self.name or self.slot}{INSTANT}")
        if self._instant_holders == 0:
            self.source.hold(self._instant_slot, self.now())
        self._instant_holders += 1
        hold.timer = asyncio.get_running_loop().call_later(cap_s, hold.release)
        return hold

    def let_routing_go(self, arrived: float | None, slot_name: str | None = None) -> bool:
        """A routing message that crossed the WAN, and `arrived` (modelled: its kernel receive
        time; None if undated), has been acted on: let go of the shaper's hold at its release
        (`netem.clock.ROUTING_DSCP`), in its connection's slot `slot_name`
        (`Envelope.routing_slot`; None where no connection is known: nothing is let go). The
        reader has answered it, or holds the present itself (`hold_instant`), so no modelled time passes between
        the message's arrival and what is done on it. One reader's let-go ends one message's
        hold (`SharedClock.let_go_one`) on its own connection, and none posted after the
        message had come: one that left unmarked (its send buffer full, a retransmission) held
        nothing, and lets go of no other's. Returns whether it let go."""
        if not isinstance(self.source, SharedClock) or slot_name is None:
            return False
        slot = self.source.slot_named(slot_name)
        if slot is None:
            return False
        return self.source.let_go_one(slot, math.inf if arrived is None else arrived)

    def hold_until_shaped(self) -> Callable[[], None] | None:
        """Hold the present until the shaper has read a routing message about to be written
        across the WAN (`netem.clock.INGRESS_SLOT`): it enters the WAN as of its sending,
        however late the shaper reads it. Returns the let-go for a write that did not leave
        at once (it leaves unmarked later, and the shaper lets go of nothing for it); None
        without a shaper on a shared clock."""
        if not isinstance(self.source, SharedClock):
            return None
        slot = self.source.slot_named(INGRESS_SLOT)
        if slot is None:
            return None
        source = self.source
        source.hold_for_one_more(slot, self.now())

        def let_go() -> None:
            source.let_go_one(slot)

        return let_go

    def hold_until_read(self) -> None:
        """Hold the present until a message about to be sent on a path without modelled time
        has been read (its reader's `let_sender_go`), or INSTANT_HOLD_CAP_S wall seconds: what the reader
        does on it is then as of its sending, however late it reads it. Call it before the
        message is stamped; messages in flight together share the hold, counted (one reader's
        let-go is one message's). In real time nothing is held."""
        if not isinstance(self.source, SharedClock) or self.slot is None:
            return
        if self._reads_slot is None:
            self._reads_slot = self.source.claim(f"{self.name or self.slot}{READS}")
        self.source.hold_for_one_more(self._reads_slot, self.now())
        self._reads_posted.append(time.monotonic())
        if self._reads_timer is None:  # one timer, at the oldest hold's cap
            self._reads_timer = asyncio.get_running_loop().call_later(
                INSTANT_HOLD_CAP_S, self._cap_reads
            )

    def _cap_reads(self) -> None:
        """Let go of each message's hold its reader has not let go of within the cap (the
        reader lost, or the message never written): `SharedClock.let_go_overdue`; then looks
        again at the cap of the oldest left."""
        if self._reads_slot is None or not isinstance(self.source, SharedClock):
            return
        posted, wall = self._reads_posted, time.monotonic()
        self.source.let_go_overdue(self._reads_slot, posted, wall, INSTANT_HOLD_CAP_S)
        self._reads_timer = None
        if posted:
            again = posted[0] + INSTANT_HOLD_CAP_S - wall + 0.001
            self._reads_timer = asyncio.get_running_loop().call_later(again, self._cap_reads)

    def let_sender_go(self, sender: str, sent: float) -> bool:
        """A message from `sender` on a path without modelled time, stamped `sent`, has been
        read and is acted on (or this participant holds the present itself): let go of the
        sender's hold for it (`hold_until_read`). A hold standing after `sent` is another
        message's, and stays. Returns whether one was let go."""
        if not isinstance(self.source, SharedClock):
            return False
        slot = self.source.slot_named(f"{sender}{READS}")  # not kept: a restarted sender moves
        return slot is not None and self.source.let_go_one(slot, sent)

    def _instant_released(self) -> None:
        self._instant_holders -= 1
        if self._instant_holders == 0 and self._instant_slot is not None:
            assert isinstance(self.source, SharedClock)
            self.source.release(self._instant_slot)

    # -- lag --------------------------------------------------------------------------------

    def _reservoir(self, kind: str) -> Reservoir:
        return Reservoir(seed=f"lag:{self.name}:{kind}")

    def count_lag(self, kind: str, lag: float) -> float:
        """Record one lag sample (modelled seconds; negative counts as 0); returns it. The
        controller's kinds also go to the participant's slot."""
        lag = lag if lag > 0 else 0.0
        if kind not in self.lags:
            self.lags[kind] = self._reservoir(kind)
        self.lags[kind].append(lag)
        if (
            kind in CONTROLLED_KINDS
            and isinstance(self.source, SharedClock)
            and self.slot is not None
        ):
            self.source.count_lag(self.slot, lag, CONTROLLED_KINDS.index(kind))
        return lag

    def hold_counts(self) -> dict[str, Any]:
        """Holds this participant posted, how many stood the clock still, for how long (wall);
        its instant holds apart under "instant" (they take no modelled time by design, so the
        controller ignores them: this is where a participant slow to release them shows)."""
        if not isinstance(self.source, SharedClock) or self.slot is None:
            return {"posted": 0, "binding": 0, "frozen_wall_s": 0.0, "instant": _NO_HOLDS}
        reports = {r.index: r for r in self.source.slots()}

        def counts(slot: int | None) -> dict[str, float]:
            report = reports.get(slot) if slot is not None else None
            if report is None:
                return dict(_NO_HOLDS)
            return {
                "posted": report.holds,
                "binding": report.holds_binding,
                "frozen_wall_s": report.frozen_wall_s,
            }

        instant, reads = counts(self._instant_slot), counts(self._reads_slot)
        return {
            **counts(self.slot),
            "instant": {key: instant[key] + reads[key] for key in instant},
        }


_NO_HOLDS: dict[str, float] = {"posted": 0, "binding": 0, "frozen_wall_s": 0.0}


class InstantHold:
    """One task's share of its participant's instant hold (`ModelledClock.hold_instant`)."""

    def __init__(self, clock: ModelledClock, capped_at: float) -> None:
        self.clock = clock
        self.released = False
        self.timer: asyncio.TimerHandle | None = None
        self.capped_at = capped_at  # the monotonic time its cap ends it

    def wall_left(self) -> float:
        """Wall seconds before its cap ends it (0 once released): what a wait under it may
        take without holding the clock past the cap."""
        return 0.0 if self.released else max(0.0, self.capped_at - time.monotonic())

    def release(self) -> None:
        """Let time go on, as far as this holder is concerned (again: nothing)."""
        if self.released:
            return
        self.released = True
        if self.timer is not None:
            self.timer.cancel()
        self.clock._instant_released()


class PauseError(RuntimeError):
    """A pause fault could not be carried out (the process was resumed as it was)."""


def pause_process(source: SharedClock | FixedRate, pid: int) -> list[str]:
    """SIGSTOP process `pid` (a pause fault) without freezing the run: a hold of its (genuine
    work under way) would stand the clock still until its resume, whose modelled time would
    then never come. On a shared clock its holds are released once every thread of it has
    stopped, the page's writers excluded meanwhile (`SharedClock.stop_participant`); resumed,
    it holds again as before, and what the pause made late is the fault's (`pause` lag).
    Returns the names of the slots whose hold was released; PauseError (the process resumed,
    no hold released) if a thread of it does not stop in time."""

    def stop() -> None:
        os.kill(pid, signal.SIGSTOP)
        if not wait_stopped(pid):
            # A thread that does not stop could still take the writers' lock once this lets
            # go: releasing its holds would bring back the freeze. Undo the pause instead.
            os.kill(pid, signal.SIGCONT)
            raise PauseError(f"process {pid} did not stop within {STOP_TIMEOUT_S:g} s")

    if isinstance(source, SharedClock):
        return source.stop_participant(pid, stop)
    stop()
    return []


def wait_stopped(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Wait until every thread of process `pid` is stopped (or it is gone): a signal takes
    effect in each thread when the kernel next schedules it. False after `timeout_s` (a
    thread stuck in an uninterruptible wait)."""
    deadline = time.monotonic() + timeout_s
    while not _all_stopped(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def _all_stopped(pid: int) -> bool:
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True  # gone
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/stat") as stat:
                line = stat.read()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended
        if line[line.rindex(")") + 2] not in "TZX":  # state, after "pid (comm) "
            return False
    return True
