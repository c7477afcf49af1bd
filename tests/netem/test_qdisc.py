"""Queueing disciplines at the bottleneck, on a fake clock: order, fairness, drops, priority."""

from __future__ import annotations

import math

import pytest

from netem.elements import RateQueue, Sink
from netem.packet import dscp, ecn_capable, flow_key, mark_congestion
from netem.qdisc import CodelParams, FairQueue, Fifo, FqCodel, Prio, band_of, make_qdisc
from netem.qdisc.codel import CodelQueue
from tests.netem.packets import AF11, AF21, EF, ICMP, flow, header_checksum, ip_packet

MTU = 1500


def run(qdisc, rate_bps: float, arrivals: list[tuple[float, bytes]]) -> list[tuple[bytes, float]]:
    """Push every (time, packet) through a rate queue with `qdisc`; what leaves, with times."""
    queue = RateQueue(rate_bps, qdisc)
    sink = Sink()
    queue.downstream = sink
    for at, packet in sorted(arrivals, key=lambda a: a[0]):
        queue.push(packet, at)
    queue.release(math.inf)
    return sink.take()


def ports(out: list[tuple[bytes, float]]) -> list[int]:
    return [flow_key(packet)[3] for packet, _ in out]


# -- packets -------------------------------------------------------------------------------


def test_flow_key_dscp_and_ecn_are_read_from_the_header() -> None:
    packet = ip_packet(100, sport=5, dport=6, dscp=AF21, ecn=2)
    protocol, src, dst, sport, dport = flow_key(packet)
    assert (protocol, sport, dport) == (6, 5, 6) and src != dst
    assert dscp(packet) == AF21 and ecn_capable(packet)
    assert flow_key(ip_packet(100, protocol=ICMP))[3:] == (0, 0)
    assert flow_key(b"\x60" + b"\0" * 60) == flow_key(b"")  # not IPv4: one anonymous flow


def test_congestion_mark_keeps_the_header_checksum_valid() -> None:
    packet = ip_packet(200, dscp=AF11, ecn=1)
    marked = mark_congestion(packet)
    assert marked[1] & 3 == 3 and dscp(marked) == AF11
    assert header_checksum(marked[:20]) == 0 and len(marked) == len(packet)
    assert marked[2:10] == packet[2:10] and marked[12:] == packet[12:]


# -- fifo ----------------------------------------------------------------------------------


def test_fifo_keeps_arrival_order_and_drops_the_tail() -> None:
    out = run(Fifo(3 * MTU), 12e6, [(0.0, flow(port)) for port in range(1, 7)])
    # 1 on the wire, 2-4 queued, 5 and 6 beyond the limit
    assert ports(out) == [1, 2, 3, 4]
    assert [t for _, t in out] == pytest.approx([0.001, 0.002, 0.003, 0.004])


# -- fq ------------------------------------------------------------------------------------


def test_fq_serves_backlogged_flows_in_turn() -> None:
    arrivals = [(0.0, flow(1)) for _ in range(5)] + [(0.0, flow(2)) for _ in range(5)]
    assert ports(run(FairQueue(100 * MTU, MTU), 12e6, arrivals)) == [1, 2] * 5


def test_fq_shares_bytes_not_packets() -> None:
    """Deficit round robin: a flow of small packets gets as many bytes as one of large ones."""
    arrivals = [(0.0, flow(1, 1500)) for _ in range(200)] + [
        (0.0, flow(2, 500)) for _ in range(600)
    ]
    out = run(FairQueue(10**6, MTU), 12e6, arrivals)[:400]
    sent = {1: 0, 2: 0}
    for packet, _ in out:
        sent[flow_key(packet)[3]] += len(packet)
    assert sent[1] == pytest.approx(sent[2], rel=0.02)


def test_fq_lets_a_sparse_flow_past_a_standing_queue() -> None:
    bulk = [(0.0, flow(1)) for _ in range(100)]  # 100 ms of backlog at 12 Mbit/s
    ping = ip_packet(84, protocol=ICMP)
    for qdisc, most in ((FairQueue(10**6, MTU), 0.0021), (Fifo(10**6), 0.1)):
        out = run(qdisc, 12e6, [*bulk, (0.0505, ping)])
        (left,) = [t for packet, t in out if packet == ping]
        assert left - 0.0505 <= most  # fq: behind at most the packet on the wire and one more
    assert left - 0.0505 > 0.04  # fifo: behind the whole backlog


