"""The search's start rates from the deployment: P's prefill capacity with no prompt cached (a
lower bound) and with an ideal cache (an upper bound), from the cost model and the replayed
requests."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pytest

from pddemu.config import ConfigError, load_config
from pddemu.emulate import workload_of
from pddemu.roles.sizing import cost_model
from pddemu.sweep.capacity import (
    PREFILL_BOUNDS,
    PREFILL_CAPACITY,
    ideal_cache_rate,
    prefill_capacity_rate,
    start_bounds,
    start_rate,
)
from pddemu.sweep.cli import _start, rate_start, within_rate_max
from pddemu.sweep.experiment import read_experiment
from pddemu.sweep.search import GoodputSearch


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


def test_rate_start_takes_a_number_or_a_bound_and_nothing_else(tmp_path: Path) -> None:
    assert rate_start("1.5") == 1.5 and rate_start(PREFILL_CAPACITY) == PREFILL_CAPACITY
    assert rate_start(PREFILL_BOUNDS) == PREFILL_BOUNDS
    path = tmp_path / "bounds.toml"
    path.write_text(f'[experiment]\nrate_start = "{PREFILL_BOUNDS}"\n')
    assert read_experiment(path)["experiment"]["rate_start"] == PREFILL_BOUNDS
    with pytest.raises(argparse.ArgumentTypeError, match=PREFILL_CAPACITY):
        rate_start("capacity")
    path = tmp_path / "e.toml"
    path.write_text('[experiment]\nrate_start = "decode-capacity"\n')
    with pytest.raises(ConfigError, match="rate_start: must be a number, .* or .*prefill-bounds"):
        read_experiment(path)


def _fifo_busy_seconds(config, system: str, prompts: list[tuple[int, int]]) -> float:
    """P's busy seconds for `prompts` ((input, hit) each) as its scheduler runs them on one
    instance: each prompt's chunks after its hit, steps of up to `max_batch_chunks` chunks
    taken in arrival order, every step costed by the cost model (padded as configured)."""
    model = cost_model(config, system, "P")
    chunks = [c for n, hit in prompts if hit < n for c in model.chunks_for(n - hit, hit)]
    batch = config.prefill.max_batch_chunks
    return sum(model.prefill_step(chunks[i : i + batch]) for i in range(0, len(chunks), batch))


@pytest.mark.parametrize("pad", [True, False])
def test_no_schedule_with_smaller_hits_beats_the_ideal_cache_bound(pad: bool) -> None:
    """Forced variations: random prompts and ideal hits, and real hits anywhere from none to
    the ideal one (a per-instance cache, eviction, a prefix not yet computed): P's modelled
    busy time never falls below what the bound allows."""
    config = load_config(None, [f"prefill.pad_chunks={str(pad).lower()}"])
    instances = config.systems["pdd"]["P"]
    rng = random.Random(7)
    chunk = config.prefill.chunk_tokens
    for _ in range(40):
        prompts = []
        for _ in range(rng.randint(1, 12)):
            n = rng.randint(1, 12 * chunk)
            prompts.append(
                (n, rng.choice([0, n, rng.randint(0, n), max(0, n - rng.randint(0, 600))]))
            )
        if all(hit == n for n, hit in prompts):
            continue
        upper = ideal_cache_rate(config, "pdd", prompts)
        real = [(n, rng.choice([0, hit, rng.randint(0, hit)])) for n, hit in prompts]
        # the instances share the requests at best evenly: their busy time at least / P
        busy = _fifo_busy_seconds(config, "pdd", real) / instances
        assert len(prompts) / busy <= upper * (1 + 1e-9)


def test_the_bound_counts_what_is_not_cached_in_whole_slots() -> None:
    config = load_config(None, [])
    model = cost_model(config, "indc", "P")
    chunk, batch = config.prefill.chunk_tokens, config.prefill.max_batch_chunks
    instances = config.systems["indc"]["P"]
    # `batch` one-chunk prompts, nothing cached: one full step's terms without its memory
    terms = model.explain([(chunk, 0)] * batch)
    one_step = max(terms.compute_s, terms.interconnect_s) + terms.overhead_s
    prompts = [(chunk, 0)] * batch
    assert ideal_cache_rate(config, "indc", prompts) == pytest.approx(instances * batch / one_step)
    # padded: one uncached token costs the whole last slot, the same as a chunk's worth
    n = 5 * chunk
    one_token = ideal_cache_rate(config, "indc", [(n, n - 1)])
    assert one_token == pytest.approx(ideal_cache_rate(config, "indc", [(n, n - chunk)]))
    assert ideal_cache_rate(config, "indc", [(n, 0)]) < one_token
    with pytest.raises(ValueError, match="every prompt"):
        ideal_cache_rate(config, "indc", [(n, n)])


def test_the_bounds_read_the_replayed_requests_own_hits() -> None:
    overrides = ["workload.requests=16"]
    requests = workload_of(load_config(None, overrides))
    config = load_config(None, overrides)
    lower, upper = start_bounds(None, overrides, "pdd", [None])
    assert lower == pytest.approx(start_rate(None, overrides, "pdd", [None]))
    hits = [(r.input_tokens, r.expected_hit_tokens) for r in requests]
    assert upper == pytest.approx(ideal_cache_rate(config, "pdd", hits))
    # the sessions' shared prefixes put P's capacity well above the cold bound
    assert sum(h for _, h in hits) > 0.5 * sum(n for n, _ in hits) and upper > 2 * lower


def test_a_length_only_trace_has_no_upper_bound_and_says_so(tmp_path: Path) -> None:
    trace = tmp_path / "lengths.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,9000,20\n1.5,12000,30\n")
    with pytest.raises(ValueError, match=f"{PREFILL_BOUNDS} needs a trace with block ids"):
        start_bounds(None, [f"workload.trace={trace}", "workload.requests=2"], "pdd", [None])


def test_a_derived_start_above_rate_max_starts_at_rate_max() -> None:
    overrides = ["workload.requests=16"]
    upper, lower = _start(PREFILL_BOUNDS, None, overrides, {}, "pdd", [None])
    assert lower is not None and lower < upper
    between = (lower + upper) / 2  # the cap between the bounds: the lower bound still follows
    first, then = within_rate_max(upper, lower, derived=True, rate_max=between)
    search = GoodputSearch(0.9, first, 0.01, between, lower=then)
    assert search.next_rate() == pytest.approx(between, rel=1e-3) and then == lower
    search.record(search.next_rate(), 0.5)
    assert search.next_rate() == lower
    below = lower / 2  # the cap below both: no lower rate left above the start
    first, then = within_rate_max(upper, lower, derived=True, rate_max=below)
    assert (first, then) == (below, None)
    assert GoodputSearch(0.9, first, 0.01, below, lower=then).next_rate() == pytest.approx(
        below, rel=1e-3
    )
    # a rate the user gave is not moved: the search refuses it in one line
    assert within_rate_max(9.0, None, derived=False, rate_max=8.0) == (9.0, None)
    with pytest.raises(ValueError, match="--rate-max"):
        GoodputSearch(0.9, 9.0, 0.01, 8.0)
