"""Messages dated by the kernel's receive stamp (pddemu.runtime.arrival), over real TCP on the
loopback, read late on purpose: the reader's lateness must not move a date; a date the kernel
may have moved (receive coalescing) must come with a lower bound that contains the arrival."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest
import uvloop

from pddemu.runtime.arrival import (
    SO_TIMESTAMPING,
    SOF_TIMESTAMPING_RX_SOFTWARE,
    SOF_TIMESTAMPING_SOFTWARE,
)
from pddemu.runtime.channel import Channel, Envelope
from pddemu.wire import Control, encode

LATE_S = 0.06  # how late the reader reads, on purpose


@pytest.fixture(autouse=True, scope="module")
def kernel_stamps() -> Iterator[None]:
    """The kernel turns receive stamping on for everyone a moment after the first socket asks
    (a deferred switch): until then packets come unstamped (dated when read, as a bound). Ask
    once, and wait until a packet comes stamped, so the tests see stamps."""
    listener = socket.create_server(("127.0.0.1", 0))
    flags = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE
    listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, flags)
    sender = socket.create_connection(listener.getsockname())
    receiver, _ = listener.accept()
    try:
        for _ in range(200):
            sender.send(b"x")
            _, ancillary, _, _ = receiver.recvmsg(1, 256)
            if ancillary:
                break
            time.sleep(0.01)
        yield
    finally:
        for sock in (sender, receiver, listener):
            sock.close()


async def _dated_pair() -> tuple[Channel, asyncio.StreamWriter, asyncio.Server]:
    accepted: asyncio.Future[Channel] = asyncio.get_running_loop().create_future()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result(Channel(reader, writer, "MD0", "control"))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    _, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
    # as the roles' channels do: each message leaves when written (Nagle would hold it back)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    writer.write(b"".join(encode(Control("hello", {"n": 0}))))  # read before the take-over
    await writer.drain()
    channel = await accepted
    await asyncio.sleep(0.01)
    await channel.date_arrivals()
    return channel, writer, server


async def _send(writer: asyncio.StreamWriter, n: int) -> tuple[float, float]:
    """Send message n; the monotonic times just before and just after it left."""
    before = time.monotonic()
    writer.write(b"".join(encode(Control("tokens", {"n": n}))))
    await writer.drain()
    return before, time.monotonic()


def _late_reads(gaps_s: list[float]) -> list[tuple[Envelope, tuple[float, float], float]]:
    """Messages sent `gaps_s` apart, each read LATE_S after the last was sent."""

    async def scenario() -> list[tuple[Envelope, tuple[float, float], float]]:
        channel, writer, server = await _dated_pair()
        try:
            first = await channel.receive()
            assert isinstance(first, Envelope) and first.body == {"n": 0}
            assert first.arrival is not None and first.arrival.latest <= time.monotonic()
            sent = []
            for n, gap in enumerate(gaps_s, start=1):
                await asyncio.sleep(gap)
                sent.append(await _send(writer, n))
            time.sleep(LATE_S)
            read = []
            for n, window in enumerate(sent, start=1):
                envelope = await channel.receive()
                assert isinstance(envelope, Envelope) and envelope.body["n"] == n
                read.append((envelope, window, time.monotonic()))
            return read
        finally:
            writer.close()
            channel.close()
            server.close()

    return uvloop.run(scenario())


def test_a_message_read_late_is_dated_by_its_arrival() -> None:
    [(envelope, (before, after), read_at)] = _late_reads([0.0])
    arrival = envelope.arrival
    assert arrival is not None and arrival.exact  # nothing came after it
    assert before <= arrival.latest <= after + 0.002  # the loopback delivers within the send
    assert read_at - arrival.latest >= LATE_S


@pytest.mark.parametrize("gap_s", [0.0, 0.02])
def test_a_date_the_kernel_may_have_moved_is_bounded_around_the_arrival(gap_s: float) -> None:
    """Several messages queue unread: each date is exact or an interval holding the arrival,
    and the last one (nothing after it) is exact."""
    reads = _late_reads([0.0, gap_s, gap_s])
    for envelope, (before, after), _read_at in reads:
        arrival = envelope.arrival
        assert arrival is not None
        assert arrival.earliest <= after + 0.002 and before <= arrival.latest
        if arrival.exact:
            assert arrival.latest <= after + 0.002
    assert reads[-1][0].arrival is not None and reads[-1][0].arrival.exact
