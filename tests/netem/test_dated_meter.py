"""The kernel-dated meter on loopback, with its reader stalled on purpose: the bytes land in
the intervals they arrived in, where a meter counting at read time moves them all."""

from __future__ import annotations

import errno
import json
import socket
import subprocess
import threading
import time
import uuid
from collections import defaultdict

import pytest

from netem import dated_meter, nsutil
from netem.dated_meter import SO_TIMESTAMPNS, DatedMeter, send_at_rate
from tests.conftest import require_namespaces

PAYLOAD = 1000


def _pair() -> tuple[socket.socket, socket.socket]:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    return receiver, socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


def test_a_stalled_reader_still_counts_each_interval_right() -> None:
    """Datagrams sent in five 100 ms intervals (4, 8, ... 20 of them), read only after the
    last interval has passed. Loopback's kernel dates a datagram inside the sendto that sends
    it (net.core.netdev_tstamp_prequeue, on by default), so each one's interval is known from
    the clock read around its sendto, however late the sender itself ran: one whose sendto
    spanned an interval's edge may land on either side."""
    receiver, sender = _pair()
    with receiver, sender:
        origin = time.time() + 0.05
        meter = DatedMeter(receiver, 0.1, origin)
        sure: defaultdict[int, int] = defaultdict(int)
        spanning = 0
        for k in range(5):
            count = 4 * (k + 1)
            for j in range(count):
                time.sleep(max(0.0, origin + k * 0.1 + 0.01 + j * 0.08 / count - time.time()))
                before = time.time()
                sender.sendto(bytes(PAYLOAD), receiver.getsockname())
                after = time.time()
                if meter.index(before) == meter.index(after):
                    sure[meter.index(before)] += PAYLOAD
                else:
                    spanning += 1
        # the reader's forced lateness: it reads nothing until all five intervals are over
        time.sleep(max(0.0, origin + 0.6 - time.time()))
        receiver.settimeout(0.2)
        while meter.read_one():
            pass
    total = sum(4 * (k + 1) for k in range(5)) * PAYLOAD
    assert sum(meter.kernel_bytes.values()) == sum(meter.read_bytes.values()) == total
    assert meter.undated_datagrams == 0 and meter.dropped_datagrams == 0
    for k in set(sure) | set(meter.kernel_bytes):
        assert sure[k] <= meter.kernel_bytes[k] <= sure[k] + spanning * PAYLOAD, (k, meter)
    assert spanning <= 2, f"{spanning} sendto calls spanned an edge: the host was too slow"
    # counted when read, every byte moved past the intervals it arrived in
    assert all(k >= 6 for k in meter.read_bytes), dict(meter.read_bytes)


def test_run_reads_until_stopped_and_drained() -> None:
    receiver, sender = _pair()
    with receiver, sender:
        meter = DatedMeter(receiver, 0.1, time.time())
        stop = threading.Event()
        reader = threading.Thread(target=meter.run, args=(stop,))
        reader.start()
        sent = send_at_rate(sender, receiver.getsockname(), 8e6, PAYLOAD, 0.3)
        stop.set()
        reader.join(timeout=5)
    assert not reader.is_alive()
    expected = int(0.3 * 8e6 / (8 * 1028)) * PAYLOAD  # 8 Mbit/s of 1028-byte datagrams: 291
    assert sum(meter.kernel_bytes.values()) == sent * PAYLOAD == expected
    assert sum(got for *_, got in meter.intervals(meter.kernel_bytes)) == expected


