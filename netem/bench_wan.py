"""`make bench-netem`, the shared WAN: queueing disciplines, fairness, cross-traffic, a
replayed delivery trace and a scheduled outage, measured from outside with ping and iperf3.

Each function takes its sizes as arguments: the benchmark runs them at full size, the
integration tests at small ones, so a test checks the very code that produces the figures.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from netem import mahimahi, nsutil
from netem.bench import _network, iperf, ping, realtime_allowed
from netem.crosstraffic import CrossTraffic, CrossTrafficSpec
from netem.dated_meter import DatedMeter, send_at_rate
from netem.nsexec import command_in
from netem.schedule import load_schedule, parse_schedule
from netem.spec import LinkSpec
from netem.topology import Network

AF21_TOS = 18 << 2  # the class pddemu's control connections carry (prio's band 1)
TARGET_EXCESS_MS = {"fq": 5.0, "fq_codel": 5.0, "prio": 2.0}
FIFO_VISIBLE_SHARE = 0.25  # of the queue's depth, at the loaded p90
# A shaper stall this long moves 2 % of a 100 ms interval's bytes into the next: the trace
# target's own margin, so a receiver's miss at a stall this long is the stall's
STALL_S = 0.002
# The bulk flow's congestion control, named rather than the host's default: a host may default
# to BBR, which paces at its bandwidth estimate and keeps a drop-tail queue nearly empty, so
# "the queue one saturating flow builds" would depend on the machine (docs/netem.md).
BULK_CONGESTION = "cubic"
UDP_PAYLOAD = 1472  # bytes a datagram: a 1500-byte IP packet


def queue_targets(
    qdisc: str, idle_p50_ms: float, loaded_ms: list[float], queue_ms: float
) -> dict[str, bool]:
    """The disciplines' targets: fq, fq_codel and prio keep the small message's p50 near the
    idle round trip; fifo shows the bulk flow's queue, its p90 at least a quarter of the queue's
    depth above idle. Not its p50: how much queue one CUBIC flow keeps standing in a one-BDP
    drop-tail buffer depends on when it loses packets (docs/netem.md), and it can run near
    empty for a while; its p90 still shows the queue the flow builds before each loss."""
    kind = qdisc.split(":")[0]
    if kind in TARGET_EXCESS_MS:
        limit = TARGET_EXCESS_MS[kind]
        return {f"p50_at_most_{limit:g}ms_above_idle": _median(loaded_ms) - idle_p50_ms <= limit}
    floor = FIFO_VISIBLE_SHARE * queue_ms
    return {
        f"queue_visible_p90_at_least_{floor:g}ms_above_idle": _quantile(loaded_ms, 0.9)
        - idle_p50_ms
        >= floor
    }


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def qdisc_latency(
    qdisc: str,
    rate_bps: float = 100e6,
    delay_s: float = 0.020,
    seconds: float = 15.0,
    warmup_s: float = 3.0,
    pings: int = 500,
    idle_pings: int = 100,
) -> dict[str, Any]:
    """Ping RTT idle, then under one saturating iperf3 TCP flow, with `qdisc` at the
    bottleneck (A->B); prio's pings carry pddemu's control mark (DSCP AF21)."""
    spec = LinkSpec(rate_bps=rate_bps, delay_s=delay_s, qdisc=qdisc)
    tos = AF21_TOS if qdisc.startswith("prio") else None
    interval = min(0.05, (seconds - 1.0) / pings)
    with _network(f"bench-q{qdisc.replace('_', '')[:7]}", spec) as net:
        idle = ping(net, idle_pings, 0.02, tos=tos)
        report: dict[str, Any] = {}
        flow = threading.Thread(
            target=lambda: report.update(
                iperf(net, warmup_s + seconds, "-O", str(warmup_s), "-C", BULK_CONGESTION)
            )
        )
        flow.start()
        time.sleep(warmup_s)
        loaded = ping(net, pings, interval, tos=tos)
        flow.join()
    excess = _median(loaded) - _median(idle)
    result = {
        "config": f"{qdisc} at {rate_bps / 1e6:g} Mbit/s, delay {delay_s * 1e3:g} ms each way, "
        "queue limit 1 BDP of the round trip (the default)",
        "tool": f"ping -i {interval:g}{' -Q 0x48 (AF21)' if tos else ''} during iperf3 TCP "
        f"({BULK_CONGESTION}) {seconds:g}s after {warmup_s:g}s; idle: {idle_pings} pings before",
        "idle_rtt_p50_ms": _median(idle),
        "loaded_rtt_p50_ms": _median(loaded),
        "loaded_rtt_p90_ms": _quantile(loaded, 0.9),
        "loaded_rtt_p99_ms": _quantile(loaded, 0.99),
        "loaded_samples": len(loaded),
        "excess_p50_ms": excess,
        "bulk_goodput_bps": report["end"]["sum_received"]["bits_per_second"],
    }
    result["targets"] = queue_targets(qdisc, _median(idle), loaded, queue_ms=2e3 * delay_s)
    return result


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one takes everything."""
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def fairness(
    flows: int = 4,
    rate_bps: float = 100e6,
    seconds: float = 15.0,
    qdisc: str = "fq",
    omit_s: float = 3.0,
) -> dict[str, Any]:
    """Jain's index of `flows` competing iperf3 TCP streams through `qdisc`."""
    spec = LinkSpec(rate_bps=rate_bps, delay_s=0.020, qdisc=qdisc)
    with _network(f"bench-fair{qdisc.replace('_', '')[:6]}", spec) as net:
        report = iperf(net, seconds, "-P", str(flows), "-O", f"{omit_s:g}")
    rates = [s["receiver"]["bits_per_second"] for s in report["end"]["streams"]]
    index = jain(rates)
    return {
        "config": f"{qdisc} at {rate_bps / 1e6:g} Mbit/s, delay 20 ms each way",
        "tool": f"iperf3 -P {flows} TCP {seconds:g}s after {omit_s:g}s omitted (receiver's rates)",
        "stream_bps": rates,
        "jain_index": index,
        "targets": {"jain_at_least_0.95": index >= 0.95},
    }


