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

A datagram is dated at its arrival only while the kernel's timestamping is on for the whole
host: the first socket to ask turns it on from a deferred kernel worker, and a datagram that
arrives before that worker ran is dated by the kernel when it is read, with nothing to tell it
from a true date. So before a meter counts, this process holds timestamping on with a socket
of its own and sees a datagram of its own dated before it was read (`hold_kernel_dating`).

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
IP_RECVERR = 11  # Linux's in.h: without it a UDP socket hides its host's queue refusing a send
_TIMESPEC = struct.Struct("=qq")  # tv_sec, tv_nsec (64-bit Linux)
_DROPS = struct.Struct("=I")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size) + socket.CMSG_SPACE(_DROPS.size)
RECEIVE_BUFFER_BYTES = 32 << 20  # over 2.5 s at 100 Mbit/s: longer than any stall seen here
DATING_WAIT_S = 2.0  # the kernel's worker normally turns timestamping on within microseconds
REFUSED_LIMIT_S = 1.0  # a host queue that refuses every datagram this long is not draining
RECEIVER_GONE = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)  # ICMP, IP_RECVERR

_dating_keeper: socket.socket | None = None  # held open for the process's life
_dating_lock = threading.Lock()


def hold_kernel_dating(wait_s: float = DATING_WAIT_S) -> None:
    """Hold the kernel's receive timestamping on for this process's life, once it is seen on.

    Linux turns timestamping on for every socket of the host when the first socket asks, but
    from a deferred worker (net_enable_timestamp); a datagram received meanwhile carries no
    date and `recvmsg` fills in the time of the read (__sock_recv_timestamp), so a meter
    started then would count its first datagrams late and not know it. A socket of this
    process's own, kept open, holds timestamping on from then on; it sends itself datagrams
    until one comes back dated before the read began. Raises RuntimeError after `wait_s`.

    The socket is made in the calling thread's network namespace and kept for the process's
    life, so it would keep that namespace alive: call this (or make the first `DatedMeter`)
    outside namespaces. A namespace whose loopback is down is an error that says so."""
    global _dating_keeper
    with _dating_lock:
        if _dating_keeper is not None:
            return
        keeper = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            keeper.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            try:
                keeper.bind(("127.0.0.1", 0))
                keeper.setblocking(False)
                dated = _dated_before_read(keeper, wait_s)
            except OSError as exc:
                raise RuntimeError(
                    "the socket that holds the kernel's receive timestamping on cannot send "
                    f"itself a datagram on this thread's loopback ({exc}): is the thread "
                    "inside a network namespace? hold it from outside namespaces"
                ) from exc
            if not dated:
                raise RuntimeError(
                    f"the kernel still dated datagrams when they were read after {wait_s:g} s "
                    "of timestamping on (SO_TIMESTAMPNS): arrival times cannot be measured"
                )
        except BaseException:
            keeper.close()
            raise
        _dating_keeper = keeper


def _dated_before_read(sock: socket.socket, wait_s: float) -> bool:
    """Whether a datagram `sock` sends itself comes back dated before its read began, within
    `wait_s`: a date the kernel filled in at the read is never earlier than the read."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        sock.sendto(b"dated?", sock.getsockname())
        time.sleep(0.001)
        read_began = time.time()
        try:
            _data, ancillary, _flags, _ = sock.recvmsg(16, _ANCILLARY)
        except BlockingIOError:
            continue
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                seconds, nanoseconds = _TIMESPEC.unpack_from(data)
                if seconds + nanoseconds * 1e-9 < read_began:
                    return True
    return False


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
        hold_kernel_dating()  # else the first datagrams may be dated at their read
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
    A datagram the sending host's own queue refuses (ENOBUFS, which Linux reports for UDP only
    with IP_RECVERR, set here) is sent again after a pause, so every datagram counted left the
    host's queue; returns the datagrams sent. Raises RuntimeError when the queue refused every
    datagram for REFUSED_LIMIT_S, and when the receiver is gone: IP_RECVERR also makes sendto
    report an ICMP error an earlier datagram met (its port closed, its host unreachable)."""
    sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
    payload = bytes(payload_bytes)
    per_second = rate_bps / (8 * (payload_bytes + ip_overhead))
    total = int(seconds * per_second)
    started = time.monotonic()
    sent = 0
    refused_since: float | None = None
    while sent < total:
        due = min(total, int((time.monotonic() - started) * per_second) + 1)
        while sent < due:
            try:
                sock.sendto(payload, to)
            except OSError as exc:
                if exc.errno in RECEIVER_GONE:
                    raise RuntimeError(
                        f"the receiver at {to[0]}:{to[1]} is gone ({errno.errorcode[exc.errno]} "
                        f"for an earlier datagram) after {sent} of {total} datagrams left"
                    ) from exc
                if exc.errno != errno.ENOBUFS:
                    raise
                refused_since = refused_since or time.monotonic()
                if time.monotonic() - refused_since > REFUSED_LIMIT_S:
                    raise RuntimeError(
                        f"the sending host's queue refused every datagram for "
                        f"{REFUSED_LIMIT_S:g} s (ENOBUFS) after {sent} of {total} left"
                    ) from exc
                break  # the host's own queue is full: this datagram again after the pause
            refused_since = None
            sent += 1
        if sent < total:
            time.sleep(0.001)
    return sent
