"""Reads dated by the kernel: each frame a process reads carries the time its last byte reached
the host (the socket's software receive timestamp, SO_TIMESTAMPNS), not the time the process got
round to reading it, so the reader's own wake-up, its interpreter lock and its other work do not
show in when the message arrived.

A connection's transport (uvloop's) reads the socket itself, from its first moment, and drops
the kernel's ancillary data, so a dated connection has none: `DatedReader` reads it with
non-blocking recvmsg calls, each taking whatever is waiting (at least the part still missing),
and serves `read_message`'s parts from that; `SocketWriter` writes the same socket. TCP reports
the receive time of the last segment a recvmsg copied from, and a part is dated by the read that
completed it: when nothing follows it in what that read took, the segment that held its last
byte, so when the part had wholly arrived. One read for what is waiting, rather than one for
each part, and the socket left registered with the loop between waits, keep the reading cheap:
the frontend reads a message every few milliseconds and is judged on how late it reads them.

But the kernel merges a segment into the one before it while both wait unread (TCP's receive
coalescing), and the merged one takes the later time, and a read that took more than the part
it completed dates the part by its own last segment. So a date is exact only when nothing was
waiting behind the part when it was read (`exact`): a reader that comes late to several frames
dates them late (by no more than its own lateness), and says so. And the kernel turns receive
timestamps on for the whole host a moment after the first socket asks (a deferred static key):
on a host where no other socket had them on, the first frames come undated (`received_wall`
None, not exact), and their reader takes them as read now.

Segments that arrive behind a lost one (a drop at the WAN's queue) are kept unreadable until the
lost one comes again, a round trip later; the reads that then return them are dated by their
last segment's arrival, before any of them could be read. Within a second (wall) of the
connection counting packets received out of order (TCP_INFO), what is readable when a waiting
read wakes is dated when the loop saw the socket readable: the retransmission's arrival, to
the loop's wake-up (`DatedReader._readable_from`).

The timestamp is CLOCK_REALTIME; it is moved to CLOCK_MONOTONIC (the clock page's wall) by the
two clocks' offset when read, and to modelled time by the anchor that held then
(`SharedClock.modelled_at`).
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import math
import socket
import struct
import termios
import time
from collections.abc import Iterable

from netem.tcp import out_of_order_packets

SO_TIMESTAMPNS = 35  # Linux's (socket.h); Python's socket module does not name it
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
_TIMESPEC = struct.Struct("=qq")  # tv_sec, tv_nsec (64-bit Linux)
_ANCILLARY_BYTES = socket.CMSG_SPACE(_TIMESPEC.size)
READ_BYTES = 1 << 16  # the least one recvmsg asks for: what is waiting, not one part at a time
# how long after packets came out of order a read that waited may have been woken by the one
# they waited for (wall seconds): a loss's recovery, a round trip or a retransmission timeout
OUT_OF_ORDER_WINDOW_S = 1.0
IOV_MAX = 1024  # the most buffers one sendmsg takes (Linux's UIO_MAXIOV)


def dated(sock: socket.socket) -> None:
    """Ask the kernel to date what `sock` receives (software receive timestamps)."""
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


class DatedReader:
    """The part of asyncio.StreamReader that `pddemu.wire.read_message` uses (`readexactly`),
    read from a non-blocking socket with recvmsg; `received_wall` is the monotonic time the
    last part read had wholly reached the host (None if it came without a timestamp), and
    `exact` whether nothing was waiting behind it then (else it may carry a later time)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        dated(sock)
        self._buffer = bytearray()
        # the date of the last recvmsg: of the buffer's tail, which that read brought
        self._stamp: float | None = None
        self._eof = False
        self._closed = False
        self._waiter: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # set while registered with it
        self._fd = -1  # the number registered with it: taken off by it even once closed
        self.received_wall: float | None = None
        self.exact = False
        self._seen_readable_at = -math.inf  # when the loop last woke a read to readable data
        self._read_bytes = 0
        self._out_of_order = out_of_order_packets(sock)
        self._out_of_order_at = -math.inf  # when the count was last seen to grow
        # (when it became readable, the byte count it ends at) of data that waited out of order
        self._held: tuple[float, int] | None = None

    async def readexactly(self, n: int) -> bytes:
        if n == 0:
            return b""
        if self._closed:  # what was read ahead is dropped: reading stops at the close
            raise asyncio.IncompleteReadError(b"", n)
        waited = False
        while len(self._buffer) < n:
            if self._eof or self._closed:
                partial = bytes(self._buffer)
                self._buffer.clear()
                raise asyncio.IncompleteReadError(partial, n)
            try:
                data, ancillary, _flags, _ = self._sock.recvmsg(
                    max(n - len(self._buffer), READ_BYTES), _ANCILLARY_BYTES
                )
            except (BlockingIOError, InterruptedError):
                await self._readable()
                waited = True
                continue
            if not data:
                self._eof = True
                continue
            self._buffer += data
            self._stamp = self._readable_from(_monotonic_of(ancillary), len(data), waited)
            waited = False
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        self.received_wall = self._stamp
        self.exact = self._stamp is not None and not self._buffer and _unread(self._sock) == 0
        return out

    def _readable_from(self, stamp: float | None, size: int, waited: bool) -> float | None:
        """When a read's `size` bytes could first be read: the kernel's receive time of its last
        segment, unless segments came out of order lately (behind a lost one, kept unreadable
        until it came again, a round trip or a timeout later). Then a read that waited for the
        socket may have been woken by the missing segment: everything readable at the wake is
        dated no earlier than when the loop saw the socket readable (at worst the loop's
        wake-up latency late). What a busy reader finds keeps its stamp: when the missing
        segment came is not known then."""
        first = self._read_bytes
        self._read_bytes += size
        count = out_of_order_packets(self._sock)
        now = time.monotonic()
        if count is not None and count != self._out_of_order:
            self._out_of_order, self._out_of_order_at = count, now
        if waited and now - self._out_of_order_at <= OUT_OF_ORDER_WINDOW_S:
            self._held = (self._seen_readable_at, self._read_bytes + _unread(self._sock))
        if stamp is not None and self._held is not None and first < self._held[1]:
            return max(stamp, self._held[0])
        return stamp

    async def _readable(self) -> None:
        """Until the socket is readable (or the reader closed). The socket stays registered
        after the wait, as long as it is readable only while a read waits: each registration
        and removal is a system call and a loop handle, per message."""
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        if self._loop is None:
            # uvloop keeps a watcher per number, and one left behind when the socket is closed
            # would never wake the next socket given the number: it is taken off by this one
            self._fd = self._sock.fileno()
            loop.add_reader(self._fd, self._ready)
            self._loop = loop
        try:
            await waiter
        except asyncio.CancelledError:
            # the socket may be closed after, not through close(): off the loop by its number
            self._unregister()
            raise
        finally:
            self._waiter = None
            if self._sock.fileno() < 0:  # closed under the read
                self._unregister()

    def _ready(self) -> None:
        if self._waiter is None:
            # readable while no read waits (the owner is handling a message): off the loop
            # until the next wait, or the loop would call this on every turn meanwhile
            self._unregister()
        elif not self._waiter.done():
            self._seen_readable_at = time.monotonic()
            self._waiter.set_result(None)

    def _unregister(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._loop = None

    def at_eof(self) -> bool:
        return self._eof and not self._buffer

    def close(self) -> None:
        """Stop reading: a read waiting for data ends as at the peer's close."""
        if self._closed:
            return
        self._closed = True
        self._unregister()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class SocketWriter:
    """The part of asyncio.StreamWriter a `Channel` uses, writing the socket a `DatedReader`
    reads (a transport would read it too). As a transport does, a write goes to the socket at
    once when nothing is queued before it, so a message leaves when it is sent, not when the
    sender's loop next gets round to it; what the socket does not take is queued, and sent by
    `drain`. What is written before `drain` goes out whole even if the drain is cancelled, so a
    cancelled sender never leaves half a frame on the wire."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._pending: list[bytes | memoryview] = []
        self._flush: asyncio.Future | None = None
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return  # as a closing transport does: dropped
        if not self._pending and (self._flush is None or self._flush.done()):
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            if sent == memoryview(data).nbytes:
                return
            data = memoryview(data).cast("B")[sent:]
        self._pending.append(data if isinstance(data, bytes | memoryview) else bytes(data))

    def writelines(self, buffers: Iterable[bytes | bytearray | memoryview]) -> None:
        """Several buffers in one system call, as a transport's `writelines`: with TCP_NODELAY
        each `write` leaves as a segment of its own, so a message of several small frames would
        take as many packets (and as much of a first window) as it has frames."""
        views = [memoryview(bytes(b) if isinstance(b, bytearray) else b).cast("B") for b in buffers]
        views = [view for view in views if view.nbytes]  # kept as a write keeps them
        if self._closing or not views:
            return
        if not self._pending and (self._flush is None or self._flush.done()):
            try:
                sent = self._sock.sendmsg(views[:IOV_MAX])
            except (BlockingIOError, InterruptedError):
                sent = 0
            while views and sent >= views[0].nbytes:
                sent -= views.pop(0).nbytes
            if views and sent:
                views[0] = views[0][sent:]
        self._pending.extend(views)

    async def drain(self) -> None:
        if self._closing:
            raise ConnectionResetError("the connection is closed")
        if not self._pending and (self._flush is None or self._flush.done()):
            return  # all of it is with the socket already
        if self._flush is None or self._flush.done():
            self._flush = asyncio.ensure_future(self._send())
        await asyncio.shield(self._flush)

    async def _send(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            await loop.sock_sendall(self._sock, self._pending.pop(0))

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._flush is not None and not self._flush.done():
            self._flush.cancel()
        self._sock.close()

    def is_closing(self) -> bool:
        return self._closing

    def get_write_buffer_size(self) -> int:
        """Bytes written and not yet taken by the socket (as a transport's)."""
        return sum(memoryview(data).nbytes for data in self._pending)

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self._sock if name == "socket" else default


def _unread(sock: socket.socket) -> int:
    """Bytes received and not yet read (SIOCINQ)."""
    count = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, count, True)
    return count[0]


def _monotonic_of(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    """The receive timestamp among recvmsg's ancillary data, as CLOCK_MONOTONIC seconds."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(data)
            return seconds + nanoseconds * 1e-9 - realtime_offset()
    return None


def realtime_offset(tries: int = 3) -> float:
    """CLOCK_REALTIME - CLOCK_MONOTONIC now: the realtime clock read between two monotonic
    readings, of `tries` the closest pair (a preemption between them would skew one)."""
    best = (float("inf"), 0.0)
    for _ in range(tries):
        before = time.monotonic()
        real = time.time()
        after = time.monotonic()
        best = min(best, (after - before, real - (before + after) / 2))
    return best[1]
