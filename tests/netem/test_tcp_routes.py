"""TCP parameters on the routes across the emulated WAN (netem.tcp), as the kernel has them."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from pathlib import Path

from netem import nsutil
from netem.clock import SharedClock
from netem.crosstraffic import CrossTrafficSpec, TimedChange
from netem.nsexec import command_in
from netem.shaper import EARLY_S
from netem.spec import LinkSpec
from netem.tcp import TcpTuning, tcp_info, transfer_counters
from netem.topology import LinkConfig, Network

TUNING = TcpTuning(
    rto_min_s=0.2,
    quickack=True,
    initcwnd=20,
    initrwnd=41,
    congestion="cubic",
)


def test_tcp_parameters_are_on_every_route_across_the_wan(run_name: str) -> None:
    link = LinkConfig.symmetric(LinkSpec(rate_bps=25e6, delay_s=0.005))
    with Network(link, name=run_name, tcp=TUNING, clock=True) as network:
        metrics = network.tcp_metrics()
        assert len(metrics) == 4  # a -> b, a -> cross_b, a2 -> b, b -> DC A (with cross_a)
        for found in metrics.values():
            assert found["rto_min"] == 200 and found["quickack"] == 1
            assert (found["initcwnd"], found["initrwnd"]) == (20, 41)
            assert found["cc_algo"] == "cubic"
            assert found["lock"] == 1 << 13  # rto_min overrides the socket's own floor
        network.retime_tcp(8.0)  # the clock runs 8 modelled seconds a wall second
        assert {m["rto_min"] for m in network.tcp_metrics().values()} == {25}
        shown = subprocess.run(
            ["ip", "-n", network.b.netns, "route"], capture_output=True, text=True, check=True
        ).stdout
        assert "rto_min lock 25ms" in shown and "congctl cubic" in shown
        assert network.clock_path is not None and SharedClock(network.clock_path).rate == 1.0


def test_a_connection_across_the_wan_takes_the_routes_parameters(run_name: str) -> None:
    link = LinkConfig.symmetric(LinkSpec(rate_bps=25e6, delay_s=0.005))
    with Network(link, name=run_name, tcp=TUNING) as network:
        with nsutil.inside(network.b.netns):
            server = socket.create_server((network.b.addr, 7901))
        with nsutil.inside(network.a.netns):
            client = socket.create_connection((network.b.addr, 7901), timeout=5)
        accepted, _ = server.accept()
        before = tcp_info(client)
        received = []
        reader = threading.Thread(target=lambda: received.append(_read(accepted, 300_000)))
        reader.start()
        client.sendall(bytes(300_000))
        reader.join(10)
        assert received == [300_000]
        after = tcp_info(client)
        assert before["snd_cwnd"] <= 20  # the route's initial window
        assert after["rto"] >= 200_000  # us: the route's floor at rate 1
        counters = transfer_counters(before, after)
        assert counters["bytes_sent"] == 300_000 and counters["retransmits"] == 0
        # the 10 ms round trip, less the shaper's early release in each direction
        assert counters["min_rtt_us"] >= 10_000 - 2 * EARLY_S * 1e6
        for sock in (client, accepted, server):
            sock.close()


def test_a_send_after_the_routes_are_retimed_leaves_in_full_segments(run_name: str) -> None:
    """Re-timing replaces the routes; a connection's next send must still be cut at the
    path's MSS. Before the routes carried their device's MTU, the first 8,000-byte send after
    each replace left in 19-52 segments (the connection's path MTU read 68 for it), not 6."""
    link = LinkConfig.symmetric(LinkSpec(rate_bps=25e6, delay_s=0.005))
    with Network(link, name=run_name, tcp=TUNING) as network:
        with nsutil.inside(network.b.netns):
            server = socket.create_server((network.b.addr, 7902))
        with nsutil.inside(network.a.netns):
            client = socket.create_connection((network.b.addr, 7902), timeout=5)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        accepted, _ = server.accept()

        def segments_of_a_send(size: int = 8000) -> int:
            before = tcp_info(client)["data_segs_out"]
            client.sendall(bytes(size))
            assert _read(accepted, size) == size
            return tcp_info(client)["data_segs_out"] - before

        full = segments_of_a_send()
        assert full == 6  # 8,000 bytes at 1,448 a segment
        for rate in (8.0, 2.0, 5.0):
            network.retime_tcp(rate)
            time.sleep(0.05)
            assert [segments_of_a_send() for _ in range(2)] == [full, full], rate
        for sock in (client, accepted, server):
            sock.close()


def _read(sock: socket.socket, size: int) -> int:
    got = 0
    while got < size:
        got += len(sock.recv(65536))
    return got


def test_cross_traffic_flows_run_the_routes_congestion_control(run_name: str) -> None:
    """Other tenants' flows take the WAN's congestion control, not the host's default: one
    long flow each way, read with `ss -ti` at both senders while it runs."""
    default = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    named = "reno" if default != "reno" else "cubic"  # built into every kernel, unlike bbr
    flows = tuple(
        TimedChange(at_s=at, flow_bytes=50_000_000, direction=d)
        for at, d in ((0.0, "a2b"), (0.01, "b2a"))
    )
    cross = CrossTrafficSpec(utilisation=0.0, schedule=flows)
    link = LinkConfig.symmetric(LinkSpec(rate_bps=20e6, delay_s=0.005))
    tuning = TcpTuning(congestion=named)
    with Network(link, name=run_name, tcp=tuning, cross_traffic=cross) as network:
        addresses = network.addresses
        senders = {network.a.netns: addresses.cross_a, network.b.netns: addresses.cross_b}
        found: dict[str, list[str]] = {}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(found) < 2:
            time.sleep(0.2)
            for ns, source in senders.items():
                if algorithms := _congestion_of_flows_from(ns, source):
                    found[ns] = algorithms
    assert set(found) == set(senders), found  # both flows seen running
    for algorithms in found.values():
        assert set(algorithms) == {named}, (default, found)


def _congestion_of_flows_from(ns: str, source: str) -> list[str]:
    """The congestion control of each established TCP connection from `source` in `ns`."""
    argv = ["ss", "-tinH", "state", "established", "src", source]
    out = subprocess.run(command_in(ns, argv), capture_output=True, text=True, check=True).stdout
    # `ss -i` prints each connection's details on a line of its own, the algorithm among them
    return re.findall(r"^\s+.*?\b(reno|cubic|bbr|bbr2|dctcp|vegas|westwood|htcp)\b", out, re.M)
