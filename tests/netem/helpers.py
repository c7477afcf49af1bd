"""Measuring a run from outside, with the real tools (the benchmark's own helpers)."""

from __future__ import annotations

from netem.bench import iperf as iperf3
from netem.bench import ping
from netem.topology import Network

__all__ = ["iperf3", "median", "ping_rtts"]


def ping_rtts(
    net: Network, count: int, interval: float = 0.05, src: str = "a", dst: str | None = None
) -> list[float]:
    return ping(net, count, interval, src=src, dst=dst)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
