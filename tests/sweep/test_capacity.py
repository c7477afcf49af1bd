"""The search's start rate from the deployment: P's prefill capacity with no prompt cached,
from the cost model and the replayed requests' inputs."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pddemu.config import ConfigError, load_config
from pddemu.emulate import workload_of
from pddemu.roles.sizing import cost_model
from pddemu.sweep.capacity import PREFILL_CAPACITY, prefill_capacity_rate, start_rate
from pddemu.sweep.cli import rate_start
from pddemu.sweep.experiment import read_experiment


def test_one_chunk_prompts_give_instances_times_a_full_steps_chunks_per_second() -> None:
    config = load_config(None, [])
    model = cost_model(config, "indc", "P")
    chunk = config.prefill.chunk_tokens
    batch = config.prefill.max_batch_chunks
    step = model.prefill_step([(chunk, 0)] * batch)
    expected = config.systems["indc"]["P"] * batch / step
    assert prefill_capacity_rate(config, "indc", [chunk, chunk]) == pytest.approx(expected)
    # a tail chunk costs a whole slot (padding) after the first chunk's context: one token more
    # at least halves the rate
    second = model.prefill_step([(chunk, chunk)] * batch)
    two_chunks = config.systems["indc"]["P"] * batch / (step + second)
    assert prefill_capacity_rate(config, "indc", [chunk + 1]) == pytest.approx(two_chunks)
    assert two_chunks <= expected / 2


def test_more_instances_or_chips_raise_it_and_longer_prompts_lower_it() -> None:
    base = load_config(None, [])
    inputs = [40_000, 70_000]
    rate = prefill_capacity_rate(base, "pdd", inputs)
    doubled = load_config(None, ["systems.pdd.P=4"])
    assert prefill_capacity_rate(doubled, "pdd", inputs) == pytest.approx(2 * rate)
    bigger = load_config(None, ['hardware."P.pdd".chips=16'])
    assert prefill_capacity_rate(bigger, "pdd", inputs) > rate
    assert prefill_capacity_rate(base, "pdd", [80_000, 140_000]) < rate


def test_the_search_starts_at_the_capacity_of_the_requests_its_seeds_replay() -> None:
    overrides = ["workload.requests=4"]
    inputs = [
        request.input_tokens
        for seed in (3, 4)
        for request in workload_of(load_config(None, [*overrides, f"workload.seed={seed}"]))
    ]
    expected = prefill_capacity_rate(load_config(None, overrides), "naive", inputs)
    assert start_rate(None, overrides, "naive", [3, 4]) == pytest.approx(expected)


def test_rate_start_takes_a_number_or_the_capacity_and_nothing_else(tmp_path: Path) -> None:
    assert rate_start("1.5") == 1.5 and rate_start(PREFILL_CAPACITY) == PREFILL_CAPACITY
    with pytest.raises(argparse.ArgumentTypeError, match=PREFILL_CAPACITY):
        rate_start("capacity")
    path = tmp_path / "e.toml"
    path.write_text('[experiment]\nrate_start = "decode-capacity"\n')
    with pytest.raises(ConfigError, match="rate_start: must be a number or"):
        read_experiment(path)
