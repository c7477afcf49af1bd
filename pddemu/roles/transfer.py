"""Bulk KV transfers: every transfer from a sender to a destination rides ONE persistent TCP
connection (a *KV link*), as a transfer engine's do (Mooncake's, NIXL's): the number of flows
on the WAN is the number of (sender, destination) pairs, not of transfers in flight, so the
flows fit the emulated path, whose queue is scaled in bytes.

A transfer on a link is `kv_begin`, then (once the receiver says `kv_admitted`: it has the
request's memory, as an RDMA engine allocates before the write) KV chunks, `kv_end`; a
`kv_cut` ends it unfinished. Each transfer on a link has a sequence number of its own
(`seq`), which its messages both ways carry: a request's id is reused (a retry, a failover),
and a reply or a cut still on its way for an earlier transfer of it must not resolve a newer
one; such a stale message is ignored, and counted. Transfers on a link are interleaved chunk by chunk (each chunk is
a send of its own, and sends queue on the channel's FIFO lock), and what a link's socket may
hold unsent is bounded (`UNSENT_BYTES`), so a small increment is not stuck behind a large one:
they share the link's bandwidth about as two flows would. A link that breaks ends every
transfer on it.

A link is opened by the first transfer that needs it; the transfers that need it meanwhile
wait for that one attempt and share its outcome (the k-th does not wait for k attempts). The
attempt is bounded in modelled time by `faults.down_after`, the silence after which the router
would take the destination for down: a destination that cannot be connected to within it is
reported unreachable (silent) by every transfer that waited (`LinkUnavailable`), by when the
router would judge a silent one down anyway. Modelled, not wall, time: the connect crosses the emulated path (a
round trip of it, across the WAN 40 modelled ms with the defaults), and a run the clock slows
down (dilation) must not time out a connect the modelled network would complete.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from netem.tcp import tcp_info, transfer_counters
from pddemu.metrics.tcp_totals import TcpTotals
from pddemu.runtime.channel import Channel
from pddemu.runtime.clock import ModelledClock

# Bytes a link's socket and its writer may hold not yet sent (beyond one chunk being handed
# over): a chunk of one transfer handed over now waits behind at most this much of the
# others' (and what is in flight), not behind a whole send buffer of them.
UNSENT_BYTES = 16 << 10
# The most KV one frame on a link carries: transfers take turns on it frame by frame, so at the
# emulated WAN's scaled rate (10 Gbit/s / 1600: 16 KB in 21 modelled ms) a small increment
# waits for others' frames of this size, not for whole prefill chunks (256 KB: 0.34 s).
SLICE_BYTES = 16 << 10


def slice_tokens(token_bytes: int, chunk_tokens: int) -> int:
    """Genuine tokens of KV a frame on a link carries: SLICE_BYTES' worth, at most a chunk."""
    return max(1, min(chunk_tokens, SLICE_BYTES // max(1, token_bytes)))


def first_chunk_end(offset: int, p_hit: int, chunk_tokens: int, prompt_tokens: int) -> int:
    """Where the first prefill chunk a destination receives ends (genuine tokens): P computes
    a prompt from its own hit `p_hit` in chunks of `chunk_tokens`, so its chunk boundaries
    are p_hit + k chunks; a destination that needs the KV from `offset` gets first the part
    of the chunk that holds it, up to the next boundary (a partial chunk when its offset is
    not on one). Before P's hit the KV is cached, and goes at once a chunk at a time."""
    if offset < p_hit:
        return min(offset + chunk_tokens, p_hit)
    return min(prompt_tokens, p_hit + ((offset - p_hit) // chunk_tokens + 1) * chunk_tokens)


TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)  # linux/tcp.h


def bound_unsent(channel: Channel) -> None:
    """Keep what the link's socket and writer hold unsent to `UNSENT_BYTES`: the kernel takes
    more only below it (TCP_NOTSENT_LOWAT), and a send waits (`drain`) until the writer's own
    buffer is below it, so the next chunk, of whichever transfer, is queued behind little."""
    sock = channel.writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, UNSENT_BYTES)
    transport = getattr(channel.writer, "transport", None)
    if transport is not None:
        transport.set_write_buffer_limits(high=UNSENT_BYTES)


class LinkLost(ConnectionError):
    """A KV link ended before a transfer on it did (its receiver's end closed, or broke)."""


class LinkUnavailable(ConnectionError):
    """A KV link could not be opened: its connect failed, or did not complete within its
    bound (`KvLinks`; `silent`: no answer, not a refusal: the destination may be alive
    behind a partition). Every transfer that waited for that attempt fails with it."""

    def __init__(self, message: str, silent: bool) -> None:
        super().__init__(message)
        self.silent = silent


class TransferRefused(Exception):
    """The receiver refused a transfer (`kv_refused`: its `kv_begin` could not be admitted).
    The link goes on: the transfer alone ends, unfinished."""


class KvLinks:
    """A sender's KV links, one per destination: opened on first use and kept; one that closed
    is opened again by the next transfer, within `open_within_s` modelled seconds of `clock`
    (one attempt at a time, shared by the transfers waiting for it). `serve_replies` reads
    what the receiver says on a link (`kv_admitted`, `kv_refused`) until it closes, then calls
    `closed`. The links are kept in `links` (the instance's connections to its peers, as
    "<destination> (kv)": closed with them). An attempt is a task of the instance's (`spawn`:
    `Instance.spawn`), which its stop ends: none opens a link after the instance closed its
    connections, and an unforeseen failure of one is logged and counted."""

    def __init__(
        self,
        open_channel: Callable[[str, str], Awaitable[Channel]],
        serve_replies: Callable[[Channel], Any],
        links: dict[str, Channel] | None = None,
        *,
        spawn: Callable[[Coroutine[Any, Any, Channel | LinkUnavailable], str], asyncio.Task],
        clock: ModelledClock,
        open_within_s: float,
    ) -> None:
        if not open_within_s > 0:
            raise ValueError(f"a link's open needs a positive bound, got {open_within_s}")
        self._open = open_channel
        self._serve = serve_replies
        self._links: dict[str, Channel] = {} if links is None else links
        self._spawn = spawn
        self._clock = clock
        self.open_within_s = open_within_s
        # the attempt under way, if any
        self._opening: dict[str, asyncio.Task[Channel | LinkUnavailable]] = {}
        self._closed = False  # the instance stopped (`close`): no link opens any more
        self.open_attempts = 0  # links opened or tried (each shared by its waiting transfers)
        # each link's transfers waiting for their admission, by sequence number
        self._admissions: dict[Channel, dict[int, asyncio.Future[None]]] = {}
        self._last_seq: dict[Channel, int] = {}  # each link's last transfer's number
        self.stale_replies = 0  # kv_admitted / kv_refused for no transfer waiting (cut, or old)

    async def acquire(self, destination: str) -> Channel:
        """The link to `destination`, opened if there is none (or it closed): the attempt
        under way if there is one, whose outcome every transfer waiting for it shares
        (LinkUnavailable if it fails). A transfer cancelled meanwhile leaves the attempt to
        the others (and the link, once open, to the next transfer)."""
        channel = self._links.get(f"{destination} (kv)")
        if channel is not None and not channel.closed:
            return channel
        opening = self._opening.get(destination)
        if opening is None:
            opening = self._spawn(self._open_link(destination), f"KV link to {destination}")
            self._opening[destination] = opening
            opening.add_done_callback(lambda done: self._opened(destination, done))
        outcome = await asyncio.shield(opening)
        if isinstance(outcome, LinkUnavailable):  # each waiter its own, with its own traceback
            raise LinkUnavailable(str(outcome), outcome.silent) from outcome.__cause__
        return outcome

    def close(self) -> None:
        """The instance stops: the attempts under way end, and no link opens after this (one
        whose connect completes meanwhile is closed), so none is added after the instance
        closed its connections."""
        self._closed = True
        for attempt in list(self._opening.values()):
            attempt.cancel()

    def _opened(self, destination: str, attempt: asyncio.Task[Any]) -> None:
        """An attempt ended: the next transfer to need the link makes a new one if it failed."""
        if self._opening.get(destination) is attempt:
            del self._opening[destination]

    async def _open_link(self, destination: str) -> Channel | LinkUnavailable:
        """The link, or why it could not open: a failure its transfers report (the
        destination's), returned, not raised, since it is no failure of the instance's."""
        self.open_attempts += 1
        try:
            channel = await self._clock.within(
                self._open(destination, "kv"), self.open_within_s, discard=Channel.close
            )
        except Exception as error:  # refused, unreachable, not open in time, or not known
            silent = isinstance(error, TimeoutError)
            why = f"the KV link to {destination} could not open: {error}"
            unavailable = LinkUnavailable(why, silent)
            unavailable.__cause__ = error
            return unavailable
        if self._closed:
            channel.close()
            return LinkUnavailable(f"the KV link to {destination}: the sender stopped", False)
        bound_unsent(channel)
        self._links[f"{destination} (kv)"] = channel
        self._admissions[channel] = {}
        self._last_seq[channel] = 0
        self._serve(channel)
        return channel

    def expect_admission(self, channel: Channel, rid: str) -> tuple[int, asyncio.Future[None]]:
        """A new transfer of `rid` on `channel`: its sequence number on the link, and a future
        the receiver's `kv_admitted` for that number resolves (fails with TransferRefused on
        its `kv_refused`, with LinkLost if the link ends first). Made before `kv_begin`."""
        waiting = self._admissions.get(channel)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if waiting is None or channel.closed:
            future.set_exception(LinkLost(f"{rid}: the KV link to {channel.peer} is closed"))
            return 0, future
        seq = self._last_seq[channel] = self._last_seq[channel] + 1
        waiting[seq] = future
        return seq, future

    def admitted(self, channel: Channel, seq: object) -> bool:
        """The receiver admitted transfer `seq` on `channel`; False (counted stale) if none
        waits for it."""
        future = self._waiting(channel, seq)
        if future is None:
            return False
        future.set_result(None)
        return True

    def refused(self, channel: Channel, seq: object, rid: str, reason: str) -> bool:
        """The receiver refused transfer `seq` (of `rid`) on `channel`; False (counted stale)
        if none waits for it."""
        future = self._waiting(channel, seq)
        if future is None:
            return False
        future.set_exception(TransferRefused(f"{rid}: {channel.peer} refused it: {reason}"))
        return True

    def _waiting(self, channel: Channel, seq: object) -> asyncio.Future[None] | None:
        """The admission transfer `seq` on `channel` waits for, taken; None, counted, for a
        reply to none (a transfer cut since, an earlier one, a malformed number)."""
        waiting = self._admissions.get(channel, {})
        future = waiting.pop(seq, None) if type(seq) is int else None  # not a bool
        if future is None or future.done():
            self.stale_replies += 1
            return None
        return future

    def forget(self, channel: Channel, seq: int) -> None:
        """Transfer `seq` on `channel` ended without its admission (cut)."""
        future = self._admissions.get(channel, {}).pop(seq, None)
        if future is not None and not future.done():
            future.cancel()

    def closed(self, channel: Channel) -> None:
        """The link ended: every transfer waiting for its admission on it fails."""
        self._last_seq.pop(channel, None)
        for seq, future in self._admissions.pop(channel, {}).items():
            if not future.done():
                future.set_exception(
                    LinkLost(f"transfer {seq}: the KV link to {channel.peer} ended")
                )


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
    """A KV link as the ledger knows it: its last TCP_INFO reading, its last charged transfer,
    and how many transfers are on it now."""

    sock: Any
    reading: dict[str, Any]
    transfer: dict[str, Any] | None = None
    in_flight: int = 0


class TcpLedger:
    """TCP_INFO counters (`netem.tcp`) of every KV transfer a sender made.

    Transfers share their link (`KvLinks`), so a retransmission belongs to the link, not to
    one transfer: each is counted once, charged to the transfer whose end (its last frame
    handed to the kernel: `charge`) came next on the link. A transfer's row is what its link
    did since the previous charge on it (the first: since the link opened): its own bytes,
    the link's retransmissions and RTO events of that span, the link's minimum RTT and last
    delivery-rate sample as of its end. The link's tail, the retransmissions after a charge
    while no transfer is on it, is added to the last charged transfer whenever the sender's
    stats are read (`settle`) or the next transfer begins (`begin`); while a transfer is on
    the link they go to the next charge. A link closed is forgotten when it is next read.
    Times are turned into modelled time at the clock's rate when read. A serve makes transfers
    without end: the summary is kept as sums and bounded samples (`totals`), the rows of the
    latest `KEPT_TRANSFERS` transfers only.
    """

    def __init__(self, rate: Callable[[], float], sender: str = "") -> None:
        self.rate = rate
        self.transfers: deque[dict[str, Any]] = deque(maxlen=KEPT_TRANSFERS)
        self.totals = TcpTotals(sender)
        self._connections: dict[int, Connection] = {}  # by id of the connection's socket

    def begin(self, channel: Channel) -> None:
        """A transfer starts on `channel`: if the link is idle, its last transfer gets its
        tail first."""
        sock = channel.writer.get_extra_info("socket")
        if sock is None:
            return
        known = self._connections.get(id(sock))
        if known is None or known.sock is not sock:
            known = self._connections[id(sock)] = Connection(sock, OPENED)
        elif known.in_flight == 0 and not self._add_tail(known):
            known = self._connections[id(sock)] = Connection(sock, OPENED)
        known.in_flight += 1

    def charge(self, channel: Channel, wan: bool, genuine_bytes: int) -> None:
        """The transfer on `channel` handed its last frame to the kernel."""
        sock = channel.writer.get_extra_info("socket")
        if sock is None:
            return
        known = self._connections.get(id(sock))
        if known is None or known.sock is not sock:
            known = self._connections[id(sock)] = Connection(sock, OPENED, in_flight=1)
        known.in_flight = max(0, known.in_flight - 1)
        try:
            info = tcp_info(sock)
        except (OSError, ValueError):  # closed (uvloop's socket of a closed transport: ValueError)
            self._connections.pop(id(sock), None)
            return
        counters = transfer_counters(known.reading, info)
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
        known.reading, known.transfer = info, transfer
        self.transfers.append(transfer)
        self.totals.add(transfer)

    def forget(self, channel: Channel) -> None:
        """A transfer on `channel` ended unfinished (cut): the link goes on, and what it did
        meanwhile goes to its next charge."""
        sock = channel.writer.get_extra_info("socket")
        known = None if sock is None else self._connections.get(id(sock))
        if known is not None:
            known.in_flight = max(0, known.in_flight - 1)

    def settle(self) -> None:
        """Charge the last transfer of each idle link with its tail so far; a link closed since
        is forgotten."""
        for key, connection in list(self._connections.items()):
            if connection.in_flight == 0 and not self._add_tail(connection):
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
