"""Bulk KV transfers: one TCP connection per transfer in flight, reused when idle.

Transfers to the same destination never share a connection, so a small increment is not stuck
behind a large one (they share the link the way TCP flows do: fairly). A transfer on a
connection is `kv_begin`, KV chunks, `kv_end`; closing the connection mid-way cancels it.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable

from pddemu.runtime.channel import Channel


class TransferPool:
    def __init__(self, open_channel: Callable[[str, str], Awaitable[Channel]]) -> None:
        self._open = open_channel
        self._idle: dict[str, list[Channel]] = defaultdict(list)

    async def acquire(self, destination: str) -> Channel:
        idle = self._idle[destination]
        while idle:
            channel = idle.pop()
            if not channel.closed:
                return channel
        return await self._open(destination, "kv")

    def release(self, destination: str, channel: Channel) -> None:
        if not channel.closed:
            self._idle[destination].append(channel)


class Progress:
    """How far a request's KV has been computed, for senders streaming it as it grows."""

    def __init__(self) -> None:
        self.tokens = 0
        self.finished = False
        self._changed = asyncio.Condition()

    async def advance(self, tokens: int, finished: bool = False) -> None:
        async with self._changed:
            self.tokens = tokens
            self.finished = self.finished or finished
            self._changed.notify_all()

    async def wait_beyond(self, tokens: int) -> None:
        """Until more than `tokens` are computed, or the KV is complete."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.tokens > tokens or self.finished)
