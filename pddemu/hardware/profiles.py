"""Chip and target-model profiles: the numbers a roofline needs, read from TOML and checked.

The shipped profiles live in `pddemu/profiles/chips.toml` and `pddemu/profiles/models.toml`,
each number with a comment naming its source. Another file of the same layout can be passed
as `path` to study other hardware without editing the package.
"""

from __future__ import annotations

import tomllib
from dataclasses import MISSING, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from pddemu.hardware.checks import positive_int, positive_number
from pddemu.hardware.errors import ProfileError

ACTIVE_TOLERANCE = 0.05
"""How far a MoE profile's active parameters, recomputed from its experts, may be from the
stated `active_params` (published figures are rounded: DeepSeek-V3's "37 B" is 37.5 B)."""

CHIPS_FILE = "chips.toml"
MODELS_FILE = "models.toml"


def _text(owner: str, name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ProfileError(f"{owner}: {name} must be a non-empty string, got {value!r}")
    return value


@dataclass(frozen=True)
class ChipProfile:
    """One accelerator. Units: FLOP/s (dense BF16), bytes, bytes/s, currency per chip-hour.

    `interconnect_bw` is the per-chip, per-direction bandwidth inside the chip's scale-up
    domain: what tensor-parallel all-reduces run over. `host_bw` is the per-chip,
    per-direction bandwidth of its host link (PCIe): what KV received over the network into
    host memory crosses to reach the chip.
    """

    name: str
    peak_flops: float
    memory_bytes: float
    memory_bw: float
    interconnect_bw: float
    host_bw: float
    price_per_hour: float
    source: str

    def __post_init__(self) -> None:
        owner = f"chip {self.name!r}"
        _text(owner, "name", self.name)
        for field_name in (
            "peak_flops",
            "memory_bytes",
            "memory_bw",
            "interconnect_bw",
            "host_bw",
            "price_per_hour",
        ):
            value = positive_number(owner, field_name, getattr(self, field_name), ProfileError)
            object.__setattr__(self, field_name, value)
        _text(owner, "source", self.source)


@dataclass(frozen=True)
class TargetModel:
    """The real model whose step times are modelled (never run): sizes only.

    FLOPs follow `active_params` (what one token touches); capacity follows `total_params`
    (what the instance holds). A step reads the weights its tokens touch: all of a dense
    model's; of a mixture of experts (`routed_experts` > 0), the always-active weights (attention,
    dense layers, shared experts, embeddings) and the routed experts its tokens pick, each token
    `experts_per_token` of `routed_experts` in each of `moe_layers` layers, `expert_params`
    parameters per expert.
    """

    name: str
    total_params: float
    active_params: float
    n_layers: int
    hidden_size: int
    kv_bytes_per_token: int
    weight_bytes_per_param: float
    source: str
    routed_experts: int = 0  # 0: a dense model
    experts_per_token: int = 0
    moe_layers: int = 0
    expert_params: float = 0.0

    def __post_init__(self) -> None:
        owner = f"target model {self.name!r}"
        _text(owner, "name", self.name)
        for field_name in ("total_params", "active_params", "weight_bytes_per_param"):
            value = positive_number(owner, field_name, getattr(self, field_name), ProfileError)
            object.__setattr__(self, field_name, value)
        for field_name in ("n_layers", "hidden_size", "kv_bytes_per_token"):
            positive_int(owner, field_name, getattr(self, field_name), ProfileError)
        if self.active_params > self.total_params:
            raise ProfileError(
                f"{owner}: active_params ({self.active_params:g}) exceeds "
                f"total_params ({self.total_params:g})"
            )
        _text(owner, "source", self.source)
        if self.routed_experts or self.experts_per_token or self.moe_layers or self.expert_params:
            self._check_experts(owner)

    def _check_experts(self, owner: str) -> None:
        for field_name in ("routed_experts", "experts_per_token", "moe_layers"):
            positive_int(owner, field_name, getattr(self, field_name), ProfileError)
        value = positive_number(owner, "expert_params", self.expert_params, ProfileError)
        object.__setattr__(self, "expert_params", value)
        if self.experts_per_token > self.routed_experts:
            raise ProfileError(
                f"{owner}: experts_per_token ({self.experts_per_token}) exceeds "
                f"routed_experts ({self.routed_experts})"
            )
        if self.moe_layers > self.n_layers:
            raise ProfileError(
                f"{owner}: moe_layers ({self.moe_layers}) exceeds n_layers ({self.n_layers})"
            )
        if self.routed_params >= self.total_params:
            raise ProfileError(
                f"{owner}: the routed experts ({self.routed_params:g} parameters) leave nothing "
                f"of total_params ({self.total_params:g}) for attention and the dense layers"
            )
        active = self.always_active_params + self.moe_layers * self.experts_per_token * (
            self.expert_params
        )
        if abs(active - self.active_params) > ACTIVE_TOLERANCE * self.active_params:
            raise ProfileError(
                f"{owner}: the experts give {active:g} active parameters per token "
                f"(always-active + moe_layers x experts_per_token x expert_params), but "
                f"active_params is {self.active_params:g}"
            )

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights, as held in memory."""
        return self.total_params * self.weight_bytes_per_param

    @property
    def routed_params(self) -> float:
        """Parameters of all routed experts (0 for a dense model)."""
        return self.moe_layers * self.routed_experts * self.expert_params

    @property
    def always_active_params(self) -> float:
        """Parameters every token uses: all of a dense model's, a MoE's non-routed ones."""
        return self.total_params - self.routed_params

    def experts_touched(self, tokens: int) -> float:
        """Expected distinct routed experts per MoE layer that `tokens` tokens pick, each token
        `experts_per_token` of `routed_experts` uniformly and independently: an expert is missed
        by one token with probability 1 - k/E, so E (1 - (1 - k/E)^tokens) are touched."""
        if not self.routed_experts:
            return 0.0
        experts, k = self.routed_experts, self.experts_per_token
        return experts * (1.0 - (1.0 - k / experts) ** tokens)

    def weight_bytes_read(self, tokens: int) -> float:
        """Bytes of weights one forward step over `tokens` new tokens reads: the always-active
        weights and the routed experts its tokens touch (each read once, whatever the number of
        tokens that picked it)."""
        touched = self.moe_layers * self.experts_touched(tokens) * self.expert_params
        return (self.always_active_params + touched) * self.weight_bytes_per_param


Profile = TypeVar("Profile", ChipProfile, TargetModel)


def _read_toml(path: Path | None, default_file: str) -> tuple[str, dict[str, Any]]:
    if path is None:
        resource = resources.files("pddemu") / "profiles" / default_file
        where, text = f"pddemu/profiles/{default_file}", resource.read_text(encoding="utf-8")
    else:
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ProfileError(f"cannot read profile file {where}: {exc.strerror}") from None
    try:
        return where, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{where}: not valid TOML: {exc}") from None


def _load_all(path: Path | None, default_file: str, cls: type[Profile]) -> dict[str, Profile]:
    where, data = _read_toml(path, default_file)
    expected = {f.name for f in fields(cls)} - {"name"}
    required = {
        f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
    } - {"name"}
    profiles: dict[str, Profile] = {}
    for name, table in data.items():
        if not isinstance(table, dict):
            raise ProfileError(f"{where}: [{name}] must be a table of profile fields")
        missing = required - set(table)
        unknown = set(table) - expected
        if missing or unknown:
            problems = []
            if missing:
                problems.append(f"missing {', '.join(sorted(missing))}")
            if unknown:
                problems.append(f"unknown {', '.join(sorted(unknown))}")
            raise ProfileError(
                f"{where}: [{name}]: {'; '.join(problems)} (fields: {', '.join(sorted(expected))})"
            )
        try:
            profiles[name] = cls(name=name, **table)
        except ProfileError as exc:
            raise ProfileError(f"{where}: {exc}") from None
    if not profiles:
        raise ProfileError(f"{where}: no profiles defined")
    return profiles


def _pick(profiles: dict[str, Profile], name: str, kind: str) -> Profile:
    try:
        return profiles[name]
    except KeyError:
        known = ", ".join(sorted(profiles))
        raise ProfileError(f"unknown {kind} {name!r}; known: {known}") from None


def load_chips(path: Path | None = None) -> dict[str, ChipProfile]:
    """Every chip profile of `path` (default: the shipped `chips.toml`), by name."""
    return _load_all(path, CHIPS_FILE, ChipProfile)


def load_targets(path: Path | None = None) -> dict[str, TargetModel]:
    """Every target-model profile of `path` (default: the shipped `models.toml`), by name."""
    return _load_all(path, MODELS_FILE, TargetModel)


def load_chip(name: str, path: Path | None = None) -> ChipProfile:
    """The chip profile called `name`; an unknown name's error lists the known ones."""
    return _pick(load_chips(path), name, "chip")


def load_target(name: str, path: Path | None = None) -> TargetModel:
    """The target-model profile called `name`; an unknown name's error lists the known ones."""
    return _pick(load_targets(path), name, "target model")
