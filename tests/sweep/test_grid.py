"""Grid expansion: parsing `--grid`, the product of settings x seeds x systems, each point's
config checked before anything runs, and identities that name the emulation, not the request."""

from __future__ import annotations

from pathlib import Path

import pytest

from pddemu.config import ConfigError, load_config
from pddemu.sweep.grid import expand, grid_settings, parse_grid, split_values
from pddemu.sweep.points import make_point, resolved_value


def test_values_split_at_top_level_commas_only() -> None:
    assert split_values("1gbit, 10gbit") == ["1gbit", "10gbit"]
    assert split_values('"a,b.jsonl","c"') == ['"a,b.jsonl"', '"c"']
    assert split_values("[1, 2],{x = 1, y = 2},3") == ["[1, 2]", "{x = 1, y = 2}", "3"]


def test_product_in_the_order_given() -> None:
    grid = parse_grid(["wan.rate=1gbit,10gbit", "policy.routing=always-relay,never-relay"])
    assert grid_settings(grid) == [
        {"wan.rate": "1gbit", "policy.routing": "always-relay"},
        {"wan.rate": "1gbit", "policy.routing": "never-relay"},
        {"wan.rate": "10gbit", "policy.routing": "always-relay"},
        {"wan.rate": "10gbit", "policy.routing": "never-relay"},
    ]
    assert grid_settings({}) == [{}]


def test_expansion_covers_settings_seeds_and_systems() -> None:
    grid = parse_grid(["wan.delay=5ms,50ms"])
    points = expand(None, ["workload.seed=7"], grid, 3, ["pdd", "indc"])
    assert len(points) == 2 * 3 * 2
    assert [(p.settings["wan.delay"], p.seed, p.system) for p in points[:6]] == [
        ("5ms", 7, "pdd"),
        ("5ms", 7, "indc"),
        ("5ms", 8, "pdd"),
        ("5ms", 8, "indc"),
        ("5ms", 9, "pdd"),
        ("5ms", 9, "indc"),
    ]
    assert len({p.id for p in points}) == len(points)
    first = points[0]
    assert first.values == {"wan.delay": 0.005}
    assert first.overrides == ("workload.seed=7", "wan.delay=5ms", "workload.seed=7")
    assert "--set" in first.emulate_args(Path("out")) and "pdd" in first.emulate_args(Path("o"))


def test_one_seed_leaves_the_configured_seed() -> None:
    (point,) = expand(None, ["workload.seed=4"], {}, 1, ["naive"])
    assert point.seed == 4 and not any(o.startswith("workload.seed=") for o in point.overrides[1:])


def test_identity_is_the_resolved_config_and_system() -> None:
    """The same emulation asked for two ways is one point; any change of value is another."""
    as_default = make_point(None, [], {"wan.rate": "10gbit"}, "pdd")
    plain = make_point(None, [], {}, "pdd")
    seeded = make_point(None, [], {}, "pdd", seed=0)
    assert as_default.id == plain.id == seeded.id
    assert make_point(None, [], {"wan.rate": "9gbit"}, "pdd").id != plain.id
    assert make_point(None, [], {}, "naive").id != plain.id


def test_resolved_values_follow_aliases_and_tables() -> None:
    config = load_config(None, ["wan.rate=2gbit", 'hardware."P.indc".chips=4'])
    assert resolved_value(config, "wan.rate") == 2e9
    assert resolved_value(config, 'hardware."P.indc".chips') == 4
    assert resolved_value(config, "policy.drc") is True
    assert resolved_value(config, "wan.nonsense") is None


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["wan.rate"], "expected KEY=V1,V2"),
        (["=1,2"], "expected KEY=V1,V2"),
        (["wan.rate=1gbit,,2gbit"], "an empty value"),
        (["wan.rate=1gbit", "wan.rate=2gbit"], "given twice"),
        (["wan.rate=1gbit,1gbit"], "a value repeats"),
        (["wan rate=1"], "is not a key"),
    ],
)
def test_bad_grids_are_refused_in_one_line(specs: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_grid(specs)


def test_a_bad_value_is_refused_before_anything_runs() -> None:
    with pytest.raises(
        ConfigError, match=r"policy\.routing=bogus.*policy\.routing: must be one of"
    ):
        expand(None, [], parse_grid(["policy.routing=wan-time,bogus"]), 1, ["pdd"])


def test_seeds_and_a_seed_grid_conflict() -> None:
    with pytest.raises(ConfigError, match="both choose the seed"):
        expand(None, [], parse_grid(["workload.seed=1,2"]), 2, ["pdd"])
    with pytest.raises(ConfigError, match="at least 1"):
        expand(None, [], {}, 0, ["pdd"])
