"""Instance faults on the run's shared clock: a paused or killed participant must not freeze
the run, wherever the fault lands.

Forced: the participant holds the clock (genuine work under way) and sits inside the page's
writers' lock when the fault comes, as an instance does for the instant of a hold or a release
(for long, on a loaded host that preempts it there).
- Paused there, it would keep the lock until its resume: the pause's own release of its hold
  would wait for it, and so would every participant's next hold.
- Killed there, the lock goes with it, but its write stays half-done: a release that cleared
  its slot and not the anchor leaves the clock standing at a hold no one has, and a kill
  between the seqlock's two writes leaves every reader waiting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from netem.clock import SharedClock
from pddemu.runtime import clock as runtime_clock
from pddemu.runtime.clock import PauseError, pause_process, wait_stopped
from pddemu.runtime.dilation import Dilation, DilationPolicy

IN_LOCK_S = 0.3  # wall seconds the participant stays inside the writers' lock each time

PARTICIPANT = """
    import sys, time
    from netem.clock import SharedClock

    shared = SharedClock(sys.argv[1])
    slot = shared.claim("MD0")
    while True:
        shared.hold(slot, shared.now())  # genuine work under way: the clock stands
        with shared._locked():  # a writer's critical section, preempted inside it
            print("in", flush=True)
            time.sleep(float(sys.argv[2]))
"""


def _participant(page: Path, code: str, *args: str) -> subprocess.Popen:
    """A participant process running `code`; it prints "in" once the fault may come."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), str(page), *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )


def _state(pid: int) -> str:
    line = Path(f"/proc/{pid}/stat").read_text()
    return line[line.rindex(")") + 2]


def test_a_pause_inside_a_hold_and_the_writers_lock_leaves_the_clock_running(
    tmp_path: Path,
) -> None:
    page = tmp_path / "clock"
    shared = SharedClock.create(page, rate=1.0)
    participant = _participant(page, PARTICIPANT, str(IN_LOCK_S))
    try:
        assert participant.stdout is not None
        assert participant.stdout.readline() == "in\n"  # holding, and inside the lock
        held_at = shared.now()
        started = time.monotonic()
        released = pause_process(shared, participant.pid)
        assert time.monotonic() - started < IN_LOCK_S + 2.0  # waited for the lock, no more
        assert released == ["MD0"]
        assert _state(participant.pid) == "T"
        # The clock runs on while it is paused, and any writer gets the lock.
        me = shared.claim("other")
        shared.hold(me, shared.now() + 0.01)
        shared.release(me)
        time.sleep(0.05)
        assert shared.now() > held_at + 0.04
        # Resumed, it holds again as before.
        participant.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 5.0
        while not any(r.name == "MD0" and r.hold_at < float("inf") for r in shared.slots()):
            assert time.monotonic() < deadline, "the resumed participant did not hold again"
            time.sleep(0.01)
    finally:
        participant.kill()
        participant.wait()
        shared.close()


def test_a_pause_that_does_not_take_is_undone_and_keeps_the_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that never stops (in an uninterruptible wait, stood in for here) could take the
    writers' lock once the pause lets go of it: the pause is undone, the process runs on."""
    monkeypatch.setattr(runtime_clock, "wait_stopped", lambda pid: False)
    page = tmp_path / "clock"
    shared = SharedClock.create(page, rate=1.0)
    participant = _participant(page, PARTICIPANT, "0.01")
    try:
        assert participant.stdout is not None
        assert participant.stdout.readline() == "in\n"
        with pytest.raises(PauseError, match=f"process {participant.pid} did not stop"):
            pause_process(shared, participant.pid)
        deadline = time.monotonic() + 5.0
        while _state(participant.pid) == "T":  # SIGCONT takes effect when next scheduled
            assert time.monotonic() < deadline, "the pause was not undone"
            time.sleep(0.01)
        assert participant.stdout.readline() == "in\n"  # running: in the lock again
    finally:
        participant.kill()
        participant.wait()
        shared.close()


def test_waiting_for_a_stop_sees_every_thread_stopped_or_the_process_gone() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not wait_stopped(sleeper.pid, timeout_s=0.05)
        sleeper.send_signal(signal.SIGSTOP)
        assert wait_stopped(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert wait_stopped(sleeper.pid)  # reaped: gone


DIES_MID_RELEASE = """
    import sys, time
    from netem.clock import SharedClock

    shared = SharedClock(sys.argv[1])
    slot = shared.claim("MD0")
    shared.hold(slot, shared.now())

    def killed_here(self):  # after the slot's write, before the anchor's
        print("in", flush=True)
        time.sleep(60)

    SharedClock._earliest_hold = killed_here
    shared.release(slot)
"""

DIES_MID_ANCHOR = """
    import sys, time
    from netem.clock import SEQ_AT, SharedClock, _SEQ

    shared = SharedClock(sys.argv[1])
    with shared._locked():  # the anchor's write begun: the seqlock odd
        _SEQ.pack_into(shared._page, SEQ_AT, _SEQ.unpack_from(shared._page, SEQ_AT)[0] + 1)
        print("in", flush=True)
        time.sleep(60)
"""


def _killed_at_in(participant: subprocess.Popen) -> None:
    assert participant.stdout is not None
    assert participant.stdout.readline() == "in\n"
    participant.kill()
    participant.wait()


def test_a_kill_inside_a_release_leaves_no_hold_standing(tmp_path: Path) -> None:
    page = tmp_path / "clock"
    shared = SharedClock.create(page, rate=1.0)
    dilation = Dilation(shared, DilationPolicy(ceiling=1.0, start=1.0))
    try:
        _killed_at_in(_participant(page, DIES_MID_RELEASE))
        stood = shared.now()
        time.sleep(0.05)
        assert shared.now() == stood  # at a hold no slot has any more
        assert dilation.release_dead() == ["MD0"]
        time.sleep(0.05)
        assert shared.now() > stood + 0.04
    finally:
        shared.close()


def test_a_kill_inside_the_anchors_write_leaves_no_reader_waiting(tmp_path: Path) -> None:
    page = tmp_path / "clock"
    shared = SharedClock.create(page, rate=1.0)
    try:
        _killed_at_in(_participant(page, DIES_MID_ANCHOR))
        me = shared.claim("other")
        shared.hold(me, 0.0)  # a writer (which reads the anchor under the lock) mends it
        shared.release(me)
        _killed_at_in(_participant(page, DIES_MID_ANCHOR))
        started = time.monotonic()
        first = shared.now()  # a reader finds it under way with no writer, and mends it
        assert time.monotonic() - started < 2.0
        time.sleep(0.05)
        assert shared.now() > first + 0.04
    finally:
        shared.close()