def test_fq_over_its_limit_drops_from_the_fattest_flow() -> None:
    qdisc = FairQueue(10 * MTU, MTU)
    arrivals = [(0.0, flow(1)) for _ in range(11)] + [(0.0, flow(2)) for _ in range(2)]
    out = run(qdisc, 12e6, arrivals)
    assert ports(out).count(2) == 2  # the small flow loses nothing
    assert ports(out).count(1) == 9 and qdisc.dropped == 2


def test_fq_forgets_flows_that_went_idle() -> None:
    qdisc = FairQueue(10**6, MTU)
    run(qdisc, 12e6, [(i * 0.01, flow(i)) for i in range(50)])
    assert len(qdisc.flows) == 0 and len(qdisc) == 0 and qdisc.queued_bytes == 0


# -- CoDel ---------------------------------------------------------------------------------


def codel_queue(ecn: bool = False) -> CodelQueue:
    return CodelQueue(flow_key(flow(1)), CodelParams(ecn=ecn))


def test_codel_leaves_a_short_burst_alone() -> None:
    """A burst that drains within one interval is never dropped, however long its queue."""
    out = run(FqCodel(10**6, MTU, CodelParams()), 12e6, [(0.0, flow(1)) for _ in range(80)])
    assert len(out) == 80  # 80 ms to drain: above target, but for less than 100 ms


def test_codel_first_drop_one_interval_after_the_queue_stands() -> None:
    queue = codel_queue()
    for _ in range(400):
        queue.push(flow(1), 0.0)
    now, drops_at = 0.010, []  # every packet has waited 10 ms when the link starts
    while queue.packets:
        before = queue.params.dropped
        queue.pop(now)
        if queue.params.dropped > before:
            drops_at.append(now)
        now += 0.001
    # above target from the first dequeue on: the first drop comes one interval later, the
    # next ones at spacings of interval / sqrt(count)
    assert drops_at[0] == pytest.approx(0.110, abs=1e-9)
    gaps = [b - a for a, b in zip(drops_at, drops_at[1:], strict=False)][:3]
    expected = [0.1 / math.sqrt(n) for n in (1, 2, 3)]
    assert gaps == pytest.approx(expected, abs=0.0011)


def test_codel_marks_ecn_capable_packets_instead_of_dropping() -> None:
    queue = codel_queue(ecn=True)
    for _ in range(400):
        queue.push(flow(1, ecn=2), 0.0)
    out = [queue.pop(0.001 * i) for i in range(400)]
    assert queue.params.dropped == 0 and queue.params.marked > 0
    assert sum(1 for item in out if item and item[0][1] & 3 == 3) == queue.params.marked


def test_fq_codel_drains_a_standing_queue_to_its_target() -> None:
    """A burst of 100 packets, then arrivals at exactly the link's rate: fifo keeps the 100 ms
    queue for ever; CoDel drops until what is sent waits no more than its 5 ms target."""
    rate = 12e6  # 1 ms per 1500-byte packet
    arrivals = [(0.0, flow(1)) for _ in range(100)] + [(i * 0.001, flow(1)) for i in range(1, 5000)]
    sojourn = {}
    for name, qdisc in (("fifo", Fifo(10**6)), ("fq_codel", FqCodel(10**6, MTU, CodelParams()))):
        sent_at = {}
        queue = RateQueue(rate, qdisc)
        sink = Sink()
        queue.downstream = sink
        for index, (at, packet) in enumerate(arrivals):
            tagged = packet[:-4] + index.to_bytes(4, "big")
            sent_at[tagged] = at
            queue.push(tagged, at)
        queue.release(math.inf)
        sojourn[name] = max(t - 0.001 - sent_at[p] for p, t in sink.take() if t > 4.0)
    assert sojourn["fifo"] == pytest.approx(0.099)
    assert sojourn["fq_codel"] <= 0.005 + 1e-9


