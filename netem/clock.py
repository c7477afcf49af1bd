"""A clock shared by every process of an emulation: modelled time read from one memory page.

Modelled time runs at `rate` modelled seconds per wall second from an anchor,

    now = modelled_anchor + (CLOCK_MONOTONIC - wall_anchor) * rate,

clamped to the earliest *hold*. Changing the rate re-anchors at the current instant, so
modelled time is continuous and never goes back, whatever the rate does (time dilation).
Readers take the anchor under a seqlock (a writer never blocks them); writers serialise with
a lock on the page's file. CLOCK_MONOTONIC is system-wide on Linux, so every process, in any
network namespace, reads the same modelled time.

Holds: a participant about to do work that must be done before modelled time T (the genuine
computation of a step that ends at T) posts a hold at T in its slot; no reader sees time pass
T until the hold is released, and the release re-anchors, so time continues from T without a
jump. A hold is never before the present: posting one at a time already passed holds the
present instead.

The rate's rise can be promised (`set_growth`): from then on the rate never grows faster than
a stated factor per wall second from the last rate set, so a sleeper can nap until its deadline
computed at that bound (`earliest_wall_delay`) and never be late for a speed-up, without
waking every few milliseconds to look.

Slots: each participant claims one (by name, with its pid), posts its holds there and counts
its lag there (how late, in modelled seconds, it did what was scheduled): monotonic counters
written only by their owner, which the rate's controller reads as differences.

History: every anchor written is also kept in a ring on the page (the write's number is half
the seqlock's count), so a reader can say what modelled time it was at a past wall time
(`modelled_at`), holds and rate changes between then and now included.

The page is a small file on a tmpfs (a netem run's directory under /run), mapped by every
participant; the userspace shaper follows it when given its path, so packets are timed in
modelled time and a dilation slows the network exactly like everything else.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import socket
import struct
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"NMCLOCK3"
SLOTS_END = 16384
HEADER_BYTES = 256
SLOT_BYTES = 160
MAX_SLOTS = (SLOTS_END - HEADER_BYTES) // SLOT_BYTES
# After the slots, the anchors' history: a ring of the last HISTORY_ANCHORS anchors written
# (each write's wall, modelled, rate, hold), so a past wall time can be told in modelled time
# as the clock read then (`modelled_at`): a packet's receive time, read by its process later.
HISTORY_AT = SLOTS_END
HISTORY_ANCHORS = 4096  # about 2 s of anchors at a busy run's ~2,000 writes per wall second
PAGE_BYTES = HISTORY_AT + HISTORY_ANCHORS * 32
NAME_BYTES = 32
TORN_CHECK_SPINS = 1 << 14  # a reader that saw a write under way this often looks for its writer

# Header: magic, then under the seqlock (seq, wall anchor, modelled anchor, rate, earliest
# hold), then fields written under the writers' lock only.
_MAGIC = struct.Struct("=8s")
_SEQ = struct.Struct("=Q")  # offset 8; odd while a writer changes the anchor
_ANCHOR = struct.Struct("=dddd")  # offset 16: wall, modelled, rate, hold
_HISTORY_WALL = struct.Struct("=d")  # a history entry's wall, its first field
_LAG_TARGET = struct.Struct("=d")  # offset 48: the mean lag the controller keeps within
_FROZEN = struct.Struct("=d")  # offset 56: wall seconds the clock stood at a hold, in all
_BINDING = struct.Struct("=d")  # offset 64: since when it stands at the earliest hold (or inf)
_CEILING = struct.Struct("=d")  # offset 72: the fastest rate the clock may be set to
# Offset 80, under the seqlock: the promise on the rate's rise (growth per wall second as a
# natural log, inf for none; the rate and wall time it grows from). See `fastest_rate`.
_PROMISE = struct.Struct("=ddd")
SEQ_AT, ANCHOR_AT, LAG_TARGET_AT, FROZEN_AT, BINDING_AT, CEILING_AT = 8, 16, 48, 56, 64, 72
PROMISE_AT = 80

# A slot: name, pid, the hold (under the lock), then its owner's counters.
# Lag is counted apart by kind, one counter for each of LAG_COUNTED_KINDS (its index is the
# kind's number, the same in every process of a run): the controller keeps each kind's mean
# within its target, as a run's validity judges each kind's mean, so a frequent kind on time
# cannot hide a rare one late. A message handled late, a request sent late, a step whose work
# began after its end, a packet leaving the shaper late.
LAG_COUNTED_KINDS = ("handler", "send", "step", "release")
LAG_COUNTERS = len(LAG_COUNTED_KINDS)
_SLOT = struct.Struct("=32sQdd QQ " + "Qd" * LAG_COUNTERS + " d")
_SLOT_HOLD = struct.Struct("=dd")  # offset 40 in a slot: hold at, wall seconds it froze time
_SLOT_HOLDS = struct.Struct("=QQ")  # offset 56: holds posted, holds that stopped the clock
_SLOT_LAG = struct.Struct("=Qd")  # offset 72 + 16 x kind: count, sum
_SLOT_LAG_MAX = struct.Struct("=d")  # after the kinds: the largest of any kind
# Then how many readers a hold shared by several messages stands for (`hold_for_one_more`)
_SLOT_READERS = struct.Struct("=Q")
SLOT_HOLD_AT, SLOT_HOLDS_AT, SLOT_LAG_AT = 40, 56, 72
SLOT_LAG_MAX_AT = SLOT_LAG_AT + _SLOT_LAG.size * LAG_COUNTERS
SLOT_READERS_AT = SLOT_LAG_MAX_AT + _SLOT_LAG_MAX.size
if SLOT_READERS_AT + _SLOT_READERS.size > SLOT_BYTES:
    raise ImportError("a clock slot's counters do not fit in SLOT_BYTES")
# The name suffix of a slot whose holds stand time still by design, at the present, for an
# exchange the modelled system does in no time (the rate's controller ignores their frozen time).
INSTANT = "/instant"
# The routing exchange's messages across the WAN (the frontend's `match`, the decode side's
# `matched`) end with this DSCP (AF22: the class of control messages, AF21, for the queueing
# disciplines): the last write of each is marked. The shaper holds modelled time at the release
# of a segment so marked that carries data and ends a write (PSH), in the slot of the
# message's connection direction (`routing_slot`: its addresses and ports), until the message's
# reader lets go (once it has acted on it, or holds the present itself) or ROUTING_HOLD_CAP_S
# of wall time has passed: so what the reader does on the message is as of its arrival, however
# late it reads it. Messages in flight together on a connection share its slot's hold, counted:
# it stands until each reader has let go or each message's cap has passed. A reader lets go
# only in the slot of the connection it read its message on: one whose message left unmarked
# (no hold) cannot end another connection's hold posted at the instant its own message came.
ROUTING_DSCP = 20
ROUTING_HOLD_CAP_S = 0.25
ROUTING_SLOT_PREFIX = "routing "
# The page has MAX_SLOTS slots for every participant, and connections come and go (a restart
# reconnects): the shaper gives a connection's slot back once the connection has ended (FIN or
# RST) and the slot holds for no reader, and keeps at most ROUTING_SLOTS_KEPT of them (beyond,
# it gives back those holding for no reader first; with none such, a message is not held).
# A slot given back has its counters added to ROUTING_ENDED_SLOT's (`SharedClock.free_into`),
# so the routing holds summed over the slots (`pddemu.runtime.timekeeping.routing_holds`)
# lose none.
ROUTING_SLOTS_KEPT = MAX_SLOTS // 3
ROUTING_ENDED_SLOT = ROUTING_SLOT_PREFIX + "ended" + INSTANT
# And from its sending until the shaper has read it: the shaper dates what it reads by the
# turn that reads it, so a message it read late would enter the WAN late (its route with it).
# The sender holds the present for one more reader in INGRESS_SLOT just before its marked
# write (`hold_for_one_more`), and lets go itself if that write did not leave at once (it
# then leaves unmarked); the shaper lets go of one for each segment so marked that ends a
# write as it reads it, and ends the slot's hold once it has stood ROUTING_HOLD_CAP_S of wall
# time (counted from before its posting) still standing for a sender: the count runs until it
# stands for none, each segment read lets one sender go but does not restart it.
INGRESS_SLOT = "shaper ingress" + INSTANT
# A reader's date of its message (the kernel's receive time, moved to modelled time) may fall
# this far before the instant the hold at its release stands at (the clocks' offset's error):
# a message dated earlier still came before that hold, which then stands for another.
ARRIVAL_SLACK_S = 1e-4


def routing_slot(source: bytes, source_port: int, destination: bytes, destination_port: int) -> str:
    """The slot of the shaper's holds at the routing messages of one direction of a TCP
    connection (IPv4 addresses as 4 bytes): what the shaper reads in a segment's headers and
    the reader in its socket's names (`socket_routing_slot`)."""
    flow = (
        source + source_port.to_bytes(2, "big") + destination + destination_port.to_bytes(2, "big")
    )
    return f"{ROUTING_SLOT_PREFIX}{zlib.crc32(flow):08x}{INSTANT}"


