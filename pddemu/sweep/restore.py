"""`pddemu sweep ... --resume-from DIR`: finished points of an earlier sweep's DIR/sweep.json
(a committed docs/reproduction/<name>/, whose per-point directories are not kept) taken as
this sweep's own instead of being run again.

A point's id is a digest of its fully resolved configuration, so a key added to the
configuration since the earlier sweep changes every id. An earlier entry stands for a point
of this sweep when both are of the same system and seed and

- their ids are equal (the same resolved configuration), or
- the entry records its resolved configuration (`point.resolved`, kept since this module
  exists) and every value it holds is the point's, while every key the point has and the entry
  lacks (added since) takes its default (the built-in configuration's value): a key's default
  keeps the behaviour from before the key existed. A default changed since is caught, the
  entry holding the old value.

Anything else is run again. A restored point keeps its own record (the code it ran on, its
wall time, its summary's fields) and says where it came from (`restored_from`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pddemu.config import ConfigError, config_to_json, load_config
from pddemu.sweep.points import Point
from pddemu.sweep.store import SWEEP_JSON

ENTRY_KEYS = ("settings", "values", "seed", "system", "point")  # the rest is the summary's


def earlier_entries(directory: Path) -> list[dict[str, Any]]:
    """The finished entries of DIR/sweep.json; ConfigError naming the file when it is missing
    or not a sweep's."""
    path = directory / SWEEP_JSON
    try:
        data = json.loads(path.read_text())
        entries = data["points"]
    except OSError as error:
        raise ConfigError(f"--resume-from: cannot read {path}: {error.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise ConfigError(f"--resume-from: {path} is not a sweep's sweep.json") from None
    return [e for e in entries if e.get("point", {}).get("status") == "done"]


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Leaves of a nested mapping under dotted names."""
    leaves: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            leaves.update(flat(value, f"{name}."))
        else:
            leaves[name] = value
    return leaves


def default_leaves() -> dict[str, Any]:
    resolved = config_to_json(load_config(None, []))
    resolved.pop("source", None)
    return flat(resolved)


def same_emulation(entry: dict[str, Any], point: Point, defaults: dict[str, Any]) -> bool:
    """Whether an earlier entry stands for `point` (the module's rule)."""
    about = entry["point"]
    if entry["system"] != point.system or entry["seed"] != point.seed:
        return False
    if about["id"] == point.id:
        return True
    if "resolved" not in about:
        return False
    earlier, now = flat(about["resolved"]), flat(point.resolved)
    if any(key not in now or now[key] != value for key, value in earlier.items()):
        return False
    return all(key in defaults and defaults[key] == now[key] for key in now.keys() - earlier)


def restored_record(entry: dict[str, Any], point: Point, source: Path) -> dict[str, Any]:
    """The point record (as point.json holds it) rebuilt from an earlier sweep.json entry."""
    about = entry["point"]
    return {
        **about,
        "id": point.id,
        "system": point.system,
        "seed": point.seed,
        "resolved": point.resolved,
        "restored_from": about.get("restored_from")
        or {"sweep": str(source / SWEEP_JSON), "id": about["id"]},
        "summary": {k: v for k, v in entry.items() if k not in ENTRY_KEYS},
    }


class Earlier:
    """An earlier sweep's finished points, looked up for the points of this one."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.entries = earlier_entries(directory)
        self.defaults = default_leaves()

    def record_for(self, point: Point) -> dict[str, Any] | None:
        for entry in self.entries:
            if same_emulation(entry, point, self.defaults):
                return restored_record(entry, point, self.directory)
        return None
