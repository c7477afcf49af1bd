"""Cost of asking the cost model: every emulated step calls it once, so it must stay negligible.

Measures the wall time of `decode_step` (batch 1, 32, 128 at 64K context), `prefill_step` (four
8K chunks) and `extend_step` (100 tokens at 64K) on the shipped gpu-b instance, each the median
of several timeit repetitions, and compares it with the wall time the same step lasts in the
emulation at the default time scale (its modelled duration / 4). Targets: under 50 us per call,
and under 1 % of the emulated step's wall time. Also records the representative step durations
that docs/hardware.md quotes, and the relay's and main decode's time per output token (one decode
step) at batch 1, 8, 32 and 128 on the default config's hardware, with the routed experts a step
of that batch touches.
"""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Callable

from pddemu.config import load_config
from pddemu.hardware import CostModel, InstanceHardware, load_chip, load_chips, load_target
from pddemu.hardware.__main__ import representative_steps
from pddemu.roles.sizing import cost_model

MAX_CALL_US = 50.0
MAX_SHARE_OF_STEP = 0.01
TIME_SCALE = 4.0
CONTEXT = 65536
TPOT_BATCHES = (1, 8, 32, 128)
TPOT_CONTEXTS = (8192, CONTEXT)


def decode_tpot() -> dict:
    """Per role of the default pdd deployment (RLD, MD): each batch's decode step at each
    context, the experts it touches per MoE layer, and whether that batch's KV fits."""
    config = load_config()
    result = {}
    for role in ("RLD", "MD"):
        model = cost_model(config, "pdd", role)
        hardware = config.hardware_for("pdd", role)
        rows = {}
        for batch in TPOT_BATCHES:
            for context in TPOT_CONTEXTS:
                terms = model.explain([(1, context)] * batch)
                rows[f"batch {batch} at {context}"] = {
                    "tpot_s": terms.total_s,
                    "bound": terms.bound,
                    "experts_touched_per_layer": model.target.experts_touched(batch),
                    "weight_bytes_read": model.target.weight_bytes_read(batch),
                    "kv_fits": batch * (context + 1) <= model.kv_capacity_tokens(),
                }
        result[role] = {"instance": f"{hardware.chips} x {hardware.chip}", "steps": rows}
    return result


def _median_call_us(call: Callable[[], float], number: int, repeats: int) -> float:
    times = timeit.repeat(call, number=number, repeat=repeats)
    return statistics.median(times) / number * 1e6


def run(quick: bool) -> dict:
    model = CostModel(InstanceHardware(load_chip("gpu-b")), load_target("agentic-50kb"))
    number, repeats = (2_000, 3) if quick else (20_000, 7)
    chunks = [(model.prefill_chunk_tokens, i * model.prefill_chunk_tokens) for i in range(4)]
    calls: dict[str, Callable[[], float]] = {
        f"decode_step batch {b}": (lambda b=b: model.decode_step([CONTEXT] * b))
        for b in (1, 32, 128)
    }
    calls["prefill_step 4 chunks"] = lambda: model.prefill_step(chunks)
    calls["extend_step 100 tokens"] = lambda: model.extend_step(100, CONTEXT)
    figures = {}
    for name, call in calls.items():
        call_us = _median_call_us(call, number, repeats)
        step_wall_us = call() / TIME_SCALE * 1e6
        figures[name] = {
            "call_us": round(call_us, 3),
            "emulated_step_wall_us": round(step_wall_us, 1),
            "share_of_step": call_us / step_wall_us,
        }
    target = load_target("agentic-50kb")
    steps = {
        name: representative_steps(CostModel(InstanceHardware(chip), target))
        for name, chip in load_chips().items()
    }
    return {
        "calls": figures,
        "representative_steps": steps,
        "decode_tpot": decode_tpot(),
        "targets": {
            f"every call under {MAX_CALL_US:g} us": all(
                f["call_us"] < MAX_CALL_US for f in figures.values()
            ),
            f"every call under {MAX_SHARE_OF_STEP:.0%} of its step's wall time": all(
                f["share_of_step"] < MAX_SHARE_OF_STEP for f in figures.values()
            ),
        },
    }
