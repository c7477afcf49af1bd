"""An instance's stop, as its process does it (`Instance.run`, then the loop closed without
cancelling what is left): no task serving a connection is left pending."""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from netem.clock import SharedClock
from pddemu.config import config_to_json, load_config
from pddemu.roles.base import Instance
from pddemu.roles.frontend import Frontend
from pddemu.roles.relay import RelayInstance
from pddemu.roles.spec import Address, InstanceSpec
from tests.process_loop import run_and_close_the_loop
from tests.roles.in_process import instance


def test_an_instance_stopping_leaves_no_connection_task_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three peers connected, each connection's task waiting for its hello (a relay's
    connections are read by the stream transport, not dated): closed and awaited at the stop,
    none is destroyed pending with the loop. On the code before, each was."""

    async def scenario() -> list[socket.socket]:
        rld = instance(RelayInstance, "RLD")
        server = await asyncio.start_server(rld._accept, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        while len(rld._accepting) < len(clients):
            await asyncio.sleep(0.01)
        await rld.close_connections(server)
        assert not rld._accepting
        return clients

    run_and_close_the_loop(scenario, caplog)


def _beating_to_a_closed_port(tmp_path) -> Instance:  # type: ignore[no-untyped-def]
    """An instance on a run's clock page whose router refuses connections: every heartbeat
    is refused."""
    SharedClock.create(tmp_path / "clock")
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        router_port = closed.getsockname()[1]
    me = Address("P0", "P", "127.0.0.1", 0, 0)
    router = Address("FE0", "FE", "127.0.0.1", router_port, router_port)
    spec = InstanceSpec(
        me, "pdd", "", {"P0": me, "FE0": router}, config_to_json(load_config()), 0.0
    )
    spec.clock = str(tmp_path / "clock")
    return Instance(spec)


def _run_and_stop(made: Instance, raised: list[BaseException | None]) -> None:
    """`made.run()` for a few heartbeat periods, stopped, and as long again after (the
    heartbeat thread, had it outlived the stop, would have woken), what the threads raise
    meanwhile kept in `raised`. What the run raises is raised."""
    period = made.config.faults.heartbeat_period_s
    previous_hook = threading.excepthook
    previous_sigcont = signal.getsignal(signal.SIGCONT)
    threading.excepthook = lambda args: raised.append(args.exc_value)

    async def scenario() -> None:
        running = asyncio.get_running_loop().create_task(made.run())
        await asyncio.sleep(3 * period)  # a few heartbeats, each refused
        made.stopping.set()
        await running

    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(scenario())
    finally:
        time.sleep(3 * period)
        loop.close()
        threading.excepthook = previous_hook
        signal.signal(signal.SIGCONT, previous_sigcont)


def test_an_instance_stopping_ends_its_heartbeats_before_closing_the_clock(tmp_path) -> None:
    """An instance on a run's clock page, beating to a router that refuses connections, runs
    and stops (`Instance.run`): its heartbeat thread is over when the stop returns, and does
    not read the page after the stop unmapped it. On the code before, the thread outlived the
    stop and its next wake-up raised `ValueError: mmap closed or invalid`."""
    raised: list[BaseException | None] = []
    _run_and_stop(_beating_to_a_closed_port(tmp_path), raised)
    assert not raised, raised
    assert not [t for t in threading.enumerate() if t.name == "heartbeats"]


def test_a_failed_close_still_ends_the_heartbeats_and_the_clock(tmp_path) -> None:
    """Closing the connections fails at the stop: the failure is raised, and the heartbeat
    thread is still over and the clock's page given back (on the code before, both were
    skipped)."""
    made = _beating_to_a_closed_port(tmp_path)

    async def failing_close(_server: object) -> None:
        raise OSError("closing failed")

    made.close_connections = failing_close  # type: ignore[method-assign]
    raised: list[BaseException | None] = []
    with pytest.raises(OSError, match="closing failed"):
        _run_and_stop(made, raised)
    assert not raised, raised
    assert not [t for t in threading.enumerate() if t.name == "heartbeats"]
    assert made.clock.slot is None and made.clock.source._page.closed


def test_a_heartbeat_thread_failing_before_its_loop_runs_is_raised_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The heartbeat thread cannot make its loop (here: no file descriptor left): starting the
    heartbeats raises an error naming it. On the code before, the caller waited forever (the
    wait is bounded here so that the test fails, not hangs)."""
    made = instance(RelayInstance, "RLD")

    def no_descriptor_left(coroutine: Any) -> None:
        coroutine.close()
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(asyncio, "run", no_descriptor_left)
    outcome: list[BaseException | None] = []

    def start() -> None:
        try:
            made.start_heartbeats()
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    starting = threading.Thread(target=start, daemon=True)
    starting.start()
    starting.join(5.0)
    assert outcome, "start_heartbeats still waits 5 s after its thread failed"
    assert isinstance(outcome[0], RuntimeError), outcome
    assert "heartbeat thread failed" in str(outcome[0]) and "Too many open files" in str(outcome[0])
    assert made._heartbeat_thread is None


def test_a_frontend_stopping_leaves_no_task_to_read_the_closed_clock(tmp_path) -> None:
    """A frontend on a run's clock page runs its liveness checks, stops (`Instance.run`), and
    the loop goes on a few heartbeat periods (as it may run what is already due after the
    stop): no background task is left, none failed. On the code before, the liveness checks
    outlived the stop and their next wake-up read the unmapped page (`liveness checks:
    ValueError('mmap closed or invalid')`)."""
    SharedClock.create(tmp_path / "clock").close()
    me = Address("FE0", "FE", "127.0.0.1", 0, 0)
    spec = InstanceSpec(me, "pdd", "", {"FE0": me}, config_to_json(load_config()), 0.0)
    spec.clock = str(tmp_path / "clock")
    made = Frontend(spec)
    period = made.config.faults.heartbeat_period_s

    async def scenario() -> None:
        running = asyncio.get_running_loop().create_task(made.run())
        await asyncio.sleep(1.5 * period)  # the liveness checks have run
        made.stopping.set()
        await running
        await asyncio.sleep(3 * period)  # a check left behind would have woken by now

    _on_a_loop_of_its_own(scenario)
    assert not made.errors, made.errors
    assert not made._tasks


def test_the_stop_waits_for_no_task_whose_clean_up_waits_for_an_answer(tmp_path) -> None:
    """A background task whose clean-up waits for what never comes (as a flight waits for its
    transfers' reports from peers that are stopping too) is cancelled there as well: the
    stop returns at once, the task ended, the clock's page closed after it."""
    made = _beating_to_a_closed_port(tmp_path)
    never = asyncio.Event()
    cleaned: list[str] = []

    async def waits_in_its_clean_up() -> None:
        try:
            await never.wait()
        finally:
            cleaned.append("began")
            await never.wait()  # cancelled here too
            cleaned.append("never")

    async def scenario() -> None:
        running = asyncio.get_running_loop().create_task(made.run())
        await asyncio.sleep(0.05)
        task = made.spawn(waits_in_its_clean_up(), "clean-up")
        made.stopping.set()
        await asyncio.wait_for(running, 5.0)
        assert task.cancelled()

    _on_a_loop_of_its_own(scenario)
    assert cleaned == ["began"]
    assert made.clock.source._page.closed


def _on_a_loop_of_its_own(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run `scenario` on a fresh loop, closed after, and give SIGCONT back the handler it had
    (`Instance.run` sets its own)."""
    previous_sigcont = signal.getsignal(signal.SIGCONT)
    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()
        signal.signal(signal.SIGCONT, previous_sigcont)
