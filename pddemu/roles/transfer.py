"""Bulk KV transfers: one TCP connection per transfer in flight, reused when idle.

Transfers to the same destination never share a connection, so a small increment is not stuck
behind a large one (they share the link the way TCP flows do: fairly). A transfer on a
connection is `kv_begin`, KV chunks, `kv_end`; closing the connection mid-way cancels it.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from netem.tcp import tcp_info, transfer_counters
from pddemu.metrics.tcp_totals import TcpTotals
from pddemu.runtime.channel import Channel


class TransferPool:
    def __init__(self, open_channel: Callable[[str, str], Awaitable[Channel]]) -> None:
        self._open = open_channel
        self._idle: dict[str, list[Channel]] = defaultdict(list)

    async def acquire(self, destination: str) -> Channel:
        idle = self._idle[destination]
        while idle:
            channel = idle.pop()
            if not channel.closed:
                return channel
        return await self._open(destination, "kv")

    def release(self, destination: str, channel: Channel) -> None:
        if not channel.closed:
            self._idle[destination].append(channel)


class Progress:
    """How far a request's KV has been computed, for senders streaming it as it grows. The
    senders waiting for more are known, so the computing side can tell when those an advance
    woke have taken their part (`due`)."""

    def __init__(self) -> None:
        self.tokens = 0
        self.at = 0.0  # modelled time the computed tokens were, as of the last advance
        self.finished = False
        self._changed = asyncio.Condition()
        self._waiting: dict[object, int] = {}  # each waiting sender's tokens

    async def advance(self, tokens: int, at: float, finished: bool = False) -> None:
        async with self._changed:
            self.tokens = tokens
            self.at = at
            self.finished = self.finished or finished
            self._changed.notify_all()

    async def wait_beyond(self, tokens: int) -> None:
        """Until more than `tokens` are computed, or the KV is complete. A sender goes on from
        here to hand what it waited for to its connection before it next waits."""
        waiter = object()
        self._waiting[waiter] = tokens
        try:
            async with self._changed:
                await self._changed.wait_for(lambda: self.tokens > tokens or self.finished)
        finally:
            del self._waiting[waiter]

    def due(self) -> bool:
        """Whether a sender has yet to take what is computed (woken, not yet gone on)."""
        return any(self.finished or self.tokens > tokens for tokens in self._waiting.values())


KEPT_TRANSFERS = 4096  # per-transfer rows a sender keeps (the latest), for a reader of /stats


# TCP_INFO's cumulative counters as a connection opens: its first transfer counts from there
OPENED = {"total_retrans": 0, "total_rto": 0, "bytes_sent": 0}


@dataclass
class Connection:
    """A KV connection as the ledger knows it: its last TCP_INFO reading, its last charged
    transfer, and whether a transfer is on it now."""

    sock: Any
    reading: dict[str, Any]
    transfer: dict[str, Any] | None = None
    busy: bool = False


class TcpLedger:
    """TCP_INFO counters (`netem.tcp`) of every KV transfer a sender made.

    A transfer is charged, when its last frame was handed to the kernel (`charge`), with what
    its connection did from its start (`begin`; a new connection: from its opening). Its tail,
    the retransmissions after that, is added to it when the next transfer starts on the
    connection, or, while the connection is idle, whenever the sender's stats are read
    (`settle`): never while a later transfer is on the connection, whose counts are its own.
    A connection the sender closes (a cut) is forgotten then (`forget`), one closed by its
    peer when it is next read. Times are turned into modelled time at the clock's rate when
    read. A serve makes transfers without end: the summary is kept as sums and bounded samples
    (`totals`), the rows of the latest `KEPT_TRANSFERS` transfers only.
    """

    def __init__(self, rate: Callable[[], float], sender: str = "") -> None:
        self.rate = rate
        self.transfers: deque[dict[str, Any]] = deque(maxlen=KEPT_TRANSFERS)
        self.totals = TcpTotals(sender)
        self._connections: dict[int, Connection] = {}  # by id of the connection's socket

    def begin(self, channel: Channel) -> None:
        """A transfer starts on `channel`: the previous one on it gets its tail, and what the
        connection does from now is the new one's."""
        sock = channel.writer.get_extra_info("socket")
        if sock is None:
            return
        known = self._connections.get(id(sock))
        if known is None or not self._add_tail(known):
            known = self._connections[id(sock)] = Connection(sock, OPENED)
        known.busy = True

    def charge(self, channel: Channel, wan: bool, genuine_bytes: int) -> None:
        """The transfer on `channel` handed its last frame to the kernel."""
        sock = channel.writer.get_extra_info("socket")
        if sock is None:
            return
        known = self._connections.pop(id(sock), None)
        try:
            info = tcp_info(sock)
        except (OSError, ValueError):  # closed (uvloop's socket of a closed transport: ValueError)
            return
        counters = transfer_counters(known.reading if known else OPENED, info)
        rate = self.rate()
        rtt, delivery = counters["min_rtt_us"], counters["delivery_rate_Bps"]
        transfer = {
            "wan": wan,
            "bytes": genuine_bytes,
            "retransmits": counters["retransmits"] or 0,
            "rto_events": counters["rto_events"] or 0,
            "min_rtt_s": rtt * 1e-6 * rate if rtt else None,  # modelled
            "delivery_rate_Bps": delivery / rate if delivery else None,  # per modelled s
        }
        self._connections[id(sock)] = Connection(sock, info, transfer)
        self.transfers.append(transfer)
        self.totals.add(transfer)

    def forget(self, channel: Channel) -> None:
        """`channel` is being closed (its transfer cut): nothing more is read of it."""
        sock = channel.writer.get_extra_info("socket")
        if sock is not None:
            self._connections.pop(id(sock), None)

    def settle(self) -> None:
        """Charge the last transfer of each idle connection with its tail so far; a connection
        closed since is forgotten."""
        for key, connection in list(self._connections.items()):
            if not connection.busy and not self._add_tail(connection):
                del self._connections[key]

    def _add_tail(self, connection: Connection) -> bool:
        """Add what `connection` did since its last reading to its last transfer (False:
        it is closed)."""
        try:
            info = tcp_info(connection.sock)
        except (OSError, ValueError):  # closed (uvloop's socket of a closed transport: ValueError)
            return False
        if connection.transfer is not None:
            counters = transfer_counters(connection.reading, info)
            self.totals.add_tail(
                connection.transfer, counters["retransmits"] or 0, counters["rto_events"] or 0
            )
        connection.reading = info
        return True
