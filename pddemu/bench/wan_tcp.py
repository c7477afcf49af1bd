"""What each TCP parameter of the emulated WAN's routes changes (`netem.tcp`,
`pddemu.emulated_network.tcp_tuning`), measured on the default scenario's scaled WAN.

The WAN of `configs/default.toml` (10 Gbit/s, 20 ms one way, no jitter here), scaled by the
byte scale and run on a clock page at a fixed rate: 1 (real time) and 8 (a fast run). For each
set of route parameters, adding them one at a time from the kernel's defaults:
- idle transfers: transfers of a 6400-token increment's genuine KV (204.8 kB) on one
  connection, one modelled second apart, each against the link's closed form (one-way delay +
  bytes at the rate's TCP payload share);
- a burst: 8 connections start 256 kB each at once; the last to finish against the closed form
  of them all, with the retransmitted segments and retransmission timeouts (TCP_INFO).
Everything is in modelled time, read from the clock page, so a parameter that makes results
depend on the rate shows as a difference between the two rates' columns.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
from dataclasses import replace
from typing import Any

import uvloop

from netem import nsutil
from netem.clock import SharedClock
from netem.tcp import TcpTuning, tcp_info
from netem.topology import LinkConfig, Network
from pddemu.config import load_config
from pddemu.emulated_network import TCP_HEADERS, scale_model, tcp_tuning, wan_link

PORT = 7900
IDLE_BYTES = 204_800
IDLE_GAP_S = 1.0  # modelled
BURST_FLOWS = 8
BURST_BYTES = 262_144
RATES = (1.0, 8.0)


def tunings() -> list[tuple[str, TcpTuning | None]]:
    """The kernel's defaults, the emulator's parameters added one at a time, then the
    emulator's with one changed: other congestion controls, no slow start after idle."""
    config = load_config(None, ["wan.jitter=0ms"])
    full = tcp_tuning(config, scale_model(config))
    steps: list[tuple[str, TcpTuning | None]] = [("kernel defaults", None)]
    tuning = TcpTuning()
    for name, change in (
        (f"+ congestion {full.congestion}", {"congestion": full.congestion}),
        (
            f"+ initcwnd {full.initcwnd}, initrwnd {full.initrwnd}",
            {"initcwnd": full.initcwnd, "initrwnd": full.initrwnd},
        ),
        ("+ rto_min 200 ms modelled", {"rto_min_s": full.rto_min_s}),
        ("+ quickack: the emulator's", {"quickack": True}),
    ):
        tuning = replace(tuning, **change)
        steps.append((name, tuning))
    assert tuning == full
    for name, change in (
        ("the emulator's, reno", {"congestion": "reno"}),
        ("the emulator's, bbr", {"congestion": "bbr"}),
        ("the emulator's, no slow start after idle", {"slow_start_after_idle": False}),
    ):
        steps.append((name, replace(full, **change)))
    return steps


def run(quick: bool) -> dict[str, Any]:
    config = load_config(None, ["wan.jitter=0ms"])
    scale = scale_model(config)
    link = wan_link(config, scale)
    assert link.rate_bps is not None
    payload_bps = link.rate_bps * (link.mtu - TCP_HEADERS) / link.mtu
    closed = {
        "idle_transfer_s": link.delay_s + IDLE_BYTES * 8 / payload_bps,
        "burst_s": link.delay_s + BURST_FLOWS * BURST_BYTES * 8 / payload_bps,
    }
    transfers = 4 if quick else 10
    rows = []
    for name, tuning in tunings():
        row: dict[str, Any] = {"parameters": name}
        for rate in RATES:
            with Network(LinkConfig.symmetric(link), clock=True, tcp=tuning) as network:
                assert network.clock_path is not None
                clock = SharedClock(network.clock_path)
                clock.set_ceiling(rate)
                clock.set_rate(rate)
                if tuning is not None:
                    network.retime_tcp(rate)
                row[f"rate {rate:g}"] = uvloop.run(measure(network, clock, transfers))
                clock.close()
        for key in ("idle_transfer_mean_s", "burst_s"):
            for rate in RATES:
                got = row[f"rate {rate:g}"][key]
                want = closed["idle_transfer_s" if key.startswith("idle") else "burst_s"]
                row[f"rate {rate:g}"][key.replace("_s", "_error")] = (got - want) / want
        rows.append(row)
    full = rows[5]  # the emulator's parameters
    return {
        "setup": {
            "link_rate_bps": link.rate_bps,
            "delay_s": link.delay_s,
            "idle_bytes": IDLE_BYTES,
            "burst": [BURST_FLOWS, BURST_BYTES],
            "queue_bytes": link.limit_bytes,
        },
        "closed_form": closed,
        "rows": rows,
        "targets": {
            **{
                f"the emulator's parameters: idle transfers within 5 % of the closed form at "
                f"rate {rate:g}": abs(full[f"rate {rate:g}"]["idle_transfer_mean_error"]) <= 0.05
                for rate in RATES
            },
            **{
                f"the emulator's parameters: {key} at rate 8 within 5 % of rate 1": abs(
                    full["rate 8"][key] / full["rate 1"][key] - 1
                )
                <= 0.05
                for key in ("idle_transfer_mean_s", "burst_s")
            },
        },
    }


