"""How long a small control message waits behind bulk KV on the WAN, per queueing discipline.

pddemu's own connections (`pddemu.runtime.channel`), marked as the roles mark them: one KV
connection (AF11) sends KV chunks from DC A to DC B as fast as the WAN takes them, while a
control connection (AF21) sends a small message every `interval_s` and waits for B's echo
(the size of a handoff's token ids or an md_ready). The control round trip is measured idle
(before the bulk starts) and loaded (after a warm-up), with each discipline at the WAN's
bottleneck; the excess of the loaded median over the idle one is the queue the control message
waited in. With `fifo` it waits behind the bulk's queue (about one bandwidth-delay product);
`fq` and `fq_codel` give its flow its own queue; `prio` serves its class first.
Targets (issue 11's, stated for ping behind iperf3): fifo's queue visible (at least 10 ms),
fq and fq_codel at most 5 ms above idle, prio at most 2 ms.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import time
from typing import Any

import numpy as np

from netem import nsutil
from netem.bench_wan import BULK_CONGESTION, queue_targets
from netem.spec import LinkSpec
from netem.tcp import TcpTuning
from netem.topology import LinkConfig, Network
from pddemu.runtime.auth import HelloCheck, RunSecret
from pddemu.runtime.channel import HELLO, Channel, Envelope
from pddemu.wire import Control, KVChunk, KVDtype

QDISCS = ("fifo", "fq", "fq_codel", "prio")
PROBE_IDS = 100  # a probe carries as many token ids as a 100-token handoff
KV_TOKENS_PER_CHUNK = 1024  # 1 layer x K,V x 1 head x 1024 tokens x 64 dims of float32: 512 KiB


def _chunk() -> KVChunk:
    data = np.random.default_rng(0).standard_normal((1, 2, 1, KV_TOKENS_PER_CHUNK, 64))
    return KVChunk("bulk", 0, 1, 0, KV_TOKENS_PER_CHUNK, KVDtype.FLOAT32, data.astype("<f4"))


async def _exchange(
    net: Network,
    listener: socket.socket,
    idle_probes: int,
    warmup_s: float,
    seconds: float,
    interval_s: float,
) -> dict[str, Any]:
    """Run in DC A's namespace; B's side is the server on `listener`."""
    secret = RunSecret.new()
    check = HelloCheck(secret, "B")
    received = {"kv_bytes": 0}
    served: list[tuple[Channel, asyncio.Task[Any]]] = []

    async def handle(item: Envelope | Any, channel: Channel) -> None:
        if isinstance(item, Envelope) and item.kind == "probe":
            await channel.send(Control("echo", item.body))
        elif isinstance(item, KVChunk):
            received["kv_bytes"] += item.nbytes

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = Channel(reader, writer, peer="?", purpose="?")
        hello = await channel.receive()
        assert isinstance(hello, Envelope) and hello.kind == HELLO
        check.verify(hello.body)
        channel.purpose = str(hello.body["purpose"])  # as the roles' accept loop does
        served.append((channel, asyncio.create_task(channel.serve(handle))))

    port = listener.getsockname()[1]
    server = await asyncio.start_server(accept, sock=listener)
    async with server:
        control = await Channel.connect(net.b.addr, port, "A", "B", "control", secret)
        probe = {"ids": list(range(PROBE_IDS))}

        async def probes(count: int) -> list[float]:
            rtts = []
            for _ in range(count):
                sent = time.perf_counter()
                await control.send(Control("probe", probe))
                await control.receive()
                rtts.append((time.perf_counter() - sent) * 1e3)
                await asyncio.sleep(max(0.0, interval_s - (time.perf_counter() - sent)))
            return rtts

        idle = await probes(idle_probes)
        kv = await Channel.connect(net.b.addr, port, "A", "B", "kv", secret)
        chunk = _chunk()
        stop = asyncio.Event()

        async def bulk() -> None:
            while not stop.is_set():
                await kv.send(chunk)

        sender = asyncio.create_task(bulk())
        await asyncio.sleep(warmup_s)
        before, started = received["kv_bytes"], time.perf_counter()
        loaded = await probes(max(1, int(seconds / interval_s)))
        goodput = (received["kv_bytes"] - before) * 8 / (time.perf_counter() - started)
        stop.set()
        await sender
        for channel in (kv, control, *(c for c, _ in served)):
            channel.close()
        await asyncio.wait([task for _, task in served], timeout=10)
    return {"idle": idle, "loaded": loaded, "bulk_goodput_bps": goodput}


def control_behind_kv(
    qdisc: str,
    rate_bps: float = 100e6,
    delay_s: float = 0.020,
    seconds: float = 10.0,
    warmup_s: float = 3.0,
    interval_s: float = 0.02,
    idle_probes: int = 50,
    name: str | None = None,
) -> dict[str, Any]:
    """The control round trip idle and under one bulk KV connection, with `qdisc` at the WAN
    (in a run called `name`, unique by default)."""
    spec = LinkSpec(rate_bps=rate_bps, delay_s=delay_s, qdisc=qdisc)
    name = name or f"bcls{qdisc.replace('_', '')[:6]}-{os.getpid()}"
    # the KV connection's congestion control named, as `[wan] tcp_congestion` names it in
    # pddemu's runs, rather than the host's default (BBR keeps a fifo nearly empty)
    tcp = TcpTuning(congestion=BULK_CONGESTION)
    with Network(LinkConfig.symmetric(spec), name=name, backend="auto", tcp=tcp) as net:
        with nsutil.inside(net.b.netns):
            listener = socket.create_server((net.b.addr, 0))
        with nsutil.inside(net.a.netns):
            measured = asyncio.run(
                _exchange(net, listener, idle_probes, warmup_s, seconds, interval_s)
            )
        backend = net.record.backend if net.record else "?"
    idle, loaded = measured["idle"], measured["loaded"]
    excess = statistics.median(loaded) - statistics.median(idle)
    ordered = sorted(loaded)
    result: dict[str, Any] = {
        "config": f"{qdisc} at {rate_bps / 1e6:g} Mbit/s, delay {delay_s * 1e3:g} ms each way "
        f"({backend} backend)",
        "idle_rtt_p50_ms": statistics.median(idle),
        "loaded_rtt_p50_ms": statistics.median(loaded),
        "loaded_rtt_p90_ms": ordered[int(0.9 * (len(ordered) - 1))],
        "loaded_rtt_p99_ms": ordered[int(0.99 * (len(ordered) - 1))],
        "loaded_samples": len(loaded),
        "excess_p50_ms": excess,
        "bulk_goodput_bps": measured["bulk_goodput_bps"],
    }
    result["targets"] = queue_targets(
        qdisc, statistics.median(idle), loaded, queue_ms=2e3 * delay_s
    )
    return result


def run(quick: bool) -> dict[str, Any]:
    """`make bench`: each discipline for 10 s of probes every 20 ms (4 s with --quick)."""
    seconds = 4.0 if quick else 10.0
    results = {qdisc: control_behind_kv(qdisc, seconds=seconds) for qdisc in QDISCS}
    return {
        "setup": "pddemu's Channel connections from DC A to DC B: one KV connection (DSCP AF11) "
        f"sending {KV_TOKENS_PER_CHUNK}-token KV chunks (512 KiB) back to back; a control "
        f"connection (AF21) sending a probe of {PROBE_IDS} token ids every 20 ms and waiting "
        "for B's echo; round trips by time.perf_counter in A; idle: 50 probes before the bulk, "
        f"loaded: {seconds:g} s after a 3 s warm-up",
        "qdiscs": results,
        "targets": {
            f"{qdisc}.{name}": ok
            for qdisc, result in results.items()
            for name, ok in result["targets"].items()
        },
    }
