"""A message that queued on a shared connection (a KV link) which closed before its turn came
is not written, and what its sender would hold for its reading is not posted: nobody would
read it, and the hold would stand until its cap."""

from __future__ import annotations

import asyncio

import pytest

from tests.runtime.loopback import channel_to, swallow


def test_a_message_whose_turn_comes_after_the_link_closed_posts_no_hold() -> None:
    async def scenario() -> list[str]:
        turns: list[str] = []
        async with channel_to(swallow, dated=False) as channel:
            async with channel._lock:  # another transfer's message is being written
                queued = asyncio.ensure_future(
                    channel.control("kv_end", {"rid": "r"}, on_turn=lambda: turns.append("r"))
                )
                await asyncio.sleep(0.05)  # it waits for its turn
                channel.close()  # the link breaks meanwhile
            with pytest.raises(ConnectionResetError, match="closed"):
                await queued
        return turns

    assert asyncio.run(scenario()) == []
