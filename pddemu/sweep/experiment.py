"""Experiment files: a sweep written down, so that it can be committed and rerun.

    pddemu sweep --experiment experiments/NAME.toml [--quick] --out DIR

An experiment file holds the arguments of one `pddemu sweep` in an `[experiment]` table, and in
a `[quick]` table what its quick variant changes (fewer seeds, requests or values):

    [experiment]
    description = "TTFT p99 against WAN bandwidth"
    config = "../configs/default.toml"    # relative to this file; default: the default config
    systems = ["pdd", "naive", "indc"]    # or "all"
    seeds = 3
    requests = 100
    warmup = 20                           # as --warmup: replayed first, not counted
    set = ["workload.arrival_rate=0.5"]   # as --set
    grid = { "wan.rate" = ["1gbit", "10gbit", "100gbit"] }   # as --grid (values: TOML values)
    search = "goodput"                    # optional, with slo_attainment, rate_min, ...
    [quick]
    seeds = 1
    grid = { "wan.rate" = ["1gbit", "100gbit"] }

An experiment of several sweeps (the same question asked along different keys) names them in
`[part.NAME]` tables, each holding what its sweep adds to `[experiment]` and, in
`[part.NAME.quick]`, what its quick variant changes; each part runs into DIR/NAME. `[[claim]]`
tables say what `pddemu sweep report` reads from the results (`pddemu/sweep/report.py`).

Arguments given on the command line as well as in the file are refused (one source each).
"""

from __future__ import annotations

import argparse
import json
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pddemu.config import ConfigError
from pddemu.sweep.capacity import PREFILL_BOUNDS, PREFILL_CAPACITY, START_RATES

# file key -> (argparse destination, type check, what the file must give)
KEYS: dict[str, tuple[str, type | tuple[type, ...], str]] = {
    "description": ("", str, "a string"),
    "config": ("config", str, "a path"),
    "systems": ("system", (list, str), 'a list of systems or "all"'),
    "seeds": ("seeds", int, "an integer"),
    "requests": ("requests", int, "an integer"),
    "warmup": ("warmup", int, "an integer"),
    "trace": ("trace", str, "a string"),
    "set": ("set", list, "a list of KEY=VALUE strings"),
    "grid": ("grid", dict, "a table of key = [values]"),
    "search": ("search", str, '"goodput"'),
    "slo_attainment": ("slo_attainment", (int, float), "a number"),
    "rate_min": ("rate_min", (int, float), "a number"),
    "rate_max": ("rate_max", (int, float), "a number"),
    "rate_start": (
        "rate_start",
        (int, float, str),
        f'a number, "{PREFILL_CAPACITY}" or "{PREFILL_BOUNDS}"',
    ),
    "rate_tolerance": ("rate_tolerance", (int, float), "a number"),
    "max_probes": ("max_probes", int, "an integer"),
}
BARE_WORD = re.compile(r"[A-Za-z0-9_.+-]+")


def read_experiment(path: Path) -> dict[str, Any]:
    """The file's tables, their keys checked."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as error:
        raise ConfigError(f"cannot read experiment {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    unknown_tables = set(data) - {"experiment", "quick", "part", "claim"}
    if unknown_tables or "experiment" not in data:
        raise ConfigError(
            f"{path}: needs an [experiment] table (and optionally [quick], [part.NAME], "
            "[[claim]]) only"
        )
    tables = {"experiment": data["experiment"], "quick": data.get("quick", {})}
    parts = data.get("part", {})
    if not isinstance(parts, dict) or not all(isinstance(t, dict) for t in parts.values()):
        raise ConfigError(f"{path}: [part.NAME] must be tables")
    for name, table in parts.items():
        quick = table.get("quick", {})
        if not isinstance(quick, dict):
            raise ConfigError(f"{path}: [part.{name}] quick: must be a table")
        tables[f"part.{name}"] = {k: v for k, v in table.items() if k != "quick"}
        tables[f"part.{name}.quick"] = quick
    for table, keys in tables.items():
        for key, value in keys.items():
            if key not in KEYS:
                raise ConfigError(f"{path}: [{table}] {key}: unknown key; known: {', '.join(KEYS)}")
            _, kind, wanted = KEYS[key]
            if (
                isinstance(value, bool)
                or not isinstance(value, kind)
                or (key == "rate_start" and isinstance(value, str) and value not in START_RATES)
            ):
                raise ConfigError(f"{path}: [{table}] {key}: must be {wanted}, got {value!r}")
    return data


def experiment_parts(path: Path) -> list[str | None]:
    """The file's parts in order, or [None] for a file of one sweep."""
    parts = list(read_experiment(path).get("part", {}))
    return parts or [None]


def load_experiment(path: Path, quick: bool, part: str | None = None) -> dict[str, Any]:
    """The arguments of one sweep of the file: `[experiment]`, then part `part`'s table, then
    (when `quick`) `[quick]` and the part's quick table over them."""
    data = read_experiment(path)
    parts = data.get("part", {})
    if (part is None) != (not parts) or (part is not None and part not in parts):
        raise ConfigError(f"{path}: no part {part!r}; parts: {', '.join(parts) or 'none'}")
    own = {k: v for k, v in parts.get(part, {}).items() if k != "quick"}
    merged = {**data["experiment"], **own}
    if quick:
        merged.update(data.get("quick", {}))
        merged.update(parts.get(part, {}).get("quick", {}))
    return merged


def value_text(value: Any) -> str:
    """A grid value from the file as `--grid` text: bare words stay bare, others TOML."""
    if isinstance(value, str):
        return value if BARE_WORD.fullmatch(value) else json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def apply_experiment(
    args: argparse.Namespace,
    default_of: Callable[[str], Any],
    path: Path,
    part: str | None = None,
) -> None:
    """Fill `args` from the experiment file (its part `part`); an argument given both ways is
    refused."""
    experiment = load_experiment(path, args.quick, part)
    for key, value in experiment.items():
        destination = KEYS[key][0]
        if not destination:
            continue
        if getattr(args, destination) != default_of(destination):
            raise ConfigError(f"--{destination.replace('_', '-')} is given by {path} already")
        if key == "config":
            value = (path.parent / value).resolve()
        elif key == "systems":
            value = value if isinstance(value, str) else ",".join(value)
        elif key == "grid":
            value = [
                f"{grid_key}=" + ",".join(value_text(v) for v in _listed(path, grid_key, values))
                for grid_key, values in value.items()
            ]
        setattr(args, destination, value)


def _listed(path: Path, key: str, values: Any) -> list[Any]:
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{path}: grid {key}: must be a non-empty list of values")
    return values
