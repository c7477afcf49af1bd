"""`--grid KEY=V1,V2,...`: the swept keys and values, and every point of their product.

Keys are `pddemu emulate --set` keys, values TOML (a bare word is a string). Values are split at
commas outside quotes and brackets, so `--grid 'workload.trace="a,b.jsonl","c.jsonl"'` has two.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from pddemu.config import ConfigError, load_config
from pddemu.sweep.points import Point, key_path, make_point

SEED_KEY = "workload.seed"


def parse_grid(specs: list[str]) -> dict[str, list[str]]:
    """{key: [values as written]} in the order given; ConfigError naming the bad `--grid`."""
    grid: dict[str, list[str]] = {}
    for spec in specs:
        key, sep, text = spec.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--grid {spec!r}: expected KEY=V1,V2,...")
        key_path(key)  # a key TOML can read
        values = split_values(text)
        if not values or any(not value for value in values):
            raise ConfigError(f"--grid {spec!r}: an empty value")
        if key in grid:
            raise ConfigError(f"--grid {key}: given twice")
        if len(set(values)) != len(values):
            raise ConfigError(f"--grid {spec!r}: a value repeats")
        grid[key] = values
    return grid


def split_values(text: str) -> list[str]:
    """Split at commas that are outside quotes, brackets and braces."""
    values, current, depth, quote = [], [], 0, ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            values.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    values.append("".join(current).strip())
    return values


def grid_settings(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination, the first key varying slowest (as nested loops in the order given)."""
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


def sweep_seeds(
    config_path: Path | None, base_overrides: list[str], count: int
) -> list[int | None]:
    """`--seeds N`: the config's seed and the N-1 after it (None: leave the seed as configured)."""
    if count < 1:
        raise ConfigError("--seeds must be at least 1")
    if count == 1:
        return [None]
    base = load_config(config_path, base_overrides).workload.seed
    return [base + i for i in range(count)]


def expand(
    config_path: Path | None,
    base_overrides: list[str],
    grid: dict[str, list[str]],
    seeds: int,
    systems: list[str],
) -> list[Point]:
    """Every point: settings x seeds x systems, each config checked now (before anything runs)."""
    if seeds > 1 and SEED_KEY in grid:
        raise ConfigError(f"--seeds and --grid {SEED_KEY}=... both choose the seed: give one")
    seed_list = sweep_seeds(config_path, base_overrides, seeds)
    return [
        make_point(config_path, base_overrides, settings, system, seed)
        for settings in grid_settings(grid)
        for seed in seed_list
        for system in systems
    ]
