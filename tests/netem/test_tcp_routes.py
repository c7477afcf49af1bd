"""TCP parameters on the routes across the emulated WAN (netem.tcp), as the kernel has them."""

from __future__ import annotations

import socket
import subprocess
import threading

from netem import nsutil
from netem.clock import SharedClock
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
        assert len(metrics) == 3  # a -> b, a2 -> b, b -> DC A
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


def _read(sock: socket.socket, size: int) -> int:
    got = 0
    while got < size:
        got += len(sock.recv(65536))
    return got
