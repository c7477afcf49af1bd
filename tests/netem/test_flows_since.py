"""Integration: a long run's reader follows the shaper's flow count round by round over its
control socket (`Network.flows_since`, the shaper's `flows` op) and judges what the whole
record gives, on real TCP flows (iperf3, eight at once) through a real TUN shaper; the shaper
then keeps only the windows from the reader's cursor on."""

from __future__ import annotations

import time

from netem.bench import iperf
from netem.spec import LinkSpec
from netem.topology import LinkConfig, Network
from pddemu.metrics.wan_flows import RunningFlows, wan_flows_summary

# 4 Mbit/s, 5 ms each way, a 15,000-byte queue: windows of one loaded round trip (40 ms) carry
# 13 packets, under 2 each for eight bulk flows, which overflow the queue
SPEC = LinkSpec(rate_bps=4e6, delay_s=0.005, limit_bytes=15_000, qdisc="fifo")
WINDOW_S = 0.04
PATH = 13.3


def test_rounds_over_the_control_socket_give_the_whole_records_figures(
    run_name: str, tools: None
) -> None:
    with Network(
        LinkConfig.symmetric(SPEC), name=run_name, backend="userspace", flow_window_s=WINDOW_S
    ) as net:
        start = time.monotonic()  # the shaper's clock: wall time without a clock page
        running = RunningFlows(start, PATH)
        iperf(net, 1, "-P", "8")
        end = time.monotonic()
        whole = net.flow_counts()["wan"]  # read before any round forgets a window
        expected = wan_flows_summary(whole, start, end, PATH)
        first = running.summary(net.flows_since(running.cursors), end)
        asked = dict(running.cursors)
        again = running.summary(net.flows_since(asked), end)
        kept = net.flow_counts()["wan"]
    assert expected["directions"]["a2b"]["flows_peak"] >= 8
    assert expected["directions"]["a2b"]["windows_starved"] > 0
    assert first == expected and again == expected
    for direction, record in kept.items():  # what the second round asked from, on
        assert record["first"] >= asked[direction] or not record["flows"]