def socket_routing_slot(sock: socket.socket) -> str | None:
    """The `routing_slot` of the messages a connected IPv4 TCP socket receives (from its
    peer to it); None for another socket, or one no longer connected."""
    if sock.family != socket.AF_INET:
        return None
    try:
        (peer, peer_port), (me, my_port) = sock.getpeername(), sock.getsockname()
    except OSError:
        return None
    return routing_slot(socket.inet_aton(peer), peer_port, socket.inet_aton(me), my_port)


class ClockError(RuntimeError):
    """The clock page is missing, not a clock, or full."""


@dataclass(frozen=True)
class Anchor:
    """One consistent reading of the page: modelled time is `modelled + (t - wall) * rate`
    at monotonic time t, but never beyond `hold`."""

    wall: float
    modelled: float
    rate: float
    hold: float

    def at(self, wall: float) -> float:
        """Modelled time at monotonic time `wall`, clamped at the earliest hold."""
        raw = self.modelled + (wall - self.wall) * self.rate
        return raw if raw < self.hold else max(self.hold, self.modelled)

    def wall_at(self, modelled: float) -> float:
        """Monotonic time when modelled time reaches `modelled` at this rate, holds aside."""
        return self.wall + (modelled - self.modelled) / self.rate


@dataclass(frozen=True)
class SlotReport:
    """A slot's counters, as the controller reads them."""

    index: int
    name: str
    pid: int
    hold_at: float
    frozen_wall_s: float
    holds: int
    holds_binding: int
    lag_by_kind: tuple[tuple[int, float], ...]  # (count, sum) of each kind
    lag_max_s: float

    @property
    def lags(self) -> int:
        return sum(count for count, _ in self.lag_by_kind)

    @property
    def lag_sum_s(self) -> float:
        return sum(total for _, total in self.lag_by_kind)


