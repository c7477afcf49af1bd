"""Cost of a served run's verdict round on the WAN's flow count, after hours of it: the whole
record (the shaper's `stats` op, judged by `wan_flows_summary`, as serve read it before) against
the windows since the last round (the `flows` op, judged by `RunningFlows`). The answer is built
on the shaper's loop, which forwards no packet meanwhile.

A userspace shaper with the default WAN (`wan_link`) counts, per direction, two KV flows with
data in every 80 ms window and a drop in one window of ten, and in one of CROWDED_EVERY twelve
bulk flows and a drop (starved), for `HOURS` of modelled time (`QUICK_HOURS` with --quick); then a round asks the whole record (median of REPEATS), and a round after each
of REPEATS more verdict periods of windows (5 s: VERDICT_WINDOWS) asks the windows since the
last (median). `shaper_busy_s`: the shaper's part (the op's answer built and encoded: the
time its loop forwards nothing); `round_s`: with the reader's decoding and judgement. Targets:
the two rounds give the same figures, and the incremental one costs under 1 % of the whole's.
"""

from __future__ import annotations

import json
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from netem.shaper import Route, Shaper
from netem.spec import LinkSpec
from pddemu.config import load_config
from pddemu.emulated_network import flow_window, path_packets, scale_model, wan_link
from pddemu.metrics.wan_flows import RunningFlows, wan_flows_summary

HOURS = 8.0
QUICK_HOURS = 0.5
VERDICT_WINDOWS = 62  # 5 s (serve's VERDICT_PERIOD_S) of 80 ms windows
REPEATS = 5
CROWDED_EVERY = 200  # windows: one of them has 12 flows (3.5 packets each) and a drop
MAX_SHARE = 0.01


def segment(port: int, data: int = 1400) -> bytes:
    """An IPv4 TCP segment with `data` bytes from `port` (the flow count reads its header)."""
    total = 40 + data
    ip = bytes([0x45, 0, total >> 8, total & 0xFF, 0, 1, 0, 0, 64, 6, 0, 0, 10, 0, 1, 1])
    ip += bytes([10, 0, 2, 1])
    tcp = port.to_bytes(2, "big") + bytes([0, 80]) + bytes(8) + bytes([0x50, 0x18]) + bytes(6)
    return ip + tcp + bytes(data)


class Counting:
    """A shaper with the default WAN both ways (datagram sockets for its TUN ends: nothing
    is forwarded here) whose flow count is fed windows directly, each direction's in turn."""

    def __init__(self, directory: Path, window_s: float, link: LinkSpec) -> None:
        self.kept: list[socket.socket] = []
        spec = link.to_dict()
        end = {"netns": "bench"}
        config = {
            "links": [
                {
                    "name": "wan",
                    "a": {**end, "ifname": "a"},
                    "b": {**end, "ifname": "b"},
                    "a2b": spec,
                    "b2a": spec,
                }
            ],
            "control": str(directory / "control.sock"),
            "flow_window_s": window_s,
        }
        self.clock = 0.0
        self.shaper = Shaper(config, self.open_end, now=lambda: self.clock)
        self.window_s = window_s
        self.window = 0
        self.dropped = 0
        self.packets = [segment(5001), segment(5001), segment(5002)]
        # 12 flows of 4 segments: each offers more than its share of a window, 3.5 packets
        self.crowd = [segment(port) for port in range(6000, 6012) for _ in range(4)]

    def open_end(self, _ifname: str, _netns: str, _device: str) -> int:
        near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.kept += [near, far]
        return near.fileno()

    def feed(self, windows: int) -> None:
        routes: list[Route] = self.shaper.routes
        for _ in range(windows):
            self.clock = (self.window + 0.5) * self.window_s
            crowded = self.window % CROWDED_EVERY == 0
            self.dropped += crowded or self.window % 10 == 0
            packets = self.crowd if crowded else self.packets
            for route in routes:
                spec = route.direction.spec
                assert route.flows is not None
                route.flows.count(packets, self.clock, self.dropped, spec.rate_bps, spec.mtu)
            self.window += 1

    def ask(self, request: dict[str, Any]) -> tuple[bytes, float]:
        """The op's answer as the shaper's loop encodes it, and how long that took."""
        started = time.perf_counter()
        reply = json.dumps(self.shaper._handle(json.dumps(request).encode())).encode() + b"\n"
        return reply, time.perf_counter() - started

    def close(self) -> None:
        self.shaper.control.close()
        for sock in self.kept:
            sock.close()