def test_a_sender_stalled_past_the_end_still_sends_every_datagram(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One sleep stalls 60 ms at 0.24 s of a 0.3 s flow (a hypervisor's steal): the sender
    sends the datagrams it owes in a burst after the end rather than stopping short (the code
    before stopped at 0.3 s: 234 sent of 291 in the run b1acc68 reports)."""
    started = time.monotonic()
    sleep = time.sleep
    stalled = []

    def stalling_sleep(seconds: float) -> None:
        if not stalled and time.monotonic() - started >= 0.24:
            stalled.append(time.monotonic() - started)
            seconds = 0.06
        sleep(seconds)

    monkeypatch.setattr(dated_meter.time, "sleep", stalling_sleep)
    receiver, sender = _pair()
    with receiver, sender:
        meter = DatedMeter(receiver, 0.1, time.time())
        sent = send_at_rate(sender, receiver.getsockname(), 8e6, PAYLOAD, 0.3)
        receiver.settimeout(0.2)
        while meter.read_one():
            pass
    assert stalled, "the sender never slept past 0.24 s"
    # what the receiver got, not what the sender says it sent
    assert (
        sum(meter.kernel_bytes.values()) == int(0.3 * 8e6 / (8 * 1028)) * PAYLOAD == sent * PAYLOAD
    )


class _RefusingSocket:
    """A socket whose host queue refuses every third datagram (ENOBUFS)."""

    def __init__(self, every: int = 3) -> None:
        self.every = every
        self.calls = 0
        self.delivered = 0
        self.options: dict[tuple[int, int], int] = {}

    def setsockopt(self, level: int, option: int, value: int) -> None:
        self.options[level, option] = value

    def sendto(self, payload: bytes, to: tuple[str, int]) -> int:
        self.calls += 1
        if self.calls % self.every == 0:
            raise OSError(errno.ENOBUFS, "No buffer space available")
        self.delivered += 1
        return len(payload)


def test_a_datagram_the_host_refuses_is_sent_again_not_counted() -> None:
    """ENOBUFS is the sending host's own queue: the datagram is sent again, and the count
    returned is of datagrams that left (the code before counted refused ones as sent)."""
    sock = _RefusingSocket()
    sent = send_at_rate(sock, ("127.0.0.1", 9), 8e6, PAYLOAD, 0.1)  # type: ignore[arg-type]
    assert sent == sock.delivered == int(0.1 * 8e6 / (8 * 1028))
    assert sock.calls > sent
    # Linux reports a UDP socket's ENOBUFS only with IP_RECVERR set
    assert sock.options[socket.IPPROTO_IP, dated_meter.IP_RECVERR] == 1


def test_a_host_queue_that_never_drains_is_an_error_not_a_hang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dated_meter, "REFUSED_LIMIT_S", 0.05)
    sock = _RefusingSocket(every=1)
    with pytest.raises(RuntimeError, match=r"refused every datagram for 0.05 s \(ENOBUFS\)"):
        send_at_rate(sock, ("127.0.0.1", 9), 8e6, PAYLOAD, 0.1)  # type: ignore[arg-type]


def test_a_receiver_gone_is_an_error_that_says_so() -> None:
    """A receiver's port closed on loopback: the ICMP error an earlier datagram met (which
    IP_RECVERR makes sendto report) is raised as the receiver gone, not a bare
    ConnectionRefusedError (as on the code before)."""
    gone = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    gone.bind(("127.0.0.1", 0))
    to = gone.getsockname()
    gone.close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        with pytest.raises(RuntimeError, match=r"receiver at 127.0.0.1:\d+ is gone \(ECONNREFUSED"):
            send_at_rate(sender, to, 8e6, PAYLOAD, 0.1)


@pytest.mark.netns
def test_a_real_host_queue_that_refuses_a_datagram_gets_it_again() -> None:
    """A namespace's veth behind a 4 Mbit/s tbf whose queue holds 3 datagrams, sent 8
    Mbit/s: the qdisc refuses datagrams (its drop count shows it), and every datagram that
    send_at_rate counts as sent passed the qdisc. Before IP_RECVERR the kernel hid the refusal
    from sendto, so the refused ones were counted as sent and the qdisc passed fewer."""
    require_namespaces()
    name = "netem-t" + uuid.uuid4().hex[:10] + "-enobufs"
    ip = ["ip", "-n", name]
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        nsutil.write_sysctl(name, "net.ipv6.conf.default.disable_ipv6", "1")  # its own
        for argv in (  # traffic, e.g. router solicitations, would pass the qdisc too
            ["link", "add", "v0", "type", "veth", "peer", "name", "v1"],
            ["addr", "add", "198.18.200.1/24", "dev", "v0"],
            ["neigh", "add", "198.18.200.2", "lladdr", "02:00:00:00:00:02", "dev", "v0"],
            ["link", "set", "v1", "up"],
            ["link", "set", "v0", "up"],
        ):
            subprocess.run([*ip, *argv], check=True)
        subprocess.run(
            ["tc", "-n", name, "qdisc", "add", "dev", "v0", "root", "tbf", "rate", "4mbit"]
            + ["burst", "1600", "limit", "3200"],
            check=True,
        )
        with nsutil.inside(name):
            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with sender:
            sent = send_at_rate(sender, ("198.18.200.2", 9), 8e6, PAYLOAD, 0.2)
        shown = subprocess.run(
            ["tc", "-n", name, "-s", "-j", "qdisc", "show", "dev", "v0"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)
    qdisc = json.loads(shown)[0]
    assert qdisc["drops"] > 0, f"the qdisc never refused a datagram: the test is blind {qdisc}"
    assert sent == int(0.2 * 8e6 / (8 * 1028))
    assert qdisc["packets"] + qdisc["qlen"] == sent, qdisc  # passed, or still queued


def test_a_meter_counts_only_while_kernel_dating_is_held() -> None:
    """A meter's socket turns timestamping on; before it counts, this process holds it on
    with a socket of its own, seen to date a datagram before its read."""
    receiver, sender = _pair()
    with receiver, sender:
        DatedMeter(receiver, 0.1, time.time())
    keeper = dated_meter._dating_keeper
    assert keeper is not None and keeper.fileno() != -1
    assert keeper.getsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS) == 1


@pytest.mark.netns
def test_kernel_dating_held_from_a_namespace_without_loopback_is_an_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first meter made by a thread inside a namespace whose loopback is down: an error
    that says where it was held from, and no keeper left (a bare OSError before)."""
    require_namespaces()
    monkeypatch.setattr(dated_meter, "_dating_keeper", None)
    name = "netem-t" + uuid.uuid4().hex[:10] + "-keeper"
    subprocess.run(["ip", "netns", "add", name], check=True)  # its lo is down
    try:
        with nsutil.inside(name), pytest.raises(RuntimeError, match="inside a network namespace"):
            dated_meter.hold_kernel_dating()
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)
    assert dated_meter._dating_keeper is None


