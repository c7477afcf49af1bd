"""The emulator's configuration: one TOML file (configs/default.toml is the documented
default), read into frozen dataclasses and checked, with errors naming the file and key."""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from netem.units import UnitError, parse_duration, parse_percent, parse_rate

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.toml"
SYSTEMS = ("pdd", "naive", "indc")
ROLES = ("P", "RLD", "MD", "D")
HANDOFF_MODES = ("one-shot", "catch-up", "adaptive")
HANDOFF_PAYLOADS = ("extend", "kv-delta")


class ConfigError(ValueError):
    """A configuration value that is missing, of the wrong type or out of range."""


@dataclass(frozen=True)
class ScaleConfig:
    token_scale: int = 32  # modelled tokens per genuine token
    time_scale: float = 4.0  # modelled seconds per wall-clock second


@dataclass(frozen=True)
class LinkModel:
    """A modelled link (real-world units); the emulator scales it onto the netem link."""

    rate_bps: float | None = None
    delay_s: float = 0.0
    jitter_s: float = 0.0
    jitter_dist: str = "normal"
    loss: float = 0.0


@dataclass(frozen=True)
class InstanceHardwareConfig:
    chip: str = "gpu-a"
    chips: int = 8
    compute_efficiency: float = 0.5
    memory_efficiency: float = 0.7
    step_overhead_s: float = 0.005


@dataclass(frozen=True)
class PrefillConfig:
    chunk_tokens: int = 8192  # modelled tokens per prefill chunk slot
    max_batch_chunks: int = 4  # chunk slots per prefill step
    pad_chunks: bool = True  # a tail chunk costs a full slot (static step shapes)


@dataclass(frozen=True)
class DecodeConfig:
    max_batch: int = 32


@dataclass(frozen=True)
class PolicyConfig:
    routing: str = "wan-time"
    wan_time_threshold_s: float = 1.0
    handoff_mode: str = "adaptive"
    catch_up_threshold_tokens: int = 64
    adaptive_load_threshold: float = 0.75
    handoff_payload: str = "extend"
    anomaly_filter: bool = True
    anomaly_output_threshold: int = 500
    anomaly_min_input_tokens: int = 16384
    drc: bool = True


@dataclass(frozen=True)
class SLOConfig:
    ttft_s: float = 5.0
    tpot_s: float = 0.1


@dataclass(frozen=True)
class WorkloadConfig:
    trace: str = "pdd-janfeb"
    requests: int | None = 100
    seed: int = 0
    arrival_rate: float | None = 0.5  # modelled requests per second; None: trace timestamps
    # (in TOML and --set: requests = "all", arrival_rate = "trace")


