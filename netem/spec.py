"""What a link does, per direction: rate, queueing discipline, delay, jitter, loss, queue limit.

The parameter set is netem's (delay, jitter with a distribution, loss with a Gilbert-Elliott
option, rate, limit) with two deliberate differences, both documented in docs/netem.md:
- `jitter` is the standard deviation of the added delay for every distribution (netem's
  uniform jitter is a half-range), so a measured standard deviation can be checked against it;
- packets are never reordered unless `reorder` is set (netem reorders as soon as jitter exceeds
  the packet spacing), because a real single path does not reorder.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from netem.qdisc import check_qdisc
from netem.units import UnitError, parse_duration, parse_percent, parse_rate, parse_size

JITTER_DISTRIBUTIONS = ("uniform", "normal", "pareto")
DEFAULT_MTU = 1500
MIN_QUEUE_PACKETS = 100


class SpecError(ValueError):
    """A link specification that is inconsistent or out of range."""


@dataclass(frozen=True)
class LossModel:
    """Packet loss: independent (Bernoulli) or Gilbert-Elliott bursts.

    Gilbert-Elliott as in netem's `gemodel p r 1-h 1-k`: `p` moves good->bad, `r` bad->good,
    a packet is lost with `loss_bad` in the bad state and `loss_good` in the good state.
    """

    kind: str = "none"  # none | bernoulli | gilbert-elliott
    p: float = 0.0
    r: float = 1.0
    loss_bad: float = 1.0
    loss_good: float = 0.0

    def validate(self) -> None:
        if self.kind not in ("none", "bernoulli", "gilbert-elliott"):
            raise SpecError(f"unknown loss model {self.kind!r}")
        for name in ("p", "r", "loss_bad", "loss_good"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise SpecError(f"loss parameter {name}={value} is outside [0, 1]")
        if self.kind == "gilbert-elliott" and self.r == 0 and self.p > 0:
            raise SpecError("Gilbert-Elliott with r=0 never leaves the bad state")

    @property
    def mean_loss(self) -> float:
        """Long-run loss probability (stationary mix of the two states)."""
        if self.kind == "none":
            return 0.0
        if self.kind == "bernoulli":
            return self.p
        if self.p + self.r == 0:
            return self.loss_good
        bad = self.p / (self.p + self.r)
        return bad * self.loss_bad + (1 - bad) * self.loss_good

    @classmethod
    def parse(cls, text: str) -> LossModel:
        """'1%' (independent) or 'gemodel:P,R[,1-H[,1-K]]' (percentages, as in tc)."""
        text = text.strip()
        if text.lower().startswith(("gemodel:", "ge:")):
            parts = [parse_percent(x) for x in text.split(":", 1)[1].split(",") if x.strip()]
            if not 2 <= len(parts) <= 4:
                raise UnitError(f"gemodel needs P,R[,1-H[,1-K]], got {text!r}")
            p, r = parts[0], parts[1]
            loss_bad = parts[2] if len(parts) > 2 else 1.0
            loss_good = parts[3] if len(parts) > 3 else 0.0
            return cls("gilbert-elliott", p, r, loss_bad, loss_good)
        p = parse_percent(text)
        return cls("bernoulli", p) if p > 0 else cls()


@dataclass(frozen=True)
class LinkSpec:
    """One direction of a link. `rate_bps=None` means unlimited (no serialization delay, no
    queue); 0 means stalled (packets queue, nothing leaves). `qdisc` orders and drops what
    waits for the rate (see `netem.qdisc`)."""

    rate_bps: float | None = None
    qdisc: str = "fifo"
    delay_s: float = 0.0
    jitter_s: float = 0.0
    jitter_dist: str = "uniform"
    reorder: bool = False
    loss: LossModel = field(default_factory=LossModel)
    limit_bytes: int | None = None
    mtu: int = DEFAULT_MTU

    def validate(self) -> LinkSpec:
        if self.rate_bps is not None and not (self.rate_bps >= 0 and math.isfinite(self.rate_bps)):
            raise SpecError(f"rate must be zero or a positive number of bit/s, got {self.rate_bps}")
        try:
            check_qdisc(self.qdisc)
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        if not (self.delay_s >= 0 and math.isfinite(self.delay_s)):
            raise SpecError(f"delay must be zero or more, got {self.delay_s} s")
        if not (self.jitter_s >= 0 and math.isfinite(self.jitter_s)):
            raise SpecError(f"jitter must be zero or more, got {self.jitter_s} s")
        if self.jitter_dist not in JITTER_DISTRIBUTIONS:
            raise SpecError(
                f"unknown jitter distribution {self.jitter_dist!r}: "
                f"use one of {', '.join(JITTER_DISTRIBUTIONS)}"
            )
        if self.limit_bytes is not None and self.limit_bytes < self.mtu:
            raise SpecError(f"queue limit {self.limit_bytes} B is below one packet ({self.mtu} B)")
        if not 576 <= self.mtu <= 65535:
            raise SpecError(f"mtu {self.mtu} is outside 576..65535")
        self.loss.validate()
        return self

    @property
    def queue_limit_bytes(self) -> int:
        """The drop-tail limit of the rate queue: explicit, or at least one bandwidth-delay
        product of the round trip (both directions taken as this one), so delay never eats
        bandwidth; never under MIN_QUEUE_PACKETS packets."""
        if self.limit_bytes is not None:
            return self.limit_bytes
        floor = MIN_QUEUE_PACKETS * self.mtu
        if self.rate_bps is None:
            return max(floor, 16 * 1024 * 1024)
        rtt = 2 * (self.delay_s + 3 * self.jitter_s)
        return max(floor, int(self.rate_bps * rtt / 8))

    def with_changes(self, **changes: Any) -> LinkSpec:
        """A copy with the given fields replaced, validated (used for live changes)."""
        unknown = set(changes) - set(LinkSpec.__dataclass_fields__)
        if unknown:
            raise SpecError(f"unknown link field(s): {', '.join(sorted(unknown))}")
        return replace(self, **changes).validate()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LinkSpec:
        data = dict(data)
        if "loss" in data and isinstance(data["loss"], dict):
            data["loss"] = LossModel(**data["loss"])
        return cls(**data).validate()


def changes_from_dict(changes: dict[str, Any]) -> dict[str, Any]:
    changes = dict(changes)
    if isinstance(changes.get("loss"), dict):
        changes["loss"] = LossModel(**changes["loss"])
    return changes


def changes_to_dict(changes: dict[str, Any]) -> dict[str, Any]:
    """Changes in plain JSON (the loss model as a dict), for the shaper's control socket."""
    return {k: (asdict(v) if isinstance(v, LossModel) else v) for k, v in changes.items()}