def wan_rx_bytes(net: Network) -> int:
    """Bytes the kernel of DC B received on its WAN interface (all traffic, IP headers in)."""
    with nsutil.inside(net.b.netns):
        table = Path("/proc/thread-self/net/dev").read_text().splitlines()
    for line in table:
        name, _, counters = line.partition(":")
        if name.strip() == "wan":
            return int(counters.split()[0])
    raise RuntimeError(f"no wan interface in {net.b.netns}")


def cross_traffic_utilisation(
    target: float = 0.5,
    rate_bps: float = 100e6,
    seconds: float = 20.0,
    arrivals: str = "paced",
    sizes: str = "exponential",
    mean_bytes: int = 200_000,
) -> dict[str, Any]:
    """Cross-traffic alone on the WAN: the utilisation its receivers saw (TCP payload) and the
    one DC B's kernel counted on its WAN interface (IP bytes, headers in)."""
    spec = LinkSpec(rate_bps=rate_bps, delay_s=0.020, qdisc="fq_codel")
    cross = CrossTrafficSpec(
        utilisation=target, sizes=sizes, mean_bytes=mean_bytes, arrivals=arrivals, seed=1
    )
    with _network(f"bench-cross{arrivals[:4]}", spec) as net:
        traffic = CrossTraffic(net, cross)
        before, started = wan_rx_bytes(net), time.monotonic()
        traffic.start(started)
        time.sleep(seconds)
        report = traffic.stop()
        wire = (wan_rx_bytes(net) - before) * 8 / (rate_bps * (time.monotonic() - started))
    a2b = report["directions"]["a2b"]
    error = abs(a2b["utilisation"] - target) / target
    result = {
        "config": f"{arrivals} arrivals of {sizes} flows, mean {mean_bytes / 1e3:g} kB, target "
        f"{target:g} of {rate_bps / 1e6:g} Mbit/s A->B, {seconds:g}s",
        "tool": "the generator's receivers (TCP payload); DC B's kernel interface counter",
        "utilisation": a2b["utilisation"],
        "wire_utilisation": wire,
        "relative_error": error,
        "flows": a2b["flows"],
        "bytes": a2b["bytes"],
    }
    if arrivals == "paced":
        result["targets"] = {"within_5pct_of_target": error <= 0.05}
    return result


