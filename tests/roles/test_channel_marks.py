"""The roles' connections carry their purpose's DSCP class, both ways: on the sockets, and on
the packets a prio WAN sorts into its bands."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

from netem import nsutil
from netem.clock import ROUTING_DSCP
from netem.spec import LinkSpec
from netem.topology import LinkConfig, Network
from pddemu.runtime.auth import HelloCheck, RunSecret
from pddemu.runtime.channel import AF11, AF21, HELLO, Channel, Envelope
from pddemu.wire import Control, TokenIds
from tests.conftest import require_namespaces
from tests.netem.conftest import run_name  # noqa: F401 - the fixture, for this module


def tos(channel: Channel) -> int:
    return channel.writer.get_extra_info("socket").getsockopt(socket.IPPROTO_IP, socket.IP_TOS)


async def exchange(
    host: str,
    listener: socket.socket,
    purpose: str,
    before_close: Callable[[], None] = lambda: None,
) -> tuple[int, int, int]:
    """Connect with `purpose`, say hello and send one message, have the answer, call
    `before_close`, close both ends; the TOS of both ends."""
    accepted: asyncio.Future[Channel] = asyncio.get_running_loop().create_future()
    secret = RunSecret.new()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = Channel(reader, writer, peer="?", purpose="?")
        hello = await channel.receive()
        assert isinstance(hello, Envelope) and hello.kind == HELLO
        HelloCheck(secret, "you").verify(hello.body)
        channel.purpose = hello.body["purpose"]  # as the roles' accept loop does
        await channel.receive()
        accepted.set_result(channel)
        await channel.send(Control("ack", {}))

    server = await asyncio.start_server(accept, sock=listener)
    async with server:
        client = await Channel.connect(
            host, listener.getsockname()[1], "me", "you", purpose, secret
        )
        await client.send(Control("handoff", {"rid": "r"}), TokenIds.from_ints("r", 0, [1, 2, 3]))
        far = await asyncio.wait_for(accepted, 10)
        await client.receive()
        result = tos(client), tos(far), far.writer.get_extra_info("socket").fileno()
        before_close()
        client.close()
        far.close()
    return result


def settled_wan_stats(net: Network, quiet_s: float = 0.2, within_s: float = 5.0) -> Any:
    """The WAN's counters once no packet has passed for `quiet_s`: a closed connection's last
    segments (its FINs and ACKs) may still be on their way through the shaper when it ends."""
    last = net.stats()["wan"]
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = net.stats()["wan"]
        if now == last:
            return now
        last = now
    return last


def test_each_purpose_marks_both_ends_of_its_connection() -> None:
    for purpose, dscp in (("control", AF21), ("heartbeat", AF21), ("kv", AF11), ("other", 0)):
        listener = socket.create_server(("127.0.0.1", 0))
        near, far, _ = asyncio.run(exchange("127.0.0.1", listener, purpose))
        assert (near >> 2, far >> 2) == (dscp, dscp), purpose


def test_a_prio_wan_sees_control_in_band_1_and_kv_in_band_2(run_name: str) -> None:  # noqa: F811
    """Real packets through the shaper: the prio discipline counts where each class went."""
    require_namespaces()
    spec = LinkSpec(rate_bps=100e6, delay_s=0.001, qdisc="prio")
    with Network(LinkConfig.symmetric(spec), name=run_name, backend="userspace") as net:
        for purpose in ("control", "kv"):
            before = settled_wan_stats(net)
            with nsutil.inside(net.b.netns):
                listener = socket.create_server((net.b.addr, 0))
            open_phase: list[Any] = []  # the counters once the answer is in, before the close
            with nsutil.inside(net.a.netns):
                asyncio.run(
                    exchange(
                        net.b.addr,
                        listener,
                        purpose,
                        lambda: open_phase.append(net.stats()["wan"]),  # noqa: B023
                    )
                )
            (after,) = open_phase
            band = 1 if purpose == "control" else 2
            for direction in ("a2b", "b2a"):
                counts = [
                    a - b
                    for a, b in zip(
                        after[direction]["qdisc"]["band_packets"],
                        before[direction]["qdisc"]["band_packets"],
                        strict=True,
                    )
                ]
                # Counted while the connection is open (what its closing sends depends on the
                # kernel: a TIME_WAIT's ACK or a reset need not carry the socket's mark). The
                # connecting side marks from its SYN on: SYN, hello and message have passed. The
                # accepting side marks after the hello (its SYN-ACK and first ACKs unmarked):
                # its answer has passed, the ACKs before it may ride on it.
                least = 3 if direction == "a2b" else 1
                assert counts[band] >= least and counts[0] == 0, (purpose, direction, counts)
                if purpose == "control" and direction == "a2b":  # marked from its SYN on
                    assert counts[2] == 0, counts


def test_a_routing_messages_last_byte_alone_is_marked() -> None:
    """`match` and `matched` (the route waits for each across the WAN) end with a one-byte
    write marked ROUTING_DSCP, the shaper's cue to hold the clock at its release
    (tests/netem/test_routing_hold.py); everything before it, and any other message, keeps
    the purpose's mark; the reader gets the messages whole."""

    async def scenario() -> tuple[list[tuple[int, bytes]], list[Envelope]]:
        server = socket.create_server(("127.0.0.1", 0))
        near_sock = socket.create_connection(server.getsockname())
        far_sock, _ = server.accept()
        server.close()
        near = Channel.dated(near_sock, "MD0", "control")
        far = Channel.dated(far_sock, "FE0", "control")
        writes: list[tuple[int, bytes]] = []
        write = near.writer.write

        def recorded(data: bytes | memoryview) -> None:
            writes.append(
                (near_sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) >> 2, bytes(data))
            )
            write(data)

        near.writer.write = recorded  # type: ignore[method-assign]
        await near.send(Control("matched", {"rid": "r", "hit": 3}))
        await near.send(Control("match", {"rid": "r"}), TokenIds.from_ints("r", 0, [1, 2, 3]))
        await near.send(Control("tokens", {"rid": "r"}))
        received = [await far.receive() for _ in range(3)]
        near.close()
        far.close()
        return writes, received  # type: ignore[return-value]

    writes, received = asyncio.run(scenario())
    assert [m.kind for m in received] == ["matched", "match", "tokens"]
    assert received[1].token_ids() == [1, 2, 3]
    marked = [i for i, (dscp, _) in enumerate(writes) if dscp == ROUTING_DSCP]
    ends = [i for i, (_, data) in enumerate(writes) if len(data) == 1]
    assert marked == ends and len(marked) == 2  # the last byte of each routing message
    assert all(dscp in (AF21, ROUTING_DSCP) for dscp, _ in writes)
