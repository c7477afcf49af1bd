"""The shared WAN measured from outside at small sizes, with the benchmark's own code (the
figures in docs/netem.md come from the same functions at full size, under the CPU lock).

Margins here are wider than the benchmark's targets, and a row that misses is measured once
more (`measured_twice`): these runs are short and share the machine with a host that loses CPU
now and then; each still fails when the behaviour is absent (a fifo's queue, an unfair split,
no cross-traffic, a trace not followed, an outage of the wrong length)."""

from __future__ import annotations

import pytest

from netem import bench_wan
from tests.conftest import require_namespaces
from tests.netem.helpers import measured_twice


@pytest.fixture(autouse=True)
def namespaces(tools: None) -> None:
    require_namespaces()


def _ping_under_bulk(qdisc: str) -> dict:
    """The benchmark's row at a small size. On this 2-core VM a whole short run now and then
    shifts by a few ms, under either priority of the shaper (8 locked runs of prio's row:
    loaded p50 above idle 0.1-0.2 ms in 6, 2.35 and 4.75 ms in the others, p90 24-39 ms):
    measured once more when it misses a target (helpers); a discipline that lets the ping wait
    behind bulk misses in both runs."""
    return measured_twice(
        lambda: bench_wan.qdisc_latency(
            qdisc, rate_bps=20e6, delay_s=0.005, seconds=2.5, warmup_s=1.5, pings=50, idle_pings=30
        ),
        lambda row: all(row["targets"].values()) and _bulk_fills_the_link(row),
    )


def _bulk_fills_the_link(row: dict) -> bool:
    return row["bulk_goodput_bps"] >= 0.8 * 20e6


def test_disciplines_keep_ping_out_of_the_bulk_queue() -> None:
    """One saturating TCP flow at 20 Mbit/s: fifo's queue shows in ping; fq, fq_codel and a
    marked ping under prio stay near the idle round trip (the benchmark's own targets)."""
    results = {qdisc: _ping_under_bulk(qdisc) for qdisc in ("fifo", "fq_codel", "prio")}
    for result in results.values():
        assert all(result["targets"].values()), result
    assert results["fifo"]["loaded_rtt_p90_ms"] > results["fq_codel"]["loaded_rtt_p90_ms"]
    for result in results.values():
        assert _bulk_fills_the_link(result), result  # the bulk flow still fills the link


def _fair(result: dict) -> bool:
    return result["jain_index"] >= 0.9 and sum(result["stream_bps"]) >= 0.8 * 20e6


def test_fq_shares_the_link_fairly() -> None:
    # iperf3's streams are read on the host: a stalled receiver reads low (helpers)
    result = measured_twice(
        lambda: bench_wan.fairness(flows=4, rate_bps=20e6, seconds=3, omit_s=1), _fair
    )
    assert _fair(result), result


def _near_target(result: dict) -> bool:
    # the receivers' utilisation, and DC B's kernel saw it too
    return result["relative_error"] <= 0.15 and result["wire_utilisation"] >= 0.4


def test_cross_traffic_reaches_its_target_utilisation() -> None:
    # the generator and its receivers are processes on the host: stalled, they read low
    # (helpers); a generator that ignores its target misses both times
    result = measured_twice(
        lambda: bench_wan.cross_traffic_utilisation(
            target=0.5, rate_bps=20e6, seconds=3, arrivals="paced", mean_bytes=50_000
        ),
        _near_target,
    )
    assert _near_target(result), result


def _trace_replay() -> dict:
    """A 3 s replay of the benchmark's trace, its shaper's own record judged (by construction
    within one packet per 100 ms, busy host or not)."""
    result = bench_wan.trace_replay(seconds=3, period_ms=1000)
    assert result["shaper_intervals"] >= 18
    assert result["targets"]["shaper_due_within_one_packet_per_100ms"], result
    return result


def test_a_mahimahi_trace_is_followed_per_100ms() -> None:
    """The shaper's own record follows the trace within a packet per 100 ms (by construction,
    also on a busy host); the receiver's meter follows it in the median, and dated by the
    kernel it misses 2 % only where the shaper's record names a stall, in every run."""
    # The meter's median is read by a process on a VM that loses CPU to its hypervisor: one CI
    # run read a median 3.1 % off, and in one quarter hour locked runs missed it on this code
    # and on the code of 6c2e909 alike, between passing runs: measured once more when the
    # median misses (helpers); the shaper's own record is judged in every run.
    readings: list[dict] = []

    def replay() -> dict:
        readings.append(_trace_replay())
        return readings[-1]

    result = measured_twice(replay, lambda r: r["relative_error_p50"] <= 0.02)
    assert result["intervals"] >= 20
    assert result["relative_error_p50"] <= 0.02, result
    # Not measured away: the receiving kernel dates each datagram inside the shaper's write
    # (netdev_tstamp_prequeue), and the record times each batch after its writes, so the
    # receiver's lateness moves no date and any stall of the shaper's (steal, the host's
    # load) shows as its lateness; a miss past that is the kernel between them or the link.
    for reading in readings:
        assert reading["receiver_misses_past_the_shaper"] == 0, reading


def _outage_seen(result: dict) -> bool:
    return abs(result["error_s"]) <= 0.05


def test_a_scheduled_outage_is_seen_by_ping() -> None:
    # ping's replies are dated on the host: a stalled shaper or ping lengthens the gap
    # (helpers); an outage of the wrong length, or none, misses both times
    result = measured_twice(lambda: bench_wan.outage(down_at_s=0.7, outage_s=1.0), _outage_seen)
    assert _outage_seen(result), result