def whole_round(counting: Counting, packets: float) -> tuple[dict[str, Any], float, float, int]:
    """serve's round as it was: the whole record, judged whole from 0 on."""
    started = time.perf_counter()
    reply, busy = counting.ask({"op": "stats"})
    records = json.loads(reply)["flows"]["wan"]
    summary = wan_flows_summary(records, 0.0, counting.clock + 0.01, packets)
    return summary, busy, time.perf_counter() - started, len(reply)


def incremental_round(
    counting: Counting, running: RunningFlows
) -> tuple[dict[str, Any], float, float, int]:
    """serve's round now: the windows since the last, added to the running totals."""
    started = time.perf_counter()
    reply, busy = counting.ask({"op": "flows", "since": dict(running.cursors)})
    summary = running.summary(json.loads(reply)["flows"], counting.clock + 0.01)
    return summary, busy, time.perf_counter() - started, len(reply)


def run(quick: bool) -> dict:
    config = load_config()
    scale = scale_model(config)
    window_s, packets, link = (
        flow_window(config),
        path_packets(config, scale),
        wan_link(config, scale),
    )
    assert window_s is not None and packets is not None
    hours = QUICK_HOURS if quick else HOURS
    windows = round(hours * 3600 / window_s)
    with tempfile.TemporaryDirectory(prefix="pddemu-flow-record-") as directory:
        counting = Counting(Path(directory), window_s, link)
        try:
            started = time.perf_counter()
            counting.feed(windows - VERDICT_WINDOWS)
            running = RunningFlows(0.0, packets)
            _, first_busy, first_round, _ = incremental_round(counting, running)
            counting.feed(VERDICT_WINDOWS)
            fed_s = time.perf_counter() - started
            wholes = [whole_round(counting, packets) for _ in range(REPEATS)]
            rounds = [incremental_round(counting, running)]
            for _ in range(REPEATS - 1):
                counting.feed(VERDICT_WINDOWS)
                rounds.append(incremental_round(counting, running))
        finally:
            counting.close()
    whole_s = statistics.median(r[2] for r in wholes)
    incremental_s = statistics.median(r[2] for r in rounds)
    same = rounds[0][0] == wholes[0][0]
    return {
        "window_s": window_s,
        "link": link.to_dict(),
        "path_packets": packets,
        "hours": hours,
        "windows": windows,
        "feeding_wall_s": round(fed_s, 3),
        "whole": {
            "round_s": whole_s,
            "shaper_busy_s": statistics.median(r[1] for r in wholes),
            "reply_bytes": wholes[0][3],
        },
        "incremental": {
            "round_s": incremental_s,
            "shaper_busy_s": statistics.median(r[1] for r in rounds),
            "reply_bytes": statistics.median(r[3] for r in rounds),
            "windows_per_round": VERDICT_WINDOWS,
            "first_round_s": first_round,
            "first_round_shaper_busy_s": first_busy,
        },
        "incremental_over_whole": incremental_s / whole_s,
        "starved_share": wholes[0][0]["starved_share"],
        "targets": {
            "the same figures whole and incremental": same,
            f"an incremental round under {MAX_SHARE:.0%} of a whole one": (
                incremental_s / whole_s < MAX_SHARE
            ),
        },
    }
