from __future__ import annotations

import math

import pytest

from netem.spec import LinkSpec, LossModel, SpecError, parse_assignments
from netem.units import UnitError, parse_duration, parse_percent, parse_rate, parse_size


@pytest.mark.parametrize(
    ("text", "bps"),
    [("100mbit", 100e6), ("1gbit", 1e9), ("10kbit", 1e4), ("12.5mbps", 100e6), ("1.5Gbit", 1.5e9)],
)
def test_rates_follow_tc(text: str, bps: float) -> None:
    assert parse_rate(text) == pytest.approx(bps)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("20ms", 0.02), ("1.5s", 1.5), ("200us", 2e-4), ("0", 0.0), ("3usec", 3e-6)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("parser", "text", "needle"),
    [
        (parse_duration, "-5ms", "negative"),
        (parse_duration, "20", "unknown time unit"),
        (parse_duration, "20parsecs", "unknown time unit"),
        (parse_rate, "10furlongs", "unknown rate unit"),
        (parse_rate, "0mbit", "above zero"),
        (parse_percent, "150%", "over 100%"),
        (parse_percent, "1pct", "unknown unit"),
        (parse_size, "5 bananas", "unknown size unit"),
        (parse_rate, "fast", "cannot read"),
    ],
)
def test_bad_quantities_name_the_problem(parser, text: str, needle: str) -> None:
    with pytest.raises(UnitError, match=needle):
        parser(text)


def test_sizes_and_percent() -> None:
    assert parse_size("5mb") == 5_000_000
    assert parse_size("64kib") == 65536
    assert parse_percent("0.5%") == pytest.approx(0.005)
    assert parse_percent("2") == pytest.approx(0.02)


def test_default_queue_is_at_least_one_bdp() -> None:
    spec = LinkSpec(rate_bps=1e9, delay_s=0.020)
    assert spec.queue_limit_bytes >= 1e9 * 0.040 / 8
    slow = LinkSpec(rate_bps=1e6, delay_s=0.001)
    assert slow.queue_limit_bytes == 100 * slow.mtu  # never under 100 packets
    assert LinkSpec(rate_bps=1e6, limit_bytes=3000).queue_limit_bytes == 3000


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"delay_s": -0.001}, "delay"),
        ({"jitter_s": math.nan}, "jitter"),
        ({"rate_bps": -1.0}, "rate"),
        ({"qdisc": "codel"}, "unknown qdisc"),
        ({"jitter_dist": "cauchy"}, "distribution"),
        ({"limit_bytes": 100}, "below one packet"),
        ({"mtu": 100}, "mtu"),
        ({"loss": LossModel("bernoulli", 1.5)}, "outside"),
    ],
)
def test_spec_validation(kwargs: dict, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        LinkSpec(**kwargs).validate()


def test_gilbert_elliott_parse_and_mean_loss() -> None:
    model = LossModel.parse("gemodel:1%,10%")
    assert (model.kind, model.p, model.r, model.loss_bad, model.loss_good) == (
        "gilbert-elliott",
        0.01,
        0.1,
        1.0,
        0.0,
    )
    assert model.mean_loss == pytest.approx(0.01 / 0.11)
    assert LossModel.parse("0%").kind == "none"


def test_spec_round_trips_through_dict() -> None:
    spec = LinkSpec(rate_bps=5e6, delay_s=0.01, loss=LossModel("bernoulli", 0.02)).validate()
    assert LinkSpec.from_dict(spec.to_dict()) == spec


def test_assignments() -> None:
    assert parse_assignments("rate=10mbit, delay=5ms") == {"rate_bps": 10e6, "delay_s": 0.005}
    with pytest.raises(UnitError, match="unknown link field"):
        parse_assignments("speed=10mbit")


def test_a_stalled_link_is_rate_zero_where_fields_are_read() -> None:
    assert parse_rate("0mbit", allow_zero=True) == 0.0
    assert parse_assignments("rate=0,qdisc=prio:fq") == {"rate_bps": 0.0, "qdisc": "prio:fq"}
    assert LinkSpec(rate_bps=0.0).validate().queue_limit_bytes == 100 * 1500
    with pytest.raises(UnitError, match="unknown qdisc"):
        parse_assignments("qdisc=cake")