@dataclass(frozen=True)
class Config:
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    model: dict[str, Any] = field(default_factory=dict)  # pddemu.model.ModelConfig fields
    target: str = "agentic-50kb"
    wan: LinkModel = field(default_factory=lambda: LinkModel(10e9, 0.020, 0.002))
    intra: LinkModel = field(default_factory=LinkModel)
    hardware: dict[str, InstanceHardwareConfig] = field(default_factory=dict)  # per role
    systems: dict[str, dict[str, int]] = field(default_factory=dict)  # system -> role -> count
    prefill: PrefillConfig = field(default_factory=PrefillConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    slo: SLOConfig = field(default_factory=SLOConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    cache_page_tokens: int = 64  # modelled tokens per radix-cache page (P's cache and MD's DRC)
    request_timeout_s: float = 600.0  # modelled seconds before a request is failed
    source: str = "<defaults>"

    def hardware_for(self, system: str, role: str) -> InstanceHardwareConfig:
        key = f"{role}.{system}" if f"{role}.{system}" in self.hardware else role
        if key not in self.hardware:
            raise ConfigError(f"{self.source}: no [hardware.{role}] section")
        return self.hardware[key]

    def with_policy(self, **changes: Any) -> Config:
        """A copy with policy fields changed, checked like a config file's (live admin changes)."""
        policy = _section(
            {**asdict(self.policy), **changes}, PolicyConfig, f"{self.source}: [policy]"
        )
        changed = replace(self, policy=policy)
        _validate(changed)
        return changed

    def with_workload(self, **changes: Any) -> Config:
        return replace(
            self,
            workload=replace(self.workload, **{k: v for k, v in changes.items() if v is not None}),
        )


def config_to_json(config: Config) -> dict[str, Any]:
    """A plain-JSON form of a checked config, to hand to instance processes."""
    return asdict(config)


def config_from_json(data: dict[str, Any]) -> Config:
    """Inverse of config_to_json (values are already checked and in base units)."""
    return Config(
        scale=ScaleConfig(**data["scale"]),
        model=dict(data["model"]),
        target=data["target"],
        wan=LinkModel(**data["wan"]),
        intra=LinkModel(**data["intra"]),
        hardware={k: InstanceHardwareConfig(**v) for k, v in data["hardware"].items()},
        systems={k: dict(v) for k, v in data["systems"].items()},
        prefill=PrefillConfig(**data["prefill"]),
        decode=DecodeConfig(**data["decode"]),
        policy=PolicyConfig(**data["policy"]),
        slo=SLOConfig(**data["slo"]),
        workload=WorkloadConfig(**data["workload"]),
        request_timeout_s=data["request_timeout_s"],
        cache_page_tokens=data["cache_page_tokens"],
        source=data["source"],
    )


def _section(
    data: dict[str, Any], cls: type, where: str, parsers: dict[str, Any] | None = None
) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a table")
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known - set(parsers or {})
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}"
        )
    values: dict[str, Any] = {}
    for key, value in data.items():
        if parsers and key in parsers:
            name, parse = parsers[key]
            try:
                values[name] = parse(value)
            except (UnitError, ValueError, TypeError) as exc:
                raise ConfigError(f"{where}.{key}: {exc}") from None
        else:
            values[key] = value
    try:
        section = cls(**values)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    for f in fields(cls):
        _check_type(getattr(section, f.name), f.type, f"{where}.{f.name}")
    return section


def _check_type(value: Any, annotation: Any, where: str) -> None:
    text = str(annotation)
    if value is None:
        if "None" not in text:
            raise ConfigError(f"{where} may not be empty")
        return
    if text.startswith("int") and (not isinstance(value, int) or isinstance(value, bool)):
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if text.startswith("float") and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ConfigError(f"{where} must be a number, got {value!r}")
    if text.startswith("bool") and not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if text.startswith("str") and not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
        raise ConfigError(f"{where} must not be negative, got {value!r}")


_LINK_PARSERS = {
    "rate": ("rate_bps", lambda v: None if v in (None, "unlimited") else parse_rate(str(v))),
    "delay": ("delay_s", lambda v: parse_duration(str(v))),
    "jitter": ("jitter_s", lambda v: parse_duration(str(v))),
    "loss": ("loss", lambda v: parse_percent(str(v))),
}


def _all_or_count(value: Any) -> int | None:
    if value == "all":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'must be a count of at least 1 or "all", got {value!r}')
    return value


def _trace_or_rate(value: Any) -> float | None:
    if value == "trace":
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value < float("inf")
    ):
        raise ValueError(
            f'must be a positive rate in requests per second or "trace", got {value!r}'
        )
    return float(value)


_WORKLOAD_PARSERS = {
    "requests": ("requests", _all_or_count),
    "arrival_rate": ("arrival_rate", _trace_or_rate),
}


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a TOML config (the default one when `path` is None), apply `section.key=value`
    overrides (values in TOML syntax; a bare word is a string), and check every value."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    source = _shown(path)
    for override in overrides or []:
        apply_override(data, override)
        source += f" + {override}"
    return config_from_dict(data, source)


def _shown(path: Path) -> str:
    """A path as reports show it: relative to the project for its own configs, so that a
    run's files do not depend on where the project was checked out."""
    resolved = path.resolve()
    project = DEFAULT_CONFIG.parent.parent
    return str(resolved.relative_to(project)) if resolved.is_relative_to(project) else str(path)


