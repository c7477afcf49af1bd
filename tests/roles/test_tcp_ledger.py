"""A sender's TCP counters of its KV transfers: a lone transfer's retransmissions are counted,
those before its end and those of its tail after it (`TcpLedger.settle`)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import uvloop

import pddemu.roles.transfer as transfer


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