def synthetic_trace(period_ms: int, seed: int = 1) -> list[int]:
    """A mahimahi trace of steps of 100-400 ms at 24-96 Mbit/s (2-8 opportunities a ms)."""
    rng = random.Random(seed)
    times: list[int] = []
    ms, credit = 1, 0.0
    while ms <= period_ms:
        rate = rng.uniform(24e6, 96e6) / (1500 * 8 * 1000)  # opportunities per ms
        for _ in range(rng.randint(100, 400)):
            if ms > period_ms:
                break
            credit += rate
            times += [ms] * int(credit)
            credit -= int(credit)
            ms += 1
    if times[-1] != period_ms:
        times.append(period_ms)
    return times


def trace_replay(seconds: float = 12.0, period_ms: int = 4000) -> dict[str, Any]:
    """A mahimahi trace pair imported with `netem trace import mahimahi`, replayed A->B under a
    saturating UDP flow of 1500-byte packets, seen two ways per 100 ms against the trace:

    - the shaper's own record (`netem.delivery`, 10 ms bins of the schedule's time): the bytes
      due per interval, which the emulator controls and which match the trace within one
      packet by construction, and the bytes it wrote, which a stall of the shaper moves to a
      later interval (its lateness names the stall);
    - the receiver's meter (`netem.dated_meter`: 0.1 s intervals of the kernel's receive
      times, aligned to the trace by the offset that fits best): the issue's target. Dated by
      the kernel, its count does not depend on when the receiving process ran. Each interval
      over 2 % is named a shaper stall when the shaper let a packet due in it, or in the
      interval before, leave STALL_S or more late; otherwise it lies past the shaper.

    The same datagrams counted when the receiver read them show what a meter counting at read
    time would have seen (`read_dated_intervals_over_2pct`). The shaper runs at real-time
    priority where allowed; the meter needs none."""
    bin_ms = mahimahi.DEFAULT_BIN_MS
    with tempfile.TemporaryDirectory() as scratch:
        up, down, out = (Path(scratch) / name for name in ("t.up", "t.down", "t.schedule"))
        trace = synthetic_trace(period_ms)
        up.write_text("\n".join(map(str, trace)) + "\n")
        down.write_text("\n".join(map(str, synthetic_trace(period_ms, seed=2))) + "\n")
        mahimahi.import_traces(up, down, out, bin_ms)
        schedule = load_schedule(out)
    rates = mahimahi.binned_rates(trace, bin_ms, period_ms)
    period = period_ms / 1000
    bin_s = bin_ms / 1000

    def capacity(start: float, end: float) -> float:
        return mahimahi.capacity_bytes(rates, bin_ms, start, end)

    # a queue of 4 MB (over 330 ms at the trace's fastest) stays full through a sender's stall
    spec = LinkSpec(rate_bps=1e6, limit_bytes=4_000_000, qdisc="fq")
    with _network(
        "bench-trace", spec, schedule=schedule, realtime_shaper=True, record_interval_s=bin_s
    ) as net:
        meter = _metered_udp_flow(net, seconds)
        record = net.deliveries()["wan"]["a2b"]
    overhead = (UDP_PAYLOAD + 28) / UDP_PAYLOAD  # IP bytes per payload byte
    intervals = [  # the first and last are cut by the flow's start and end
        (start, end, got * overhead)
        for start, end, got in meter.intervals(meter.kernel_bytes)[1:-1]
    ]

    def errors(offset: float) -> list[float]:
        return [got - capacity(offset + start, offset + end) for start, end, got in intervals]

    # the receiver's time 0 in the schedule's: the best fit within one period, then the pass
    # in which the shaper saw the flow begin (its first bin carrying half the trace's rate)
    offset = min((k / 1000 for k in range(period_ms)), key=lambda o: sum(e * e for e in errors(o)))
    bins = _bins(record)
    began = min(t for t, due, _, _ in bins if due >= 0.5 * capacity(t, t + bin_s))
    offset += period * round((began - offset) / period)

    def lateness(start: float, end: float) -> float:
        return max((late for t, _, _, late in bins if start <= t + 1e-9 < end), default=0.0)

    receiver = [got / capacity(offset + s, offset + e) - 1 for s, e, got in intervals]
    read_dated = [
        meter.read_bytes.get(round(s / meter.interval_s), 0)
        * overhead
        / capacity(offset + s, offset + e)
        - 1
        for s, e, _ in intervals
    ]
    misses = [
        {
            "start_s": round(offset + s, 3),
            "error": round(err, 4),
            "shaper_lateness_ms": round(1e3 * lateness(offset + s - 0.1, offset + e), 2),
        }
        for (s, e, _), err in zip(intervals, receiver, strict=True)
        if abs(err) > 0.02
    ]
    stalls = [m for m in misses if m["shaper_lateness_ms"] >= STALL_S * 1e3]
    # the shaper's own 100 ms intervals of schedule time, inside the span the receiver measured
    first = math.ceil((offset + intervals[0][0]) / 0.1 + 1e-9) + 1
    last = math.floor((offset + intervals[-1][1]) / 0.1 - 1e-9) - 1
    due_error, written_error, written_misses = [], [], 0
    for k in range(first, last):
        start, end = k / 10, (k + 1) / 10
        expected = capacity(start, end)
        due = sum(d for t, d, _, _ in bins if start <= t + 1e-9 < end)
        written = sum(w for t, _, w, _ in bins if start <= t + 1e-9 < end)
        due_error.append(due - expected)
        written_error.append(written / expected - 1)
        written_misses += abs(written / expected - 1) > 0.02
    worst_bytes = max(abs(e) for e in due_error)
    worst_receiver = max(abs(e) for e in receiver)
    return {
        "config": f"synthetic mahimahi trace, steps of 100-400 ms at 24-96 Mbit/s, period "
        f"{period_ms} ms, imported in {bin_ms} ms bins; {seconds:g}s",
        "tool": "UDP at 130 Mbit/s of 1472-byte datagrams, counted per 0.1 s by the kernel's "
        f"receive time (SO_TIMESTAMPNS); the shaper's own delivery record ({bin_ms} ms bins) "
        f"(shaper at real-time priority: {realtime_allowed()})",
        "intervals": len(intervals),
        "relative_error_p50": _median([abs(e) for e in receiver]),
        "relative_error_max": worst_receiver,
        "signed_errors": [round(e, 4) for e in receiver],
        "time_offset_s": offset,
        "receiver_misses": misses,
        "receiver_misses_at_shaper_stalls": len(stalls),
        "receiver_misses_past_the_shaper": len(misses) - len(stalls),
        "receiver_dropped_datagrams": meter.dropped_datagrams,
        "read_dated_intervals_over_2pct": sum(abs(e) > 0.02 for e in read_dated),
        "read_dated_relative_error_max": max(abs(e) for e in read_dated),
        "shaper_intervals": len(due_error),
        "shaper_due_max_error_bytes": worst_bytes,
        "shaper_written_relative_error_max": max(abs(e) for e in written_error),
        "shaper_written_intervals_over_2pct": written_misses,
        "shaper_max_lateness_ms": 1e3 * max(late for *_, late in bins),
        "targets": {
            "shaper_due_within_one_packet_per_100ms": worst_bytes < 1500,
            "every_100ms_within_2pct": worst_receiver <= 0.02,
        },
    }


