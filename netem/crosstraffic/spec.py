"""What cross-traffic to make: other tenants' TCP flows sharing the WAN with the emulator's.

Flows arrive as a Poisson process (or `paced`: each arrival one flow's worth of the target
rate after the previous one, so the offered load is exact over any long window) with sizes
drawn from an exponential or a Pareto distribution; the arrival rate is set so the offered
load is `utilisation` of the link's rate in each direction asked. A schedule may change the
target over time and start single bulk flows at given times:

    # <time> utilisation=X | flow=SIZE [dir=a2b|b2a]
    0    utilisation=0.3
    30   utilisation=0.7
    45   flow=50mb dir=b2a
    60   utilisation=0
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from netem.spec import SpecError
from netem.units import UnitError, parse_duration, parse_size

SIZES = ("exponential", "pareto")
ARRIVALS = ("poisson", "paced")
DIRECTIONS = ("a2b", "b2a", "both")


@dataclass(frozen=True)
class TimedChange:
    """From `at_s` (seconds from the start): a new target utilisation, or one bulk flow."""

    at_s: float
    utilisation: float | None = None
    flow_bytes: int | None = None
    direction: str | None = None  # the flow's direction (default: the spec's first one)


@dataclass(frozen=True)
class CrossTrafficSpec:
    utilisation: float = 0.5  # target mean share of each direction's rate, before any schedule
    sizes: str = "exponential"
    mean_bytes: int = 1_000_000
    pareto_shape: float = 1.5  # > 1, so the mean exists (infinite variance below 2)
    arrivals: str = "poisson"
    direction: str = "a2b"
    max_flows: int = 100  # flows open at once per direction; arrivals beyond it are skipped
    schedule: tuple[TimedChange, ...] = field(default_factory=tuple)
    seed: int = 0

    def validate(self) -> CrossTrafficSpec:
        if not (0.0 <= self.utilisation <= 1.0):
            raise SpecError(f"cross-traffic utilisation must be in [0, 1], got {self.utilisation}")
        if self.sizes not in SIZES:
            raise SpecError(
                f"cross-traffic sizes must be one of {', '.join(SIZES)}, not {self.sizes!r}"
            )
        if self.arrivals not in ARRIVALS:
            raise SpecError(
                f"cross-traffic arrivals must be one of {', '.join(ARRIVALS)}, not {self.arrivals!r}"
            )
        if self.direction not in DIRECTIONS:
            raise SpecError(
                f"cross-traffic direction must be one of {', '.join(DIRECTIONS)}, not {self.direction!r}"
            )
        if self.mean_bytes < 1:
            raise SpecError(
                f"cross-traffic mean flow size must be at least 1 byte, got {self.mean_bytes}"
            )
        if not (self.pareto_shape > 1.0 and math.isfinite(self.pareto_shape)):
            raise SpecError(
                f"pareto shape must be above 1 (a finite mean), got {self.pareto_shape}"
            )
        if self.max_flows < 1:
            raise SpecError(f"max_flows must be at least 1, got {self.max_flows}")
        last = -1.0
        for change in self.schedule:
            if not (math.isfinite(change.at_s) and change.at_s > last):
                raise SpecError(f"cross-traffic schedule times must increase, got {change.at_s:g}")
            last = change.at_s
            if change.utilisation is not None and not 0.0 <= change.utilisation <= 1.0:
                raise SpecError(
                    f"cross-traffic utilisation must be in [0, 1], got {change.utilisation}"
                )
            if change.direction is not None and change.direction not in ("a2b", "b2a"):
                raise SpecError(f"a scheduled flow goes a2b or b2a, not {change.direction!r}")
        return self

    def directions(self) -> tuple[str, ...]:
        return ("a2b", "b2a") if self.direction == "both" else (self.direction,)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CrossTrafficSpec:
        data = dict(data)
        data["schedule"] = tuple(TimedChange(**c) for c in data.get("schedule", ()))
        return cls(**data).validate()


def _fraction(text: str) -> float:
    value = float(text.rstrip("%")) / (100.0 if text.endswith("%") else 1.0)
    if not math.isfinite(value):
        raise UnitError(f"not a number: {text!r}")
    return value


# CLI and config keys, and how to read each.
KEYS: dict[str, tuple[str, Any]] = {
    "utilisation": ("utilisation", _fraction),
    "utilization": ("utilisation", _fraction),
    "sizes": ("sizes", str),
    "mean": ("mean_bytes", parse_size),
    "mean_size": ("mean_bytes", parse_size),
    "shape": ("pareto_shape", float),
    "pareto_shape": ("pareto_shape", float),
    "arrivals": ("arrivals", str),
    "dir": ("direction", str),
    "direction": ("direction", str),
    "max_flows": ("max_flows", int),
    "seed": ("seed", int),
}


def _read(parse: Any, value: Any) -> Any:
    """A value from text (the CLI), or from a TOML number (a size in bytes, a fraction)."""
    if isinstance(value, str):
        return parse(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or parse is str:
        raise TypeError(f"unexpected value {value!r}")
    if parse is parse_size or parse is int:
        if value != int(value):
            raise ValueError(f"expected a whole number, got {value!r}")
        return int(value)
    return float(value)


def spec_from_pairs(
    pairs: dict[str, Any], base: CrossTrafficSpec | None = None
) -> CrossTrafficSpec:
    """A spec from key=value pairs (CLI text or config values); `schedule` names a file."""
    changes: dict[str, Any] = {}
    for key, value in pairs.items():
        if key == "schedule":
            changes["schedule"] = load_cross_schedule(value)
            continue
        if key not in KEYS:
            raise SpecError(
                f"unknown cross-traffic key {key!r}: use {', '.join([*KEYS, 'schedule'])}"
            )
        name, parse = KEYS[key]
        try:
            changes[name] = _read(parse, value)
        except (ValueError, TypeError) as exc:
            raise SpecError(f"cross-traffic {key}: {exc}") from None
    return replace(base or CrossTrafficSpec(), **changes).validate()


def parse_cross_traffic(text: str) -> CrossTrafficSpec:
    """'utilisation=0.5,sizes=pareto,mean=1mb,arrivals=poisson,dir=both,schedule=FILE'."""
    pairs: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise SpecError(f"cross-traffic: expected key=value, got {item!r}")
        pairs[key.strip()] = value.strip()
    return spec_from_pairs(pairs)


def parse_cross_schedule(
    text: str, source: str = "<cross-traffic schedule>"
) -> tuple[TimedChange, ...]:
    changes: list[TimedChange] = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            try:
                at = float(words[0])
            except ValueError:
                at = parse_duration(words[0])
            pairs = dict(word.partition("=")[::2] for word in words[1:])
            unknown = set(pairs) - {"utilisation", "utilization", "flow", "dir"}
            if unknown or not pairs or ("dir" in pairs and "flow" not in pairs):
                raise SpecError("write '<time> utilisation=X' or '<time> flow=SIZE [dir=a2b|b2a]'")
            share = pairs.get("utilisation", pairs.get("utilization"))
            change = TimedChange(
                at,
                utilisation=_fraction(share) if share is not None else None,
                flow_bytes=parse_size(pairs["flow"]) if "flow" in pairs else None,
                direction=pairs.get("dir"),
            )
            changes.append(change)
            CrossTrafficSpec(schedule=tuple(changes)).validate()
        except (SpecError, ValueError) as exc:
            raise SpecError(f"{source}:{number}: {exc}") from None
    if not changes:
        raise SpecError(f"{source}: the cross-traffic schedule has no lines")
    return tuple(changes)


def load_cross_schedule(path: str | Path) -> tuple[TimedChange, ...]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read cross-traffic schedule {path}: {exc.strerror}") from None
    return parse_cross_schedule(text, str(path))
