"""Kernel-dated reads (pddemu.runtime.dated_reads): a reader that comes late dates each frame
by when it reached the host, not by when it was read."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time

import pytest
import uvloop

from netem.tcp import OUT_OF_ORDER_OFFSET
from pddemu.roles.base import DatedServer
from pddemu.runtime.channel import Channel
from pddemu.runtime.dated_reads import SCM_TIMESTAMPNS, DatedReader, SocketWriter
from pddemu.wire import Control, TokenIds, encode
from tests.process_loop import run_and_close_the_loop

GAP_S = 0.3  # wall seconds between the sender's frames


async def _connected() -> tuple[socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    sender = socket.create_connection(listener.getsockname())
    accepted, _ = await asyncio.get_running_loop().sock_accept(listener)
    listener.close()
    return sender, accepted


async def _until_the_kernel_dates(writer: Channel, receiver: Channel) -> None:
    """Send frames until one comes dated. The kernel turns receive timestamps on for the whole
    host a moment after the first socket asks for them (a static key switched by a deferred
    work item), so on a host where no other socket had them on, the first frames come undated
    (the reader says so: no date, not exact). One CI run read its first frame undated."""
    deadline = time.monotonic() + 5.0
    while True:
        await writer.control("warm-up", {})
        envelope = await receiver.receive()
        if envelope.received is not None:  # type: ignore[union-attr]
            return
        assert time.monotonic() < deadline, "the kernel dated no frame within 5 s"
        await asyncio.sleep(0.01)


async def _three_frames(late: bool) -> tuple[list[float], list[tuple[float | None, bool]], float]:
    """Three frames GAP_S apart, read as each comes or (`late`) only after the last."""
    sender, accepted = await _connected()
    receiver = Channel.dated(accepted, peer="sender", purpose="control")
    receiver.modelled_at = lambda wall: wall  # modelled time = wall time, to compare
    writer = Channel.dated(sender, peer="receiver", purpose="control")
    await _until_the_kernel_dates(writer, receiver)
    sent, dates = [], []
    for i in range(3):
        if i:
            await asyncio.sleep(GAP_S)
        sent.append(time.monotonic())
        await writer.control("tick", {"i": i})
        if not late:
            envelope = await receiver.receive()
            dates.append((envelope.received, envelope.exact))  # type: ignore[union-attr]
    await asyncio.sleep(GAP_S)
    read_from = time.monotonic()
    while len(dates) < 3:
        envelope = await receiver.receive()
        dates.append((envelope.received, envelope.exact))  # type: ignore[union-attr]
    writer.close()
    receiver.close()
    return sent, dates, read_from


def test_a_reader_dates_each_frame_by_its_arrival_and_says_when_it_cannot() -> None:
    """Read as they come, each frame is dated exactly, between its send and the next one's.
    Read late, all three waiting, the first two may carry a later segment's time (the kernel
    merges waiting segments): they are marked not exact; the last is exact again."""
    sent, dates, read_from = uvloop.run(_three_frames(late=False))
    seen = (sent, dates, read_from)
    for i, (at, exact) in enumerate(dates):
        assert exact and at is not None, seen
        assert sent[i] - 0.005 <= at < (sent[i + 1] if i + 1 < len(sent) else read_from), seen
    sent, dates, read_from = uvloop.run(_three_frames(late=True))
    seen = (sent, dates, read_from)
    assert [exact for _, exact in dates] == [False, False, True], seen
    last = dates[-1][0]
    assert last is not None and sent[-1] - 0.005 <= last < read_from, seen
    for at, _ in dates:
        assert at is not None and at < read_from, seen  # never the late reading's own time


def test_a_dated_connection_ends_cleanly_when_its_peer_closes() -> None:
    async def scenario() -> str:
        right, left = await _connected()
        reader = Channel.dated(left, peer="right", purpose="control")
        writer = Channel.dated(right, peer="left", purpose="control")
        await writer.send(Control("bye", {}))
        writer.close()
        seen = []

        async def handle(item, _channel) -> None:  # type: ignore[no-untyped-def]
            seen.append(item.kind)

        await reader.serve(handle)
        return ",".join(seen) + "|" + reader.broken

    assert uvloop.run(scenario()) == "bye|"


async def _close_and_cancel_a_waiting_read(cancel_first: bool) -> int:
    """A read left waiting on its socket, then the socket closed under it (not through the
    reader's close) and the read cancelled, in either order; returns the socket's fd number."""
    right, left = await _connected()
    left.setblocking(False)
    reading = asyncio.ensure_future(DatedReader(left).readexactly(4))
    await asyncio.sleep(0.05)  # waiting in the loop for the socket to become readable
    number = left.fileno()
    if not cancel_first:
        left.close()
    reading.cancel()
    try:
        await reading
    except asyncio.CancelledError:
        pass
    left.close()
    right.close()
    return number


def test_a_read_cancelled_after_its_socket_closed_ends_cancelled() -> None:
    """A read waiting when its socket is closed under it (not through the reader's close, as
    at a process's teardown) ends as cancelled when cancelled: no ValueError for fd -1 from
    taking the closed socket off the loop."""

    uvloop.run(_close_and_cancel_a_waiting_read(cancel_first=False))


def test_a_dated_server_leaves_no_connection_pending_when_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An instance's stop as its process does it (`Instance.run`, then the loop closed without
    cancelling what is left): the server's connection tasks, each waiting in a dated read, are
    ended and awaited, so none is destroyed pending at the loop's close."""
    ended: list[str] = []

    async def scenario() -> list[socket.socket]:
        async def accepted(sock: socket.socket) -> None:
            channel = Channel.dated(sock, peer="client", purpose="control")
            try:
                await channel.serve(lambda _item, _channel: asyncio.sleep(0))
            finally:
                ended.append("served" if channel.closed else "left open")

        server = DatedServer("127.0.0.1", 0, accepted)
        clients = [socket.create_connection(server._listener.getsockname()) for _ in range(3)]
        while len(server._connections) < len(clients):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # each connection's task waits in a dated read
        server.close()
        await server.wait_closed()
        return clients

    run_and_close_the_loop(scenario, caplog)
    assert ended == ["served"] * 3


async def _attachment_after_a_gap() -> tuple[float, float | None]:
    """A control message whose attachment follows its header GAP_S later."""
    sender, accepted = await _connected()
    receiver = Channel.dated(accepted, peer="sender", purpose="kv")
    receiver.modelled_at = lambda wall: wall
    writer = Channel.dated(sender, peer="receiver", purpose="kv")
    await _until_the_kernel_dates(writer, receiver)
    reading = asyncio.ensure_future(receiver.receive())  # reads the header as it comes
    for buffer in encode(Control("part", {"attach": 1})):
        writer.writer.write(buffer)
    await writer.writer.drain()
    await asyncio.sleep(GAP_S)
    attached = time.monotonic()
    for buffer in encode(TokenIds.from_ints("r", 0, [1, 2, 3])):
        writer.writer.write(buffer)
    await writer.writer.drain()
    envelope = await reading
    writer.close()
    receiver.close()
    return attached, envelope.received  # type: ignore[union-attr]


def test_a_message_is_dated_by_its_last_frame() -> None:
    """A message with attachments had wholly reached the host only with its last frame: its
    date is that frame's, not its header's (a KV-delta part's KV follows its header)."""
    attached, received = uvloop.run(_attachment_after_a_gap())
    assert received is not None and received >= attached - 0.005, (attached, received)


@pytest.mark.parametrize("cancel_first", [False, True], ids=["close-cancel", "cancel-close"])
def test_a_socket_closed_under_a_read_leaves_its_fd_number_to_the_next_reader(
    cancel_first: bool,
) -> None:
    """A read waiting when its socket is closed under it, or cancelled and its socket closed
    afterwards (not through the reader's close), must take its registration off the loop even
    so (by the fd number it registered): uvloop keeps a watcher for that number, and a later
    socket given the same number would never be woken for its reads."""

    async def scenario() -> bytes:
        number = await _close_and_cancel_a_waiting_read(cancel_first)
        ours, theirs = socket.socketpair()
        if ours.fileno() != number:  # the next socket takes the closed one's number
            os.dup2(ours.fileno(), number)
            ours.close()
            ours = socket.socket(fileno=number)
        try:
            ours.setblocking(False)
            reading = asyncio.ensure_future(DatedReader(ours).readexactly(4))
            await asyncio.sleep(0.05)  # waiting in the loop, as the first read was
            theirs.sendall(b"abcd")
            return await asyncio.wait_for(reading, 2.0)
        finally:
            ours.close()
            theirs.close()

    assert uvloop.run(scenario()) == b"abcd"


def test_a_socket_readable_while_no_read_waits_does_not_spin_the_loop() -> None:
    """The socket stays registered with the loop between reads; data that comes while its
    owner is busy with the last message wakes the reader once, which then leaves the loop
    until the next read waits (a level-triggered registration would call it on every turn),
    and that read still gets the data."""

    async def scenario() -> tuple[int, bytes]:
        right, left = await _connected()
        left.setblocking(False)
        reader = DatedReader(left)
        calls = 0
        ready = reader._ready

        def counted() -> None:
            nonlocal calls
            calls += 1
            ready()

        reader._ready = counted  # type: ignore[method-assign]
        reading = asyncio.ensure_future(reader.readexactly(4))
        await asyncio.sleep(0.01)
        right.sendall(b"one.")
        assert await reading == b"one."
        right.sendall(b"two.")  # no read waits: the owner is busy elsewhere
        for _ in range(200):  # loop turns
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        second = await reader.readexactly(4)
        reader.close()
        left.close()
        right.close()
        return calls, second

    calls, second = uvloop.run(scenario())
    assert second == b"two."
    assert calls <= 3, calls  # one wake for each message, one to leave the loop


def test_a_write_leaves_at_once_and_a_drain_with_nothing_queued_does_not_wait() -> None:
    """A dated connection's writer sends what it is given at once, as a transport does: the
    peer can read it before the sender's loop turns again (and before any drain), so the
    message leaves when its send time is stamped, not when the sender's loop next gets round
    to it; a drain with nothing left to send returns without yielding to the loop. What the
    socket does not take at once (its buffer full) is queued and sent, in order, by the
    drain."""

    async def scenario() -> tuple[bytes, bool, bytes]:
        right, left = await _connected()
        left.setblocking(False)
        writer = SocketWriter(left)
        writer.write(b"at once")
        right.settimeout(1.0)
        first = right.recv(64)  # blocks this loop: no turn for a deferred send to run
        drain = writer.drain()
        try:
            drain.send(None)
            waited = True
        except StopIteration:
            waited = False
        drain.close()
        left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        big = bytes(range(256)) * 4096  # more than the socket takes at once
        writer.write(big)
        writer.write(b"end")
        reading = asyncio.get_running_loop().run_in_executor(
            None, _read_exactly, right, len(big) + 3
        )
        await writer.drain()
        rest = await reading
        writer.close()
        right.close()
        return first, waited, rest

    first, waited, rest = uvloop.run(scenario())
    assert first == b"at once"
    assert not waited
    assert rest == bytes(range(256)) * 4096 + b"end"


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def test_lines_leave_in_one_call_and_what_the_socket_does_not_take_is_sent_in_order() -> None:
    """`writelines` hands every buffer to one system call (what fits leaves at once, the peer
    reads it before any drain) and queues the rest where the socket stopped taking it, even
    mid-buffer, for the drain to send in order."""

    async def scenario() -> tuple[bytes, bytes]:
        right, left = await _connected()
        left.setblocking(False)
        writer = SocketWriter(left)
        writer.writelines([b"at ", bytearray(b"once"), b""])
        right.settimeout(1.0)
        first = right.recv(64)
        left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        big = bytes(range(256)) * 4096
        writer.writelines([b"head.", memoryview(big), b".tail"])
        writer.write(b"end")
        reading = asyncio.get_running_loop().run_in_executor(
            None, _read_exactly, right, len(big) + 13
        )
        await writer.drain()
        rest = await reading
        writer.close()
        right.close()
        return first, rest

    first, rest = uvloop.run(scenario())
    assert first == b"at once"
    assert rest == b"head." + bytes(range(256)) * 4096 + b".tailend"


class _HeldBehindALoss(socket.socket):
    """A socket whose reads carry the receive time of segments that arrived `early_s` before
    they could be read, and whose TCP_INFO counts them out of order once `lost` is set: as
    the kernel gives data that waited behind a lost segment (dated by the last one's
    arrival, not by the retransmission that made it readable)."""

    early_s = 0.5
    lost = False

    def recvmsg(self, *args):  # type: ignore[no-untyped-def, override]
        data, _ancillary, flags, address = super().recvmsg(*args)
        arrived = time.time() - self.early_s
        stamp = struct.pack("=qq", int(arrived), int((arrived % 1) * 1e9))
        return data, [(socket.SOL_SOCKET, SCM_TIMESTAMPNS, stamp)], flags, address

    def getsockopt(self, level, option, *size):  # type: ignore[no-untyped-def, override]
        raw = super().getsockopt(level, option, *size)
        if (level, option) == (socket.IPPROTO_TCP, socket.TCP_INFO) and self.lost:
            raw = bytearray(raw)
            struct.pack_into("=I", raw, OUT_OF_ORDER_OFFSET, 3)
            raw = bytes(raw)
        return raw


async def _read_behind_a_loss(lost: bool) -> tuple[float, float, float]:
    """Wait to read 5 bytes, write them (`lost`: counted out of order); the write's time, the
    read's date, the time the read returned."""
    right, left = await _connected()
    left.setblocking(False)
    held = _HeldBehindALoss(left.family, left.type, left.proto, fileno=left.detach())
    reader = DatedReader(held)
    reading = asyncio.ensure_future(reader.readexactly(5))
    await asyncio.sleep(0.05)  # the read waits: nothing to read
    held.lost = lost
    written = time.monotonic()
    right.sendall(b"hello")
    await reading
    done = time.monotonic()
    right.close()
    reader.close()
    held.close()
    assert reader.received_wall is not None
    return written, reader.received_wall, done


def test_data_that_waited_behind_a_loss_is_dated_when_it_could_be_read() -> None:
    """Data the connection received out of order, read after a wait, is dated when the loop
    saw the socket readable: it could not be read at its segments' arrival. Before, the read
    took the date of the last segment's arrival: kv_end dated up to a round trip early, MD's
    first step placed there (its lag), to_ready short (docs/validation.md, kv-transfer)."""
    written, dated, done = uvloop.run(_read_behind_a_loss(lost=True))
    assert written <= dated <= done


def test_data_received_in_order_keeps_its_kernel_date() -> None:
    """Without packets out of order the kernel's date stands, however it compares with the
    wait: the reader's own lateness is not the data's."""
    written, dated, _ = uvloop.run(_read_behind_a_loss(lost=False))
    assert dated < written - 0.4
