"""The shaper counts, per direction and window, the TCP flows that sent data through it, their
max-min fair share of what the link carries in a window, and the packets its queue dropped
(`netem.flow_count`): a bare ACK, SYN or FIN is no flow, a flow is counted once a window however
many segments it sends, a flow offering less than the share keeps its own, and a drop falls in
the window it happened in. On a fake clock, through datagram sockets standing for the TUN
ends."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from netem.flow_count import FlowCount, fair_share, tcp_data_flow
from netem.shaper import Shaper
from netem.spec import LinkSpec
from tests.netem.packets import UDP, ip_packet
from tests.netem.test_delivery_record import FakeLink, drain, one_link_config

SOURCE, DESTINATION = bytes([10, 0, 1, 1]), bytes([10, 0, 2, 1])
PSH_ACK, ACK, SYN = 0x18, 0x10, 0x02


def segment(port: int, data: int = 1000, flags: int = PSH_ACK) -> bytes:
    """An IPv4 TCP segment (no options) from `port` with `data` bytes of payload."""
    total = 40 + data
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 1, 0, 64, 6, 0, SOURCE, DESTINATION)
    tcp = struct.pack("!HHIIBBHHH", port, 80, 1, 1, 5 << 4, flags, 65535, 0, 0)
    return ip + tcp + bytes(data)


def test_only_segments_with_data_are_flows() -> None:
    assert tcp_data_flow(segment(1000)) == SOURCE + DESTINATION + struct.pack("!HH", 1000, 80)
    assert tcp_data_flow(segment(1000, data=0, flags=ACK)) is None
    assert tcp_data_flow(segment(1000, data=0, flags=SYN)) is None
    assert tcp_data_flow(ip_packet(600, protocol=UDP)) is None
    assert tcp_data_flow(b"\x60" + bytes(59)) is None  # IPv6: no flow of the emulator's


def test_the_fair_share_is_max_min() -> None:
    # a path of 42 packets (the default WAN's): 10 bulk flows get 4.2 each, 11 get 3.8
    assert fair_share([100] * 10, 42) == pytest.approx(4.2)
    assert fair_share([100] * 11, 42) == pytest.approx(42 / 11)
    # short flows keep what they offered; the bulk ones divide the rest
    assert fair_share([1] * 20 + [100] * 2, 42) == pytest.approx(11.0)
    assert fair_share([5, 10], 42) == 42  # the offers fit: the whole window
    assert fair_share([], 42) == 42


def test_flows_are_distinct_per_window_and_drops_fall_in_theirs() -> None:
    count = FlowCount(0.08, origin=10.0)
    # 1 Mbit/s: 10,000 bytes a window, 10 packets of 1,000 bytes
    rate, mtu = 1e6, 1000
    count.count([segment(1), segment(1), segment(2)], 10.01, 0, rate, mtu)
    count.count([segment(2), segment(3, data=0, flags=ACK)], 10.05, 2, rate, mtu)
    count.count([segment(4)] * 12, 10.25, 2, rate, mtu)  # windows 1 empty, 3 over the link
    count.count([segment(4, data=0, flags=ACK)], 10.33, 5, rate, mtu)  # drops, no flow
    assert count.to_dict(rate, mtu) == {
        "window_s": 0.08,
        "origin": 10.0,
        "first": 0,
        "flows": [2, 0, 0, 1, 0],
        "share_packets": [10.0, None, None, 10.0, None],
        "drops": [2, 0, 0, 0, 3],
    }
    assert count.to_dict(None, mtu)["share_packets"] == [10.0, None, None, 10.0, None]
    with pytest.raises(ValueError, match="window must be positive"):
        FlowCount(0.0, 0.0)


def test_the_shaper_counts_each_directions_flows(tmp_path: Path) -> None:
    # a queue of 3 packets at 1 Mbit/s: 6 segments of 1,040 bytes at once, 2 dropped
    spec = LinkSpec(rate_bps=1e6, limit_bytes=3 * 1040, qdisc="fifo")
    config = one_link_config(spec, tmp_path, flow_window_s=0.1)
    link = FakeLink()
    clock = [100.0]
    shaper = Shaper(config, link.open_end, now=lambda: clock[0])
    try:
        a2b, b2a = shaper.routes
        for port in range(1, 7):
            link.far["a"].send(segment(port))
        link.far["b"].send(segment(9, data=0, flags=ACK))  # the ACKs' way: no data flow
        clock[0] = 100.01
        shaper.turn([a2b.source_fd, b2a.source_fd], clock[0], early=0.0)
        for at in (100.2, 100.35):  # later windows: the queue drains, one flow sends again
            link.far["a"].send(segment(1))
            clock[0] = at
            shaper.turn([a2b.source_fd], clock[0], early=0.0)
        drain(link.far["b"])
        counts = shaper.flow_counts()["wan"]
    finally:
        shaper.control.close()
        link.close()
    assert counts["a2b"]["flows"] == [6, 0, 1, 1]
    # 12,500 bytes a window among 6 flows of 1,040 bytes: their offers fit
    assert counts["a2b"]["share_packets"] == [round(12_500 / 1500, 3), None, 8.333, 8.333]
    assert counts["a2b"]["drops"] == [2, 0, 0, 0]
    assert counts["b2a"]["flows"] == []
