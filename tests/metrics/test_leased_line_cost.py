"""The leased WAN line in a system's cost: from the config, into summary.json's cost and BCR."""

from __future__ import annotations

import pytest
from metrics_samples import (
    SAMPLE_SCALE,
    SAMPLE_SLO,
    SAMPLE_WAN_RATE,
    sample_instances,
    sample_records,
)

from pddemu.config import ConfigError, load_config
from pddemu.metrics import MetricsError, summarize


def test_cross_dc_systems_lease_the_modelled_wan_rate() -> None:
    config = load_config(None, ["wan.rate=40gbit", "cost.leased_line_per_gbit_hour=0.5"])
    assert config.wan_cost_per_hour("pdd") == config.wan_cost_per_hour("naive") == 20.0
    assert config.wan_cost_per_hour("indc") == 0.0
    assert load_config(None, ["wan.rate=unlimited"]).wan_cost_per_hour("pdd") == 0.0
    assert load_config().wan_cost_per_hour("pdd") == pytest.approx(2.25)  # the default
    with pytest.raises(ConfigError, match="cost.leased_line_per_gbit_hour"):
        load_config(None, ["cost.leased_line_per_gbit_hour=-1"])


def test_the_line_adds_to_the_cost_and_divides_the_bcr() -> None:
    args = ("pdd", sample_records(), sample_instances(), SAMPLE_SLO, SAMPLE_SCALE, SAMPLE_WAN_RATE)
    chips_only = summarize(*args)
    with_line = summarize(*args, 7.5)
    assert "WAN" not in chips_only["cost_per_hour_by_role"]
    assert with_line["cost_per_hour"] == chips_only["cost_per_hour"] + 7.5
    assert with_line["cost_per_hour_by_role"]["WAN"] == 7.5
    assert with_line["bcr"] == pytest.approx(with_line["goodput_rps"] / with_line["cost_per_hour"])
    with pytest.raises(MetricsError, match="wan_cost_per_hour"):
        summarize(*args, -1.0)
