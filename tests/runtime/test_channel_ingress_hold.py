"""A routing message's sender holds the present until the shaper has read it
(`ModelledClock.hold_until_shaped`, netem.clock.INGRESS_SLOT): the shaper lets go of one such
hold for each marked segment that ends a write. `Channel.send` posts the hold just before the
marked byte and lets go itself when that byte did not leave at once (queued behind a full send
buffer, it leaves later unmarked and the shaper would never let go), so every hold posted gets
exactly one let-go. Over loopback TCP, the hold stood for by a recorder."""

from __future__ import annotations

import asyncio
import socket

import pytest

from netem.clock import routing_slot
from pddemu.runtime.auth import RunSecret
from pddemu.runtime.channel import Channel
from tests.runtime.loopback import channel_to, swallow


class Holds:
    """Stands for `ModelledClock.hold_until_shaped`: counts holds posted and let go."""

    def __init__(self) -> None:
        self.posted = 0
        self.let_go = 0

    def hold(self) -> object:
        self.posted += 1

        def let_go() -> None:
            self.let_go += 1

        return let_go


async def sent(dated: bool, kind: str, peer_reads: bool) -> Holds:
    """One `kind` message sent on a connection with the recorder; when the peer does not read,
    after the send buffer has filled."""
    stalled = asyncio.Event()

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if peer_reads:
            while await reader.read(1 << 16):
                pass
        else:
            await stalled.wait()
        writer.close()

    async with channel_to(peer, dated) as channel:
        holds = Holds()
        channel.hold_until_shaped = holds.hold  # type: ignore[assignment]
        if not peer_reads:
            sock = channel.writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            channel.writer.write(bytes(8 << 20))  # more than the socket takes: queued
        sending = asyncio.ensure_future(channel.control(kind, {"rid": "r"}))
        await asyncio.sleep(0.05)
        sending.cancel()
        stalled.set()
        channel.close()
    return holds


@pytest.mark.parametrize("dated", [False, True])
def test_a_routing_message_that_leaves_at_once_is_let_go_by_the_shaper(dated: bool) -> None:
    holds = asyncio.run(sent(dated, "match", peer_reads=True))
    assert (holds.posted, holds.let_go) == (1, 0)


@pytest.mark.parametrize("dated", [False, True])
def test_a_routing_message_behind_a_full_send_buffer_is_let_go_by_its_sender(
    dated: bool,
) -> None:
    """Its marked byte is queued: it will leave unmarked, so the sender lets go at once (else
    time would stand still until the shaper's cap)."""
    holds = asyncio.run(sent(dated, "matched", peer_reads=False))
    assert (holds.posted, holds.let_go) == (1, 1)


def test_other_messages_post_no_hold() -> None:
    holds = asyncio.run(sent(False, "prefill", peer_reads=True))
    assert (holds.posted, holds.let_go) == (0, 0)


def test_a_routing_message_names_its_connections_slot_as_the_shaper_does() -> None:
    """The reader's `Envelope.routing_slot` is the shaper's `routing_slot` of the segment's
    headers (source address and port: the sender's socket; destination: the reader's), so a
    reader lets go only of holds at its own connection's messages."""

    async def run() -> tuple[str | None, str]:
        received: asyncio.Queue = asyncio.Queue()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            channel = Channel(reader, writer, "FE0", "control")
            for _ in range(2):  # the hello, then the match
                await received.put(await channel.receive())
            writer.close()

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            sender = await Channel.connect(
                "127.0.0.1", port, "FE0", "MD0", "control", RunSecret.new()
            )
            await sender.control("match", {"rid": "r"})
            await received.get()
            envelope = await asyncio.wait_for(received.get(), 5)
            ip, sender_port = sender.writer.get_extra_info("socket").getsockname()
            sender.close()
        expected = routing_slot(socket.inet_aton(ip), sender_port, socket.inet_aton(ip), port)
        return envelope.routing_slot, expected

    named, expected = asyncio.run(run())
    assert named == expected


@pytest.mark.parametrize("dated", [False, True])
def test_a_routing_message_sent_on_a_closed_channel_leaves_no_hold_standing(dated: bool) -> None:
    """Closed locally (the connection broke while the send waited for the channel's lock):
    the send fails before its turn, and no hold is posted (none stands until the shaper's cap,
    or for good without a shaper). Before, the dated channel posted the hold and then failed
    to mark the socket, and the transport's dropped byte was judged sent: both left it
    standing."""

    async def run() -> Holds:
        async with channel_to(swallow, dated) as channel:
            holds = Holds()
            channel.hold_until_shaped = holds.hold  # type: ignore[assignment]
            channel.close()
            with pytest.raises(ConnectionResetError, match="closed"):
                await channel.control("match", {"rid": "r"})
        return holds

    holds = asyncio.run(run())
    assert holds.posted == holds.let_go == 0
