"""`make bench-netem`: the link measured from outside, with ping and iperf3.

Nothing here reads the shaper's own counters: delays are ping round trips, rates are iperf3
TCP goodput, reordering and loss are what iperf3's UDP receiver reports. Each figure is
written beside its target in one JSON file.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from netem import nsutil
from netem.nsexec import command_in
from netem.procstat import process_cpu_s, steal_between, steal_s
from netem.spec import LinkSpec, LossModel
from netem.topology import LinkConfig, Network

IPERF_PORT = 5201
REALTIME = ["chrt", "--fifo", "10"]


def realtime_allowed() -> bool:
    """Whether this process may start one at real-time priority (not in a user namespace)."""
    try:
        return subprocess.run([*REALTIME, "true"], capture_output=True).returncode == 0
    except OSError:
        return False


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ping(
    net: Network,
    count: int,
    interval: float,
    src: str = "a",
    dst: str | None = None,
    tos: int | None = None,
) -> list[float]:
    """Round-trip times (ms) of `count` pings from host `src` of the run (DC A's a by default)
    to `dst` (DC B by default), with the TOS byte `tos` when given; lost pings are simply
    missing."""
    marks = ["-Q", str(tos)] if tos is not None else []
    argv = [
        "ping",
        "-n",
        *marks,
        "-c",
        str(count),
        "-i",
        str(interval),
        "-W",
        "2",
        dst or net.b.addr,
    ]
    out = subprocess.run(
        command_in(getattr(net, src).netns, argv), capture_output=True, text=True, check=False
    ).stdout
    return [float(x) for x in re.findall(r"time=([0-9.]+) ms", out)]


def wait_listening(netns: str, port: int, timeout: float = 10.0) -> None:
    """Until a TCP socket listens on `port` inside `netns` (read from the namespace's own
    /proc/net/tcp: connecting to check would use up iperf3's one-test server)."""
    deadline = time.monotonic() + timeout
    suffix = f":{port:04X}"
    while time.monotonic() < deadline:
        with nsutil.inside(netns):
            # thread-self: /proc/net follows the main thread, not the one that entered netns
            table = Path("/proc/thread-self/net/tcp").read_text().splitlines()[1:]
        if any(f[1].endswith(suffix) and f[3] == "0A" for f in (line.split() for line in table)):
            return
        time.sleep(0.02)
    raise RuntimeError(f"nothing listens on port {port} in {netns} after {timeout:.0f} s")


def iperf(
    net: Network,
    seconds: float,
    *extra: str,
    server_ns: str | None = None,
    server_addr: str | None = None,
    server_args: tuple[str, ...] = (),
    server_priority: bool = False,
) -> dict[str, Any]:
    """One iperf3 run from DC A to DC B (or another server namespace); its JSON report. With
    `server_priority` the receiving iperf3 runs at real-time priority where allowed, so its
    per-interval counts follow arrivals rather than when a busy machine let it read."""
    server_ns = server_ns or net.b.netns
    server_addr = server_addr or net.b.addr
    server = subprocess.Popen(
        command_in(
            server_ns,
            [
                *(REALTIME if server_priority and realtime_allowed() else []),
                "iperf3",
                "-s",
                "-1",
                "-J",
                "-B",
                server_addr,
                "-p",
                str(IPERF_PORT),
                *server_args,
            ],
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(server_ns, IPERF_PORT)
        argv = [
            "iperf3",
            "-c",
            server_addr,
            "-p",
            str(IPERF_PORT),
            "-t",
            str(seconds),
            "-J",
            *extra,
        ]
        done = subprocess.run(
            command_in(net.a.netns, argv), capture_output=True, text=True, check=False
        )
        try:
            report = json.loads(done.stdout)
        except ValueError:
            raise RuntimeError(f"iperf3 gave no report: {done.stderr.strip()[:300]}") from None
        if "error" in report:
            raise RuntimeError(f"iperf3: {report['error']}")
        return report
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


def receiver_udp(report: dict[str, Any]) -> dict[str, Any]:
    """The UDP receiver's own summary (needs --get-server-output): what actually arrived."""
    streams = report["server_output_json"]["end"]["streams"]
    udp = [s["udp"] for s in streams]
    return {
        "packets": sum(u["packets"] for u in udp),
        "lost_packets": sum(u["lost_packets"] for u in udp),
        "out_of_order": sum(u.get("out_of_order", 0) for u in udp),
    }


BACKENDS_USED: set[str] = set()


@contextmanager
def _network(
    name: str, a2b: LinkSpec, b2a: LinkSpec | None = None, **options: Any
) -> Iterator[Network]:
    """A run named for the benchmark step (a unique suffix keeps parallel runs apart), its
    shaper at real-time priority where allowed: the figures are the shaping's, not how a busy
    host schedules a Python loop (each row records whether it was on)."""
    options.setdefault("realtime_shaper", True)
    with Network(
        LinkConfig(a2b, b2a or a2b), name=f"{name}-{os.getpid()}", backend="auto", **options
    ) as net:
        BACKENDS_USED.add(net.record.backend if net.record else "?")
        yield net


def shaper_cpu_s(net: Network) -> float | None:
    """CPU seconds the userspace shaper has used; None for the kernel backend (no shaper
    process: its work is the kernel's, not measured here). At a share near 1 of a core the
    shaper, not the shaping, bounds what iperf3 sees."""
    return None if net.shaper is None else process_cpu_s(net.shaper.pid)


def bench_delay(quick: bool) -> dict[str, Any]:
    with _network("bench-delay", LinkSpec(delay_s=0.020)) as net:
        rtts = ping(net, 300 if quick else 2000, 0.01)
    p50, p99 = _percentile(rtts, 0.5), _percentile(rtts, 0.99)
    return {
        "config": "delay 20ms each way, no rate limit",
        "tool": "ping -i 0.01",
        "samples": len(rtts),
        "rtt_p50_ms": p50,
        "rtt_p99_ms": p99,
        "rtt_min_ms": min(rtts),
        "targets": {
            "rtt_p50_within_0.5ms_of_40ms": abs(p50 - 40.0) <= 0.5,
            "rtt_p99_under_42ms": p99 < 42.0,
        },
    }


def bench_rate(rate_bps: float, quick: bool) -> dict[str, Any]:
    seconds = 5 if quick else 15
    with _network(
        f"bench-rate{int(rate_bps / 1e6)}", LinkSpec(rate_bps=rate_bps, delay_s=0.020)
    ) as net:
        cpu, started = shaper_cpu_s(net), time.monotonic()
        report = iperf(net, seconds, "-O", "3", server_priority=True)
        cpu_after, wall = shaper_cpu_s(net), time.monotonic() - started
    cpu_share = None if cpu is None or cpu_after is None else (cpu_after - cpu) / wall
    goodput = report["end"]["sum_received"]["bits_per_second"]
    return {
        "congestion": report["end"].get("sender_tcp_congestion"),
        "shaper_cpu_share": cpu_share,
        "config": f"rate {rate_bps / 1e6:g} Mbit/s, delay 20ms each way (RTT 40 ms), queue 1 BDP",
        "tool": f"iperf3 TCP {seconds}s after 3s omitted",
        "goodput_bps": goodput,
        "ratio": goodput / rate_bps,
        "retransmits": report["end"]["sum_sent"].get("retransmits"),
        "targets": {"goodput_at_least_93pct": goodput / rate_bps >= 0.93},
    }


def bench_jitter(dist: str, quick: bool) -> dict[str, Any]:
    jitter = 0.002
    spec = LinkSpec(delay_s=0.020, jitter_s=jitter, jitter_dist=dist)
    with _network(f"bench-jit-{dist[:4]}", spec, LinkSpec(delay_s=0.020)) as net:
        rtts = ping(net, 300 if quick else 2000, 0.01)
    std = statistics.pstdev(rtts)
    return {
        "config": f"delay 20ms each way, jitter {dist} with std 2ms on A->B only",
        "tool": "ping -i 0.01",
        "samples": len(rtts),
        "rtt_std_ms": std,
        "configured_std_ms": jitter * 1e3,
        "relative_error": abs(std - jitter * 1e3) / (jitter * 1e3),
        "targets": {"std_within_20pct": abs(std - jitter * 1e3) <= 0.2 * jitter * 1e3},
    }


def bench_reordering(reorder: bool, quick: bool) -> dict[str, Any]:
    spec = LinkSpec(rate_bps=100e6, delay_s=0.020, jitter_s=0.002, reorder=reorder)
    with _network(f"bench-reord{int(reorder)}", spec) as net:
        report = iperf(
            net,
            3 if quick else 10,
            *("-u", "-b", "40M", "-l", "1200", "--get-server-output"),
            server_priority=True,
        )
    received = receiver_udp(report)
    out_of_order = received["out_of_order"]
    result = {
        "config": "rate 100 Mbit/s, delay 20ms, jitter 2ms uniform, reorder="
        + ("on" if reorder else "off"),
        "tool": "iperf3 UDP 40 Mbit/s, 1200-byte datagrams (receiver's report)",
        "packets": received["packets"],
        "out_of_order": out_of_order,
    }
    if not reorder:
        result["targets"] = {"zero_reordered": out_of_order == 0}
    return result


def bench_loss(quick: bool) -> dict[str, Any]:
    spec = LinkSpec(rate_bps=200e6, delay_s=0.005, loss=LossModel("bernoulli", 0.01))
    with _network("bench-loss", spec, LinkSpec(rate_bps=200e6, delay_s=0.005)) as net:
        report = iperf(
            net,
            4 if quick else 12,
            *("-u", "-b", "50M", "-l", "1200", "--get-server-output"),
            server_priority=True,
        )
    received = receiver_udp(report)
    lost, packets = received["lost_packets"], received["packets"]
    pct = 100.0 * lost / packets
    return {
        "config": "independent loss 1% on A->B",
        "tool": "iperf3 UDP 50 Mbit/s, 1200-byte datagrams (receiver's report)",
        "packets": packets,
        "lost": lost,
        "loss_pct": pct,
        "targets": {
            "loss_between_0.8_and_1.2pct": 0.8 <= pct <= 1.2,
            "at_least_20000_packets": packets >= 20000 or quick,
        },
    }


def bench_overhead(quick: bool) -> dict[str, Any]:
    seconds = 3 if quick else 8
    with _network("bench-overhead", LinkSpec()) as net:
        shaper = iperf(net, seconds, "-O", "1")["end"]["sum_received"]["bits_per_second"]
        veth = iperf(net, seconds, "-O", "1", server_ns=net.a2.netns, server_addr=net.a2.addr)[
            "end"
        ]["sum_received"]["bits_per_second"]
    return {
        "config": "no shaping: userspace shaper path A->B versus the raw veth path A->A2, same run",
        "tool": f"iperf3 TCP {seconds}s",
        "shaper_bps": shaper,
        "veth_bps": veth,
        "ratio": shaper / veth,
    }


def main(out: str, quick: bool = False, only: tuple[str, ...] = ()) -> int:
    """Run the steps (those named in `only`, when given) and write their figures to `out`."""
    from netem import bench_wan

    started = time.time()
    results: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "realtime_priority": realtime_allowed(),
            "loadavg_before": Path("/proc/loadavg").read_text().split()[:3],
        }
    }
    steps = [
        ("delay", lambda: bench_delay(quick)),
        *[
            (f"rate_{int(r / 1e6)}mbit", lambda r=r: bench_rate(r, quick))
            for r in (10e6, 100e6, 1000e6)
        ],
        *[
            (f"jitter_{d}", lambda d=d: bench_jitter(d, quick))
            for d in ("uniform", "normal", "pareto")
        ],
        ("reordering_off", lambda: bench_reordering(False, quick)),
        ("reordering_on", lambda: bench_reordering(True, quick)),
        ("loss", lambda: bench_loss(quick)),
        ("overhead", lambda: bench_overhead(quick)),
        *bench_wan.steps(quick),
    ]
    unknown = set(only) - {name for name, _ in steps}
    if unknown:
        print(f"netem bench: no step {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    for name, step in steps:
        if only and name not in only:
            continue
        print(f"netem bench: {name} ...", file=sys.stderr, flush=True)
        BACKENDS_USED.clear()
        stolen = steal_s()
        results[name] = step()
        results[name]["host_steal_s"] = steal_between(stolen, steal_s())
        results[name]["backend"] = ",".join(sorted(BACKENDS_USED))
        results[name]["realtime_priority"] = results["machine"]["realtime_priority"]
        figures = {k: v for k, v in results[name].items() if k not in ("config", "tool")}
        print(
            f"netem bench: {name}: {json.dumps(figures)}",
            file=sys.stderr,
        )
    results["wall_s"] = round(time.time() - started, 1)
    results["machine"]["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    results["quick"] = quick
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    missed = [
        f"{n}.{t}"
        for n, r in results.items()
        if isinstance(r, dict)
        for t, ok in r.get("targets", {}).items()
        if not ok
    ]
    print(
        f"netem bench: wrote {path}"
        + (f"; missed: {', '.join(missed)}" if missed else "; all targets met"),
        file=sys.stderr,
    )
    return 1 if missed and not quick else 0
