"""How many TCP flows sent data through one direction of a shaped link at once, window by
window of the shaper's time, and how many packets it dropped in each window (its rate queue's
drops and its random loss: either needs recovering).

Why: a link scaled in bytes keeps its queue's seconds but not its packets, while the flows that
share it are not scaled (each connection is the modelled system's own). With too many flows
for the path's packets each flow's window falls under the few packets TCP needs to recover a
loss by fast retransmit, and the emulator's TCP (timeouts), not the modelled system's, sets the
results. Only the bottleneck sees every flow however the senders carry their data (a connection
per transfer or shared ones), so it counts them here.

A flow is a TCP 5-tuple (protocol, addresses, ports) with a data segment (not a bare ACK, SYN or
FIN) reaching the direction in the window: a flow with data in flight sends within a round
trip, so windows about one round trip wide see every active flow. Counted at arrival, before
loss and the queue's limit: what the flows offered the bottleneck, in bytes each. Each window
keeps its flows and their max-min fair share of the bytes the link carries in a window
(`fair_share`): a short flow (a control message, another tenant's small transfer) keeps what it
offered and leaves the rest to the others, so only flows that want more than their share divide
it. With windows one loaded round trip wide (the base round trip plus the queue's time), what
the link carries in one is its path's packets (bandwidth-delay product plus queue), and a flow's
share is the window TCP can keep in flight. A drop is counted in the window of the first arrival
after it: exact for drops at arrival (drop-tail, fq's over-limit drop), within a window for
those at dequeue (CoDel's). Opt-in (`flow_window_s` in the shaper's config): the emulator's
networks ask for it on the WAN (`pddemu.emulated_network.network_for`), judged or not.
"""

from __future__ import annotations

import math
from typing import Any

from netem.packet import TCP


def tcp_data_flow(packet: bytes) -> bytes | None:
    """An IPv4 TCP segment's flow (addresses and ports, as bytes) when it carries data; None
    for a bare ACK, SYN, FIN or any other packet."""
    if len(packet) < 40 or packet[0] >> 4 != 4 or packet[9] != TCP:
        return None
    header = (packet[0] & 0x0F) * 4
    if len(packet) < header + 13:
        return None
    total = (packet[2] << 8) | packet[3]
    if total <= header + (packet[header + 12] >> 4) * 4:
        return None
    return packet[12:20] + packet[header : header + 4]


def fair_share(offered: list[int], capacity: float) -> float:
    """The max-min fair share of `capacity` among flows that offered `offered` (bytes each): the
    level L at which the offers, each capped at L, fill the capacity, which is what fair
    queueing gives each flow that offers more (a flow offering less keeps its own); the whole
    capacity when the offers fit in it."""
    left, flows = capacity, len(offered)
    for offer in sorted(offered):
        if offer * flows > left:
            return left / flows
        left -= offer
        flows -= 1
    return capacity


def thousandths_down(packets: float) -> float:
    """`packets` to the thousandth, rounded down: a share under a bound a reader judges it by
    (4 packets, `pddemu.metrics.wan_flows`) stays under it, where rounding 3.9996 up to 4.0
    would hide it. A millionth is allowed for the binary's error, so an exact 4 stays 4."""
    return math.floor(packets * 1000 + 1e-6) / 1000


