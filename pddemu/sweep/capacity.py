"""A max-goodput search's start rate from the deployment: its prefill instances' capacity.

`--rate-start prefill-capacity` starts each system's search at the arrival rate its P instances
sustain with no prompt found in P's cache: the cost model's prefill time of every replayed
request's whole input (its chunks costed as one slot of a full prefill step, so a step's
overhead is shared by `max_batch_chunks` chunks), and the rate at which `P` instances finish the
mean request:

    rate = P instances / mean prefill seconds of a whole prompt

No cache is the most prefill a request can need, so this is a lower bound of what P sustains;
a prefix hit only raises it. The search doubles from there while probes pass, so it brackets a
maximum set by P wherever the prompts' real hit rate puts it, and halves when another stage
(the decode batch, the WAN) gives out first. It reads the configuration and the workload only,
never a measurement, so the same experiment always starts at the same rate.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean

from pddemu.config import Config, load_config
from pddemu.hardware import CostModel
from pddemu.roles.sizing import cost_model

PREFILL_CAPACITY = "prefill-capacity"


def prefill_seconds(model: CostModel, batch_chunks: int, input_tokens: int) -> float:
    """Modelled seconds of P's prefill of a whole prompt of `input_tokens`, each chunk one slot
    of a step of `batch_chunks` chunks."""
    return sum(
        model.prefill_step([chunk] * batch_chunks) / batch_chunks
        for chunk in model.chunks_for(input_tokens, 0)
    )


def prefill_capacity_rate(config: Config, system: str, input_tokens: list[int]) -> float:
    """Requests per modelled second that `system`'s P instances prefill, every prompt whole."""
    instances = config.systems[system].get("P", 0)
    if not input_tokens or instances < 1:
        raise ValueError(f"prefill capacity of {system} needs requests and a P instance")
    model = cost_model(config, system, "P")
    batch = config.prefill.max_batch_chunks
    return instances / mean(prefill_seconds(model, batch, tokens) for tokens in input_tokens)


def start_rate(
    config_path: Path | None, overrides: list[str], system: str, seeds: list[int | None]
) -> float:
    """`prefill_capacity_rate` over the requests every seed of the search replays (generated at
    the configured arrival rate)."""
    from pddemu.emulate import workload_of  # the points' own workload; emulate loads torch

    inputs: list[int] = []
    config = load_config(config_path, overrides)
    for seed in seeds:
        seeded = (
            config
            if seed is None
            else load_config(config_path, [*overrides, f"workload.seed={seed}"])
        )
        inputs += [request.input_tokens for request in workload_of(seeded)]
    return prefill_capacity_rate(config, system, inputs)
