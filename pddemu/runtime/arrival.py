"""When a message reached this host, as the kernel stamped it: the reader's lateness kept out
of the message's date.

A participant that dates a message by when it reads it puts its own lateness (a busy event
loop, a starved core) into the date. The kernel stamps every packet as it receives it
(SO_TIMESTAMPING, software receive stamps), and a recvmsg on a TCP socket returns the stamp of
the last packet buffer it consumed. An `ArrivalReader` reads a connection itself, exactly up to
each frame's end, so a message is dated by the buffer holding its last byte: its arrival,
however late it is read.

What is exact and what is bounded (docs/validation.md, "Dated by the kernel"):
- TCP may append a newly arrived segment to a buffer not yet read (receive coalescing), and the
  buffer then carries the later segment's stamp. That can have happened to the buffer holding a
  message's last byte only if that buffer also holds the byte after it. After each message the
  reader peeks at the next byte: when nothing is queued, or the next byte's buffer carries a
  later stamp, the message's stamp is exact; otherwise it is an upper bound, and the reader
  gives a lower one: the last time it found the connection empty (whatever came later arrived
  later), or the previous message's lower bound (bytes arrive in order).
- Stamps are CLOCK_REALTIME, the clock page runs on CLOCK_MONOTONIC: a stamp is moved by the
  two clocks' offset read just after the read that returned it (a slew of the real-time clock
  in between, at most 500 ppm of the reader's lateness, is the error).
- Bytes read before the reader took the connection over (with its hello) carry no stamp: they
  are dated when read, with the lower bound as above.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import struct
import time
from dataclasses import dataclass

SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
SOF_TIMESTAMPING_RX_SOFTWARE = 1 << 3
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
_TIMESPECS = struct.Struct("=qq")  # scm_timestamping's first timespec: the software stamp
_ANCILLARY_BYTES = socket.CMSG_SPACE(3 * _TIMESPECS.size)


@dataclass(frozen=True)
class Arrival:
    """When a message's last byte reached the host, in monotonic seconds: at `latest` at the
    latest, at `earliest` at the earliest (-inf: unknown); exact when the two are one."""

    latest: float
    earliest: float

    @property
    def exact(self) -> bool:
        return self.earliest == self.latest


class ArrivalReader:
    """Reads a TCP connection with recvmsg from the event loop, noting the kernel's stamps.

    It reads a duplicate of the connection's descriptor (the transport's own reading is
    paused), so writing stays the transport's; `readexactly` is what `read_message` needs.
    """

    def __init__(self, sock: socket.socket, unread: bytes = b"") -> None:
        self._sock = socket.socket(fileno=os.dup(sock.fileno()))
        self._sock.setblocking(False)
        self._sock.setsockopt(
            socket.SOL_SOCKET,
            SO_TIMESTAMPING,
            SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE,
        )
        self._unread = bytearray(unread)
        self._stamp: int | None = None  # the kernel's, of the last read (None: none)
        self._read_at = -math.inf  # monotonic time of the last read
        self._floor = -math.inf  # bytes not yet read arrived after this (monotonic)
        self._ready: asyncio.Future[None] | None = None  # while waiting for bytes

    def close(self) -> None:
        """Stop reading (a read waiting for bytes ends with ConnectionResetError)."""
        if self._ready is not None and not self._ready.done():
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._ready.set_exception(ConnectionResetError("the connection was closed"))
        self._sock.close()

    async def readexactly(self, size: int) -> bytes:
        data = bytearray()
        if self._unread:
            data += self._unread[:size]
            del self._unread[:size]
            self._stamp, self._read_at = None, time.monotonic()
        while len(data) < size:
            try:
                part, ancillary, _flags, _address = self._sock.recvmsg(
                    size - len(data), _ANCILLARY_BYTES
                )
            except (BlockingIOError, InterruptedError):
                await self._readable()
                continue
            if not part:
                raise asyncio.IncompleteReadError(bytes(data), size)
            data += part
            self._read_at = time.monotonic()
            self._stamp = _kernel_stamp(ancillary)
        return bytes(data)

    def arrival(self) -> Arrival:
        """When the message whose last byte was just read arrived (call it at its end)."""
        if self._stamp is None:
            return Arrival(self._read_at, min(self._floor, self._read_at))
        stamp = _monotonic(self._stamp, self._read_at)
        peeked_at = time.monotonic()
        following = self._peek()
        if following is None:  # nothing queued after it: nothing was appended to its buffer
            self._floor = peeked_at
            return Arrival(stamp, stamp)
        if following > self._stamp:  # the next byte is in a later buffer (stamps compared raw)
            self._floor = max(self._floor, stamp)
            return Arrival(stamp, stamp)
        return Arrival(stamp, min(self._floor, stamp))  # maybe coalesced with later bytes

    def _peek(self) -> int | None:
        """The kernel's stamp of the next byte's buffer (0 if it has none), None if none is
        queued."""
        try:
            part, ancillary, _flags, _address = self._sock.recvmsg(
                1, _ANCILLARY_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT
            )
        except (BlockingIOError, InterruptedError):
            return None
        if not part:
            return None  # the peer closed: nothing more will come
        return _kernel_stamp(ancillary) or 0

    async def _readable(self) -> None:
        loop = asyncio.get_running_loop()
        ready = self._ready = loop.create_future()
        fd = self._sock.fileno()
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            self._ready = None
            if self._sock.fileno() >= 0:  # not closed meanwhile (close took it off)
                loop.remove_reader(fd)


def _kernel_stamp(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The software receive stamp among `ancillary` (real-time nanoseconds), if any."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(data) >= 16:
            seconds, nanoseconds = _TIMESPECS.unpack_from(data)
            return seconds * 1_000_000_000 + nanoseconds or None
    return None


def _monotonic(stamp: int, read_at: float) -> float:
    """A real-time stamp on the monotonic clock (never after the read that returned it)."""
    offset = time.clock_gettime(time.CLOCK_REALTIME) - time.monotonic()
    return min(stamp * 1e-9 - offset, read_at)
