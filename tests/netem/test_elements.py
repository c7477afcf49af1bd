"""The shaper's queue elements, driven by a fake clock: exact and deterministic."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace

import pytest

from netem.direction import Direction
from netem.elements import DelayLine, Gate, LossProcess, RateQueue, Sink
from netem.qdisc import Fifo
from netem.spec import LinkSpec, LossModel
from tests.netem.packets import AF21, flow


def chain(*elements):
    sink = Sink()
    for upstream, downstream in zip(elements, (*elements[1:], sink), strict=True):
        upstream.downstream = downstream
    return sink


def test_rate_queue_serializes_back_to_back() -> None:
    queue = RateQueue(1e6, Fifo(10_000))
    sink = chain(queue)
    for _ in range(3):
        queue.push(b"x" * 1250, at=0.0)  # 10 ms each at 1 Mbit/s
    queue.release(0.025)
    assert [t for _, t in sink.take()] == pytest.approx([0.01, 0.02])
    assert queue.next_time() == pytest.approx(0.03)
    queue.release(1.0)
    assert [t for _, t in sink.take()] == pytest.approx([0.03])  # exit time, not the late pump time


def test_rate_queue_idle_link_starts_at_arrival() -> None:
    queue = RateQueue(8e6, Fifo(10_000))
    sink = chain(queue)
    queue.push(b"x" * 1000, at=0.0)
    queue.push(b"x" * 1000, at=5.0)
    queue.release(10.0)
    assert [t for _, t in sink.take()] == pytest.approx([0.001, 5.001])


def test_rate_queue_drops_at_the_byte_limit() -> None:
    queue = RateQueue(1e6, Fifo(3000))
    chain(queue)
    for _ in range(4):  # the first is on the wire at once; the limit holds what waits
        queue.push(b"x" * 1500, at=0.0)
    assert (queue.queued_bytes, queue.dropped_total) == (3000, 1)


def test_rate_change_applies_to_packets_not_yet_sent() -> None:
    queue = RateQueue(1e6, Fifo(100_000))
    sink = chain(queue)
    for _ in range(2):
        queue.push(b"x" * 1250, at=0.0)
    queue.release(0.01)
    queue.set_rate(2e6, now=0.01)
    queue.release(1.0)
    assert [t for _, t in sink.take()] == pytest.approx([0.01, 0.015])


def test_delay_line_constant_delay() -> None:
    line = DelayLine(0.02, 0.0, "uniform", reorder=False, rng=random.Random(1))
    sink = chain(line)
    line.push(b"a", 0.0)
    line.push(b"b", 0.001)
    line.release(0.0205)
    assert sink.take() == [(b"a", 0.02)]
    line.release(0.05)
    assert sink.take() == [(b"b", pytest.approx(0.021))]


@pytest.mark.parametrize("dist", ["uniform", "normal", "pareto"])
def test_jitter_has_the_configured_standard_deviation(dist: str) -> None:
    line = DelayLine(0.05, 0.002, dist, reorder=True, rng=random.Random(7))
    sink = chain(line)
    for i in range(50_000):
        line.push(b"p", i * 0.1)  # far apart: ordering never interferes
    line.release(1e9)
    delays = [t - i * 0.1 for i, (_, t) in enumerate(sorted(sink.take(), key=lambda x: x[1]))]
    assert statistics.fmean(delays) == pytest.approx(0.05, abs=1e-4)
    tolerance = 0.15 if dist == "pareto" else 0.03  # pareto's sample std converges slowly
    assert statistics.pstdev(delays) == pytest.approx(0.002, rel=tolerance)


def test_no_reordering_unless_asked() -> None:
    fifo = DelayLine(0.02, 0.005, "normal", reorder=False, rng=random.Random(3))
    sink = chain(fifo)
    for i in range(5000):
        fifo.push(i.to_bytes(4, "big"), i * 0.0001)
    fifo.release(1e9)
    order = [int.from_bytes(p, "big") for p, _ in sink.take()]
    assert order == sorted(order)

    free = DelayLine(0.02, 0.005, "normal", reorder=True, rng=random.Random(3))
    sink = chain(free)
    for i in range(5000):
        free.push(i.to_bytes(4, "big"), i * 0.0001)
    free.release(1e9)
    order = [int.from_bytes(p, "big") for p, _ in sink.take()]
    assert order != sorted(order)


def test_bernoulli_loss_rate() -> None:
    loss = LossProcess(LossModel("bernoulli", 0.01), random.Random(11))
    sink = chain(loss)
    for _ in range(200_000):
        loss.push(b"p", 0.0)
    assert loss.dropped / 200_000 == pytest.approx(0.01, rel=0.05)
    assert len(sink.take()) == 200_000 - loss.dropped


def test_gilbert_elliott_bursts() -> None:
    model = LossModel("gilbert-elliott", p=0.01, r=0.25, loss_bad=1.0, loss_good=0.0)
    loss = LossProcess(model, random.Random(5))
    sink = chain(loss)
    n = 400_000
    lost = []
    for _ in range(n):
        before = loss.dropped
        loss.push(b"p", 0.0)
        lost.append(loss.dropped > before)
    sink.take()
    assert sum(lost) / n == pytest.approx(model.mean_loss, rel=0.1)
    bursts, run = [], 0
    for flag in lost:
        if flag:
            run += 1
        elif run:
            bursts.append(run)
            run = 0
    assert statistics.fmean(bursts) == pytest.approx(1 / model.r, rel=0.1)  # mean burst 4 packets


def test_gate_drops_while_down() -> None:
    gate = Gate()
    sink = chain(gate)
    gate.push(b"a", 0.0)
    gate.up = False
    gate.push(b"b", 0.0)
    assert [p for p, _ in sink.take()] == [b"a"] and gate.dropped == 1


def test_direction_delay_after_serialization() -> None:
    direction = Direction(LinkSpec(rate_bps=1e6, delay_s=0.02), seed=0)
    direction.push(b"x" * 1250, 0.0)
    assert direction.next_time() == pytest.approx(0.01)
    assert direction.release(0.01) == []
    assert direction.next_time() == pytest.approx(0.03)
    assert [t for _, t in direction.release(0.03)] == pytest.approx([0.03])


def test_direction_live_change_keeps_queued_packets() -> None:
    direction = Direction(LinkSpec(rate_bps=1e6, delay_s=0.02), seed=0)
    for _ in range(4):
        direction.push(b"x" * 1250, 0.0)
    direction.apply(direction.spec.with_changes(delay_s=0.1), now=0.0)
    out = direction.release(10.0)
    assert len(out) == 4 and out[0][1] == pytest.approx(0.11)


def test_direction_down_loses_everything_in_flight() -> None:
    direction = Direction(LinkSpec(rate_bps=1e6, delay_s=0.02), seed=0)
    for _ in range(3):
        direction.push(b"x" * 1250, 0.0)
    direction.set_up(False)
    direction.push(b"y", 0.001)
    direction.set_up(True)
    assert direction.release(10.0) == []
    counters = direction.counters()
    assert counters["queue_dropped"] + counters["gate_dropped"] == 4


def test_a_cleared_delay_line_leaves_nothing_to_wait_behind() -> None:
    line = DelayLine(10.0, 0.0, "uniform", reorder=False, rng=random.Random(1))
    sink = chain(line)
    line.push(b"old", 0.0)
    line.clear()
    line.configure(0.01, 0.0, "uniform", False)
    line.push(b"new", 1.0)
    line.release(1.02)
    assert sink.take() == [(b"new", pytest.approx(1.01))]


@pytest.mark.parametrize("qdisc", ["fifo", "fq", "fq_codel", "prio:fq_codel"])
@pytest.mark.parametrize("loss", ["0%", "3%", "gemodel:5%,30%"])
@pytest.mark.parametrize("rate_bps", [None, 0.0, 2e6])
def test_a_batch_of_arrivals_is_the_same_as_pushing_each(
    qdisc: str, loss: str, rate_bps: float | None
) -> None:
    """The shaper hands each turn's packets to a direction in one call (`push_many`); the
    chain must release the same packets at the same times, drop the same ones and count the
    same as one `push` per packet, whatever the discipline, loss, limit and rate (and across a
    live rate change and the link going down and up)."""
    spec = LinkSpec(
        rate_bps=rate_bps,
        delay_s=0.005,
        jitter_s=0.001,
        loss=LossModel.parse(loss),
        qdisc=qdisc,
        limit_bytes=12_000,
    )
    one, batched = Direction(spec, seed=7), Direction(spec, seed=7)
    draw = random.Random(3)
    out_one: list[tuple[bytes, float]] = []
    out_batched: list[tuple[bytes, float]] = []
    now = 0.0
    for turn in range(400):
        now += draw.choice([0.0, 1e-6, 2e-4, 3e-3, 0.02])
        packets = [
            flow(draw.randrange(4), draw.choice([64, 600, 1500]), dscp=draw.choice([0, AF21]))
            for _ in range(draw.choice([0, 1, 2, 7, 30]))
        ]
        for packet in packets:
            one.push(packet, now)
        batched.push_many(packets, now)
        if turn == 150:
            changed = replace(spec, rate_bps=None if rate_bps else 1e6)
            for direction in (one, batched):
                direction.apply(changed, now)
        if turn in (250, 260):
            for direction in (one, batched):
                direction.set_up(turn == 260)
        release_at = now + draw.choice([0.0, 1e-3])
        out_one += one.release(release_at)
        out_batched += batched.release(release_at)
        assert one.next_time() == batched.next_time()
    assert out_batched == out_one and len(out_one) > 100
    assert batched.counters() == one.counters()


@pytest.mark.parametrize("push_first", [False, True])
@pytest.mark.parametrize(
    ("delay_s", "jitter_s", "dist", "reorder", "loss"),
    [
        (0.020, 0.0, "uniform", False, 0.0),
        (0.0, 0.0, "uniform", False, 0.0),
        (0.005, 0.002, "uniform", True, 0.0),
        (0.005, 0.003, "pareto", False, 0.0),
        (0.001, 0.002, "normal", False, 0.0),
        (0.005, 0.002, "uniform", True, 0.1),
        (0.001, 0.002, "normal", False, 0.1),
    ],
)
def test_waking_only_at_next_exit_releases_every_packet_at_its_exit_time(
    delay_s: float, jitter_s: float, dist: str, reorder: bool, loss: float, push_first: bool
) -> None:
    """The shaper sleeps until a direction's `next_exit`, not until each end of
    serialization: pumped only then (and at arrivals), every packet still leaves exactly at
    its exit time (never late) and the packets and times are those of a pump every 10 us,
    with loss too and whether arrivals are pushed before the release (as `Shaper.turn` does)
    or after: loss and jitter draw from their own streams, so when the pump runs does not
    change which packet draws what."""
    spec = LinkSpec(
        rate_bps=4e6,
        delay_s=delay_s,
        jitter_s=jitter_s,
        jitter_dist=dist,
        reorder=reorder,
        loss=LossModel("bernoulli", p=loss) if loss else LossModel(),
        qdisc="fq_codel",
        limit_bytes=30_000,
    )
    draw = random.Random(5)
    arrivals, at = [], 0.0
    for _ in range(300):
        at += draw.choice([0.0, 1e-4, 2e-3, 0.03])
        arrivals.append((at, flow(draw.randrange(3), draw.choice([64, 1500]))))
    woken, fine = Direction(spec, seed=1), Direction(spec, seed=1)
    out_woken: list[tuple[bytes, float]] = []
    pending = list(arrivals)
    while pending or woken.next_exit() < math.inf:
        now = min(pending[0][0] if pending else math.inf, woken.next_exit())
        if not push_first:
            released = woken.release(now)
        while pending and pending[0][0] == now:
            woken.push(pending.pop(0)[1], now)
        if push_first:
            released = woken.release(now)
        assert all(exit_time == now for _, exit_time in released)  # none late
        out_woken += released
    out_fine: list[tuple[bytes, float]] = []
    grid = [step * 1e-5 for step in range(int(arrivals[-1][0] / 1e-5) + 20_000)]
    for now in sorted({*grid, *(t for t, _ in arrivals)}):  # every 10 us and every arrival
        out_fine += fine.release(now)
        while arrivals and arrivals[0][0] == now:
            fine.push(arrivals.pop(0)[1], now)
    assert len(out_woken) > 150
    assert [p for p, _ in out_woken] == [p for p, _ in out_fine]
    assert [t for _, t in out_woken] == [t for _, t in out_fine]
