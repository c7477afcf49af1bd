"""A control `Channel` over loopback TCP, its far end served by a peer of the test's own:
the sending side of the channel tests, with no deployment and no namespaces."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from pddemu.runtime.auth import RunSecret
from pddemu.runtime.channel import Channel

Peer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A peer that reads whatever comes until the sender closes."""
    while await reader.read(1 << 16):
        pass
    writer.close()


@asynccontextmanager
async def channel_to(peer: Peer, dated: bool) -> AsyncIterator[Channel]:
    """FE0's control channel to MD0, MD0 being `peer` on a loopback server that stands while
    the block runs."""
    server = await asyncio.start_server(peer, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        yield await Channel.connect(
            "127.0.0.1", port, "FE0", "MD0", "control", RunSecret.new(), dated=dated
        )
