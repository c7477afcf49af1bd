"""Cross-traffic's model without a network: flow sizes, arrival processes, targets, parsing."""

from __future__ import annotations

import random
import statistics

import pytest

from netem.crosstraffic.arrivals import flows, mean_target, random_flows, size_sampler
from netem.crosstraffic.spec import (
    CrossTrafficSpec,
    parse_cross_schedule,
    parse_cross_traffic,
    spec_from_pairs,
)
from netem.spec import SpecError

RATE = 100e6


def take_until(iterator, seconds: float) -> list[tuple[float, int]]:
    out = []
    for at, size in iterator:
        if at >= seconds:
            break
        out.append((at, size))
    return out


@pytest.mark.parametrize("sizes", ["exponential", "pareto"])
def test_flow_sizes_have_the_mean_asked(sizes: str) -> None:
    draw = size_sampler(
        CrossTrafficSpec(sizes=sizes, mean_bytes=100_000, pareto_shape=2.5), random.Random(3)
    )
    samples = [draw() for _ in range(200_000)]
    assert statistics.fmean(samples) == pytest.approx(100_000, rel=0.03)
    if sizes == "pareto":  # heavy tail: the smallest is the scale, the largest far above the mean
        assert min(samples) == pytest.approx(100_000 * 1.5 / 2.5, rel=0.01)
        assert max(samples) > 20 * 100_000


@pytest.mark.parametrize("arrivals", ["poisson", "paced"])
def test_offered_load_is_the_target(arrivals: str) -> None:
    spec = CrossTrafficSpec(utilisation=0.4, mean_bytes=50_000, arrivals=arrivals)
    got = take_until(random_flows(spec, RATE, random.Random(1)), 200.0)
    share = sum(size for _, size in got) * 8 / (RATE * 200.0)
    assert share == pytest.approx(0.4, rel=0.02 if arrivals == "poisson" else 0.001)
    gaps = [b[0] - a[0] for a, b in zip(got, got[1:], strict=False)]
    if arrivals == "poisson":  # exponential gaps: standard deviation equals the mean
        assert statistics.pstdev(gaps) == pytest.approx(statistics.fmean(gaps), rel=0.05)


def test_a_schedule_changes_the_target_and_adds_single_flows() -> None:
    changes = parse_cross_schedule(
        "0 utilisation=0.2\n10 utilisation=0\n20 utilisation=0.6\n25 flow=5mb dir=b2a\n"
    )
    spec = CrossTrafficSpec(mean_bytes=20_000, schedule=changes, direction="a2b", arrivals="paced")
    a2b = take_until(flows(spec, "a2b", RATE, 0), 30.0)
    assert not [at for at, _ in a2b if 10.0 <= at < 20.0]  # nothing offered at utilisation 0
    early = sum(s for at, s in a2b if at < 10) * 8 / (RATE * 10)
    late = sum(s for at, s in a2b if at >= 20) * 8 / (RATE * 10)
    assert early == pytest.approx(0.2, rel=0.01) and late == pytest.approx(0.6, rel=0.01)
    assert list(flows(spec, "b2a", RATE, 0)) == [(25.0, 5_000_000)]
    assert mean_target(spec, 30.0) == pytest.approx((0.2 * 10 + 0.6 * 10) / 30)


def test_the_same_seed_gives_the_same_flows() -> None:
    spec = CrossTrafficSpec(sizes="pareto")
    assert take_until(flows(spec, "a2b", RATE, 7), 5) == take_until(flows(spec, "a2b", RATE, 7), 5)
    assert take_until(flows(spec, "a2b", RATE, 7), 5) != take_until(flows(spec, "a2b", RATE, 8), 5)


def test_cli_and_config_forms(tmp_path) -> None:
    spec = parse_cross_traffic(
        "utilisation=50%,sizes=pareto,mean=2mb,arrivals=paced,dir=both,shape=1.8"
    )
    assert (spec.utilisation, spec.mean_bytes, spec.direction, spec.pareto_shape) == (
        0.5,
        2_000_000,
        "both",
        1.8,
    )
    schedule = tmp_path / "cross.schedule"
    schedule.write_text("5 utilisation=0.7\n")
    config = spec_from_pairs({"utilisation": 0.3, "mean_size": 1000, "schedule": str(schedule)})
    assert config.mean_bytes == 1000 and config.schedule[0].utilisation == 0.7


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("utilisation=1.5", "in \\[0, 1\\]"),
        ("sizes=lognormal", "exponential, pareto"),
        ("sizes=pareto,shape=1", "above 1"),
        ("dir=sideways", "a2b, b2a, both"),
        ("rate=10mbit", "unknown cross-traffic key 'rate'"),
        ("mean=big", "cross-traffic mean"),
        ("schedule=/nonexistent/x", "cannot read"),
    ],
)
def test_bad_cross_traffic_is_refused_in_one_line(text: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        parse_cross_traffic(text)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("1 utilisation=0.2\n1 utilisation=0.3\n", ":2: .*increase"),
        ("1 speed=3\n", ":1: write"),
        ("1 flow=5mb dir=up\n", "a2b or b2a"),
    ],
)
def test_bad_cross_schedules(text: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        parse_cross_schedule(text)
