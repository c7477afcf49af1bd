"""`pddemu validate`: does the emulator give the modelled system's answer, whatever the host?

    pddemu validate [--out DIR] [--config FILE] [--full]

Two checks (docs/validation.md says what each shows):
- analytic: an idle system, one request at a time, each pipeline, a grid of prompt sizes and
  hit rates: TTFT, KV-transfer time and TPOT against the closed-form model
  (`pddemu.validate.closed_form`), within 2 %;
- invariance: a sample of pdd-janfeb through pdd at time scale 1 and at "auto", and at token
  scale 16 against 32 (`--full` adds 64), over three seeds: TTFT p50/p90/p99 and TPOT p50 within 3 %, the
  seed-to-seed spread reported beside each difference.

By default it is kept short (outputs capped at 64 tokens, 8 requests a seed, token scale 16
against 32, an analytic grid of 8K and 64K tokens at no hit and 90 %); `--full` replays 100
requests a seed with their own outputs, adds token scale 64 and a finer analytic grid.
Writes DIR/validation.json and DIR/validation.md and prints the tables. Exit status 0 when
every check passed, 4 when one did not, 2 for bad input, 1 when the network cannot be set up,
130 when interrupted (SIGINT or SIGTERM: no verdict is written; everything the runs made is
removed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import uvloop

from netem.signals import on_termination, raise_keyboard_interrupt
from pddemu.cli import add_rootless_flag
from pddemu.config import Config, load_config
from pddemu.emulate import INTERRUPTED_EXIT, run_system, until_interrupted, workload_of
from pddemu.emulated_network import network_for, scale_model
from pddemu.help_format import HelpFormatter
from pddemu.roles.launcher import Launcher
from pddemu.validate import analytic, invariance
from pddemu.workload.expansion import genuine_output_length

FAILED_EXIT = 4
QUICK = {
    "requests": 8,
    "arrival_rate": 1.0,
    "output_cap": 64,
    "seeds": (0, 1, 2),
    "tokens": invariance.TOKENS[:2],  # 16 against 32; 64 too with --full
}
FULL = {
    "requests": 100,
    "arrival_rate": 0.5,
    "output_cap": None,
    "seeds": (0, 1, 2),
    "tokens": invariance.TOKENS,
}


def run_analytic(
    base: Config, out: Path, full: bool, launcher: Launcher | None = None
) -> dict[str, Any]:
    sizes = analytic.FULL_SIZES if full else analytic.SIZES
    hits = analytic.FULL_HITS if full else analytic.HITS
    outcomes = []
    walls = {}
    steals = {}
    for system, pipeline, routing in analytic.PIPELINES:
        config = analytic.scenario(base, system, routing, max(sizes))
        probes = analytic.probes(config, system, pipeline, sizes, hits)
        print(f"validate: analytic, {system} {pipeline}, {len(probes)} requests", file=sys.stderr)
        started = time.monotonic()
        run = _run(
            system, config, probes, out / "analytic" / f"{system}-{pipeline}", launcher=launcher
        )
        walls[f"{system} {pipeline}"] = time.monotonic() - started
        steals[f"{system} {pipeline}"] = _steal(run)
        by_id = {r.request_id: r for r in run.records}
        idle = analytic.idleness(run.records)
        outcomes += [
            analytic.judge(p, by_id.get(p.request_id), idle.get(p.request_id))
            for p in probes
            if p.request is not None
        ]
    analytic.write_probes_csv(out / "analytic.csv", outcomes)
    return {
        **analytic.summarise(outcomes, analytic.TOLERANCE),
        "requests": [o.to_dict() for o in outcomes],
        "wall_s": walls,  # each pipeline's deployment, start to stop
        "host_steal_s": steals,  # each pipeline's replay: seconds stolen from each CPU
    }


def run_invariance(
    base: Config, out: Path, full: bool, launcher: Launcher | None = None
) -> dict[str, Any]:
    plan = FULL if full else QUICK
    runs: dict[tuple, tuple[dict[str, float | None], float | None]] = {}
    walls: dict[str, float] = {}
    steals: dict[str, list[float] | None] = {}

    def measure(variant: invariance.Variant, seed: int) -> tuple[dict, float | None]:
        """The metrics and speed-up of one run (runs that configure the same are run once:
        the time comparison's "auto" is the token comparison's 32)."""
        config = invariance.configure(base, variant, seed, plan["requests"], plan["arrival_rate"])
        key = (config.scale.token_scale, config.scale.time_scale, seed)
        if key not in runs:
            workload = _capped(workload_of(config), plan["output_cap"], config)
            print(f"validate: invariance, {variant.name}, seed {seed}", file=sys.stderr)
            tag = f"token{key[0]}-time{key[1] or 'auto'}-seed{seed}"
            started = time.monotonic()
            run = _run("pdd", config, workload, out / "invariance" / tag, launcher=launcher)
            walls[tag] = time.monotonic() - started
            steals[tag] = _steal(run)
            runs[key] = (invariance.metrics_of(run.records), run.timing["dilation"]["speedup"])
        return runs[key]

    workload = {k: v for k, v in plan.items() if k != "tokens"}
    results: dict[str, Any] = {"workload": {**workload, "trace": base.workload.trace}}
    for name, variants in (("time", invariance.TIME), ("tokens", plan["tokens"])):
        measured = {v.name: {s: measure(v, s)[0] for s in plan["seeds"]} for v in variants}
        speedups = {v.name: [measure(v, s)[1] for s in plan["seeds"]] for v in variants}
        results[name] = {
            **invariance.compare(measured, variants[0].name, invariance.TOLERANCE),
            "measured": measured,
            "speedup": speedups,
        }
    results["passed"] = results["time"]["passed"] and results["tokens"]["passed"]
    results["wall_s"] = walls  # each run's deployment, start to stop
    results["host_steal_s"] = steals  # each run's replay: seconds stolen from each CPU
    return results


def _steal(run: Any) -> list[float] | None:
    """The seconds the hypervisor took from each CPU during the run's replay: a run whose
    timing missed may have lost its CPU to the host, not to the emulator."""
    return run.timing.get("cpu", {}).get("host_steal_s")


def _capped(workload: list[Any], cap: int | None, config: Config) -> list[Any]:
    """The workload with outputs of at most `cap` tokens (None: as they are)."""
    if cap is None:
        return workload
    scale = config.scale.token_scale
    return [
        replace(
            r,
            output_tokens=min(r.output_tokens, cap),
            genuine_output_tokens=genuine_output_length(min(r.output_tokens, cap), scale),
        )
        for r in workload
    ]


def _run(
    system: str, config: Config, workload: list[Any], out: Path, launcher: Launcher | None = None
) -> Any:
    """One replay; an interrupted one ends the whole validation (KeyboardInterrupt): a check
    judged on part of its runs would be no check. `launcher`: the instances' launcher, kept
    across the validation's runs."""
    out.mkdir(parents=True, exist_ok=True)
    with network_for(config, scale_model(config), seed=config.workload.seed) as network:
        replaying = run_system(system, config, network, workload, out, launcher)
        run = uvloop.run(until_interrupted(replaying))
    if run.interrupted:
        raise KeyboardInterrupt
    return run


