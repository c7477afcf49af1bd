"""A framed TCP connection between two instances.

The first frame on every connection is a `hello` naming the sender and what the connection is
for, and proving the run's secret (`pddemu.runtime.auth`). A Control message may declare
`attach: n` (at most `MAX_ATTACHMENTS`): the next n frames on the connection belong to it (a
prompt's token ids, a handoff's token ids or KV), and are delivered to the handler with it.

A connection that breaks mid-frame or carries a frame that breaks the wire format ends
`serve` the same way a clean close does: the caller's cleanup (forgetting what was in flight on
the connection) runs in every case; `broken` says why it ended, if not cleanly.

Every connection's packets carry the DSCP class of its purpose (IP_TOS), both ways, so a WAN
queueing discipline can treat them as a real network would (RFC 4594's classes):
- `control`, the long-lived connection between two instances (requests, token ids streamed to
  the frontend, handoffs, md_ready, caught_up, took_over, release, transfer reports): AF21,
  low-latency data;
- `heartbeat`, an instance's heartbeats to the router, from a thread of their own: AF21 too
  (behind bulk KV they would be late, and a late heartbeat makes a live instance look lost);
- `kv`, P's KV link to each decode instance, carrying every bulk KV transfer to it (kv_begin,
  KV chunks, kv_end; `pddemu.roles.transfer`), and the relay's connection to each MD for
  kv-delta handoff parts: AF11, high-throughput data.
The connecting side marks its socket before connecting (the SYN is marked too); the accepting
side marks its socket as soon as the hello names the purpose.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from netem.clock import ROUTING_DSCP, socket_routing_slot
from pddemu.runtime.auth import RunSecret
from pddemu.runtime.dated_reads import DatedReader, SocketWriter
from pddemu.wire import Control, KVChunk, Message, TokenIds, encode, frame_size, read_message
from pddemu.wire.errors import BadControl, EndOfStream, WireError

HELLO = "hello"
MAX_ATTACHMENTS = 4096  # frames one message may carry (a prompt's ids are one frame)
MAX_ATTACHED_BYTES = 512 << 20  # payload they may carry together (each frame is capped too)
AF11 = 10
AF21 = 18
DSCP_BY_PURPOSE = {"control": AF21, "heartbeat": AF21, "kv": AF11}
# The routing exchange's messages that may cross the WAN: the route waits for each
ROUTING_KINDS = frozenset({"match", "matched"})
SIOCOUTQNSD = 0x894B  # ioctl: bytes in a TCP socket's send queue not yet sent (linux/sockios.h)


def _all_sent(writer: Any, sock: socket.socket) -> bool:
    """Whether everything written on the connection has been sent to the network: nothing
    queued by the writer (a transport's buffer, or `SocketWriter`'s), nothing in the socket
    not yet sent (SIOCOUTQNSD). A byte written marked then left marked. Not on a closing
    connection: its writer drops what is written."""
    transport = getattr(writer, "transport", writer)
    if transport.is_closing() or transport.get_write_buffer_size():
        return False
    unsent = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, unsent, True)
    return unsent[0] == 0


def mark_socket(sock: socket.socket, purpose: str) -> None:
    """Set the socket's DSCP to its purpose's class (best effort for an unknown purpose)."""
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, DSCP_BY_PURPOSE.get(purpose, 0) << 2)


@dataclass
class Envelope:
    """A control message with the frames attached to it."""

    kind: str
    body: dict[str, Any]
    attachments: list[Message] = field(default_factory=list)
    channel: Channel | None = None
    # Modelled time the message had wholly reached this host (the kernel's receive time), on a
    # dated connection (`Channel.dated`); None otherwise. `exact`: nothing waited behind it
    # when it was read, so no later segment merged into its (whose time it would then carry).
    received: float | None = None
    exact: bool = False
    # The same instant as a monotonic (wall) time: how long a hold standing since it has stood.
    received_wall: float | None = None
    # A routing message's: the clock page's slot of the shaper's holds at its connection's
    # messages (`netem.clock.routing_slot`); None where no connection is known.
    routing_slot: str | None = None

    def token_ids(self) -> list[int]:
        ids: list[int] = []
        for message in self.attachments:
            if not isinstance(message, TokenIds):
                raise ValueError(f"{self.kind}: expected token ids, got {type(message).__name__}")
            ids.extend(int(x) for x in message.ids)
        return ids

    def kv_chunks(self) -> list[KVChunk]:
        chunks = [m for m in self.attachments if isinstance(m, KVChunk)]
        if len(chunks) != len(self.attachments):
            raise ValueError(f"{self.kind}: expected KV chunks only")
        return chunks


class Channel:
    """Sends are serialised by a lock so a message and its attachments stay adjacent."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str, purpose: str
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.peer = peer
        self._lock = asyncio.Lock()
        self.bytes_sent = 0
        self.broken = ""  # why serve() ended, when not by a clean close
        # The sender's modelled clock: each control message carries its send time as "t", so
        # the receiver can tell how late it handles it.
        self.stamp: Callable[[], float] | None = None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.purpose = purpose
        # On a dated connection (`dated`): a monotonic time then -> modelled time then, which
        # tells each control message's kernel receive time as its `received`.
        self.modelled_at: Callable[[float], float | None] | None = None
        # Across the WAN: holds the present until the shaper has read a routing message
        # (`ModelledClock.hold_until_shaped`), returning the let-go for one that left unmarked.
        self.hold_until_shaped: Callable[[], Callable[[], None] | None] | None = None

    @classmethod
    def dated(cls, sock: socket.socket, peer: str, purpose: str) -> Channel:
        """A channel on a connected socket, read with kernel-dated reads
        (`pddemu.runtime.dated_reads`); the owner sets `modelled_at`."""
        sock.setblocking(False)
        return cls(DatedReader(sock), SocketWriter(sock), peer, purpose)  # type: ignore[arg-type]

    @property
    def purpose(self) -> str:
        return self._purpose

    @purpose.setter
    def purpose(self, purpose: str) -> None:
        """What the connection is for; its socket's DSCP mark follows."""
        self._purpose = purpose
        sock = self.writer.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_INET:
            mark_socket(sock, purpose)

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        me: str,
        peer: str,
        purpose: str,
        secret: RunSecret,
        dated: bool = False,
    ) -> Channel:
        """`dated`: read with kernel-dated reads (the owner sets `modelled_at`). A connect
        that fails or is cancelled at any point (the hello's send too: a dated writer's waits)
        closes what it opened: no connection is left open that its caller never got."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            mark_socket(sock, purpose)
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
        except BaseException:
            sock.close()
            raise
        if dated:
            channel = cls.dated(sock, peer, purpose)
        else:
            reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 22)
            channel = cls(reader, writer, peer, purpose)
        try:
            await channel.send(Control(HELLO, secret.hello(me, peer, purpose)))
        except BaseException:
            channel.close()
            raise
        return channel

    async def send(
        self,
        control: Control | Message,
        *attachments: Message,
        handed: Callable[[], None] | None = None,
        on_turn: Callable[[], None] | None = None,
    ) -> int:
        """Send a message with its attachments. All frames are handed to the transport before
        the first wait, so a sender cancelled while waiting never leaves half a group on a
        shared connection; `handed` is called then, before the wait for the send buffer, which
        may wait for acknowledgements across the WAN. A control message is stamped (`stamp`)
        when its turn on the connection comes (the lock taken), not when it queued for it:
        on a shared connection (a KV link) the wait behind others' sends is not its transit.
        `on_turn` is called then, before the stamp and the write, and never for a message
        whose sender was cancelled while it queued (what the sender holds for its reading,
        `ModelledClock.hold_until_read`, is posted there). A message of the routing exchange
        (`ROUTING_KINDS`) has its last byte sent marked `netem.clock.ROUTING_DSCP`: where it
        crosses the WAN, the shaper holds modelled time at that segment's release until its
        reader lets go (`ModelledClock.let_routing_go`). What the socket cannot take at once
        (a send buffer still full) leaves unmarked later, and is read as any message is."""
        if attachments:
            assert isinstance(control, Control)
            control = Control(control.kind, {**control.body, "attach": len(attachments)})
        attached = [buffer for message in attachments for buffer in encode(message)]
        routing = isinstance(control, Control) and control.kind in ROUTING_KINDS
        sock = self.writer.get_extra_info("socket") if routing else None
        marked = sock is not None and sock.family == socket.AF_INET
        async with self._lock:
            if self.closed:  # closed while it queued: nothing is written, nor held for reading
                raise ConnectionResetError(f"the connection to {self.peer} is closed")
            if on_turn is not None:
                on_turn()
            if self.stamp is not None and isinstance(control, Control):
                control = Control(control.kind, {**control.body, "t": self.stamp()})
            buffers = [*encode(control), *attached]
            # a routing message's last byte is a write of its own, the one marked: a segment
            # so marked then ends the message, or (the socket did not take what came before
            # at once) the byte leaves later, unmarked
            tail = memoryview(buffers[-1]).cast("B") if marked else None
            # in one call: with TCP_NODELAY a write per frame would leave as a packet per frame
            if tail is None or not tail.nbytes:
                self.writer.writelines(buffers)
            else:
                self.writer.writelines([*buffers[:-1], tail[:-1]])
                last = tail[-1:]
                let_go = None
                left_marked = False
                try:  # a hold is posted only once the mark is set, and let go if the write fails
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, ROUTING_DSCP << 2)
                    let_go = self.hold_until_shaped() if self.hold_until_shaped else None
                    self.writer.write(last)
                    left_marked = _all_sent(self.writer, sock)
                finally:
                    # The mark set back first, at once: a byte judged unsent but queued in the
                    # socket (not the writer's buffer, sent only once this returns) may still
                    # leave marked until then, and the shaper let go of the hold too: one
                    # let-go extra, which ends another message's hold early (a small error in
                    # its date, never a clock left standing). The window is this line's.
                    with contextlib.suppress(OSError):  # the socket closed meanwhile: no mark
                        mark_socket(sock, self.purpose)
                    if let_go is not None and not left_marked:  # (or the write failed)
                        let_go()
            if handed is not None:
                handed()
            await self.writer.drain()
        sent = frame_size(buffers)
        self.bytes_sent += sent
        return sent

    async def control(
        self,
        kind: str,
        body: dict[str, Any],
        *attachments: Message,
        handed: Callable[[], None] | None = None,
        on_turn: Callable[[], None] | None = None,
    ) -> int:
        return await self.send(Control(kind, body), *attachments, handed=handed, on_turn=on_turn)

    async def receive(self) -> Envelope | Message:
        """The next control message with its attachments, or a bare data frame."""
        message = await read_message(self.reader)
        if not isinstance(message, Control):
            return message
        count = message.body.get("attach", 0)
        if (
            isinstance(count, bool)
            or not isinstance(count, int)
            or not 0 <= count <= MAX_ATTACHMENTS
        ):
            raise BadControl(f"{message.kind}: attach must be 0..{MAX_ATTACHMENTS}, got {count!r}")
        attachments: list[Message] = []
        attached_bytes = 0
        for _ in range(count):
            attachment = await read_message(self.reader)
            attached_bytes += attachment.nbytes if isinstance(attachment, KVChunk) else 0
            attached_bytes += 4 * len(attachment.ids) if isinstance(attachment, TokenIds) else 0
            if attached_bytes > MAX_ATTACHED_BYTES:
                raise BadControl(
                    f"{message.kind}: attachments exceed {MAX_ATTACHED_BYTES >> 20} MiB"
                )
            attachments.append(attachment)
        # dated by its last frame: the message had wholly reached the host only then
        received = self.read_date()
        exact = received is not None and bool(getattr(self.reader, "exact", False))
        wall = getattr(self.reader, "received_wall", None) if received is not None else None
        envelope = Envelope(message.kind, message.body, attachments, self, received, exact, wall)
        if message.kind in ROUTING_KINDS:
            sock = self.writer.get_extra_info("socket")
            envelope.routing_slot = None if sock is None else socket_routing_slot(sock)
        return envelope

    def read_date(self) -> float | None:
        """When the last frame read had wholly reached the host (the kernel's receive time,
        in modelled time), on a dated connection; None otherwise. A bare data frame has no
        envelope to carry it: its handler asks here, before the next frame is read."""
        wall = getattr(self.reader, "received_wall", None)
        if wall is None or self.modelled_at is None:
            return None
        return self.modelled_at(wall)

    async def serve(self, handle: Callable[[Envelope | Message, Channel], Awaitable[None]]) -> None:
        """Read until the peer closes, handing every message to `handle` in order."""
        try:
            while True:
                try:
                    item = await self.receive()
                except EndOfStream:
                    return
                await handle(item, self)
        except (ConnectionError, asyncio.IncompleteReadError, WireError) as error:
            self.broken = f"{type(error).__name__}: {error}"
            return
        finally:
            self.close()

    def close(self) -> None:
        if isinstance(self.reader, DatedReader):
            self.reader.close()
        if not self.writer.is_closing():
            self.writer.close()

    @property
    def closed(self) -> bool:
        return self.writer.is_closing()
