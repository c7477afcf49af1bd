"""The scenario file's [workload] keys: "all" and "trace" where a count or a rate would go."""

from __future__ import annotations

from pathlib import Path

import pytest

from pddemu.config import ConfigError, load_config
from pddemu.emulate import workload_of
from pddemu.workload import load_workload

MOONCAKE = Path(__file__).parent / "workload" / "data" / "mooncake_excerpt.jsonl"


def test_arrival_rate_trace_keeps_the_trace_timestamps() -> None:
    config = load_config(
        overrides=[
            f"workload.trace={str(MOONCAKE)!r}",
            "workload.requests=all",
            "workload.arrival_rate=trace",
        ]
    )
    assert config.workload.requests is None and config.workload.arrival_rate is None
    replayed = workload_of(config)
    recorded = load_workload(MOONCAKE, requests=None, seed=0, token_scale=32)
    assert [r.arrival_s for r in replayed] == [r.arrival_s for r in recorded]
    poisson = workload_of(load_config(overrides=[f"workload.trace={str(MOONCAKE)!r}"]))
    assert [r.arrival_s for r in poisson] != [r.arrival_s for r in recorded]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("workload.arrival_rate=0", "arrival_rate: must be a positive rate"),
        ("workload.arrival_rate=poisson", "arrival_rate: must be a positive rate"),
        ("workload.requests=0", "requests: must be a count"),
        ("workload.requests=some", "requests: must be a count"),
    ],
)
def test_bad_workload_values_are_named(override: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_config(overrides=[override])


def test_the_projects_own_configs_are_named_relative_to_it() -> None:
    """A run's summary.json names its config the same wherever the project is checked out."""
    assert load_config().source == "configs/default.toml"
    assert load_config(overrides=["workload.seed=1"]).source == (
        "configs/default.toml + workload.seed=1"
    )
