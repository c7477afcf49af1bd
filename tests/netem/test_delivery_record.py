"""The shaper's own delivery record, on a fake clock: a replayed delivery trace is followed
exactly by construction (bytes due per 100 ms against the trace, within one packet), also
across forced stalls of the shaper, which the record names by their lateness and which move
bytes between the intervals it wrote them in."""

from __future__ import annotations

import select
import socket
from pathlib import Path

import pytest

from netem import mahimahi
from netem import shaper as shaper_module
from netem.bench_wan import synthetic_trace
from netem.delivery import DeliveryRecord
from netem.schedule import parse_schedule
from netem.shaper import Shaper
from netem.spec import LinkSpec

PACKET = 1500
OFFERED_PER_MS = 11  # 132 Mbit/s offered, above the trace's 24-96 Mbit/s: always a queue
# at ms: the shaper does not run for this long (the last one across an interval's end)
STALLS_MS = {437: 30, 1013: 12, 1555: 45}


class FakeLink:
    """Datagram socket pairs standing for the TUN ends; the test holds the far sides."""

    def __init__(self) -> None:
        self.far: dict[str, socket.socket] = {}
        self.kept: list[socket.socket] = []

    def open_end(self, ifname: str, _netns: str, _device: str) -> int:
        near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        for sock in (near, far):
            sock.setblocking(False)
        self.far[ifname] = far
        self.kept.append(near)
        return near.fileno()

    def close(self) -> None:
        for sock in [*self.kept, *self.far.values()]:
            sock.close()


def one_link_config(spec: LinkSpec, tmp_path: Path, **extra: object) -> dict:
    """The shaper's config for one WAN link between FakeLink's ends "a" and "b", `spec` both ways."""
    end = {"ifname": "", "netns": "n"}
    both = spec.to_dict()
    link = {"name": "wan", "a": {**end, "ifname": "a"}, "b": {**end, "ifname": "b"}}
    return {
        "links": [{**link, "a2b": both, "b2a": both}],
        "control": str(tmp_path / "control.sock"),
        **extra,
    }


def drain(sock: socket.socket) -> None:
    while True:
        try:
            sock.recv(65536)
        except BlockingIOError:
            return


def test_a_replayed_trace_is_due_exactly_and_stalls_are_named(tmp_path: Path) -> None:
    bin_ms = mahimahi.DEFAULT_BIN_MS
    trace = synthetic_trace(1000)
    schedule = parse_schedule(mahimahi.schedule_text(trace, trace, bin_ms))
    rates = mahimahi.binned_rates(trace, bin_ms, 1000)
    spec = LinkSpec(rate_bps=1e6, limit_bytes=1_000_000, qdisc="fifo")
    config = one_link_config(spec, tmp_path, schedule=schedule.to_dict(), record_interval_s=0.1)
    link = FakeLink()
    clock = [100.0]  # the schedule starts here (the shaper's time when it is made)
    shaper = Shaper(config, link.open_end, now=lambda: clock[0])
    try:
        sender, receiver = link.far["a"], link.far["b"]
        source = shaper.routes[0].source_fd
        ms = 0
        while ms < 2500:
            pause = STALLS_MS.get(ms, 1)
            for _ in range(OFFERED_PER_MS * pause):  # sent meanwhile, read at the next turn
                try:
                    sender.send(bytes(PACKET))
                except BlockingIOError:
                    break  # the end's buffer is full, as a TUN's queue would be
            ms += pause
            clock[0] = 100.0002 + ms / 1000  # turns off the intervals' edges
            while True:  # a turn reads at most READ_BATCH packets; the rest wait for the next
                shaper.turn([source], clock[0], early=0.0)
                drain(receiver)
                if not select.select([source], [], [], 0)[0]:
                    break
        record = shaper.deliveries()["wan"]["a2b"]
    finally:
        shaper.control.close()
        link.close()
    assert (record["interval_s"], record["origin"], record["first"]) == (0.1, 100.0, 0)
    due, written, late = record["due_bytes"], record["written_bytes"], record["max_lateness_s"]
    stalled = {ms // 100 for ms in STALLS_MS}
    for k in range(1, 24):  # the first fills the queue; the last is cut by the end
        expected = mahimahi.capacity_bytes(rates, bin_ms, k / 10, (k + 1) / 10)
        assert abs(due[k] - expected) < PACKET, (k, due[k], expected)  # in stalls too
        assert (late[k] >= 0.010) == (k in stalled), (k, late[k])  # named, and only them
        if k not in stalled:
            assert late[k] < 0.001 + 1e-9  # a turn a millisecond: never later than that
    # bytes move only where a stall crosses an interval's end: out of it, into the next
    moved = [k for k in range(1, 24) if abs(written[k] - due[k]) > 0.02 * due[k]]
    assert moved == [15, 16], moved
    assert written[15] < due[15] and written[16] > due[16]


def test_the_record_counts_by_due_time_and_by_write_time() -> None:
    record = DeliveryRecord(0.1, origin=10.0)
    record.count(1500, due=10.05, written=10.05)
    record.count(1500, due=10.09, written=10.13)  # a stall: due in the first, written in the next
    record.count(500, due=9.95, written=9.99)  # before the origin: interval -1
    out = record.to_dict()
    assert out["first"] == -1
    assert out["due_bytes"] == [500, 3000, 0]
    assert out["written_bytes"] == [500, 1500, 1500]
    assert out["max_lateness_s"][1] == pytest.approx(0.04)
    with pytest.raises(ValueError, match="positive"):
        DeliveryRecord(0.0, origin=0.0)


def test_a_stall_while_the_shaper_writes_shows_as_lateness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shaper loses the CPU for 20 ms inside the write of a packet it sends 0.5 ms after
    the packet was due (a hypervisor's steal): the receiving kernel dates the packet 20.5 ms
    late, so the record names that lateness (timed before the write, it named 0.5 ms)."""
    config = one_link_config(LinkSpec(rate_bps=1e6, qdisc="fifo"), tmp_path, record_interval_s=0.1)
    link = FakeLink()
    clock = [100.0]
    writes = []
    real_write = shaper_module.os.write

    def stalled_write(fd: int, data: bytes) -> int:
        if not writes:
            clock[0] += 0.020
        writes.append(clock[0])
        return real_write(fd, data)

    shaper = Shaper(config, link.open_end, now=lambda: clock[0])
    try:
        link.far["a"].send(bytes(PACKET))
        clock[0] = 100.05
        monkeypatch.setattr(shaper_module.os, "write", stalled_write)
        shaper.turn([shaper.routes[0].source_fd], clock[0], early=0.0)  # read, queued
        clock[0] = 100.05 + PACKET * 8 / 1e6 + 0.0005  # 0.5 ms after 1 Mbit/s let it leave
        shaper.turn([], clock[0], early=0.0)
        record = shaper.deliveries()["wan"]["a2b"]
    finally:
        shaper.control.close()
        link.close()
    assert len(writes) == 1, writes
    assert max(record["max_lateness_s"]) == pytest.approx(0.0205), record