def apply_override(data: dict[str, Any], override: str) -> None:
    """`policy.handoff_mode=one-shot` -> data["policy"]["handoff_mode"] = "one-shot"."""
    key, sep, text = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {override!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    *sections, name = key.strip().split(".")
    table = data
    for section in sections:
        table = table.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"override {override!r}: {section} is not a section")
    table[name] = value


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> Config:
    known = {f.name for f in fields(Config)} - {"source"}
    for key in ("request_timeout_s", "cache_page_tokens"):
        if key in data and (
            isinstance(data[key], bool) or not isinstance(data[key], int | float) or data[key] <= 0
        ):
            raise ConfigError(f"{source}: {key} must be a positive number, got {data[key]!r}")
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {', '.join(sorted(unknown))}")
    hardware = {
        role: _section(value, InstanceHardwareConfig, f"{source}: [hardware.{role}]")
        for role, value in data.get("hardware", {}).items()
    }
    for role in hardware:
        if role.split(".")[0] not in ROLES:
            raise ConfigError(f"{source}: [hardware.{role}]: roles are {', '.join(ROLES)}")
    systems: dict[str, dict[str, int]] = {}
    for system, roles in data.get("systems", {}).items():
        if system not in SYSTEMS:
            raise ConfigError(f"{source}: [systems.{system}]: systems are {', '.join(SYSTEMS)}")
        for role, count in roles.items():
            if (
                role not in ROLES
                or not isinstance(count, int)
                or isinstance(count, bool)
                or count < 0
            ):
                raise ConfigError(
                    f"{source}: [systems.{system}].{role} must be a count of one of {', '.join(ROLES)}"
                )
        systems[system] = dict(roles)
    config = Config(
        scale=_section(data.get("scale", {}), ScaleConfig, f"{source}: [scale]"),
        model=dict(data.get("model", {})),
        target=str(data.get("target", {}).get("model", Config.target))
        if isinstance(data.get("target"), dict)
        else Config.target,
        wan=_section(data.get("wan", {}), LinkModel, f"{source}: [wan]", _LINK_PARSERS),
        intra=_section(data.get("intra", {}), LinkModel, f"{source}: [intra]", _LINK_PARSERS),
        hardware=hardware,
        systems=systems,
        prefill=_section(data.get("prefill", {}), PrefillConfig, f"{source}: [prefill]"),
        decode=_section(data.get("decode", {}), DecodeConfig, f"{source}: [decode]"),
        policy=_section(data.get("policy", {}), PolicyConfig, f"{source}: [policy]"),
        slo=_section(data.get("slo", {}), SLOConfig, f"{source}: [slo]"),
        workload=_section(
            data.get("workload", {}), WorkloadConfig, f"{source}: [workload]", _WORKLOAD_PARSERS
        ),
        request_timeout_s=float(data.get("request_timeout_s", Config.request_timeout_s)),
        cache_page_tokens=int(data.get("cache_page_tokens", Config.cache_page_tokens)),
        source=source,
    )
    _validate(config)
    return config


def _validate(config: Config) -> None:
    where = config.source
    if config.scale.token_scale < 1 or config.scale.time_scale <= 0:
        raise ConfigError(f"{where}: [scale] token_scale must be >= 1 and time_scale > 0")
    if config.policy.handoff_mode not in HANDOFF_MODES:
        raise ConfigError(
            f"{where}: [policy].handoff_mode must be one of {', '.join(HANDOFF_MODES)}"
        )
    if config.policy.handoff_payload not in HANDOFF_PAYLOADS:
        raise ConfigError(
            f"{where}: [policy].handoff_payload must be one of {', '.join(HANDOFF_PAYLOADS)}"
        )
    if (
        config.prefill.chunk_tokens < config.scale.token_scale
        or config.prefill.chunk_tokens % config.scale.token_scale
    ):
        raise ConfigError(
            f"{where}: [prefill].chunk_tokens must be a multiple of token_scale ({config.scale.token_scale})"
        )
    if config.cache_page_tokens % config.scale.token_scale:
        raise ConfigError(
            f"{where}: cache_page_tokens must be a multiple of token_scale ({config.scale.token_scale})"
        )
    if config.decode.max_batch < 1 or config.prefill.max_batch_chunks < 1:
        raise ConfigError(f"{where}: batch sizes must be at least 1")
    for system, roles in config.systems.items():
        needed = {"pdd": ("P", "RLD", "MD"), "naive": ("P", "MD"), "indc": ("P", "D")}[system]
        for role in needed:
            if roles.get(role, 0) < 1:
                raise ConfigError(f"{where}: [systems.{system}] needs at least one {role}")
            config.hardware_for(system, role)
