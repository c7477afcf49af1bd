"""A sweep's point: one emulation of one system under one configuration.

A point is a config file plus `--set` overrides (the sweep's own, then its grid settings, then
its seed) and a system. It is identified by a digest of the fully resolved configuration and
the system, so the same emulation gets the same identity however it was asked for (a grid
value equal to the default, a resumed sweep with more values): that is what resuming relies on.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pddemu.config import Config, ConfigError, config_to_json, load_config


@dataclass(frozen=True)
class Point:
    config_path: Path | None
    overrides: tuple[str, ...]  # applied in order, as `pddemu emulate --set`
    settings: dict[str, str] = field(hash=False)  # the swept keys, values as written
    system: str
    seed: int
    id: str
    source: str  # the config's description, as summary.json states it
    values: dict[str, Any] = field(hash=False)  # the swept keys' checked values (base units)
    resolved: dict[str, Any] = field(hash=False, default_factory=dict)  # what the id digests

    def emulate_args(self, out: Path, config_path: Path | None = None) -> list[str]:
        """`pddemu emulate` arguments for this point, writing into `out`; `config_path` stands
        in for the config file where it lives elsewhere (a Ray node)."""
        config = config_path or self.config_path
        args = ["emulate", "--out", str(out), "--system", self.system]
        if config is not None:
            args += ["--config", str(config)]
        for override in self.overrides:
            args += ["--set", override]
        return args


def make_point(
    config_path: Path | None,
    base_overrides: list[str],
    settings: dict[str, str],
    system: str,
    seed: int | None = None,
) -> Point:
    """The point of `system` under the config with `settings` (and `seed`, when given) applied;
    ConfigError naming the override when a value is refused."""
    overrides = [*base_overrides, *(f"{key}={value}" for key, value in settings.items())]
    if seed is not None:
        overrides.append(f"workload.seed={seed}")
    config = load_config(config_path, overrides)
    resolved = config_to_json(config)
    resolved.pop("source", None)
    digest = hashlib.sha256(
        json.dumps({"system": system, "config": resolved}, sort_keys=True).encode()
    ).hexdigest()[:12]
    return Point(
        config_path=config_path,
        overrides=tuple(overrides),
        settings=dict(settings),
        system=system,
        seed=config.workload.seed,
        id=f"{system}-seed{config.workload.seed}-{digest}",
        source=config.source,
        values={key: resolved_value(config, key) for key in settings},
        resolved=resolved,
    )


def key_path(key: str) -> list[str]:
    """`hardware."P.indc".chips` -> ["hardware", "P.indc", "chips"] (a TOML dotted key)."""
    try:
        table: Any = tomllib.loads(f"{key} = 0")
    except tomllib.TOMLDecodeError:
        raise ConfigError(f"{key!r} is not a key") from None
    path = []
    while isinstance(table, dict):
        (name, table), *_ = table.items()
        path.append(name)
    return path


def resolved_value(config: Config, key: str) -> Any:
    """The checked value of a `--set` key in base units (`wan.rate` -> the rate in bit/s), or
    None where the key names no single value (`target.model` is a string field of its own)."""
    node: Any = config
    for part in key_path(key):
        if isinstance(node, BaseModel):
            fields = type(node).model_fields
            name = next((n for n, f in fields.items() if part in (n, f.alias)), None)
            if name is None:
                return None
            node = getattr(node, name)
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    if isinstance(node, BaseModel):
        return node.model_dump(mode="json")
    return node