async def measure(network: Network, clock: SharedClock, transfers: int) -> dict[str, Any]:
    """Idle transfers on one connection, then a burst on BURST_FLOWS connections."""
    with nsutil.inside(network.b.netns):
        server = socket.create_server((network.b.addr, PORT), backlog=64)
    arrivals: asyncio.Queue[tuple[int, float]] = asyncio.Queue()
    handlers: list[asyncio.Task] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        while True:
            header = await reader.read(8)
            if not header:
                break
            size = int.from_bytes(header, "big")
            await reader.readexactly(size)
            await arrivals.put((size, clock.now()))
            writer.write(b"k")
            await writer.drain()
        writer.close()

    listener = await asyncio.start_server(serve, sock=server)

    async def connect() -> tuple[socket.socket, asyncio.StreamReader, asyncio.StreamWriter]:
        with nsutil.inside(network.a.netns):
            sock = socket.socket()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (network.b.addr, PORT))
        reader, writer = await asyncio.open_connection(sock=sock)
        return sock, reader, writer

    async def send(writer: asyncio.StreamWriter, size: int) -> None:
        writer.write(size.to_bytes(8, "big") + bytes(size))
        await writer.drain()

    sock, reader, writer = await connect()
    await send(writer, 1000)  # the connection's first bytes: what an opened pool sees
    await reader.readexactly(1)
    await arrivals.get()
    idle = []
    for _ in range(transfers):
        await _sleep_until(clock, clock.now() + IDLE_GAP_S)
        started = clock.now()
        await send(writer, IDLE_BYTES)
        _, arrived = await arrivals.get()
        await reader.readexactly(1)
        idle.append(arrived - started)
    flows = [await connect() for _ in range(BURST_FLOWS)]
    for _, r, w in flows:  # open them before the burst, as a pool would be
        await send(w, 1000)
        await r.readexactly(1)
        await arrivals.get()
    await _sleep_until(clock, clock.now() + IDLE_GAP_S)
    started = clock.now()
    await asyncio.gather(*(send(w, BURST_BYTES) for _, _, w in flows))
    ends = [(await arrivals.get())[1] for _ in flows]
    infos = [tcp_info(s) for s, _, _ in flows]
    for _, _, flow_writer in [*flows, (sock, reader, writer)]:
        flow_writer.close()
    await asyncio.gather(*handlers)  # each sees its connection end
    listener.close()
    await listener.wait_closed()
    return {
        "idle_transfer_mean_s": statistics.fmean(idle),
        "idle_transfer_max_s": max(idle),
        "burst_s": max(ends) - started,
        "burst_retransmits": sum(i["total_retrans"] or 0 for i in infos),
        "burst_rto_events": sum(i["total_rto"] or 0 for i in infos),
    }


async def _sleep_until(clock: SharedClock, modelled: float) -> None:
    while (delay := clock.wall_delay(modelled)) > 0:
        await asyncio.sleep(delay)
