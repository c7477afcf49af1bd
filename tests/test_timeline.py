"""The scenario's timeline and WAN: modelled times and quantities onto the emulated link."""

from __future__ import annotations

import pytest

from netem.spec import LossModel, SpecError
from pddemu.config import ConfigError, load_config
from pddemu.emulated_network import cross_traffic_spec, scale_model, wan_link
from pddemu.scale import ScaleModel
from pddemu.timeline import Timeline

SCALE = ScaleModel(
    genuine_kv_bytes_per_token=1024, target_kv_bytes_per_token=51200, token_scale=32, time_scale=4.0
)


def test_link_events_are_scaled_like_the_link(tmp_path) -> None:
    path = tmp_path / "wan.schedule"
    path.write_text("30 link=down\n35 link=up a2b.rate=5gbit delay=40ms\n60 rate=0\n80 repeat\n")
    schedule = Timeline.load(path).link_schedule(SCALE)
    assert [step.at_s for step in schedule.steps] == [7.5, 8.75, 15.0]
    assert schedule.period_s == 20.0
    changes = {(a.link, a.direction): a.changes for a in schedule.steps[1].actions}
    assert changes[("wan", "a2b")]["rate_bps"] == pytest.approx(5e9 * SCALE.byte_scale * 4)
    assert changes[("wan", "both")] == {"up": True, "delay_s": 0.010}
    assert schedule.steps[2].actions[0].changes == {"rate_bps": 0.0}  # stalled at any scale


def test_a_scenario_schedule_cannot_size_the_queue(tmp_path) -> None:
    path = tmp_path / "wan.schedule"
    path.write_text("10 limit=1mb\n")
    with pytest.raises(SpecError, match="queue limit"):
        Timeline.load(path)


def test_an_empty_timeline_has_no_schedule() -> None:
    assert Timeline.load(None).link_schedule(SCALE) is None


def test_wan_keys_reach_the_emulated_link(tmp_path) -> None:
    schedule = tmp_path / "wan.schedule"
    schedule.write_text("5 intra.link=down\n6 intra.link=up\n")
    config = load_config(
        overrides=[
            'wan.qdisc="prio:fq_codel"',
            'wan.loss="gemodel:1%,30%,90%"',
            f"wan.schedule={str(schedule)!r}",
        ]
    )
    link = wan_link(config, scale_model(config))
    assert link.qdisc == "prio:fq_codel"
    assert link.loss == LossModel("gilbert-elliott", 0.01, 0.3, 0.9)
    assert load_config().wan.qdisc == "fq_codel"  # the default a real router or host has


def test_cross_traffic_sizes_are_scaled_and_times_modelled(tmp_path) -> None:
    """Bytes shrink by the byte scale; times stay modelled seconds: the generator reads them
    on the run's clock page, which runs at whatever rate the run does."""
    changes = tmp_path / "cross.schedule"
    changes.write_text("40 utilisation=0.7\n60 flow=1gb dir=b2a\n")
    config = load_config(
        overrides=[
            'wan.cross_traffic.mean_size="100mb"',
            f"wan.cross_traffic.schedule={str(changes)!r}",
        ]
    )
    scale = scale_model(config)
    spec = cross_traffic_spec(config, scale)
    assert spec.mean_bytes == round(100e6 * scale.byte_scale)
    assert scale.time_scale == 1.0
    assert [c.at_s for c in spec.schedule] == [40.0, 60.0]
    assert spec.schedule[1].flow_bytes == round(1e9 * scale.byte_scale)
    assert cross_traffic_spec(load_config(), scale) is None


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ('wan.qdisc="cake"', "wan.qdisc: must be one of"),
        ('wan.loss="gemodel:1%"', "wan.loss: gemodel needs"),
        ('wan.schedule="/nonexistent"', "wan.schedule: cannot read schedule"),
        ("wan.cross_traffic.sizes=uniform", "wan.cross_traffic.sizes: must be one of"),
        ("wan.cross_traffic.pareto_shape=1", "pareto_shape"),
    ],
)
def test_bad_wan_keys_are_named(override: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_config(overrides=[override])