class SharedClock:
    """A mapping of a clock page. `monotonic` is injectable so tests drive it with a fake
    wall clock; every process of a real run uses time.monotonic."""

    def __init__(self, path: str | Path, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.monotonic = monotonic
        try:
            self._fd = os.open(self.path, os.O_RDWR)
        except OSError as error:
            raise ClockError(f"clock page {self.path}: {error.strerror}") from None
        try:
            if os.fstat(self._fd).st_size != PAGE_BYTES:
                raise ClockError(f"clock page {self.path}: not a clock page (wrong size)")
            self._page = mmap.mmap(self._fd, PAGE_BYTES)
        except BaseException:
            os.close(self._fd)
            raise
        if _MAGIC.unpack_from(self._page, 0)[0] != MAGIC:
            self.close()
            raise ClockError(f"clock page {self.path}: not a clock page")
        self._last = -math.inf  # this mapping's last reading: now() never goes back in it

    @classmethod
    def create(
        cls,
        path: str | Path,
        rate: float = 1.0,
        modelled: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
        ceiling: float | None = None,
    ) -> SharedClock:
        """Make a new page at `path` (refused if it exists): time `modelled` now, at `rate`,
        never to run faster than `ceiling` (default: `rate`)."""
        _check_rate(rate)
        ceiling = rate if ceiling is None else ceiling
        _check_rate(ceiling)
        page = bytearray(PAGE_BYTES)
        _MAGIC.pack_into(page, 0, MAGIC)
        _ANCHOR.pack_into(page, ANCHOR_AT, monotonic(), modelled, rate, math.inf)
        _LAG_TARGET.pack_into(page, LAG_TARGET_AT, math.inf)
        _BINDING.pack_into(page, BINDING_AT, math.inf)
        _CEILING.pack_into(page, CEILING_AT, max(rate, ceiling))
        _PROMISE.pack_into(page, PROMISE_AT, math.inf, rate, monotonic())
        _ANCHOR.pack_into(page, _history_at(0), *_ANCHOR.unpack_from(page, ANCHOR_AT))
        for index in range(MAX_SLOTS):
            _SLOT_HOLD.pack_into(page, _slot_at(index) + SLOT_HOLD_AT, math.inf, 0.0)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, bytes(page))
        finally:
            os.close(fd)
        return cls(path, monotonic)

    def close(self) -> None:
        if not self._page.closed:
            self._page.close()
            os.close(self._fd)

    def __enter__(self) -> SharedClock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ----------------------------------------------------------------------------

    def anchor(self) -> Anchor:
        """A consistent reading of the anchor (retried while a writer is changing it)."""
        return self._consistent()[0]

    def _consistent(self) -> tuple[Anchor, tuple[float, float, float]]:
        """The anchor and the promise on the rate's rise, read together under the seqlock."""
        page = self._page
        spins = 0
        while True:
            before = _SEQ.unpack_from(page, SEQ_AT)[0]
            if before & 1:  # a writer is inside: out within microseconds, unless preempted
                spins += 1
                if spins % 64 == 0:
                    os.sched_yield()
                if spins % TORN_CHECK_SPINS == 0:
                    self._recover_if_unlocked()  # or it died there
                continue
            values = _ANCHOR.unpack_from(page, ANCHOR_AT)
            promise = _PROMISE.unpack_from(page, PROMISE_AT)
            if _SEQ.unpack_from(page, SEQ_AT)[0] == before:
                return Anchor(*values), promise

    def now(self) -> float:
        """Modelled seconds: continuous, never going back, never past a hold."""
        anchor = self.anchor()
        now = anchor.at(self.monotonic())  # read after the anchor: never before the re-anchor
        if now < self._last:
            return self._last
        self._last = now
        return now

    @property
    def rate(self) -> float:
        return self.anchor().rate

    def modelled_at(self, wall: float) -> float | None:
        """Modelled time at a past monotonic time `wall`, as the clock read then (the anchor
        that held at `wall`, from the history); None if that anchor has left the ring (or
        `wall` is before the page)."""
        page = self._page
        while True:
            newest = _SEQ.unpack_from(page, SEQ_AT)[0] // 2  # (a write under way makes the next)
            oldest = max(0, newest - HISTORY_ANCHORS + 1)  # the oldest entry still in the ring
            index, lowest_read = self._last_at_or_before(wall, oldest, newest)
            found = None if index is None else self._history_entry(index)
            top = (_SEQ.unpack_from(page, SEQ_AT)[0] + 1) // 2  # the entry written last, or now
            if lowest_read + HISTORY_ANCHORS > top:  # nothing it read was overwritten meanwhile
                return None if found is None else found.at(wall)
            if found is None:
                return None  # older than the ring, which moved on as it read

    def _last_at_or_before(self, wall: float, oldest: int, newest: int) -> tuple[int | None, int]:
        """The newest history entry whose wall is at or before `wall`, between `oldest` and
        `newest` (None if none is), and the lowest index read. The entries' walls rise with
        their index (written in order under the writer lock). A kernel date is read a few
        anchors after it, so the search gallops back from the newest (1, 2, 4, ... entries)
        and then halves the bracket: a reading or two for a recent date, about twice log2 of
        the ring for the oldest."""
        above = newest + 1  # the entries from here on are after `wall`
        step = 1
        while True:
            probe = max(oldest, above - step)
            if self._history_wall(probe) <= wall:
                break
            if probe == oldest:
                return None, probe
            above = probe
            step *= 2
        found, lowest_read = probe, probe
        low, high = probe + 1, above - 1
        while low <= high:
            middle = (low + high) // 2
            if self._history_wall(middle) <= wall:
                found = middle
                low = middle + 1
            else:
                high = middle - 1
        return found, lowest_read

    def _history_wall(self, index: int) -> float:
        return _HISTORY_WALL.unpack_from(self._page, _history_at(index))[0]

    def _history_entry(self, index: int) -> Anchor:
        return Anchor(*_ANCHOR.unpack_from(self._page, _history_at(index)))

    def wall_delay(self, modelled: float) -> float:
        """Wall seconds until modelled time reaches `modelled` if the rate stays as it is and
        no hold stops it (a hold can only make it longer); 0 once that time has come."""
        anchor = self.anchor()
        return max(0.0, anchor.wall + (modelled - anchor.modelled) / anchor.rate - self.monotonic())

    def earliest_wall_delay(self, modelled: float) -> float:
        """The least wall time until modelled time reaches `modelled`, whatever the rate does
        meanwhile (never above the ceiling, nor above the promise): how long a sleeper may
        safely sleep.

        Under a promise the rate at wall time w is at most f0 * exp(g * (w - now)), f0 the
        fastest rate allowed now, so time advances by at most f0 * (exp(g * t) - 1) / g in t
        wall seconds: solved for the time left."""
        anchor, (growth, rate, since) = self._consistent()
        wall = self.monotonic()
        left = modelled - anchor.at(wall)
        if left <= 0:
            return 0.0
        ceiling = self.ceiling
        at_ceiling = left / ceiling
        if growth == math.inf:
            return at_ceiling
        fastest = _promised(growth, rate, since, wall, ceiling)
        if growth == 0:
            return max(at_ceiling, left / fastest)
        return max(at_ceiling, math.log1p(left * growth / fastest) / growth)

    def fastest_rate(self) -> float:
        """The fastest the rate may be set to now: the ceiling, or less under a promise (the
        last rate set, grown at the promised factor per wall second since)."""
        _, (growth, rate, since) = self._consistent()
        ceiling = self.ceiling
        if growth == math.inf:
            return ceiling
        return _promised(growth, rate, since, self.monotonic(), ceiling)

    @property
    def ceiling(self) -> float:
        return _CEILING.unpack_from(self._page, CEILING_AT)[0]

    @property
    def lag_target(self) -> float:
        return _LAG_TARGET.unpack_from(self._page, LAG_TARGET_AT)[0]

    @property
    def frozen_wall_s(self) -> float:
        """Wall seconds the clock has stood still at a hold since it was made."""
        return _FROZEN.unpack_from(self._page, FROZEN_AT)[0]

    def slots(self, locked: bool = False) -> list[SlotReport]:
        """Every claimed slot's counters. `locked`: read under the writers' lock, for a reader
        that sums counters across slots: a slot given back moves its counters into another in
        several writes (`free_into`), between which an unlocked reader may count them twice."""
        if locked:
            with self._locked():
                return self.slots()
        reports = []
        for index in range(MAX_SLOTS):
            fields = _SLOT.unpack_from(self._page, _slot_at(index))
            name = fields[0].rstrip(b"\0").decode()
            if name:
                kinds = fields[6 : 6 + 2 * LAG_COUNTERS]
                by_kind = tuple(zip(kinds[::2], kinds[1::2], strict=True))
                reports.append(SlotReport(index, name, *fields[1:6], by_kind, fields[-1]))
        return reports

    # -- writing (serialised by the file lock) ----------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            if _SEQ.unpack_from(self._page, SEQ_AT)[0] & 1:  # its last holder died writing
                self._recover()  # (or this writer's own reading of the anchor would wait)
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _write_anchor(
        self,
        wall: float,
        modelled: float,
        rate: float,
        hold: float,
        promise: tuple[float, float, float] | None = None,
    ) -> None:
        page = self._page
        seq = _SEQ.unpack_from(page, SEQ_AT)[0]
        _SEQ.pack_into(page, SEQ_AT, seq + 1)
        _ANCHOR.pack_into(page, ANCHOR_AT, wall, modelled, rate, hold)
        _ANCHOR.pack_into(page, _history_at(seq // 2 + 1), wall, modelled, rate, hold)
        if promise is not None:
            _PROMISE.pack_into(page, PROMISE_AT, *promise)
        _SEQ.pack_into(page, SEQ_AT, seq + 2)

    def set_rate(self, rate: float) -> float:
        """Run at `rate` modelled seconds per wall second from now on (at most the ceiling);
        under a promise, at most what it allows now (`fastest_rate`), and the promise grows
        from here. Returns the rate set."""
        _check_rate(rate)
        if rate > self.ceiling:
            raise ClockError(f"rate {rate:g} is above the clock's ceiling {self.ceiling:g}")
        with self._locked():
            anchor, (growth, promised, since) = self._consistent()
            wall = self.monotonic()
            if growth < math.inf:
                rate = min(rate, _promised(growth, promised, since, wall, self.ceiling))
            self._mark_binding(anchor, wall)  # before the anchor that dates it changes
            self._write_anchor(wall, anchor.at(wall), rate, anchor.hold, (growth, rate, wall))
            return rate

    def set_growth(self, per_s: float) -> None:
        """Promise that the rate grows at most by exp(`per_s`) per wall second from the last
        rate set (sleepers rely on it). A promise is only ever tightened: a smaller `per_s`
        than the page's stands, a larger one is refused."""
        if not (math.isfinite(per_s) and per_s >= 0):
            raise ClockError(f"a growth bound must be a number >= 0, got {per_s!r}")
        with self._locked():
            anchor, (growth, _, _) = self._consistent()
            if per_s > growth:
                raise ClockError(f"growth {per_s:g}/s would break the promise of {growth:g}/s")
            wall = self.monotonic()
            self._write_anchor(
                anchor.wall, anchor.modelled, anchor.rate, anchor.hold, (per_s, anchor.rate, wall)
            )

    def set_ceiling(self, ceiling: float) -> None:
        """The fastest the rate may become from now on (sleepers rely on it)."""
        _check_rate(ceiling)
        with self._locked():
            if ceiling < self.anchor().rate:
                raise ClockError(f"ceiling {ceiling:g} is below the rate {self.anchor().rate:g}")
            _CEILING.pack_into(self._page, CEILING_AT, ceiling)

    def set_lag_target(self, seconds: float) -> None:
        """The mean lag (modelled seconds) the rate's controller keeps the participants within."""
        with self._locked():
            _LAG_TARGET.pack_into(self._page, LAG_TARGET_AT, seconds)

    def slot_named(self, name: str) -> int | None:
        """The index of the claimed slot called `name` (the first), or None."""
        encoded = name.encode()[:NAME_BYTES]
        for index in range(MAX_SLOTS):
            if self._page[_slot_at(index) : _slot_at(index) + NAME_BYTES].rstrip(b"\0") == encoded:
                return index
        return None

    def claim(self, name: str, pid: int | None = None) -> int:
        """A free slot for participant `name` (its index)."""
        encoded = name.encode()[:NAME_BYTES]
        if not encoded:
            raise ClockError("a participant needs a name")
        with self._locked():
            for index in range(MAX_SLOTS):
                at = _slot_at(index)
                if not _SLOT.unpack_from(self._page, at)[0].rstrip(b"\0"):
                    _SLOT.pack_into(
                        self._page, at, encoded, pid or os.getpid(), math.inf, 0.0, 0, 0,
                        *(0, 0.0) * LAG_COUNTERS, 0.0,
                    )  # fmt: skip
                    _SLOT_READERS.pack_into(self._page, at + SLOT_READERS_AT, 0)  # past _SLOT
                    return index
        raise ClockError(f"clock page {self.path}: all {MAX_SLOTS} slots are taken")

    def free(self, index: int) -> None:
        """Give a slot back (its hold, if any, is released first)."""
        self.release(index)
        with self._locked():
            self._clear(index)

    def free_into(self, index: int, into: int) -> None:
        """Give a slot back, its holds' counters (posted, binding, wall seconds frozen) added
        to slot `into`'s first, in one write: a reader summing both slots loses none of them.
        Its hold, if any, is released first (and counted)."""
        with self._locked():
            self._release(index)
            source, target = _slot_at(index), _slot_at(into)
            _, frozen = _SLOT_HOLD.unpack_from(self._page, source + SLOT_HOLD_AT)
            posted, binding = _SLOT_HOLDS.unpack_from(self._page, source + SLOT_HOLDS_AT)
            held, frozen_before = _SLOT_HOLD.unpack_from(self._page, target + SLOT_HOLD_AT)
            _SLOT_HOLD.pack_into(self._page, target + SLOT_HOLD_AT, held, frozen_before + frozen)
            posted_before, binding_before = _SLOT_HOLDS.unpack_from(
                self._page, target + SLOT_HOLDS_AT
            )
            _SLOT_HOLDS.pack_into(
                self._page, target + SLOT_HOLDS_AT, posted_before + posted, binding_before + binding
            )
            self._clear(index)

    def _clear(self, index: int) -> None:
        """Make a slot whose hold is released free (unnamed, its counters zero). The hold
        stays at inf throughout, so a kill between these writes leaves at worst a slot holding
        nothing, never a nameless one holding at 0."""
        at = _slot_at(index)
        hold_end = at + SLOT_HOLD_AT + _SLOT_HOLD.size
        self._page[at : at + SLOT_HOLD_AT] = bytes(SLOT_HOLD_AT)
        self._page[hold_end : at + SLOT_BYTES] = bytes(at + SLOT_BYTES - hold_end)
        _SLOT_HOLD.pack_into(self._page, at + SLOT_HOLD_AT, math.inf, 0.0)

    def recover(self) -> bool:
        """Make the page whole again if a writer died inside its critical section (SIGKILL,
        a crash: the lock goes with its open files, its half-done write stays): the anchor's
        write left under way (readers would wait for it forever), or its hold no longer the
        slots' earliest (a release that cleared its slot but not the anchor would stand the
        clock still for good). Time goes on from where it stood. Returns whether it did
        anything."""
        with self._locked():
            return self._recover()

    def _recover_if_unlocked(self) -> None:
        """Recover, if no writer is inside (a fresh open file: even this process's own other
        mappings, which may be writing from another thread, exclude it)."""
        fd = os.open(self.path, os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # a writer is inside, alive
            self._recover()
        finally:
            os.close(fd)

    def _recover(self) -> bool:
        page = self._page
        seq = _SEQ.unpack_from(page, SEQ_AT)[0]
        torn = bool(seq & 1)
        if torn:  # its history entry too holds what the anchor holds, until the rewrite below
            _ANCHOR.pack_into(
                page, _history_at(seq // 2 + 1), *_ANCHOR.unpack_from(page, ANCHOR_AT)
            )
            _SEQ.pack_into(page, SEQ_AT, seq + 1)
        anchor = Anchor(*_ANCHOR.unpack_from(page, ANCHOR_AT))
        earliest = self._earliest_hold()
        if not torn and earliest == anchor.hold:
            return False
        wall = self.monotonic()
        self._mark_binding(anchor, wall)
        since = _BINDING.unpack_from(page, BINDING_AT)[0]
        if since < math.inf and earliest != anchor.hold:  # it stood at a hold no one has
            total = _FROZEN.unpack_from(page, FROZEN_AT)[0]
            _FROZEN.pack_into(page, FROZEN_AT, total + wall - since)
            _BINDING.pack_into(page, BINDING_AT, math.inf)
        self._write_anchor(wall, anchor.at(wall), anchor.rate, earliest)
        self._mark_binding(self.anchor(), wall)
        return True

    def stop_participant(self, pid: int, stop: Callable[[], None]) -> list[str]:
        """Stop process `pid` with `stop` (which returns once it has stopped) and release its
        slots' holds, the writers' lock held throughout: so it is never stopped inside a
        writer's critical section (the lock would stay its own until it resumes, and every
        participant's next hold would wait for it), and posts no hold after the release. Its
        slots stay claimed: resumed, it holds as before. Returns the released slots' names."""
        with self._locked():
            stop()
            released = []
            for report in self.slots():
                if report.pid == pid and report.hold_at < math.inf:
                    self._release(report.index)
                    released.append(report.name)
            return released

    def hold(self, index: int, at: float) -> float:
        """Hold modelled time at `at` (or at the present, if `at` has passed) until `release`;
        returns where it holds. A slot holds one time at most: a new hold replaces its last."""
        with self._locked():
            return self._hold(index, at)

    def _hold(self, index: int, at: float) -> float:
        self._release(index)
        anchor = self.anchor()
        wall = self.monotonic()
        at = max(at, anchor.at(wall))
        where = _slot_at(index)
        _, frozen = _SLOT_HOLD.unpack_from(self._page, where + SLOT_HOLD_AT)
        _SLOT_HOLD.pack_into(self._page, where + SLOT_HOLD_AT, at, frozen)
        posted, binding = _SLOT_HOLDS.unpack_from(self._page, where + SLOT_HOLDS_AT)
        _SLOT_HOLDS.pack_into(self._page, where + SLOT_HOLDS_AT, posted + 1, binding)
        earliest = self._earliest_hold()
        if earliest != anchor.hold:
            self._write_anchor(wall, anchor.at(wall), anchor.rate, earliest)
            self._mark_binding(self.anchor(), wall)
        return at

    def hold_for_one_more(self, index: int, at: float) -> float:
        """Hold modelled time at `at` (or the present) for one more reader: where the slot
        holds already, for readers of other messages still to let go (`let_go_one`), that hold
        stands for this one too (time stood still there since). Returns where it holds."""
        with self._locked():
            where = _slot_at(index)
            held, _ = _SLOT_HOLD.unpack_from(self._page, where + SLOT_HOLD_AT)
            (readers,) = _SLOT_READERS.unpack_from(self._page, where + SLOT_READERS_AT)
            if held == math.inf:  # a new hold, for this reader alone
                _SLOT_READERS.pack_into(self._page, where + SLOT_READERS_AT, 1)
                return self._hold(index, at)
            _SLOT_READERS.pack_into(self._page, where + SLOT_READERS_AT, readers + 1)
            posted, binding = _SLOT_HOLDS.unpack_from(self._page, where + SLOT_HOLDS_AT)
            _SLOT_HOLDS.pack_into(self._page, where + SLOT_HOLDS_AT, posted + 1, binding)
            return held

    def readers_held_for(self, index: int) -> int:
        """How many readers the slot's hold stands for (`hold_for_one_more`)."""
        return _SLOT_READERS.unpack_from(self._page, _slot_at(index) + SLOT_READERS_AT)[0]

    def let_go_one(self, index: int, arrived: float = math.inf, readers: int | None = None) -> bool:
        """One reader fewer for the slot's hold (`hold_for_one_more`), released when none is
        left. Nothing is let go (False) if it stands for no reader; if it stands at an instant
        after `arrived` (modelled; ARRIVAL_SLACK_S spared), when the reader's message had
        already come, so it is another's; or, given `readers`, if it stands for another number
        of them (one let go meanwhile: the caller counted on that number)."""
        with self._locked():
            where = _slot_at(index)
            (count,) = _SLOT_READERS.unpack_from(self._page, where + SLOT_READERS_AT)
            held, _ = _SLOT_HOLD.unpack_from(self._page, where + SLOT_HOLD_AT)
            if (
                count == 0
                or held > arrived + ARRIVAL_SLACK_S
                or (readers is not None and count != readers)
            ):
                return False
            _SLOT_READERS.pack_into(self._page, where + SLOT_READERS_AT, count - 1)
            if count == 1:
                self._release(index)
            return True

    def let_go_overdue(self, index: int, posted: deque[float], wall: float, cap_s: float) -> None:
        """Let go of each reader of the slot's hold (`hold_for_one_more`, its wall time of
        posting in `posted`, oldest first) not let go of within `cap_s` by `wall` (the reader
        lost, or the message never read): time stood still no longer. Readers' let-gos are
        taken as the oldest holds' (which one a reader let go of is not known), so those left
        in `posted` are the youngest, and the last of them ends at the latest one's cap."""
        while posted:
            readers = self.readers_held_for(index)
            while len(posted) > readers:
                posted.popleft()
            if not posted or wall - posted[0] < cap_s:
                return
            if self.let_go_one(index, readers=readers):
                posted.popleft()

    def release(self, index: int) -> float:
        """Release the slot's hold; returns the wall seconds it stood the clock still."""
        with self._locked():
            return self._release(index)

    def _release(self, index: int) -> float:
        where = _slot_at(index)
        at, frozen = _SLOT_HOLD.unpack_from(self._page, where + SLOT_HOLD_AT)
        if at == math.inf:
            return 0.0
        # the readers it stood for (`hold_for_one_more`) go with it, however it is released
        _SLOT_READERS.pack_into(self._page, where + SLOT_READERS_AT, 0)
        anchor = self.anchor()
        wall = self.monotonic()
        self._mark_binding(anchor, wall)
        since = _BINDING.unpack_from(self._page, BINDING_AT)[0]
        stood = wall - since if since < math.inf and at <= anchor.hold else 0.0
        _SLOT_HOLD.pack_into(self._page, where + SLOT_HOLD_AT, math.inf, frozen + stood)
        if stood > 0:
            posted, binding = _SLOT_HOLDS.unpack_from(self._page, where + SLOT_HOLDS_AT)
            _SLOT_HOLDS.pack_into(self._page, where + SLOT_HOLDS_AT, posted, binding + 1)
            total = _FROZEN.unpack_from(self._page, FROZEN_AT)[0]
            _FROZEN.pack_into(self._page, FROZEN_AT, total + stood)
        earliest = self._earliest_hold()
        if at <= anchor.hold:  # the earliest hold went: time goes on, unless another holds
            still = since < math.inf and earliest == anchor.hold  # the same instant
            _BINDING.pack_into(self._page, BINDING_AT, wall if still else math.inf)
        # Time stood at the earliest hold: it goes on from there, not from where the
        # anchor's line has run to meanwhile.
        self._write_anchor(wall, anchor.at(wall), anchor.rate, earliest)
        return stood

    def _mark_binding(self, anchor: Anchor, wall: float) -> None:
        """Note when time began to stand at the earliest hold, if it has by `wall`."""
        if anchor.hold == math.inf or _BINDING.unpack_from(self._page, BINDING_AT)[0] < math.inf:
            return
        if anchor.modelled + (wall - anchor.wall) * anchor.rate >= anchor.hold:
            since = max(anchor.wall, anchor.wall_at(anchor.hold))
            _BINDING.pack_into(self._page, BINDING_AT, since)

    def _earliest_hold(self) -> float:
        page = self._page
        return min(
            _SLOT_HOLD.unpack_from(page, _slot_at(i) + SLOT_HOLD_AT)[0] for i in range(MAX_SLOTS)
        )

    # -- a participant's own counters (written by the slot's owner only) --------------------

    def count_lag(self, index: int, lag: float, kind: int = 0) -> None:
        """Add one lag sample of `kind` (modelled seconds, 0 when on time) to the slot's
        counters."""
        self.count_lags(index, kind, 1, lag, lag)

    def count_lags(self, index: int, kind: int, count: int, total: float, worst: float) -> None:
        """Add `count` lag samples of `kind` at once, summing to `total` (modelled seconds),
        the largest `worst`: what a participant counting many at a time (the shaper, a batch
        of packets) writes in one go."""
        if not 0 <= kind < LAG_COUNTERS:
            raise ClockError(f"no lag kind {kind}: the page counts {LAG_COUNTERS}")
        slot = _slot_at(index)
        where = slot + SLOT_LAG_AT + kind * _SLOT_LAG.size
        counted, summed = _SLOT_LAG.unpack_from(self._page, where)
        _SLOT_LAG.pack_into(self._page, where, counted + count, summed + total)
        (largest,) = _SLOT_LAG_MAX.unpack_from(self._page, slot + SLOT_LAG_MAX_AT)
        if worst > largest:
            _SLOT_LAG_MAX.pack_into(self._page, slot + SLOT_LAG_MAX_AT, worst)


def _history_at(entry: int) -> int:
    return HISTORY_AT + (entry % HISTORY_ANCHORS) * _ANCHOR.size


def _slot_at(index: int) -> int:
    if not 0 <= index < MAX_SLOTS:
        raise ClockError(f"no slot {index}")
    return HEADER_BYTES + index * SLOT_BYTES


def _promised(growth: float, rate: float, since: float, wall: float, ceiling: float) -> float:
    """The fastest rate a promise allows at `wall`: `rate`, grown at `growth` per wall second
    since `since`, never above the ceiling."""
    exponent = growth * max(0.0, wall - since)
    if exponent > math.log(ceiling / rate):  # (and no overflow)
        return ceiling
    return min(ceiling, rate * math.exp(exponent))


def _check_rate(rate: float) -> None:
    if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
        raise ClockError(f"a clock rate must be a positive number, got {rate!r}")