# Human-facing field names (CLI flags, schedule files) and how to read them.
FIELD_PARSERS: dict[str, tuple[str, Any]] = {
    "rate": (
        "rate_bps",
        lambda t: None if t in ("unlimited", "none") else parse_rate(t, allow_zero=True),
    ),
    "qdisc": ("qdisc", check_qdisc),
    "delay": ("delay_s", parse_duration),
    "jitter": ("jitter_s", parse_duration),
    "dist": ("jitter_dist", str),
    "distribution": ("jitter_dist", str),
    "loss": ("loss", LossModel.parse),
    "limit": ("limit_bytes", parse_size),
    "reorder": ("reorder", lambda t: _parse_bool(t)),
    "mtu": ("mtu", int),
}


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "yes", "true", "on"):
        return True
    if lowered in ("0", "no", "false", "off"):
        return False
    raise UnitError(f"expected yes/no, got {text!r}")


def parse_fields(pairs: dict[str, str]) -> dict[str, Any]:
    """{'rate': '10mbit', 'delay': '20ms'} -> {'rate_bps': 1e7, 'delay_s': 0.02}."""
    out: dict[str, Any] = {}
    for key, text in pairs.items():
        if key not in FIELD_PARSERS:
            raise UnitError(f"unknown link field {key!r}: use {', '.join(FIELD_PARSERS)}")
        name, parser = FIELD_PARSERS[key]
        try:
            out[name] = parser(text)
        except ValueError as exc:
            raise UnitError(f"{key}: {exc}") from None
    return out


def parse_assignments(text: str) -> dict[str, Any]:
    """'rate=10mbit,delay=20ms' -> parsed fields (for per-direction CLI overrides)."""
    pairs: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise UnitError(f"expected key=value, got {item!r}")
        pairs[key.strip()] = value.strip()
    return parse_fields(pairs)
