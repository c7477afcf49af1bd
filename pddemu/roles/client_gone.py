"""A client that goes away gives its request up.

aiohttp cancels a request's handler when its connection closes (the instances' and the host
door's runners are made with `handler_cancellation`), and a write to a closed connection raises
ConnectionResetError; either way the request is abandoned, so it fails as cancelled and
releases what it holds in the emulated system at once rather than running to its end for
nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

CLIENT_GONE = "cancelled: the client went away"


class Abandonable(Protocol):
    def abandon(self, reason: str) -> None: ...


@contextmanager
def client_gone_abandons(request: Abandonable) -> Iterator[None]:
    try:
        yield
    except (asyncio.CancelledError, ConnectionResetError):
        request.abandon(CLIENT_GONE)
        raise