def _metered_udp_flow(net: Network, seconds: float) -> DatedMeter:
    """UDP from DC A to DC B at 130 Mbit/s for `seconds`, counted per 0.1 s by DC B's kernel
    receive times (their origin: when the flow began)."""
    with contextlib.ExitStack() as sockets:  # the receiver's closes if the sender's cannot open
        with nsutil.inside(net.b.netns):
            receiver = sockets.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        with nsutil.inside(net.a.netns):
            sender = sockets.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        receiver.bind((net.b.addr, 0))
        meter = DatedMeter(receiver, 0.1, time.time())
        stop = threading.Event()
        reader = threading.Thread(target=meter.run, args=(stop,), daemon=True)
        reader.start()
        try:
            send_at_rate(sender, receiver.getsockname(), 130e6, UDP_PAYLOAD, seconds)
        finally:
            time.sleep(0.5)  # what the shaper still holds arrives
            stop.set()
            reader.join()
    if meter.undated_datagrams:
        raise RuntimeError(f"{meter.undated_datagrams} datagrams came without a kernel date")
    return meter


def _bins(record: dict[str, Any]) -> list[tuple[float, int, int, float]]:
    """A delivery record's bins as (start in the schedule's time, due bytes, written bytes,
    lateness in seconds)."""
    width = record["interval_s"]
    return [
        ((record["first"] + i) * width, due, written, late)
        for i, (due, written, late) in enumerate(
            zip(
                record.get("due_bytes", []),
                record.get("written_bytes", []),
                record.get("max_lateness_s", []),
                strict=True,
            )
        )
    ]


