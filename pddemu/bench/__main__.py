"""`make bench`: runs every benchmark module of this package and writes one JSON file each.

A benchmark module is any module here with a `run(quick: bool) -> dict` function; its result
goes to `<out>/<module>.json`. Every one runs unless `--only` names some (`reproduce_quick`,
every experiment's quick variant, takes about 25 minutes of them: `make bench-reproduce` runs
it alone). Targets are checked inside the result (`"targets": {...: bool}`)
so a reader sees measured figure and verdict side by side. A module that fails writes its error
there instead (target `ran` missed), and the others still run.

Each file gets `job_wall_s`: the job's wall time, import and setup included. `wall_s` is the
benchmark's own, where it has one (handoff.json: the wall time of the deployments its cells
list, summed) and is left as the benchmark wrote it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import platform
import sys
import time
from pathlib import Path

import pddemu.bench as bench_pkg
from netem.rootless import RootlessError, ensure_network_privileges

NETWORK_BENCHMARKS = (
    "handoff",
    "wan_classes",
    "faults",
    "validate",
    "wan_tcp",
    "reproduce_quick",
)  # they make namespaces: root, or a user namespace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pddemu.bench", description=__doc__)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results"),
        help="directory of the <benchmark>.json files (default bench/results)",
    )
    parser.add_argument("--only", action="append", help="run only these benchmark modules")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller sizes, for a smoke run (reproduce_quick has none: it runs every "
        "experiment's quick variant either way)",
    )
    parser.add_argument(
        "--experiments",
        nargs="+",
        metavar="NAME",
        help="reproduce_quick: only these experiments (experiments/NAME.toml)",
    )
    args = parser.parse_args(argv)
    if args.experiments and args.only != ["reproduce_quick"]:
        parser.error("--experiments goes with --only reproduce_quick alone")
    args.out.mkdir(parents=True, exist_ok=True)
    names = benchmark_names()
    if args.only:
        unknown = set(args.only) - set(names)
        if unknown:
            parser.error(
                f"unknown benchmark(s): {', '.join(sorted(unknown))}; have {', '.join(names)}"
            )
    names = chosen(names, args.only)
    no_network = None
    if set(names) & set(NETWORK_BENCHMARKS):
        try:
            ensure_network_privileges()  # while this process has one thread (see netem.rootless)
        except RootlessError as error:
            no_network = error
    failed = []
    for name in names:
        print(f"bench {name} ...", file=sys.stderr, flush=True)
        started = time.time()
        try:
            if no_network is not None and name in NETWORK_BENCHMARKS:
                raise no_network
            module = importlib.import_module(f"pddemu.bench.{name}")
            if args.experiments:
                result = module.run(quick=args.quick, experiments=args.experiments)
            else:
                result = module.run(quick=args.quick)
        except Exception as error:  # noqa: BLE001 - one broken benchmark must not hide the rest
            result = {"error": f"{type(error).__name__}: {error}", "targets": {"ran": False}}
        result.setdefault(
            "machine",
            {
                "python": platform.python_version(),
                "cpu": platform.processor() or platform.machine(),
            },
        )
        result["job_wall_s"] = round(time.time() - started, 3)
        path = args.out / f"{name}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        missed = [k for k, ok in result.get("targets", {}).items() if not ok]
        if missed:
            failed.append(f"{name}: {', '.join(missed)}")
        print(
            f"bench {name}: wrote {path}" + (f" (missed: {', '.join(missed)})" if missed else ""),
            file=sys.stderr,
        )
    if failed:
        print("targets missed:\n  " + "\n  ".join(failed), file=sys.stderr)
    return 1 if failed else 0


def benchmark_names() -> list[str]:
    """This package's benchmark modules: every one but the runner and its helpers (`_name`)."""
    return [m.name for m in pkgutil.iter_modules(bench_pkg.__path__) if not m.name.startswith("_")]


def chosen(names: list[str], only: list[str] | None) -> list[str]:
    """The benchmarks to run: those named, or every one."""
    return [n for n in names if not only or n in only]


if __name__ == "__main__":
    sys.exit(main())
