"""A max-goodput search's start from the deployment: bounds of its prefill instances' capacity.

Two bounds, from the cost model and the replayed requests alone (never a measurement, so the
same experiment always starts at the same rates):

- `prefill-capacity`, a LOWER bound: the rate at which P instances finish the mean request when
  no prompt is found in P's cache, every chunk one slot of a full prefill step (a step's
  overhead shared by `max_batch_chunks` chunks):

      rate = P instances / mean prefill seconds of a whole prompt

  A prefix hit only shortens prefill, so P sustains at least this, provided the router
  spreads the requests over the P instances evenly; a router that keeps sessions on one
  instance (pdd-janfeb's quick runs put every request on P0) can load one instance beyond
  its share, and the bound is then not a lower bound of the system's capacity. Where the
  prompts share long prefixes it lies far below P's capacity (2-5x on pdd-janfeb's sessions).

- the ideal-cache UPPER bound: each request prefills only the tokens its trace's block ids say
  no earlier request had (`expected_hit_tokens`: an infinite cache shared by every P instance,
  each earlier prompt in it as soon as it arrived). Real P has less: one cache per instance,
  eviction, and a prompt reaches the cache only when its own prefill ends. Over the N requests
  P instances then work at least

      T = max(sum of compute terms, sum of interconnect terms) + ceil(chunks / batch) x overhead

  (the step's roofline terms of the uncached tokens: compute and interconnect are linear in
  tokens and attention pairs, and a step takes at least its largest term plus its overhead;
  with `pad_chunks` each chunk costs a whole slot, so the bound counts ceil(uncached / chunk)
  whole slots ending at the prompt's last token: a smaller real hit shifts P's slots earlier
  or adds one, never removes one), so no run of them keeps up above  P instances x N / T.

`prefill-bounds` starts the search at the upper bound, which a long enough run fails (its
backlog grows without bound; a short one fails when requests of one session arrive before each
other's prefill ends and miss the prefix the bound counted as cached), and probes the lower
bound next if it does, so two probes bracket a maximum set by P. If the upper bound passes (the
run too short for a backlog) the search doubles as from any start; if the lower one fails
(decode or the WAN gives out first) it halves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from statistics import mean
from typing import Any

from pddemu.config import Config, load_config
from pddemu.hardware import CostModel
from pddemu.roles.sizing import cost_model

PREFILL_CAPACITY = "prefill-capacity"
PREFILL_BOUNDS = "prefill-bounds"
START_RATES = (PREFILL_CAPACITY, PREFILL_BOUNDS)


def prefill_seconds(model: CostModel, batch_chunks: int, input_tokens: int) -> float:
    """Modelled seconds of P's prefill of a whole prompt of `input_tokens`, each chunk one slot
    of a step of `batch_chunks` chunks."""
    return sum(
        model.prefill_step([chunk] * batch_chunks) / batch_chunks
        for chunk in model.chunks_for(input_tokens, 0)
    )


def _p_instances(config: Config, system: str, requests: int) -> int:
    instances = config.systems[system].get("P", 0)
    if not requests or instances < 1:
        raise ValueError(f"prefill capacity of {system} needs requests and a P instance")
    return instances


def prefill_capacity_rate(config: Config, system: str, input_tokens: list[int]) -> float:
    """Requests per modelled second that `system`'s P instances prefill, every prompt whole:
    the lower bound."""
    instances = _p_instances(config, system, len(input_tokens))
    model = cost_model(config, system, "P")
    batch = config.prefill.max_batch_chunks
    return instances / mean(prefill_seconds(model, batch, tokens) for tokens in input_tokens)


def ideal_cache_rate(config: Config, system: str, prompts: Sequence[tuple[int, int]]) -> float:
    """The rate above which `system`'s P instances cannot keep up with `prompts` ((input
    tokens, ideal-cache hit tokens) each, in arrival order) even with every hit: the upper
    bound."""
    instances = _p_instances(config, system, len(prompts))
    model = cost_model(config, system, "P")
    compute = interconnect = 0.0
    chunks = 0
    for input_tokens, hit in prompts:
        if not 0 <= hit <= input_tokens:
            raise ValueError(f"a hit of {hit} tokens does not fit a prompt of {input_tokens}")
        if hit == input_tokens:
            continue
        slots = math.ceil((input_tokens - hit) / model.prefill_chunk_tokens)
        new = input_tokens - hit
        if model.pad_chunks:  # whole slots, ending at the prompt's last token
            new = min(slots * model.prefill_chunk_tokens, input_tokens)
        terms = model.explain([(new, input_tokens - new)])
        compute += terms.compute_s
        interconnect += terms.interconnect_s
        chunks += slots
    if not chunks:
        raise ValueError(f"every prompt of {system}'s requests is cached: no prefill bounds it")
    steps = math.ceil(chunks / config.prefill.max_batch_chunks)
    busy = max(compute, interconnect) + steps * model.instance.step_overhead_s
    return instances * len(prompts) / busy


def _replayed(config_path: Path | None, overrides: list[str], seeds: list[int | None]) -> list:
    """The requests every seed of the search replays (generated at the configured rate)."""
    from pddemu.emulate import workload_of  # the points' own workload; emulate loads torch

    requests: list[Any] = []
    for seed in seeds:
        seeded = [*overrides] if seed is None else [*overrides, f"workload.seed={seed}"]
        requests += workload_of(load_config(config_path, seeded))
    return requests


def start_rate(
    config_path: Path | None, overrides: list[str], system: str, seeds: list[int | None]
) -> float:
    """`prefill_capacity_rate` over the requests every seed of the search replays."""
    config = load_config(config_path, overrides)
    inputs = [request.input_tokens for request in _replayed(config_path, overrides, seeds)]
    return prefill_capacity_rate(config, system, inputs)


def start_bounds(
    config_path: Path | None, overrides: list[str], system: str, seeds: list[int | None]
) -> tuple[float, float]:
    """(lower, upper) bounds of P's capacity over the requests every seed replays; each seed's
    requests are their own cache's history."""
    config = load_config(config_path, overrides)
    requests = _replayed(config_path, overrides, seeds)
    if any(request.expected_hit_tokens is None for request in requests):
        raise ValueError(
            f"{PREFILL_BOUNDS} needs a trace with block ids (its prompts' prefix reuse); "
            f"this one gives lengths only: use {PREFILL_CAPACITY} or a number"
        )
    lower = prefill_capacity_rate(config, system, [r.input_tokens for r in requests])
    prompts = [(r.input_tokens, r.expected_hit_tokens) for r in requests]
    return lower, ideal_cache_rate(config, system, prompts)
