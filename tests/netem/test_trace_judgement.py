"""How the trace replay names a receiver's miss of 2 %: the shaper's when the receiver counted
what the shaper itself wrote in that interval, judged by bytes rather than by a fixed length
of the shaper's lateness."""

from __future__ import annotations

import contextlib
import errno
import socket
from types import SimpleNamespace

import pytest

from netem import bench_wan, mahimahi
from netem.bench_wan import judge_miss, written_between
from netem.dated_meter import DatedMeter

RATE = 12e6  # bytes a second: 96 Mbit/s, the trace's fastest
BIN_S = 0.01


def capacity(start: float, end: float) -> float:
    return RATE * (end - start)


def steady_bins(late_at: float | None = None, late_s: float = 0.0) -> list:
    """One second of the shaper's 10 ms bins at RATE; with `late_at`, the bytes of the last
    `late_s` of the bin before it are written in it, `late_s` late."""
    per_bin = int(RATE * BIN_S)
    bins = []
    for i in range(100):
        t = round(i * BIN_S, 3)
        written, late = per_bin, 0.0
        if late_at is not None and abs(t + BIN_S - late_at) < 1e-9:
            written -= int(RATE * late_s)
        if late_at is not None and abs(t - late_at) < 1e-9:
            written, late = per_bin + int(RATE * late_s), late_s
        bins.append((t, per_bin, written, late))
    return bins


def test_written_bytes_are_counted_pro_rata_at_cut_bins() -> None:
    bins = steady_bins()
    assert written_between(bins, BIN_S, 0.5003, 0.6003) == pytest.approx(RATE * 0.1)
    assert written_between(bins, BIN_S, 0.0, 1.0) == pytest.approx(RATE)


def test_a_stall_under_2ms_that_moves_over_2pct_is_the_shapers() -> None:
    """The shaper 1.85 ms late at an interval's start (as in a recorded -2.33/+2.49 % pair):
    the receiver read 2.49 % over, what the shaper wrote there plus half a millisecond of
    alignment and a packet. A fixed 2 ms lateness threshold called this miss past the
    shaper."""
    bins = steady_bins(late_at=0.5, late_s=0.00185)
    assert max(late for *_, late in bins) < 0.002
    judged = judge_miss(bins, BIN_S, 0.5003, 0.6003, 0.0249, capacity)
    assert judged["shaper_error"] > 0.015, judged
    assert judged["shapers"], judged


def test_a_miss_the_shaper_did_not_write_lies_past_it() -> None:
    """The shaper wrote the trace's bytes on time; a receiver 2.5 % over or under (a meter
    miscounting, datagrams dropped after the shaper) is not the shaper's."""
    bins = steady_bins()
    for error in (0.025, -0.025):
        judged = judge_miss(bins, BIN_S, 0.5003, 0.6003, error, capacity)
        assert not judged["shapers"], judged
    # a stall elsewhere does not excuse it either
    far = steady_bins(late_at=0.2, late_s=0.01)
    assert not judge_miss(far, BIN_S, 0.5003, 0.6003, 0.025, capacity)["shapers"]


def test_a_miss_against_the_shapers_own_direction_lies_past_it() -> None:
    """The shaper wrote 1.85 % more there; a receiver 2.5 % under did not see its bytes."""
    bins = steady_bins(late_at=0.5, late_s=0.00185)
    assert not judge_miss(bins, BIN_S, 0.5003, 0.6003, -0.025, capacity)["shapers"]


def test_the_metered_flow_closes_its_receiver_when_the_sender_cannot_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The code before left the receiver's socket open when creating the sender's raised."""
    opened: list[socket.socket] = []
    real_socket = socket.socket

    def second_fails(*args: object) -> socket.socket:
        if opened:
            raise OSError(errno.EMFILE, "Too many open files")
        opened.append(real_socket(socket.AF_INET, socket.SOCK_DGRAM))
        return opened[-1]

    monkeypatch.setattr(bench_wan.nsutil, "inside", lambda _netns: contextlib.nullcontext())
    monkeypatch.setattr(bench_wan.socket, "socket", second_fails)
    net = SimpleNamespace(a=SimpleNamespace(netns="a"), b=SimpleNamespace(netns="b"))
    with pytest.raises(OSError, match="Too many open files"):
        bench_wan._metered_udp_flow(net, 0.1)  # type: ignore[arg-type]
    assert opened and opened[0].fileno() == -1, "the receiver's socket was left open"


def _replay_judged(
    monkeypatch: pytest.MonkeyPatch, stall_s: float, meter_error_at: int | None
) -> dict:
    """trace_replay's judgement of a synthetic 3 s run: the shaper's record follows the trace
    but for one stall of `stall_s` at 1.5 s; the receiver counts what the shaper wrote, 0.2373 s
    of schedule time after its origin, and 3 % more in interval `meter_error_at`."""
    period_ms, seconds, offset = 1000, 3.0, 0.2373
    bin_ms = mahimahi.DEFAULT_BIN_MS
    rates = mahimahi.binned_rates(bench_wan.synthetic_trace(period_ms), bin_ms, period_ms)
    bin_s = bin_ms / 1000

    def trace(start: float, end: float) -> float:
        return mahimahi.capacity_bytes(rates, bin_ms, start, end)

    first = round(offset / bin_s)
    due = [round(trace((first + i) * bin_s, (first + i + 1) * bin_s)) for i in range(300)]
    written, late = list(due), [0.0] * 300
    moved = round(trace((first + 150) * bin_s - stall_s, (first + 150) * bin_s))
    written[149] -= moved
    written[150] += moved
    late[150] = stall_s
    record = {
        "interval_s": bin_s,
        "first": first,
        "due_bytes": due,
        "written_bytes": written,
        "max_lateness_s": late,
    }
    bins = bench_wan._bins(record)
    overhead = (bench_wan.UDP_PAYLOAD + 28) / bench_wan.UDP_PAYLOAD
    meter = SimpleNamespace(interval_s=0.1, kernel_bytes={}, read_bytes={}, dropped_datagrams=0)
    meter.intervals = lambda counts: DatedMeter.intervals(meter, counts)  # type: ignore[arg-type]
    for k in range(30):
        got = written_between(bins, bin_s, offset + k / 10, offset + (k + 1) / 10) / overhead
        meter.kernel_bytes[k] = meter.read_bytes[k] = round(
            got * (1.03 if k == meter_error_at else 1)
        )
    net = SimpleNamespace(deliveries=lambda: {"wan": {"a2b": record}})
    monkeypatch.setattr(bench_wan, "_network", lambda *_a, **_k: contextlib.nullcontext(net))
    monkeypatch.setattr(bench_wan, "_metered_udp_flow", lambda _net, _seconds: meter)
    return bench_wan.trace_replay(seconds=seconds, period_ms=period_ms)


def test_the_replay_names_a_stall_the_shapers_and_a_meter_error_past_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stalled = _replay_judged(monkeypatch, 0.004, None)
    assert stalled["receiver_misses"], stalled  # 4 ms of bytes moved: a miss of over 2 %
    assert stalled["receiver_misses_past_the_shaper"] == 0, stalled["receiver_misses"]
    miscounted = _replay_judged(monkeypatch, 0.0, 20)
    assert [m["start_s"] for m in miscounted["receiver_misses"]] == [2.237], miscounted
    assert miscounted["receiver_misses_past_the_shaper"] == 1, miscounted["receiver_misses"]
