"""Cost of asking the cost model: every emulated step calls it once, so it must stay negligible.

Measures the wall time of `decode_step` (batch 1, 32, 128 at 64K context), `prefill_step` (four
8K chunks) and `extend_step` (100 tokens at 64K) on the shipped gpu-b instance, each the median
of several timeit repetitions, and compares it with the wall time the same step lasts in the
emulation at the default time scale (its modelled duration / 4). Targets: under 50 us per call,
and under 1 % of the emulated step's wall time. Also records the representative step durations
that docs/hardware.md quotes.
"""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Callable

from pddemu.hardware import CostModel, InstanceHardware, load_chip, load_chips, load_target
from pddemu.hardware.__main__ import representative_steps

MAX_CALL_US = 50.0
MAX_SHARE_OF_STEP = 0.01
TIME_SCALE = 4.0
CONTEXT = 65536


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
        "targets": {
            f"every call under {MAX_CALL_US:g} us": all(
                f["call_us"] < MAX_CALL_US for f in figures.values()
            ),
            f"every call under {MAX_SHARE_OF_STEP:.0%} of its step's wall time": all(
                f["share_of_step"] < MAX_SHARE_OF_STEP for f in figures.values()
            ),
        },
    }