def outage(down_at_s: float = 2.0, outage_s: float = 5.0, delay_s: float = 0.020) -> dict[str, Any]:
    """A schedule takes the WAN down at `down_at_s` for `outage_s`; ping every 10 ms sees a
    gap between replies of the outage plus one round trip."""
    schedule = parse_schedule(f"{down_at_s:g} link=down\n{down_at_s + outage_s:g} link=up\n")
    spec = LinkSpec(delay_s=delay_s)
    with _network("bench-outage", spec, schedule=schedule) as net:
        count = int((down_at_s + outage_s + 1.5) / 0.01)
        argv = ["ping", "-n", "-D", "-c", str(count), "-i", "0.01", "-W", "1", net.b.addr]
        out = subprocess.run(
            command_in(net.a.netns, argv), capture_output=True, text=True, check=False
        ).stdout
    replies = [
        (float(stamp), float(rtt))
        for stamp, rtt in re.findall(r"^\[([0-9.]+)\].*time=([0-9.]+) ms", out, re.MULTILINE)
    ]
    gaps = [(b[0] - a[0], b) for a, b in zip(replies, replies[1:], strict=False)]
    gap, _ = max(gaps)
    rtt = _median([r for _, r in replies]) / 1000
    seen = gap - rtt
    return {
        "config": f"schedule: link down at {down_at_s:g}s for {outage_s:g}s, delay "
        f"{delay_s * 1e3:g} ms each way",
        "tool": "ping -D -i 0.01: the longest gap between replies, less one round trip",
        "replies": len(replies),
        "outage_seen_s": seen,
        "error_s": seen - outage_s,
        "targets": {"within_50ms": abs(seen - outage_s) <= 0.050},
    }


def steps(quick: bool) -> list[tuple[str, Any]]:
    """The benchmark's steps (name, function); `quick` runs them short (a smoke test)."""
    seconds = 4.0 if quick else 15.0
    return [
        *[
            (
                f"qdisc_{q}",
                lambda q=q: qdisc_latency(q, seconds=seconds, pings=100 if quick else 500),
            )
            for q in ("fifo", "fq", "fq_codel", "prio")
        ],
        ("fairness_fq", lambda: fairness(seconds=seconds)),
        *[
            (
                f"cross_traffic_{a}",
                lambda a=a: cross_traffic_utilisation(arrivals=a, seconds=seconds + 5),
            )
            for a in ("paced", "poisson")
        ],
        ("trace_replay", lambda: trace_replay(seconds=4.0 if quick else 12.0)),
        ("outage", lambda: outage(outage_s=2.0 if quick else 5.0)),
    ]
