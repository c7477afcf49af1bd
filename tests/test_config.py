"""The scenario file: every key checked at load, in one line naming file, key and reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pddemu.cli import main as cli_main
from pddemu.config import (
    NEEDED_ROLES,
    ROUTING_POLICIES,
    Config,
    ConfigError,
    config_from_json,
    config_to_json,
    load_config,
)
from pddemu.config_docs import DOCS_PAGE, render
from pddemu.emulate import workload_of
from pddemu.policy.routing import POLICIES
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
        ("workload.seed=2147483648", "workload.seed: .*less than 2147483648"),
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


def test_the_default_file_writes_out_the_built_in_defaults() -> None:
    """configs/default.toml documents the defaults: a file naming nothing gives the same."""
    assert load_config().model_copy(update={"source": "x"}) == Config(source="x")


def test_any_subset_of_sections_is_a_complete_scenario(tmp_path: Path) -> None:
    only_scale = tmp_path / "scale.toml"
    only_scale.write_text("[scale]\ntoken_scale = 16\n")
    config = load_config(only_scale)
    assert config.scale.token_scale == 16
    for system, roles in NEEDED_ROLES.items():
        for role in roles:
            assert config.systems[system][role] >= 1
            assert config.hardware_for(system, role).chips >= 1


def test_a_table_names_only_what_it_changes() -> None:
    config = load_config(overrides=["hardware.MD.chips=4", "systems.pdd.MD=3"])
    assert (config.hardware["MD"].chip, config.hardware["MD"].chips) == ("gpu-b", 4)
    assert config.systems["pdd"] == {"P": 2, "RLD": 1, "MD": 3}
    indc = load_config(overrides=['hardware."P.indc".chips=2'])
    assert indc.hardware_for("indc", "P").chips == 2 and indc.hardware_for("pdd", "P").chips == 8


def test_units_are_read_as_netem_reads_them_and_json_keeps_base_units() -> None:
    config = load_config(
        overrides=['wan.rate="2.5gbit"', "wan.delay=15ms", "wan.jitter=1ms", 'wan.loss="0.5%"']
    )
    assert (config.wan.rate_bps, config.wan.delay_s, config.wan.jitter_s) == (2.5e9, 0.015, 0.001)
    assert config.wan.loss_model.p == pytest.approx(0.005)  # text: it may be a gemodel
    assert config_from_json(json.loads(json.dumps(config_to_json(config)))) == config
    assert load_config(overrides=["wan.rate=unlimited"]).wan.rate_bps is None


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("policy.routing=bogus", "policy.routing: must be one of 'wan-time'"),
        ("wan.jitter_dist=bogus", "wan.jitter_dist: must be one of 'uniform'"),
        ("policy.handoff_mode=fast", "policy.handoff_mode: must be one of"),
        ("wan.rate=10", "wan.rate: unknown rate unit"),
        ("wan.loss=150", "wan.loss: percentage '150' is over 100%"),
        ("policy.routnig=wan-time", "policy.routnig: unknown key; known: routing,"),
        ("scale.token_scale=0", "scale.token_scale: must be greater than or equal to 1"),
        ("scale.time_scale=true", 'scale.time_scale: must be a positive number or "auto"'),
        ('decode.max_batch="32"', "decode.max_batch: must be an integer"),
        ("hardware.MD.chip=gpu-z", "hardware.MD.chip: unknown chip 'gpu-z'"),
        ("hardware.X.chips=1", "hardware: X: not a role"),
        ("systems.pdd.RLD=0", r"\[systems.pdd\] needs at least one RLD"),
        ("target.model=gpt-9", "target: unknown target model 'gpt-9'"),
        ("model.n_layer=3", "model: unknown key"),
        ("prefill.chunk_tokens=100", "chunk_tokens must be a multiple of token_scale"),
        ("policy.adaptive_load_threshold=1.5", "adaptive_load_threshold: must be less than"),
        ("scale.time_scale=inf", "scale.time_scale: must be a finite number, got inf"),
        ("request_timeout_s=inf", "request_timeout_s: must be a finite number"),
        ("slo.tpot_s=nan", "slo.tpot_s: must be a finite number"),
    ],
)
def test_bad_values_are_refused_in_one_line_naming_file_and_key(override: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named) as refused:
        load_config(overrides=[override])
    message = str(refused.value)
    assert message.startswith(f"configs/default.toml + {override}: ") and "\n" not in message


def test_live_policy_changes_are_checked_like_the_file() -> None:
    config = load_config()
    assert config.with_policy(routing="never-relay").policy.routing == "never-relay"
    with pytest.raises(ConfigError, match="policy.routing: must be one of"):
        config.with_policy(routing="bogus")


def test_every_routing_word_the_config_allows_is_a_policy() -> None:
    assert set(ROUTING_POLICIES) == set(POLICIES)


def test_the_config_page_is_generated_from_the_schema() -> None:
    """docs/config.md is `pddemu config docs`'s output: regenerate it after changing a key."""
    assert DOCS_PAGE.read_text() == render(), (
        "docs/config.md is stale: run `pddemu config docs --out docs/config.md`"
    )


def test_config_show_refuses_a_bad_value_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["config", "show", "--set", "wan.jitter_dist=bogus"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "wan.jitter_dist: must be one of" in err
