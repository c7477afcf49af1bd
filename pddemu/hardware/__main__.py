"""`python -m pddemu.hardware`: modelled durations of representative steps on every chip.

Prints a Markdown table (or JSON with --json) so that docs and reports quote figures computed by
the cost model itself rather than typed by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pddemu.hardware.costmodel import CostModel, InstanceHardware
from pddemu.hardware.profiles import load_chips, load_target

CONTEXT = 65536
"""The representative long context ("64K") of an agentic request."""

BATCH = 32
EXTEND_TOKENS = 100


def representative_steps(model: CostModel) -> dict[str, Any]:
    """Durations (modelled seconds) and limiting resource of the steps the docs quote."""
    chunk = model.prefill_chunk_tokens
    steps = {
        f"prefill {chunk}-token chunk, empty context": [(chunk, 0)],
        f"prefill {chunk}-token chunk after {CONTEXT - chunk} context": [(chunk, CONTEXT - chunk)],
        f"decode batch {BATCH} at {CONTEXT} context": [(1, CONTEXT)] * BATCH,
        f"decode batch 1 at {CONTEXT} context": [(1, CONTEXT)],
        f"extend {EXTEND_TOKENS} tokens at {CONTEXT} context": [(EXTEND_TOKENS, CONTEXT)],
    }
    figures: dict[str, Any] = {
        "instance": f"{model.instance.chips} x {model.instance.chip.name}",
        "price_per_hour": model.price_per_hour,
        "kv_capacity_tokens": model.kv_capacity_tokens(),
        "steps": {},
    }
    for name, chunks in steps.items():
        terms = model.explain(chunks)
        figures["steps"][name] = {"seconds": terms.total_s, "bound": terms.bound}
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pddemu.hardware", description=__doc__)
    parser.add_argument("--target", default="agentic-50kb", help="target model profile")
    parser.add_argument("--chips", type=int, default=8, help="chips per instance")
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    args = parser.parse_args(argv)
    target = load_target(args.target)
    results = {
        name: representative_steps(CostModel(InstanceHardware(chip, chips=args.chips), target))
        for name, chip in load_chips().items()
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"Target {target.name}; instance defaults of InstanceHardware; times in ms.\n")
    print(_row("step", [figures["instance"] for figures in results.values()]))
    print("|---|" + "---:|" * len(results))
    for step in next(iter(results.values()))["steps"]:
        cells = []
        for figures in results.values():
            measured = figures["steps"][step]
            cells.append(f"{measured['seconds'] * 1e3:.1f} ({measured['bound']})")
        print(_row(step, cells))
    capacities = [f"{figures['kv_capacity_tokens']:,}" for figures in results.values()]
    print(_row("KV capacity (tokens)", capacities))
    print(_row("price per hour", [f"{f['price_per_hour']:.2f}" for f in results.values()]))
    return 0


def _row(first: str, cells: list[str]) -> str:
    return f"| {first} | " + " | ".join(cells) + " |"


if __name__ == "__main__":
    sys.exit(main())
