"""SIGINT/SIGTERM handlers that only act in the process that installed them.

Libraries fork helper children that inherit Python-level handlers (pyroute2 forks one to open a
socket in a namespace, then SIGTERMs it). A handler that raised there would run the parent's
cleanup inside the child (removing the parent's namespaces); in a forked child these handlers
instead die the way an unhandled signal would.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable


def on_termination(callback: Callable[[int], None]) -> None:
    owner = os.getpid()

    def handler(signum: int, _frame: object) -> None:
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        callback(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)


def raise_keyboard_interrupt(_signum: int) -> None:
    """Turn SIGTERM into the same orderly unwinding as Ctrl-C."""
    raise KeyboardInterrupt
