"""Several emulations at once, each in a child process of its own: how `pddemu emulate
--system all` runs its three systems side by side.

Each child is forked from the command's process (the config and workload are loaded once) and
does its work there: for `pddemu emulate`, its own network (namespaces, shaper, clock page and
controller), so no system's traffic queues behind another's and each clock dilates for its own
system's lag alone. A child sends its result back (pickled) and exits; this process is told of
each result as it comes, in the order they come.

Signals, as a sweep's points (`pddemu.sweep.runner`): the children are in a session of their
own, so a Ctrl-C at the terminal reaches this process alone, which passes each SIGINT or
SIGTERM on to every child still running as a SIGTERM: the first makes each end what is in
flight and send what it has, a second stops them at once (each still removes what it made) and
is raised here as KeyboardInterrupt once they have all ended. A child gets SIGTERM when this
process dies, even by SIGKILL (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from netem.signals import on_termination, raise_keyboard_interrupt

PR_SET_PDEATHSIG = 1
INTERRUPTED_EXIT = 130  # a child stopped at once, without a result
STOP_TIMEOUT_S = 60.0  # wall seconds a child has, after a second signal, to remove what it made

TERMINATING = {signal.SIGINT, signal.SIGTERM}
Work = Callable[[str], Any]  # run in the child: the name's result (picklable)
Finished = Callable[[str, Any], None]  # called here with each result as it comes


@dataclass
class Child:
    name: str
    process: multiprocessing.process.BaseProcess
    results: Connection  # this process's end of the child's pipe
    result: Any = None
    received: bool = False
    signalled: int = 0  # the SIGTERMs passed on to it


@dataclass
class Outcome:
    """How the children ended: those that sent no result, with their exit status."""

    failed: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False  # a SIGINT or SIGTERM came while they ran


def run_at_once(names: Sequence[str], work: Work, finished: Finished) -> Outcome:
    """`work(name)` for every name, each in a child process, all at once; `finished(name,
    result)` is called here as each result comes (while the others run on). Returns once every
    child has ended; a second interrupt raises KeyboardInterrupt then."""
    context = multiprocessing.get_context("fork")  # the loaded workload and config, as they are
    children: list[Child] = []
    signals = 0
    passing_on = False

    def catch_up() -> None:
        """Pass on to every running child the signals it has not had yet, once each: run by
        the handler and after each start (a signal that came while a child was being started
        reaches it then). The handler, run while this is under way, leaves it to finish."""
        nonlocal passing_on
        if passing_on:
            return
        passing_on = True
        try:
            while lagging := [
                child
                for child in children
                if child.signalled < signals
                and child.process.pid is not None
                and child.process.is_alive()
            ]:
                for child in lagging:
                    child.signalled += 1
                    os.kill(child.process.pid, signal.SIGTERM)  # type: ignore[arg-type]
        finally:
            passing_on = False

    def pass_on(_signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            print(
                "pddemu: stopping every system; writing what finished (again to stop at once)",
                file=sys.stderr,
            )
        catch_up()

    on_termination(pass_on)
    try:
        for name in names:  # each makes its own network: none inherits another's (nor its guardian)
            ours, theirs = context.Pipe(duplex=False)
            process = context.Process(
                target=_child, args=(name, work, theirs), name=f"pddemu-{name}", daemon=False
            )
            # the child is born with SIGINT and SIGTERM blocked, until its handler is armed
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINATING)
            try:
                process.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            theirs.close()
            children.append(Child(name, process, ours))
            catch_up()
        _collect(children, finished)
    finally:
        on_termination(raise_keyboard_interrupt)
        if any(child.process.is_alive() for child in children):  # this process is unwinding
            for child in children:
                _stop(child)
    if signals > 1:
        raise KeyboardInterrupt
    return Outcome(
        failed={
            child.name: child.process.exitcode or 0 for child in children if not child.received
        },
        interrupted=signals > 0,
    )


def _collect(children: list[Child], finished: Finished) -> None:
    """Each result as it comes, then each child's end."""
    pending = {child.results: child for child in children}
    running = {child.process.sentinel: child for child in children}
    while pending or running:
        for ready in wait([*pending, *running]):
            if ready in pending:
                child = pending.pop(ready)  # type: ignore[index]
                try:
                    child.result = ready.recv()  # type: ignore[union-attr]
                    child.received = True
                except EOFError:  # it ended without one
                    continue
                finally:
                    child.results.close()
                finished(child.name, child.result)
            else:
                child = running.pop(ready)  # type: ignore[index]
                child.process.join()


def _stop(child: Child) -> None:
    """Ask a child to remove what it made and end (SIGTERM); kill it if it does not."""
    if child.process.is_alive() and child.process.pid is not None:
        os.kill(child.process.pid, signal.SIGTERM)
    child.process.join(STOP_TIMEOUT_S)
    if child.process.is_alive():
        child.process.kill()  # the network's guardian removes what it left
        child.process.join()


def _child(name: str, work: Work, results: Connection) -> None:
    """The child's side: its own session, bound to its parent's life, signals as a command's."""
    parent = os.getppid()
    os.setsid()
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    on_termination(raise_keyboard_interrupt)
    if os.getppid() != parent:  # the parent died before the signal was armed
        sys.exit(INTERRUPTED_EXIT)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, TERMINATING)  # one sent meanwhile comes now
        result = work(name)
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED_EXIT)
    results.send(result)
    results.close()
