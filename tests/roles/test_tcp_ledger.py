"""A sender's TCP counters of its KV transfers: a lone transfer's retransmissions are counted,
those before its end and those of its tail after it (`TcpLedger.settle`); a transfer on a
reused connection is charged with its own, whenever the sender's stats are read."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace
from typing import Any

import pytest
import uvloop

import pddemu.roles.transfer as transfer
from pddemu.roles.prefill import Destination, PrefillInstance, PrefillJob
from pddemu.roles.spec import Address
from pddemu.runtime.channel import Envelope
from tests.roles.in_process import instance
from tests.roles.test_cut_transfer import Connection, Receiver, links_to


class Readings:
    """TCP_INFO readings of one connection, as the test scripts them (OSError: closed)."""

    def __init__(self) -> None:
        self.info: dict[str, Any] | None = None

    def now(self, retransmitted: int, rto: int = 0) -> None:
        self.info = {
            "total_retrans": retransmitted,
            "total_rto": rto,
            "bytes_sent": 1000,
            "min_rtt_us": 20_000,
            "delivery_rate": 1e6,
        }

    def read(self, sock: object) -> dict[str, Any]:
        if self.info is None:
            raise OSError("closed")
        return dict(self.info)


@pytest.fixture
def readings(monkeypatch: pytest.MonkeyPatch) -> Readings:
    scripted = Readings()
    monkeypatch.setattr(transfer, "tcp_info", scripted.read)
    return scripted


def channel() -> SimpleNamespace:
    sock = object()
    return SimpleNamespace(writer=SimpleNamespace(get_extra_info=lambda _: sock))


def test_a_lone_transfer_counts_its_retransmissions_and_its_tails(readings: Readings) -> None:
    ledger = transfer.TcpLedger(lambda: 1.0)
    readings.now(retransmitted=3)  # lost and resent while its frames were being handed over
    ledger.charge(channel(), True, 1000)
    assert ledger.totals.counters["wan"]["retransmits"] == 3  # 0 before: no earlier reading
    readings.now(retransmitted=5, rto=1)  # its tail, resent after its last frame left
    ledger.settle()
    wan = ledger.totals.counters["wan"]
    assert (wan["retransmits"], wan["rto_events"], wan["transfers_with_retransmits"]) == (5, 1, 1)
    assert (ledger.transfers[-1]["retransmits"], ledger.transfers[-1]["rto_events"]) == (5, 1)
    ledger.settle()  # read again: nothing new, nothing counted twice
    assert wan["retransmits"] == 5


def test_a_tail_counts_once_for_a_transfer_without_retransmissions_before(
    readings: Readings,
) -> None:
    ledger = transfer.TcpLedger(lambda: 1.0)
    readings.now(retransmitted=0)
    ledger.charge(channel(), False, 1000)
    readings.now(retransmitted=2)
    ledger.settle()
    intra = ledger.totals.counters["intra"]
    assert (intra["retransmits"], intra["transfers_with_retransmits"]) == (2, 1)
    readings.info = None  # the connection closed: forgotten, its counts kept
    ledger.settle()
    assert intra["retransmits"] == 2


def test_a_connection_closed_since_its_last_transfer_is_forgotten() -> None:
    """A real connection on uvloop, closed after its transfer: its socket is then uvloop's
    stand-in of a closed descriptor, whose read raises ValueError (not OSError); `settle`
    forgets it (it raised before, and the prefill's /stats answered 500)."""

    async def scenario() -> transfer.TcpLedger:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        ledger = transfer.TcpLedger(lambda: 1.0)
        ledger.charge(SimpleNamespace(writer=writer), True, 1000)
        writer.close()
        await writer.wait_closed()
        ledger.settle()
        server.close()
        return ledger

    ledger = uvloop.run(scenario())
    assert ledger.totals.counters["wan"]["retransmits"] == 0
    ledger.settle()  # nothing left to read


class Unix:
    """A socket that is not a TCP one: its counters are scripted (`Readings`)."""

    family = socket.AF_UNIX


class Socketed(Receiver):
    """A KV connection with a socket to read TCP counters of: scripted (`Readings`), or a real
    connection's (`writer`), whose closing closes it."""

    def __init__(self, writer: Any = None) -> None:
        super().__init__()
        self.sock = Unix() if writer is None else writer.get_extra_info("socket")
        self.real = writer

    def get_extra_info(self, _name: str) -> Any:
        return self.sock

    def close(self) -> None:
        super().close()
        if self.real is not None:
            self.real.close()


async def two_transfers(
    p: PrefillInstance, connection: Socketed, between: Any, cut_second: bool = False
) -> None:
    """P sends two transfers to MD0, one after the other on the same pooled `connection`; the
    first ends, then `between()` runs while the second is on its way, which then ends (or is
    cut)."""

    async def reopened(_name: str, _purpose: str) -> Socketed:
        return connection

    p.links = links_to(reopened, p)
    p.spec.peers["MD0"] = Address("MD0", "MD", "127.0.0.1", 3, 4)
    frontend = Connection()
    frontend.closed = False  # type: ignore[attr-defined]
    step = p.chunk_genuine
    prompt = [1 + i % 200 for i in range(2 * step)]
    kv, _ = p.model.prefill(prompt, None, len(prompt))
    for rid, last in (("r1", False), ("r2", True)):
        job = PrefillJob(rid, prompt, {}, frontend, kv=kv, first_token=1)
        await job.progress.advance(step, 0.0)
        destination = Destination("MD0", 0, {})
        destination.task = p.spawn(p.send(job, destination), rid)
        job.destinations.append(destination)
        p.jobs[rid] = job
        await asyncio.sleep(0.02)  # its first chunk is sent
        if last:
            between()
        if last and cut_second:
            await p.on_cut(Envelope("cut", {"rid": rid, "destination": "MD0"}, [], None))
        else:
            await job.progress.advance(2 * step, 0.0, finished=True)
        await asyncio.sleep(0.02)


def test_a_transfer_in_flight_keeps_its_retransmissions_when_stats_are_read(
    readings: Readings,
) -> None:
    """P's stats are read while a second transfer is on the connection the first one used:
    what was retransmitted meanwhile is the second one's, not the first one's tail (before,
    `settle` charged it to the first, and the second counted from that reading: 0)."""
    p = instance(PrefillInstance, "P")
    readings.now(retransmitted=0)

    def retransmit_and_read_stats() -> None:
        readings.now(retransmitted=4)
        p.stats()

    asyncio.run(two_transfers(p, Socketed(), retransmit_and_read_stats))
    assert [row["retransmits"] for row in p.tcp.transfers] == [0, 4]
    p.stats()  # the connection idle: nothing new, nothing counted twice
    assert p.tcp.totals.counters["wan"]["retransmits"] == 4


def test_the_prefill_stats_after_a_cut_on_a_reused_real_connection() -> None:
    """On uvloop, a real link carries a finished transfer, then one cut (P says `kv_cut`; the
    link goes on), and then closes: P's stats still read (they raised ValueError, a closed
    socket's negative descriptor, and /stats answered 500), with the finished transfer
    charged once."""

    async def scenario() -> tuple[PrefillInstance, dict[str, Any]]:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        p = instance(PrefillInstance, "P")
        connection = Socketed(writer)
        await two_transfers(p, connection, lambda: None, cut_second=True)
        assert connection.controls[-1] == "kv_cut" and not connection.closed
        connection.close()
        assert writer.is_closing()
        stats = p.stats()
        server.close()
        return p, stats

    p, stats = uvloop.run(scenario())
    assert stats["transfers_cut"] == 1 and len(stats["kv_transfers_tcp"]) == 1
    assert stats["kv_transfers_tcp_totals"]["wan"]["transfers"] == 1


def test_transfers_sharing_a_link_count_each_retransmission_once(readings: Readings) -> None:
    """Two transfers on one link at once: a retransmission is the link's, charged to the
    transfer whose end came next on it; stats read while the second is still on the link
    leave its counts to it; the link's tail, once it is idle, goes to the last."""
    ledger = transfer.TcpLedger(lambda: 1.0)
    link = channel()
    readings.now(retransmitted=0)
    ledger.begin(link)
    ledger.begin(link)
    readings.now(retransmitted=3)
    ledger.charge(link, True, 1000)  # the first ends: the link's 3 so far
    readings.now(retransmitted=5)
    ledger.settle()  # the second is on the link: nothing moves
    ledger.charge(link, True, 2000)  # the second ends: the 2 since
    readings.now(retransmitted=6)
    ledger.settle()  # the idle link's tail: the last's
    assert [row["retransmits"] for row in ledger.transfers] == [3, 3]
    wan = ledger.totals.counters["wan"]
    assert (wan["transfers"], wan["bytes"], wan["retransmits"]) == (2, 3000, 6)
    ledger.settle()
    assert wan["retransmits"] == 6
