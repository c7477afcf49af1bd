"""A scenario run as an instance's process runs its loop: on a fresh uvloop loop, closed
without cancelling what is left, so a task left pending is destroyed with the loop, and says so
in the log."""

from __future__ import annotations

import gc
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop


def run_and_close_the_loop(
    scenario: Callable[[], Coroutine[Any, Any, list[socket.socket]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Run `scenario`, close its loop, collect what it left, close the client sockets it
    returns, and assert nothing was logged at warning or above (a pending task's
    destruction, an unclosed transport)."""
    loop = uvloop.new_event_loop()
    try:
        clients = loop.run_until_complete(scenario())
    finally:
        loop.close()
    gc.collect()
    for client in clients:
        client.close()
    noise = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not noise, noise
