"""A message leaves in as few TCP segments as its bytes need. With TCP_NODELAY each write is a
segment of its own, and on a slow emulated WAN the first window holds only a few segments (the
bottleneck's queue: 5 at 2.5 Gbit/s), so a routing question written a frame at a time waited a
round trip for the first acknowledgements (docs/validation.md, kv-transfer's bandwidth part)."""

from __future__ import annotations

import asyncio

import pytest

from netem.tcp import tcp_info
from pddemu.wire import TokenIds
from tests.runtime.loopback import channel_to, swallow

PROMPT_IDS = 512  # a 16K-token prompt's genuine ids at the default token scale (32)


async def segments_sent(dated: bool, kind: str) -> int:
    """Data segments the sender's socket sent for one `kind` message carrying a prompt's ids."""
    async with channel_to(swallow, dated) as channel:
        sock = channel.writer.get_extra_info("socket")
        before = tcp_info(sock)["data_segs_out"]
        ids = TokenIds.from_ints("r", 0, range(PROMPT_IDS))
        await channel.control(kind, {"rid": "r"}, ids)
        sent = tcp_info(sock)["data_segs_out"] - before
        channel.close()
    return sent


@pytest.mark.parametrize("dated", [False, True])
def test_a_message_and_its_attachment_leave_in_one_segment(dated: bool) -> None:
    """Loopback takes 64 KB a segment: the control frame and its ids (2 KB) fit in one."""
    assert asyncio.run(segments_sent(dated, "prefill")) == 1


@pytest.mark.parametrize("dated", [False, True])
def test_a_routing_message_leaves_in_two_segments(dated: bool) -> None:
    """All of it but its last byte, then that byte alone (marked for the shaper's hold)."""
    assert asyncio.run(segments_sent(dated, "match")) == 2
