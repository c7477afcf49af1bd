"""The shared clock (netem.clock), driven by a fake wall clock: rate changes, holds, slots,
and many processes reading it while it is written."""

from __future__ import annotations

import fcntl
import math
import multiprocessing
import random
import threading
import time
from pathlib import Path

import pytest

from netem import clock as clock_module
from netem.clock import MAX_SLOTS, ClockError, SharedClock


class FakeWall:
    """A monotonic clock that moves only when told."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def wall() -> FakeWall:
    return FakeWall()


@pytest.fixture
def page(tmp_path: Path) -> Path:
    return tmp_path / "clock"


def test_time_runs_at_the_rate_from_the_anchor(page: Path, wall: FakeWall) -> None:
    clock = SharedClock.create(page, rate=4.0, modelled=10.0, monotonic=wall)
    assert clock.now() == 10.0
    wall.advance(0.5)
    assert clock.now() == pytest.approx(12.0)
    assert clock.wall_delay(14.0) == pytest.approx(0.5)
    assert clock.wall_delay(11.0) == 0.0


def test_the_rate_never_exceeds_the_ceiling(page: Path, wall: FakeWall) -> None:
    clock = SharedClock.create(page, rate=2.0, monotonic=wall, ceiling=4.0)
    with pytest.raises(ClockError, match="above the clock's ceiling"):
        clock.set_rate(8.0)
    assert clock.earliest_wall_delay(8.0) == pytest.approx(2.0)  # were it to run at 4
    assert clock.wall_delay(8.0) == pytest.approx(4.0)
    with pytest.raises(ClockError, match="below the rate"):
        clock.set_ceiling(1.0)


def test_a_rate_change_reanchors_without_a_jump(page: Path, wall: FakeWall) -> None:
    clock = SharedClock.create(page, rate=8.0, monotonic=wall, ceiling=16.0)
    wall.advance(1.0)
    assert clock.now() == pytest.approx(8.0)
    clock.set_rate(2.0)  # dilation: slower from here on
    assert clock.now() == pytest.approx(8.0)
    wall.advance(1.0)
    assert clock.now() == pytest.approx(10.0)
    clock.set_rate(16.0)
    wall.advance(0.25)
    assert clock.now() == pytest.approx(14.0)


def test_time_never_goes_back_under_random_rate_changes(page: Path, wall: FakeWall) -> None:
    clock = SharedClock.create(page, rate=1.0, monotonic=wall, ceiling=64.0)
    other = SharedClock(page, monotonic=wall)  # another process's mapping of the same page
    rng = random.Random(7)
    last = expected = 0.0
    rate = 1.0
    for _ in range(2000):
        step = rng.uniform(0, 0.01)
        wall.advance(step)
        expected += step * rate
        if rng.random() < 0.3:
            rate = rng.choice([0.05, 0.5, 1.0, 3.0, 64.0])
            other.set_rate(rate)
        now = clock.now()
        assert now >= last
        assert now == pytest.approx(expected, rel=1e-9, abs=1e-9)
        last = now


def test_a_hold_stops_time_and_its_release_continues_from_it(page: Path, wall: FakeWall) -> None:
    clock = SharedClock.create(page, rate=10.0, monotonic=wall)
    worker = clock.claim("P0")
    assert clock.hold(worker, 1.0) == 1.0
    wall.advance(0.05)
    assert clock.now() == pytest.approx(0.5)  # not yet at the hold
    wall.advance(0.2)  # the genuine work overruns: time stands at 1.0
    assert clock.now() == pytest.approx(1.0)
    assert clock.wall_delay(1.5) == 0.0  # its line passed 1.5: only the hold stops it
    stood = clock.release(worker)
    assert stood == pytest.approx(0.15)  # it reached 1.0 after 0.1 s of wall time
    assert clock.now() == pytest.approx(1.0)  # no jump
    wall.advance(0.1)
    assert clock.now() == pytest.approx(2.0)
    assert clock.frozen_wall_s == pytest.approx(0.15)
    report = clock.slots()[0]
    assert (report.name, report.holds, report.holds_binding) == ("P0", 1, 1)
    assert report.frozen_wall_s == pytest.approx(0.15)


def test_a_hold_that_does_not_bind_changes_nothing(page: Path, wall: FakeWall) -> None:
    clock = SharedClock.create(page, rate=10.0, monotonic=wall)
    worker = clock.claim("MD0")
    clock.hold(worker, 1.0)
    wall.advance(0.05)
    assert clock.release(worker) == 0.0
    assert clock.now() == pytest.approx(0.5)
    wall.advance(0.05)
    assert clock.now() == pytest.approx(1.0)
    assert clock.slots()[0].holds_binding == 0


def test_a_hold_in_the_past_holds_the_present(page: Path, wall: FakeWall) -> None:
    clock = SharedClock.create(page, rate=1.0, modelled=5.0, monotonic=wall)
    worker = clock.claim("RLD0")
    assert clock.hold(worker, 2.0) == 5.0  # never back in time
    wall.advance(1.0)
    assert clock.now() == 5.0
    clock.release(worker)
    assert clock.now() == 5.0


def test_the_earliest_of_several_holds_binds(page: Path, wall: FakeWall) -> None:
    clock = SharedClock.create(page, rate=1.0, monotonic=wall)
    a, b = clock.claim("P0"), clock.claim("P1")
    clock.hold(a, 3.0)
    clock.hold(b, 2.0)
    wall.advance(5.0)
    assert clock.now() == 2.0
    assert clock.release(a) == 0.0  # not the one that stood the clock still
    assert clock.now() == 2.0
    assert clock.release(b) == pytest.approx(3.0)
    wall.advance(0.5)
    assert clock.now() == pytest.approx(2.5)


def test_equal_holds_keep_time_standing_until_both_release(page: Path, wall: FakeWall) -> None:
    clock = SharedClock.create(page, rate=1.0, monotonic=wall)
    a, b = clock.claim("MD0"), clock.claim("MD1")
    clock.hold(a, 1.0)
    clock.hold(b, 1.0)
    wall.advance(2.0)
    assert clock.release(a) == pytest.approx(1.0)
    wall.advance(1.0)
    assert clock.now() == 1.0
    assert clock.release(b) == pytest.approx(1.0)
    assert clock.frozen_wall_s == pytest.approx(2.0)
    wall.advance(1.0)
    assert clock.now() == pytest.approx(2.0)


def test_a_rate_change_while_held_keeps_time_at_the_hold(page: Path, wall: FakeWall) -> None:
    clock = SharedClock.create(page, rate=4.0, monotonic=wall)
    worker = clock.claim("P0")
    clock.hold(worker, 1.0)
    wall.advance(0.5)  # reached 1.0 at 0.25 s
    clock.set_rate(1.0)
    wall.advance(0.5)
    assert clock.now() == 1.0
    assert clock.release(worker) == pytest.approx(0.75)
    wall.advance(0.5)
    assert clock.now() == pytest.approx(1.5)


def test_a_new_hold_of_a_slot_replaces_its_last(page: Path, wall: FakeWall) -> None:
    clock = SharedClock.create(page, rate=1.0, monotonic=wall)
    worker = clock.claim("MD0")
    clock.hold(worker, 1.0)
    clock.hold(worker, 3.0)
    wall.advance(2.0)
    assert clock.now() == pytest.approx(2.0)
    wall.advance(2.0)
    assert clock.now() == 3.0


def test_slots_are_claimed_counted_and_freed(page: Path, wall: FakeWall) -> None:
    clock = SharedClock.create(page, monotonic=wall)
    clock.set_lag_target(0.002)
    first = clock.claim("FE0", pid=123)
    clock.count_lag(first, 0.001)
    clock.count_lag(first, 0.005)
    (report,) = clock.slots()
    assert (report.name, report.pid, report.lags) == ("FE0", 123, 2)
    assert (report.lag_sum_s, report.lag_max_s) == pytest.approx((0.006, 0.005))
    clock.hold(first, 10.0)
    clock.free(first)
    assert clock.slots() == []
    assert clock.anchor().hold == math.inf  # a freed slot's hold goes with it
    again = clock.claim("MD0", pid=456)  # the freed slot, wiped: nothing of FE0's left
    (report,) = clock.slots()
    assert again == first and (report.name, report.pid, report.lags) == ("MD0", 456, 0)
    assert (report.hold_at, report.frozen_wall_s, report.lag_sum_s) == (math.inf, 0.0, 0.0)
    for i in range(MAX_SLOTS - 1):
        clock.claim(f"p{i}")
    with pytest.raises(ClockError, match="slots are taken"):
        clock.claim("one too many")


def test_a_file_that_is_not_a_clock_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.write_bytes(b"x" * 8192)
    with pytest.raises(ClockError, match="not a clock page"):
        SharedClock(other)
    with pytest.raises(ClockError, match="No such file"):
        SharedClock(tmp_path / "missing")
    with pytest.raises(ClockError, match="positive"):
        SharedClock.create(tmp_path / "bad", rate=0.0)


def _read_many(path: str, seconds: float, queue: multiprocessing.Queue) -> None:
    clock = SharedClock(path)
    last, reads, backwards = -math.inf, 0, 0
    bound = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = clock.now()
        backwards += now < last
        last = now
        reads += 1
        bound = max(bound, now)
    queue.put((reads, backwards, bound))


def test_many_readers_in_other_processes_see_one_monotonic_time(page: Path) -> None:
    """Readers in four processes never see time go back while a writer changes the rate and
    posts and releases holds as fast as it can; nobody sees time beyond what it could be."""
    clock = SharedClock.create(page, rate=1.0, ceiling=2.0)
    worker = clock.claim("writer")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    readers = [context.Process(target=_read_many, args=(str(page), 1.5, queue)) for _ in range(4)]
    for reader in readers:
        reader.start()
    rng = random.Random(3)
    end = time.monotonic() + 1.5
    writes = 0
    while time.monotonic() < end:
        clock.set_rate(rng.choice([0.5, 1.0, 2.0]))
        with_hold = rng.random() < 0.5
        if with_hold:
            clock.hold(worker, clock.now() + rng.uniform(0, 0.001))
            clock.release(worker)
        writes += 1
    results = [queue.get(timeout=30) for _ in readers]
    for reader in readers:
        reader.join(30)
    assert writes > 1000
    for reads, backwards, bound in results:
        assert reads > 1000
        assert backwards == 0
        assert bound <= clock.now() + 1e-6


def test_a_past_wall_time_reads_as_the_clock_read_then(page: Path, wall: FakeWall) -> None:
    """The anchors' history tells a past wall time in modelled time as readers saw it then,
    whatever rate changes and holds came since (the current anchor alone would extrapolate
    back at today's rate, through the hold)."""
    clock = SharedClock.create(page, rate=2.0, ceiling=8.0, monotonic=wall)
    slot = clock.claim("P0")
    seen = []  # (wall, what now() read then)
    for step in range(40):
        seen.append((wall.t, clock.now()))
        wall.advance(0.013)
        if step % 7 == 3:
            clock.set_rate(1.0 + (step % 5))
        if step % 11 == 5:
            clock.hold(slot, clock.now() + 0.004)  # time stands at it for a while
        if step % 11 == 9:
            clock.release(slot)
    for at, modelled in seen:
        assert clock.modelled_at(at) == pytest.approx(modelled, abs=1e-9)
    assert clock.modelled_at(seen[0][0] - 1.0) is None  # before the page


def test_a_wall_time_older_than_the_history_is_not_told(page: Path, wall: FakeWall) -> None:
    from netem.clock import HISTORY_ANCHORS

    clock = SharedClock.create(page, rate=1.0, ceiling=4.0, monotonic=wall)
    then = wall.t + 0.0005
    wall.advance(0.001)
    assert clock.modelled_at(then) == pytest.approx(0.0005)
    for i in range(HISTORY_ANCHORS):
        wall.advance(0.001)
        clock.set_rate(1.0 + (i % 2))
    assert clock.modelled_at(then) is None
    assert clock.modelled_at(wall.t) == pytest.approx(clock.now())


def _linear_modelled_at(clock: SharedClock, wall: float) -> float | None:
    """The reference: every entry of the ring, newest first, to the first at or before `wall`."""
    from netem.clock import _SEQ, HISTORY_ANCHORS, SEQ_AT

    newest = _SEQ.unpack_from(clock._page, SEQ_AT)[0] // 2
    for index in range(newest, max(-1, newest - HISTORY_ANCHORS), -1):
        entry = clock._history_entry(index)
        if entry.wall <= wall:
            return entry.at(wall)
    return None


def test_a_past_wall_time_is_found_in_a_few_readings_of_a_full_ring(
    page: Path, wall: FakeWall, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past wall times are told as a scan of the whole ring would tell them, after it wrapped,
    reading at most about twice log2(ring) entries' walls each, however far back they are, and
    one or two for a date at or after the newest anchors (what a reader of a fresh receive
    date asks)."""
    from netem.clock import HISTORY_ANCHORS

    clock = SharedClock.create(page, rate=1.0, ceiling=8.0, monotonic=wall)
    start = wall.t
    rng = random.Random(5)
    for i in range(HISTORY_ANCHORS + HISTORY_ANCHORS // 3):  # wraps the ring
        wall.advance(rng.choice((0.0, 0.0004, 0.001, 0.003)))  # equal walls too
        clock.set_rate(1.0 + (i % 7))
    end = wall.t
    read = 0
    history_wall = clock._history_wall

    def counted(index: int) -> float:
        nonlocal read
        read += 1
        return history_wall(index)

    monkeypatch.setattr(clock, "_history_wall", counted)
    bound = 2 * math.ceil(math.log2(HISTORY_ANCHORS)) + 2
    queries = [start - 1.0, start, end, end + 0.5] + [rng.uniform(start, end) for _ in range(300)]
    told = 0
    for at in queries:
        read = 0
        got = clock.modelled_at(at)
        assert read <= bound
        assert got == _linear_modelled_at(clock, at)
        told += got is not None
    assert 0 < told < len(queries)  # both inside the ring and older than it
    for at in (end, end + 0.5):  # at or after the newest anchor
        read = 0
        clock.modelled_at(at)
        assert read == 1


def test_a_claimed_slot_holds_for_no_reader_whatever_its_bytes_held(
    page: Path, wall: FakeWall
) -> None:
    """The readers count lies past the slot's packed fields: a claim zeroes it too, so a slot
    whose page was not zeroed there (a freed slot's bytes left over) starts at no reader."""
    clock = SharedClock.create(page, rate=1.0, monotonic=wall)
    index = clock.claim("shaper routing/instant")
    clock.free(index)
    at = clock_module._slot_at(index) + clock_module.SLOT_READERS_AT
    clock_module._SLOT_READERS.pack_into(clock._page, at, 7)  # left over, as a crash could leave
    again = clock.claim("shaper routing/instant")
    assert again == index
    assert clock.readers_held_for(again) == 0


def test_readers_go_with_their_hold_however_it_is_released(page: Path, wall: FakeWall) -> None:
    """A routing hold standing for two readers is released by `stop_participant` (its owner
    paused): the readers go with it, so the next message's hold is let go by its own reader.
    On the code before, the count stayed at 2: the next hold stood for 3 readers, and its
    reader's let-go left time standing."""
    clock = SharedClock.create(page, rate=1.0, monotonic=wall)
    slot = clock.claim("shaper routing/instant", pid=4242)
    for _ in range(2):
        clock.hold_for_one_more(slot, clock.now())
    assert clock.stop_participant(4242, lambda: None) == ["shaper routing/instant"]
    assert clock.readers_held_for(slot) == 0
    wall.advance(1.0)
    held = clock.hold_for_one_more(slot, clock.now())
    wall.advance(1.0)
    assert clock.now() == held  # time stands at the new hold
    assert clock.let_go_one(slot, held)
    wall.advance(1.0)
    assert clock.now() == pytest.approx(held + 1.0)


def test_a_locked_read_of_the_slots_waits_for_a_writer(page: Path, wall: FakeWall) -> None:
    """A reader summing counters across slots reads under the writers' lock: while another
    process's writer holds it (a slot's counters half moved by `free_into`), the read waits."""
    clock = SharedClock.create(page, rate=1.0, monotonic=wall)
    slot = clock.claim("routing a")
    clock.hold(slot, clock.now())
    read: list[int] = []
    with open(page, "rb") as writer:
        fcntl.flock(writer, fcntl.LOCK_EX)  # another mapping's writer in its critical section
        reader = threading.Thread(target=lambda: read.append(len(clock.slots(locked=True))))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and not read  # waiting for the lock, not reading past it
        assert len(clock.slots()) == 1  # an unlocked read does not wait
        fcntl.flock(writer, fcntl.LOCK_UN)
    reader.join(10)
    assert read == [1]
