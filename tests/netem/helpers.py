"""Measuring a run from outside, with the real tools."""

from __future__ import annotations

import json
import re
import subprocess
import time

from netem.nsexec import command_in
from netem.topology import Network


def ping_rtts(
    net: Network, count: int, interval: float = 0.05, src: str = "a", dst: str | None = None
) -> list[float]:
    netns = getattr(net, src).netns
    target = dst or net.b.addr
    argv = ["ping", "-n", "-c", str(count), "-i", str(interval), "-W", "1", target]
    out = subprocess.run(
        command_in(netns, argv), capture_output=True, text=True, check=False
    ).stdout
    return [float(x) for x in re.findall(r"time=([0-9.]+) ms", out)]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def iperf3(net: Network, seconds: float, *extra: str, port: int = 5201) -> dict:
    server = subprocess.Popen(
        command_in(net.b.netns, ["iperf3", "-s", "-1", "-J", "-B", net.b.addr, "-p", str(port)]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        argv = ["iperf3", "-c", net.b.addr, "-p", str(port), "-t", str(seconds), "-J", *extra]
        done = subprocess.run(
            command_in(net.a.netns, argv), capture_output=True, text=True, check=False
        )
        report = json.loads(done.stdout)
        assert "error" not in report, report["error"]
        return report
    finally:
        server.wait(15)
