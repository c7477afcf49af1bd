"""`pddemu sweep`: run `pddemu emulate` over a grid of settings, or search each system's
maximum goodput, locally or on a Ray cluster; `pddemu sweep plot`: a metric against a key.

    pddemu sweep --out DIR [--grid KEY=V1,V2,... ...] [--seeds N]
                 [--system S[,S...]|all] [--requests N] [--warmup N]
                 [--trace T] [--config F] [--set KEY=VALUE ...]
                 [--executor local|ray] [--parallel K] [--ray-address ADDR]
                 [--cpus-per-point C] [--rootless]
                 [--search goodput [--slo-attainment 0.9] [--rate-min R]
                  [--rate-max R] [--rate-start R|prefill-capacity]
                  [--rate-tolerance F] [--max-probes N]]
    pddemu sweep --experiment experiments/NAME.toml [--quick] --out DIR
    pddemu sweep ... --resume-from EARLIER_DIR
        (its finished points kept, not run again)
    pddemu sweep plot DIR --x KEY --y METRIC [--out FILE] [--logx] [--logy]
    pddemu sweep report RESULTS [RESULTS ...] [--experiments DIR]
                        [--out docs/validation.md]

Every point is one `pddemu emulate` of one system in its own namespaces. DIR gets a run
directory per point (points/), sweep.json (one entry per point: settings, seed, system and the
summary's fields), sweep.csv, and with --search search.json. Rerunning the same command skips
the points already finished and redoes an interrupted one.

Exit status: 0 when every point finished with exit 0; 3 when a point's emulation found a
token mismatch; otherwise a point's own non-zero exit (4: not valid, 5: partial results); 1
when a point produced no results (its emulate.log says why) or the executor cannot run; 2
for bad input; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from netem.signals import on_termination, raise_keyboard_interrupt
from pddemu.cli import add_rootless_flag
from pddemu.config import SYSTEMS, Config, ConfigError, load_config
from pddemu.help_format import HelpFormatter
from pddemu.sweep.capacity import (
    PREFILL_BOUNDS,
    PREFILL_CAPACITY,
    START_RATES,
    start_bounds,
    start_rate,
)
from pddemu.sweep.driver import RATE_KEY, SearchGroup, Sweep, run_searches
from pddemu.sweep.executors import LocalExecutor, RayExecutor, SweepError, host_cpus
from pddemu.sweep.experiment import apply_experiment, experiment_parts
from pddemu.sweep.grid import SEED_KEY, expand, grid_settings, parse_grid, sweep_seeds
from pddemu.sweep.progress import Progress
from pddemu.sweep.provenance import code_version
from pddemu.sweep.restore import Earlier
from pddemu.sweep.search import GoodputSearch, SearchError, rounded
from pddemu.sweep.store import SWEEP_JSON

DEFAULT_CPUS_PER_POINT = 2.0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="run emulate over a grid of settings or search max goodput (local or Ray)",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--out", type=Path, help="the sweep directory (required)")
    parser.add_argument("--config", type=Path, help="TOML scenario (default: configs/default.toml)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value for every point, as in emulate (repeatable)",
    )
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="sweep a config key (keys and values as in --set; repeatable: the product)",
    )
    parser.add_argument(
        "--seeds", type=int, default=1, help="seeds per setting (from the config's)"
    )
    parser.add_argument(
        "--system", default="all", help="pdd, naive, indc, a comma-separated list, or all"
    )
    parser.add_argument("--requests", type=int, help="requests per point (workload.requests)")
    parser.add_argument(
        "--warmup",
        type=int,
        help="requests replayed first in every point and left out of its figures "
        "(workload.warmup_requests; summary.json's `warmup` holds their own)",
    )
    parser.add_argument("--trace", help="the workload (workload.trace): pdd-janfeb or a path")
    parser.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="where the points run: here, or on a Ray cluster (default local)",
    )
    parser.add_argument("--parallel", type=int, default=1, help="local: points at once (default 1)")
    parser.add_argument("--ray-address", help="ray: the cluster (default: a local one)")
    parser.add_argument(
        "--cpus-per-point",
        type=float,
        default=DEFAULT_CPUS_PER_POINT,
        help=f"CPUs one emulation reserves (Ray) or is counted for (local; default "
        f"{DEFAULT_CPUS_PER_POINT:g})",
    )
    add_rootless_flag(parser, help="run every point in a private user namespace even as root")
    parser.add_argument(
        "--search",
        choices=("goodput",),
        help="per system (and grid setting): the highest arrival rate meeting --slo-attainment",
    )
    parser.add_argument(
        "--slo-attainment",
        type=float,
        default=0.9,
        help="--search: the share of requests within the SLO a rate must reach (default 0.9)",
    )
    parser.add_argument("--rate-min", type=float, default=0.01, help="req/s (default 0.01)")
    parser.add_argument("--rate-max", type=float, default=64.0, help="req/s (default 64)")
    parser.add_argument(
        "--rate-start",
        type=rate_start,
        help=f"req/s, {PREFILL_CAPACITY} (each system's P capacity with no prompt cached) or "
        f"{PREFILL_BOUNDS} (P's capacity with an ideal cache, then with none; default: the "
        "config's arrival_rate, else 1)",
    )
    parser.add_argument(
        "--rate-tolerance",
        type=float,
        default=0.1,
        help="stop when the failing rate is within this share of the passing one (0.1)",
    )
    parser.add_argument("--max-probes", type=int, default=16, help="per search (16)")
    parser.add_argument(
        "--experiment", type=Path, help="an experiment file giving these arguments (experiments/)"
    )
    parser.add_argument("--quick", action="store_true", help="the experiment's quick variant")
    parser.add_argument(
        "--resume-from",
        type=Path,
        metavar="DIR",
        help="take the finished points of an earlier sweep's DIR/sweep.json (an experiment's "
        "parts: DIR/PART/sweep.json) instead of running them again (docs/sweep.md)",
    )
    parser.set_defaults(func=run_cli, sweep_parser=parser)
    actions = parser.add_subparsers(dest="action")
    plot = actions.add_parser("plot", help="a metric of sweep.json against a swept key")
    plot.add_argument("dir", type=Path, help="the sweep directory")
    plot.add_argument("--x", required=True, help="a swept key, e.g. wan.rate")
    plot.add_argument("--y", required=True, help="a summary field, e.g. ttft_s.p99 or bcr")
    plot.add_argument("--out", type=Path, help="PNG file (default: DIR/<y>-vs-<x>.png)")
    plot.add_argument("--logx", action="store_true", help="a logarithmic x axis")
    plot.add_argument("--logy", action="store_true", help="a logarithmic y axis")
    plot.set_defaults(func=run_plot)
    report = actions.add_parser(
        "report", help="docs/validation.md's reproduction section from experiments' results"
    )
    report.add_argument(
        "results",
        type=Path,
        nargs="+",
        help="a directory per experiment (as make reproduce writes); several: the quick "
        "variants' and the full ones', each claim's figures side by side",
    )
    report.add_argument(
        "--experiments",
        type=Path,
        default=Path("experiments"),
        help="the experiment files' directory (default: experiments)",
    )
    report.add_argument(
        "--out",
        type=Path,
        default=Path("docs/validation.md"),
        help="the page whose reproduction section is rewritten (default: docs/validation.md)",
    )
    report.set_defaults(func=run_report)


def systems_of(text: str) -> list[str]:
    if text == "all":
        return list(SYSTEMS)
    systems = [name.strip() for name in text.split(",")]
    unknown = [name for name in systems if name not in SYSTEMS]
    if unknown or len(set(systems)) != len(systems):
        raise ConfigError(
            f"--system {text!r}: use {', '.join(SYSTEMS)}, a comma-separated list of them, or all"
        )
    return systems


def base_overrides(args: argparse.Namespace) -> list[str]:
    overrides = list(args.set)
    if args.requests is not None:
        if args.requests < 1:
            raise ConfigError("--requests must be at least 1")
        overrides.append(f"workload.requests={args.requests}")
    if args.warmup is not None:
        if args.warmup < 0:
            raise ConfigError("--warmup must be at least 0")
        overrides.append(f"workload.warmup_requests={args.warmup}")
    if args.trace is not None:
        overrides.append(f"workload.trace={json.dumps(args.trace)}")
    return overrides


def make_executor(args: argparse.Namespace) -> LocalExecutor | RayExecutor:
    if args.cpus_per_point <= 0:
        raise ConfigError("--cpus-per-point must be positive")
    if args.executor == "ray":
        if args.parallel != 1:
            raise ConfigError("--parallel is for the local executor; Ray runs what its CPUs allow")
        return RayExecutor(args.ray_address, args.cpus_per_point, args.rootless)
    if args.ray_address:
        raise ConfigError("--ray-address needs --executor ray")
    cpus = host_cpus()
    if args.parallel * args.cpus_per_point > cpus:
        print(
            f"pddemu sweep: {args.parallel} points at once x {args.cpus_per_point:g} CPUs "
            f"exceed this host's {cpus}; points will slow each other (each point's "
            "emulator_lag_s shows by how much)",
            file=sys.stderr,
        )
    return LocalExecutor(args.parallel, args.rootless)


def run_cli(args: argparse.Namespace) -> int:
    if args.out is None:
        raise ConfigError("sweep: --out DIR is required")
    if args.experiment is None:
        if args.quick:
            raise ConfigError("--quick needs --experiment")
        return run_sweep(args)
    parts = experiment_parts(args.experiment)
    if parts == [None]:
        apply_experiment(args, args.sweep_parser.get_default, args.experiment)
        return run_sweep(args)
    if args.resume_from is not None and not args.resume_from.is_dir():
        raise ConfigError(f"--resume-from: {args.resume_from} is not a directory")
    # every part's arguments, settings, grid and earlier sweep are checked before the first runs
    part_args = []
    for part in parts:
        one = copy.copy(args)
        apply_experiment(one, args.sweep_parser.get_default, args.experiment, part)
        one.out = args.out / str(part)
        load_config(one.config, base_overrides(one))
        parse_grid(one.grid)
        earlier = earlier_part(args.resume_from, str(part))
        one.resume_from = earlier.directory if earlier else None
        part_args.append((one, earlier))
    status = 0
    for one, earlier in part_args:
        print(f"pddemu sweep: part {one.out.name} of {args.experiment}", file=sys.stderr)
        result = run_sweep(one, earlier)
        if result == 130:
            return result
        status = status or result
    return status


def earlier_part(resume_from: Path | None, part: str) -> Earlier | None:
    """Part `part`'s points in the earlier experiment's directory (DIR/PART/sweep.json); a
    part without one (added since) has nothing to resume, and runs every point."""
    if resume_from is None:
        return None
    if not (resume_from / part / SWEEP_JSON).exists():
        print(
            f"pddemu sweep: --resume-from: no {resume_from / part / SWEEP_JSON}: "
            f"part {part} runs every point",
            file=sys.stderr,
        )
        return None
    return Earlier(resume_from / part)


def run_sweep(args: argparse.Namespace, earlier: Earlier | None = None) -> int:
    """One sweep; `earlier`: the points to resume, if not those of `args.resume_from`."""
    if args.config is not None:
        args.config = args.config.resolve()  # the same file from a Ray node's working directory
    overrides = base_overrides(args)
    base = load_config(args.config, overrides)  # the sweep-wide settings, checked once
    if earlier is None and args.resume_from:
        earlier = Earlier(args.resume_from)
    grid = parse_grid(args.grid)
    systems = systems_of(args.system)
    try:
        executor = make_executor(args)
    except SweepError as error:
        print(f"pddemu sweep: {error}", file=sys.stderr)
        return 1
    meta = {
        "experiment": str(args.experiment) if args.experiment else None,
        "quick": args.quick,
        "config": base.source,
        "sets": overrides,
        "grid": grid,
        "seeds": args.seeds,
        "warmup_requests": base.workload.warmup_requests,
        "systems": systems,
        "executor": args.executor,
        "rootless": args.rootless,
        "search": None,
        "code": code_version(),  # this run's: a resumed sweep's points say their own
    }
    on_termination(raise_keyboard_interrupt)
    try:
        if args.search:
            return search(args, overrides, grid, systems, executor, meta, base, earlier)
        points = expand(args.config, overrides, grid, args.seeds, systems)
        sweep = Sweep(args.out, executor, meta, Progress(), earlier)
        try:
            sweep.run(points)
        finally:
            sweep.progress.close()
        print(f"pddemu sweep: {len(points)} points; wrote {args.out / 'sweep.json'} and sweep.csv")
        return sweep.exit_status()
    except SweepError as error:
        print(f"pddemu sweep: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "\npddemu sweep: interrupted; every running point was stopped and cleaned up; "
            "rerun the same command to carry on",
            file=sys.stderr,
        )
        return 130


def search(
    args: argparse.Namespace,
    overrides: list[str],
    grid: dict[str, list[str]],
    systems: list[str],
    executor: LocalExecutor | RayExecutor,
    meta: dict[str, Any],
    base: Config,
    earlier: Earlier | None,
) -> int:
    """Each system's (and grid setting's) max-goodput search; search.json and a table."""
    if RATE_KEY in grid:
        raise ConfigError(f"--search goodput chooses {RATE_KEY} itself: do not --grid it")
    if args.seeds > 1 and SEED_KEY in grid:
        raise ConfigError(f"--seeds and --grid {SEED_KEY}=... both choose the seed: give one")
    seeds = sweep_seeds(args.config, overrides, args.seeds)
    start = args.rate_start or base.workload.arrival_rate or 1.0
    try:
        groups = [
            SearchGroup(
                settings,
                system,
                GoodputSearch(
                    args.slo_attainment,
                    first,
                    args.rate_min,
                    args.rate_max,
                    args.rate_tolerance,
                    args.max_probes,
                    lower,
                ),
                {},
            )
            for settings in grid_settings(grid)
            for system in systems
            for first, lower in [
                within_rate_max(
                    *_start(start, args.config, overrides, settings, system, seeds),
                    derived=start in START_RATES,
                    rate_max=args.rate_max,
                )
            ]
        ]
    except SearchError as error:
        raise ConfigError(str(error)) from None
    meta["search"] = {
        "metric": "goodput",
        "slo_attainment": args.slo_attainment,
        "rate_start": start,
        "rate_min": args.rate_min,
        "rate_max": args.rate_max,
        "rate_tolerance": args.rate_tolerance,
        "max_probes": args.max_probes,
    }
    sweep = Sweep(args.out, executor, meta, Progress("search"), earlier)
    try:
        results = run_searches(sweep, groups, args.config, overrides, seeds)
    finally:
        sweep.progress.close()
    print(search_table(results, args.slo_attainment))
    print(f"pddemu sweep: wrote {args.out / 'search.json'}, sweep.json and sweep.csv")
    if any(result["status"] == "error" for result in results):
        return 1
    return sweep.exit_status()


def rate_start(text: str) -> float | str:
    """--rate-start: a rate, or the name of rates derived from the deployment."""
    if text in START_RATES:
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a number, {PREFILL_CAPACITY} or {PREFILL_BOUNDS}, got {text!r}"
        ) from None


def _start(
    start: float | str,
    config_path: Path | None,
    overrides: list[str],
    settings: dict[str, str],
    system: str,
    seeds: list[int | None],
) -> tuple[float, float | None]:
    """One search's first rate and the rate to probe if it fails (None: half of it): the given
    rate, or bounds of its system's P capacity (`capacity`)."""
    if start not in START_RATES:
        return float(start), None
    grid_overrides = [*overrides, *(f"{key}={value}" for key, value in settings.items())]
    try:
        if start == PREFILL_CAPACITY:
            return rounded(start_rate(config_path, grid_overrides, system, seeds)), None
        lower, upper = start_bounds(config_path, grid_overrides, system, seeds)
    except ValueError as error:
        raise ConfigError(f"--rate-start {start}: {error}") from None
    # equal bounds (no prompt shares a prefix) leave nothing to bracket: halve as usual
    return rounded(upper), rounded(lower) if lower < upper else None