# -- prio ----------------------------------------------------------------------------------


def test_prio_bands_follow_the_dscp_precedence() -> None:
    assert band_of(ip_packet(dscp=EF)) == 0
    assert band_of(ip_packet(dscp=AF21)) == 1
    assert [band_of(ip_packet(dscp=d)) for d in (0, AF11, 8)] == [2, 2, 2]


def test_prio_sends_the_highest_band_first() -> None:
    bulk = [(0.0, flow(1, dscp=AF11)) for _ in range(10)]
    control = (0.0035, flow(2, 200, dscp=AF21))
    urgent = (0.0036, flow(3, 200, dscp=EF))
    out = run(make_qdisc("prio", 10**6, MTU), 12e6, [*bulk, control, urgent])
    # packet 4 of the bulk is on the wire when they arrive; then EF, then AF21, then the rest
    assert ports(out)[:6] == [1, 1, 1, 1, 3, 2]
    assert out[4][1] == pytest.approx(0.004 + 200 * 8 / 12e6)


def test_a_later_arrival_never_takes_a_transmission_started_before_it() -> None:
    out = run(
        make_qdisc("prio", 10**6, MTU),
        12e6,
        [(0.0, flow(1)), (0.0, flow(1)), (0.0012, flow(2, dscp=EF))],
    )
    # bulk 1 ends at 1 ms and bulk 2 starts then; the EF packet, 0.2 ms later, waits for it
    assert ports(out) == [1, 1, 2]


def test_prio_with_fq_shares_its_lowest_band_fairly() -> None:
    qdisc = make_qdisc("prio:fq", 10**6, MTU)
    assert isinstance(qdisc, Prio) and isinstance(qdisc.bands[-1], FairQueue)
    arrivals = [(0.0, flow(1)) for _ in range(4)] + [(0.0, flow(2)) for _ in range(4)]
    assert ports(run(qdisc, 12e6, arrivals)) == [1, 2] * 4


# -- the rate queue around them ------------------------------------------------------------


def test_replacing_the_discipline_keeps_what_waits() -> None:
    queue = RateQueue(12e6, Fifo(10**6))
    sink = Sink()
    queue.downstream = sink
    for port in (1, 1, 1, 2, 2, 2):
        queue.push(flow(port), 0.0)
    queue.set_qdisc(make_qdisc("fq", 10**6, MTU))
    queue.release(math.inf)
    assert ports(sink.take()) == [1, 1, 2, 1, 2, 2]  # 1 on the wire; then in turn


def test_rate_steps_integrate_exactly() -> None:
    """A packet spanning a rate change takes the bits it has left at the new rate; rate 0
    holds it until the link resumes."""
    queue = RateQueue(1e6, Fifo(10**6))
    sink = Sink()
    queue.downstream = sink
    queue.push(b"x" * 1250, 0.0)  # 10,000 bits
    queue.release(0.004)
    queue.set_rate(0.0, 0.004)  # 4,000 bits sent
    assert queue.next_time() == math.inf
    queue.release(1.0)
    queue.set_rate(2e6, 1.0)  # 6,000 bits left at 2 Mbit/s
    queue.release(math.inf)
    assert [t for _, t in sink.take()] == pytest.approx([1.003])


@pytest.mark.parametrize("name", ["fifo", "fq", "fq_codel", "prio", "prio:fq", "prio:fq_codel"])
def test_every_discipline_delivers_everything_within_its_limit(name: str) -> None:
    arrivals = [(i * 0.002, flow(i % 3, 1000, dscp=(AF21 if i % 2 else 0))) for i in range(300)]
    qdisc = make_qdisc(name, 10**6, MTU)
    out = run(qdisc, 12e6, arrivals)
    assert len(out) == 300 and qdisc.dropped == 0 and len(qdisc) == 0 and qdisc.queued_bytes == 0
    times = [t for _, t in out]
    assert times == sorted(times)


def test_unknown_discipline_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="fq_codel"):
        make_qdisc("red", 10**6, MTU)
    with pytest.raises(ValueError, match="prio:fq"):
        make_qdisc("fq:prio", 10**6, MTU)
