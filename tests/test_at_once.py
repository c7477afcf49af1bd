"""`pddemu.at_once`, in-process with fake work: the children run at the same time, each result
is handed over as it comes, an interrupt is passed on to them (the first to end what is in
flight, the second to stop at once), and none outlives the call."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pddemu.at_once import run_at_once

WAIT_S = 20.0  # wall seconds a fake waits for something another process does


def wait_for(path: Path, timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture(autouse=True)
def own_signal_handlers() -> Iterator[None]:
    """run_at_once sets this process's SIGINT and SIGTERM handlers: put pytest's back."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def interrupt_when(*stages: list[Path]) -> threading.Thread:
    """SIGINT to this process (as a Ctrl-C would) once every path of a stage exists, a stage
    after another."""

    def send() -> None:
        for paths in stages:
            if not all(wait_for(path) for path in paths):
                return
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_the_children_run_at_the_same_time_and_each_result_comes_as_it_ends(
    tmp_path: Path,
) -> None:
    """ "a" cannot end until "b" has started: one after another, it would wait for good."""

    def work(name: str) -> dict[str, object]:
        (tmp_path / f"{name}.started").touch()
        if name == "a" and not wait_for(tmp_path / "b.started"):
            return {"name": name, "alone": True}
        if name == "b":
            wait_for(tmp_path / "a.started")
        return {"name": name, "pid": os.getpid(), "session": os.getsid(0)}

    got: list[tuple[str, dict[str, object]]] = []
    outcome = run_at_once(["a", "b"], work, lambda name, result: got.append((name, result)))
    assert sorted(name for name, _ in got) == ["a", "b"]
    results = dict(got)
    assert "alone" not in results["a"]
    assert {results["a"]["pid"], results["b"]["pid"]}.isdisjoint({os.getpid()})
    # each child in a session of its own: a Ctrl-C at the terminal reaches the parent alone
    assert os.getsid(0) not in {results["a"]["session"], results["b"]["session"]}
    assert outcome.failed == {} and not outcome.interrupted


def test_a_child_that_fails_is_named_with_its_status_and_the_others_are_kept(
    tmp_path: Path,
) -> None:
    def work(name: str) -> str:
        if name == "broken":
            raise SystemExit(1)
        return name

    got: list[str] = []
    outcome = run_at_once(["good", "broken"], work, lambda name, result: got.append(result))
    assert got == ["good"]
    assert outcome.failed == {"broken": 1}


def test_a_first_interrupt_makes_every_child_end_and_send_what_it_has(tmp_path: Path) -> None:
    """As `pddemu emulate` does: the first SIGTERM a child gets ends its replay, whose partial
    results it still sends."""

    def work(name: str) -> str:
        (tmp_path / name).touch()
        try:
            time.sleep(WAIT_S)
        except KeyboardInterrupt:
            return f"{name}: partial"
        return f"{name}: whole"

    sender = interrupt_when([tmp_path / "a", tmp_path / "b"])
    got: dict[str, str] = {}
    started = time.monotonic()
    outcome = run_at_once(["a", "b"], work, lambda name, result: got.update({name: result}))
    sender.join()
    assert got == {"a": "a: partial", "b": "b: partial"}
    assert outcome.interrupted and outcome.failed == {}
    assert time.monotonic() - started < WAIT_S


def test_a_second_interrupt_stops_every_child_at_once_then_raises(tmp_path: Path) -> None:
    """The children end (each removing what it made) before the interrupt goes on."""

    def work(name: str) -> str:
        (tmp_path / name).touch()
        try:
            time.sleep(WAIT_S)
        except KeyboardInterrupt:  # the first: it winds down, slowly
            try:
                (tmp_path / f"{name}.winding").touch()
                time.sleep(WAIT_S)
            except KeyboardInterrupt:  # the second: it cleans up and ends at once
                (tmp_path / f"{name}.cleaned").touch()
                raise
        return name

    sender = interrupt_when(
        [tmp_path / "a", tmp_path / "b"], [tmp_path / "a.winding", tmp_path / "b.winding"]
    )
    got: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run_at_once(["a", "b"], work, lambda name, result: got.append(result))
    sender.join()
    assert got == []
    assert (tmp_path / "a.cleaned").exists() and (tmp_path / "b.cleaned").exists()


def test_an_interrupt_while_a_child_is_being_started_still_reaches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal handled between a child's start and its being known here (CI once saw a child
    sleep through it) is passed on all the same; one started after it gets it at once."""
    process_class = multiprocessing.get_context("fork").Process
    start = process_class.start

    def start_then_interrupt(self: multiprocessing.process.BaseProcess) -> None:
        start(self)
        if self.name == "pddemu-a":
            os.kill(os.getpid(), signal.SIGINT)  # handled here, before run_at_once records "a"

    monkeypatch.setattr(process_class, "start", start_then_interrupt)

    def work(name: str) -> str:
        try:
            time.sleep(WAIT_S)
        except KeyboardInterrupt:
            return f"{name}: partial"
        return f"{name}: whole"

    got: dict[str, str] = {}
    started = time.monotonic()
    outcome = run_at_once(["a", "b"], work, lambda name, result: got.update({name: result}))
    assert time.monotonic() - started < WAIT_S / 2, got
    # each ended what it had: its work interrupted, or interrupted before it began
    for name in ("a", "b"):
        assert got.get(name) == f"{name}: partial" or outcome.failed.get(name) == 130
    assert outcome.interrupted