def within_rate_max(
    first: float, lower: float | None, *, derived: bool, rate_max: float
) -> tuple[float, float | None]:
    """A start derived from the deployment never exceeds --rate-max: above it the search starts
    at --rate-max, and a lower rate not below that start is dropped (a failing start then
    halves). A start given as a number is the user's and is checked, not moved."""
    if not derived or first <= rate_max:
        return first, lower
    return rate_max, lower if lower is not None and lower < rate_max else None


def search_table(results: list[dict[str, Any]], target: float) -> str:
    def number(value: float | None, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}g}"

    lines = [
        f"max goodput with SLO attainment >= {target:.0%}:",
        "| system | settings | status | arrival rate | attainment | goodput (req/s) | "
        "cost per hour | BCR | probes | points not valid |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        settings = ", ".join(f"{k}={v}" for k, v in r["settings"].items()) or "-"
        not_valid = sum(p["points_not_valid"] for p in r["probes"])
        points = sum(len(p["points"]) for p in r["probes"])
        lines.append(
            f"| {r['system']} | {settings} | {r['status']} | {number(r['arrival_rate'])} | "
            f"{number(r.get('slo_attainment'))} | {number(r.get('goodput_rps'))} | "
            f"{number(r.get('cost_per_hour'), 4)} | {number(r.get('bcr'))} | {len(r['probes'])} | "
            f"{not_valid} of {points} |"
        )
    return "\n".join(lines)


def run_plot(args: argparse.Namespace) -> int:
    from pddemu.sweep.plot import plot_sweep

    path = plot_sweep(args.dir, args.x, args.y, args.out, args.logx, args.logy)
    print(f"pddemu sweep: wrote {path}")
    return 0


def run_report(args: argparse.Namespace) -> int:
    from pddemu.sweep.report import write_report

    if not args.experiments.is_dir():
        raise ConfigError(f"--experiments {args.experiments}: not a directory")
    write_report(args.experiments, args.results, args.out)
    print(f"pddemu sweep: wrote the reproduction section of {args.out}")
    return 0