class FlowCount:
    def __init__(self, window_s: float, origin: float) -> None:
        if not (window_s > 0 and math.isfinite(window_s)):
            raise ValueError(f"the flow count's window must be positive, got {window_s}")
        self.window_s = window_s
        self.origin = origin
        self.flows: dict[int, int] = {}  # window -> distinct data flows, once it has passed
        self.shares: dict[int, float | None] = {}  # window -> its fair share, in packets
        self.drops: dict[int, int] = {}  # window -> packets the rate queue dropped
        self.current: int | None = None  # the window whose flows are being collected
        self.offered: dict[bytes, int] = {}  # its flows' bytes so far
        self.dropped_seen = 0  # the queue's drop counter at the last arrival

    def count(
        self,
        packets: list[bytes],
        now: float,
        dropped_total: int,
        rate_bps: float | None,
        mtu: int,
    ) -> None:
        """`packets` reached the direction at `now`; its loss process and queue have dropped
        `dropped_total` packets since they were made (read after these were queued); its rate is `rate_bps` (None:
        unlimited) with packets of `mtu` bytes at most, as now."""
        index = math.floor((now - self.origin) / self.window_s)
        if index != self.current:
            self._close(rate_bps, mtu)
            self.current = index
        offered = self.offered
        for packet in packets:
            flow = tcp_data_flow(packet)
            if flow is not None:
                offered[flow] = offered.get(flow, 0) + len(packet)
        if dropped_total > self.dropped_seen:
            self.drops[index] = self.drops.get(index, 0) + dropped_total - self.dropped_seen
        self.dropped_seen = dropped_total

    def _close(self, rate_bps: float | None, mtu: int) -> None:
        """The window under way has passed: its flows and their fair share are kept."""
        if self.current is not None and self.offered:
            self.flows[self.current] = len(self.offered)
            self.shares[self.current] = self._share(rate_bps, mtu)
        self.offered = {}

    def _share(self, rate_bps: float | None, mtu: int) -> float | None:
        """The window under way's fair share of what the link carries in a window at
        `rate_bps`, in packets of `mtu` (None for an unlimited link)."""
        if rate_bps is None:
            return None
        capacity = rate_bps / 8 * self.window_s
        return thousandths_down(fair_share(list(self.offered.values()), capacity) / mtu)

    def to_dict(self, rate_bps: float | None, mtu: int) -> dict[str, Any]:
        """Dense lists from the first window with data or drops (`first`) to the last (the
        window under way taken at `rate_bps`): each window's data flows (`flows`), their fair
        share of what the link carries in a window, in packets of `mtu` to the thousandth, rounded
        down (`share_packets`; the whole window's when their offers fit, null for an unlimited link or a window without
        data), and the packets dropped (`drops`)."""
        flows, shares = dict(self.flows), dict(self.shares)
        if self.current is not None and self.offered:
            flows[self.current] = len(self.offered)
            shares[self.current] = self._share(rate_bps, mtu)
        indices = [*flows, *self.drops]
        if not indices:
            return {
                "window_s": self.window_s,
                "origin": self.origin,
                "first": 0,
                "flows": [],
                "share_packets": [],
                "drops": [],
            }
        first, last = min(indices), max(indices)
        span = range(first, last + 1)
        return {
            "window_s": self.window_s,
            "origin": self.origin,
            "first": first,
            "flows": [flows.get(i, 0) for i in span],
            "share_packets": [shares.get(i) for i in span],
            "drops": [self.drops.get(i, 0) for i in span],
        }

    def since(self, first: int, rate_bps: float | None, mtu: int) -> dict[str, Any]:
        """The record from window `first` on, as `to_dict` gives it (`first`: the lowest window
        it holds, `first` itself when it holds none), and `final`: the windows before it are
        closed and never change, the one under way and any after it may. The windows before
        `first` are forgotten: a reader that follows the record asks from the first window it
        has not taken in yet, so what it was sent before and lost is sent again, and the record
        kept (and each answer) is what came since, however long the run. One such reader a
        count: the others' `to_dict` then starts at its cursor."""
        if min(self.flows, default=first) < first or min(self.drops, default=first) < first:
            self.flows = {i: n for i, n in self.flows.items() if i >= first}
            self.shares = {i: s for i, s in self.shares.items() if i >= first}
            self.drops = {i: n for i, n in self.drops.items() if i >= first}
        record = self.to_dict(rate_bps, mtu)
        if not record["flows"]:
            record["first"] = first
        record["final"] = first if self.current is None else max(first, self.current)
        return record
