"""A UDP receiver that counts bytes per interval by the time the kernel received them.

A meter that counts a datagram when its process reads it moves bytes into a later interval
whenever the process is late (a hypervisor's steal, another process on the CPU, its own
interpreter): what it measures is then the host's scheduling, not the link. Here each
datagram carries the kernel's software receive timestamp (SO_TIMESTAMPNS, read as ancillary
data with recvmsg, taken as the packet entered the receiving host's stack), and the bytes
are counted in the interval of that time. A reader that comes late reads the same dates, so
its lateness moves nothing, as long as the socket's buffer holds what arrives meanwhile (it
is made large, and the kernel's count of datagrams dropped for lack of room, SO_RXQ_OVFL,
is reported).

Each datagram is also counted by the time it was read (`read_bytes`), so a run shows what
the reader's lateness would have moved. Times are CLOCK_REALTIME, the timestamp's clock.
"""

from __future__ import annotations

import errno
import math
import socket
import struct
import threading
import time
from collections import defaultdict

SO_TIMESTAMPNS = 35  # Linux's socket.h; Python's socket module does not name these
SO_RXQ_OVFL = 40
SO_RCVBUFFORCE = 33
_TIMESPEC = struct.Struct("=qq")  # tv_sec, tv_nsec (64-bit Linux)
_DROPS = struct.Struct("=I")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size) + socket.CMSG_SPACE(_DROPS.size)
RECEIVE_BUFFER_BYTES = 32 << 20  # over 2.5 s at 100 Mbit/s: longer than any stall seen here


class DatedMeter:
    """Counts the UDP bytes `sock` receives per `interval_s` from `origin` (CLOCK_REALTIME
    seconds), by kernel receive time (`kernel_bytes`) and by read time (`read_bytes`)."""

    def __init__(self, sock: socket.socket, interval_s: float, origin: float) -> None:
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"the meter's interval must be positive, got {interval_s}")
        self.sock = sock
        self.interval_s = interval_s
        self.origin = origin
        self.kernel_bytes: defaultdict[int, int] = defaultdict(int)
        self.read_bytes: defaultdict[int, int] = defaultdict(int)
        self.undated_datagrams = 0
        self.dropped_datagrams = 0  # by the kernel, its buffer full (SO_RXQ_OVFL's count)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER_BYTES)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        self._buffer = bytearray(65536)

    def index(self, at: float) -> int:
        """The interval holding CLOCK_REALTIME time `at`."""
        return math.floor((at - self.origin) / self.interval_s)

    def read_one(self) -> bool:
        """Read and count one datagram if one is waiting or comes within the socket's
        timeout; False if none did."""
        try:
            size, ancillary, _flags, _ = self.sock.recvmsg_into([self._buffer], _ANCILLARY)
        except (BlockingIOError, TimeoutError):
            return False
        self.read_bytes[self.index(time.time())] += size
        received = None
        for level, kind, data in ancillary:
            if level != socket.SOL_SOCKET:
                continue
            if kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
                seconds, nanoseconds = _TIMESPEC.unpack_from(data)
                received = seconds + nanoseconds * 1e-9
            elif kind == SO_RXQ_OVFL and len(data) >= _DROPS.size:
                self.dropped_datagrams = _DROPS.unpack_from(data)[0]
        if received is None:
            self.undated_datagrams += 1
        else:
            self.kernel_bytes[self.index(received)] += size
        return True

    def run(self, stop: threading.Event, poll_s: float = 0.05) -> None:
        """Read until `stop` is set and nothing more is waiting."""
        self.sock.settimeout(poll_s)
        while self.read_one() or not stop.is_set():
            pass

    def intervals(self, counts: dict[int, int]) -> list[tuple[float, float, int]]:
        """(start, end, bytes) of each interval from the first with traffic to the last, in
        seconds from `origin`."""
        if not counts:
            return []
        width = self.interval_s
        return [
            (k * width, (k + 1) * width, counts.get(k, 0))
            for k in range(min(counts), max(counts) + 1)
        ]


def send_at_rate(
    sock: socket.socket,
    to: tuple[str, int],
    rate_bps: float,
    payload_bytes: int,
    seconds: float,
    ip_overhead: int = 28,
) -> int:
    """Send int(seconds * rate) datagrams of `payload_bytes` to `to`, keeping up with
    `rate_bps` of IP bytes (payload plus IPv4 and UDP headers) by catching up after each short
    sleep, so a late sender sends a burst rather than less, also when it stalls past the end.
    A datagram the sending host's own queue refuses (ENOBUFS) is sent again after a pause, so
    every datagram counted left; returns the datagrams sent."""
    payload = bytes(payload_bytes)
    per_second = rate_bps / (8 * (payload_bytes + ip_overhead))
    total = int(seconds * per_second)
    started = time.monotonic()
    sent = 0
    while sent < total:
        due = min(total, int((time.monotonic() - started) * per_second) + 1)
        while sent < due:
            try:
                sock.sendto(payload, to)
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                break  # the host's own queue is full: this datagram again after the pause
            sent += 1
        if sent < total:
            time.sleep(0.001)
    return sent