class _DatingSocket:
    """A socket whose datagrams come back dated `lag_s` after their read began (0 or more:
    the kernel filled the date in at the read) or before it (negative: dated on arrival)."""

    def __init__(self, lag_s: float) -> None:
        self.lag_s = lag_s

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", 9)

    def sendto(self, payload: bytes, to: tuple[str, int]) -> int:
        return len(payload)

    def recvmsg(self, size: int, ancillary: int) -> tuple[bytes, list, int, None]:
        at = time.time() + self.lag_s
        date = dated_meter._TIMESPEC.pack(int(at), int((at % 1) * 1e9))
        return b"dated?", [(socket.SOL_SOCKET, SO_TIMESTAMPNS, date)], 0, None


def test_a_date_filled_in_at_the_read_is_not_taken_for_kernel_dating() -> None:
    assert dated_meter._dated_before_read(_DatingSocket(-0.001), 0.5)  # type: ignore[arg-type]
    assert not dated_meter._dated_before_read(_DatingSocket(0.0), 0.05)  # type: ignore[arg-type]


def test_kernel_dating_that_never_comes_on_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dated_meter, "_dating_keeper", None)
    monkeypatch.setattr(dated_meter, "_dated_before_read", lambda _sock, _wait: False)
    with pytest.raises(RuntimeError, match="dated datagrams when they were read"):
        dated_meter.hold_kernel_dating(0.01)
    assert dated_meter._dating_keeper is None


def test_an_interval_that_is_not_positive_is_refused() -> None:
    receiver, sender = _pair()
    with receiver, sender, pytest.raises(ValueError, match="interval must be positive"):
        DatedMeter(receiver, 0.0, 0.0)