def markdown(result: dict[str, Any]) -> str:
    lines = ["# pddemu validate", ""]
    an = result["analytic"]
    lines += [
        f"## Analytic check (idle system, one request at a time; within {an['tolerance']:.0%})",
        "",
        "| pipeline | TTFT | KV transfer | TPOT | routing: mean / max excess (not judged) |",
        "|---|---:|---:|---:|---:|",
    ]
    for pipeline, row in an["pipelines"].items():
        cells = []
        for metric in analytic.JUDGED:
            cell = row.get(metric)
            if cell is None:
                cells.append("-")
            elif cell["max_abs_error"] is None:
                cells.append("missing")
            else:
                cells.append(f"{_pct(cell['largest_error'])} {'ok' if cell['within'] else 'OVER'}")
        route = an.get("route_excess_s", {}).get(pipeline)
        cells.append(f"{route['mean'] * 1e3:+.1f} / {route['max'] * 1e3:+.1f} ms" if route else "-")
        lines.append(f"| {pipeline} | {' | '.join(cells)} |")
    lines += [
        "",
        "(largest relative error over the grid; routing: arrival to the route's decision, "
        "beyond the closed form's)",
        "",
        f"Idle before each probe (every earlier request's last token and KV delivered): "
        f"{_idle(an)}",
        "",
        *_over(an),
    ]
    inv = result["invariance"]
    for name, title in (("time", "time scale 1 vs auto"), ("tokens", "token scale vs 32")):
        block = inv[name]
        lines += [
            f"## Invariance: {title} (mean of {len(block['measured'][block['reference']])} "
            f"seeds; within {block['tolerance']:.0%})",
            "",
            "| variant | " + " | ".join(invariance.METRICS) + " |",
            "|---|" + "---:|" * len(invariance.METRICS),
        ]
        for variant, rows in block["variants"].items():
            cells = [
                f"{_pct(rows[m]['mean'])} (max {_pct(rows[m]['largest'])})"
                for m in invariance.METRICS
            ]
            lines.append(f"| {variant} | {' | '.join(cells)} |")
        spread = [_pct(block["seed_spread"][m]) for m in invariance.METRICS]
        lines.append(f"| seed-to-seed spread of the reference | {' | '.join(spread)} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _over(analytic_result: dict[str, Any]) -> list[str]:
    """The cells over the bound, each with how late its route was and its error had the
    route come on time: a cell within the bound then was put over by the routing exchange's
    lateness (the emulator's handling on the routing path), not by the rest of the pipeline."""
    over = analytic_result.get("over", [])
    if not over:
        return []
    lines = [
        "Over the bound (probe, metric: error; the route's lateness; the error with the route "
        "on time, estimated):",
        "",
    ]
    for cell in over:
        route = cell["route_excess_s"]
        late = "-" if route is None else f"{route * 1e3:+.1f} ms"
        lines.append(
            f"- {cell['pipeline']} {cell['input_tokens']} tokens, {cell['hit_tokens']} hit, "
            f"{cell['metric']}: {_pct(cell['relative_error'])}; route {late}; "
            f"{_pct(cell['relative_error_without_late_route'])} with it on time"
        )
    is_ = analytic_result.get("without_late_route_is")
    if is_:
        lines += ["", f"The error with the route on time is {is_}."]
    return [*lines, ""]


def _idle(analytic_result: dict[str, Any]) -> str:
    not_idle = analytic_result.get("not_idle", [])
    if not_idle:
        return f"NOT for {', '.join(not_idle)} (fails the check)"
    quiet = analytic_result.get("min_idle_for_s")
    return "-" if quiet is None else f"yes, for at least {quiet:.2f} modelled s"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "validate",
        allow_abbrev=False,  # `--rootless` is acted on before parsing, by its full name
        help="check the emulator against the closed-form model and for invariance",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/validate"),
        help="directory for validation.json, validation.md and each run (default runs/validate)",
    )
    parser.add_argument("--config", type=Path, help="TOML scenario (default: configs/default.toml)")
    parser.add_argument("--full", action="store_true", help="larger grids and workloads")
    add_rootless_flag(parser)
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    base = load_config(args.config)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    on_termination(raise_keyboard_interrupt)
    try:
        # one launcher for every run (the command's, started before its imports): the
        # instances' code is imported once
        with ExitStack() as stack:
            launcher = args.launcher or stack.enter_context(Launcher(args.out / "launcher.err"))
            result = {
                "config": base.source,
                "full": args.full,
                "analytic": run_analytic(base, args.out, args.full, launcher),
                "invariance": run_invariance(base, args.out, args.full, launcher),
            }
    except KeyboardInterrupt:
        print(
            "pddemu validate: interrupted; no verdict written, everything the runs made has "
            "been removed",
            file=sys.stderr,
        )
        return INTERRUPTED_EXIT
    result["wall_s"] = time.monotonic() - started
    result["passed"] = result["analytic"]["passed"] and result["invariance"]["passed"]
    (args.out / "validation.json").write_text(json.dumps(result, indent=1))
    table = markdown(result)
    (args.out / "validation.md").write_text(table)
    print(table)
    print(f"wrote {args.out / 'validation.json'} and {args.out / 'validation.md'}")
    return 0 if result["passed"] else FAILED_EXIT
