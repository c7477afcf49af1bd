"""Chip and target-model profiles: the shipped files, custom files, and every validation error."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from pddemu.hardware import (
    ChipProfile,
    ProfileError,
    TargetModel,
    load_chip,
    load_chips,
    load_target,
    load_targets,
)
from pddemu.hardware.__main__ import main as table_main

CHIP_FIELDS = {
    "peak_flops": 1e12,
    "memory_bytes": 10e9,
    "memory_bw": 1e11,
    "interconnect_bw": 1e10,
    "host_bw": 1e10,
    "price_per_hour": 1.0,
    "source": "made up",
}
TARGET_FIELDS = {
    "total_params": 4e9,
    "active_params": 1e9,
    "n_layers": 2,
    "hidden_size": 1000,
    "kv_bytes_per_token": 1000,
    "weight_bytes_per_param": 2.0,
    "source": "made up",
}


def test_shipped_chips_are_prefill_and_decode_strong() -> None:
    a, b = load_chip("gpu-a"), load_chip("gpu-b")
    assert a.peak_flops > b.peak_flops
    assert b.memory_bw > a.memory_bw
    assert b.memory_bytes > a.memory_bytes
    assert 1.2 <= b.price_per_hour / a.price_per_hour <= 1.3
    assert "Gaudi 3" in a.source and "H200" in b.source
    assert set(load_chips()) == {"gpu-a", "gpu-b"}


def test_shipped_target_is_an_agentic_50kb_model() -> None:
    target = load_target("agentic-50kb")
    assert target.kv_bytes_per_token == 50 * 1024
    assert 25e9 <= target.active_params <= 40e9
    assert 55 <= target.n_layers <= 65
    assert target.weight_bytes == pytest.approx(671e9)
    assert set(load_targets()) == {"agentic-50kb"}


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(ProfileError, match=r"unknown chip 'h100'; known: gpu-a, gpu-b"):
        load_chip("h100")
    with pytest.raises(ProfileError, match=r"unknown target model 'llama'; known: agentic-50kb"):
        load_target("llama")


def write_toml(path: Path, tables: dict[str, dict[str, object]]) -> Path:
    lines = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {json.dumps(value)}" for key, value in table.items())
    path.write_text("\n".join(lines) + "\n")
    return path


def test_custom_profile_files_load(tmp_path: Path) -> None:
    chips = write_toml(tmp_path / "chips.toml", {"tiny": CHIP_FIELDS})
    targets = write_toml(tmp_path / "models.toml", {"small": TARGET_FIELDS})
    chip = load_chip("tiny", chips)
    assert chip == ChipProfile(name="tiny", **CHIP_FIELDS)  # type: ignore[arg-type]
    assert load_target("small", targets).hidden_size == 1000


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"tiny": {k: v for k, v in CHIP_FIELDS.items() if k != "memory_bw"}}, "missing memory_bw"),
        ({"tiny": {**CHIP_FIELDS, "tdp_watts": 700}}, "unknown tdp_watts"),
        ({"tiny": {**CHIP_FIELDS, "peak_flops": -1}}, "peak_flops must be positive"),
        ({"tiny": {**CHIP_FIELDS, "memory_bytes": "80GB"}}, "memory_bytes must be a number"),
        ({"tiny": {**CHIP_FIELDS, "source": ""}}, "source must be a non-empty string"),
        ({}, "no profiles defined"),
    ],
)
def test_bad_chip_files_are_refused(
    tmp_path: Path, tables: dict[str, dict[str, object]], message: str
) -> None:
    path = write_toml(tmp_path / "chips.toml", tables)
    with pytest.raises(ProfileError, match=message) as caught:
        load_chips(path)
    assert str(path) in str(caught.value)


def test_unreadable_or_malformed_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read profile file"):
        load_chips(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[gpu-a\npeak_flops = 1\n")
    with pytest.raises(ProfileError, match="not valid TOML"):
        load_chips(broken)
    flat = tmp_path / "flat.toml"
    flat.write_text("peak_flops = 1\n")
    with pytest.raises(ProfileError, match=r"\[peak_flops\] must be a table"):
        load_chips(flat)


@pytest.mark.parametrize(
    "field_name",
    ["peak_flops", "memory_bytes", "memory_bw", "interconnect_bw", "host_bw", "price_per_hour"],
)
@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "1", None])
def test_every_chip_number_is_checked(field_name: str, bad: object) -> None:
    with pytest.raises(ProfileError, match=field_name):
        ChipProfile(name="x", **{**CHIP_FIELDS, field_name: bad})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field_name", "bad"),
    [
        ("total_params", 0),
        ("total_params", math.inf),
        ("active_params", -1),
        ("weight_bytes_per_param", math.nan),
        ("n_layers", 0),
        ("n_layers", 2.5),
        ("hidden_size", True),
        ("kv_bytes_per_token", -1000),
        ("kv_bytes_per_token", 1000.0),
        ("source", "  "),
        ("name", ""),
    ],
)
def test_every_target_field_is_checked(field_name: str, bad: object) -> None:
    fields = {"name": "x", **TARGET_FIELDS, field_name: bad}
    with pytest.raises(ProfileError, match=field_name):
        TargetModel(**fields)  # type: ignore[arg-type]


def test_active_params_cannot_exceed_total() -> None:
    target = TargetModel(name="x", **TARGET_FIELDS)  # type: ignore[arg-type]
    with pytest.raises(ProfileError, match="active_params .* exceeds total_params"):
        replace(target, active_params=5e9)


MOE_FIELDS = {
    **TARGET_FIELDS,
    "total_params": 10e9,
    "active_params": 3e9,
    "routed_experts": 64,
    "experts_per_token": 4,
    "moe_layers": 2,
    "expert_params": 62.5e6,  # routed 8e9, always active 2e9, active 2e9 + 2 x 4 x 62.5e6 = 2.5e9
}


def test_a_mixture_of_experts_profile_loads() -> None:
    target = TargetModel(name="moe", **{**MOE_FIELDS, "active_params": 2.5e9})  # type: ignore[arg-type]
    assert target.routed_params == pytest.approx(8e9)
    assert target.always_active_params == pytest.approx(2e9)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"active_params": 2.5e9, "experts_per_token": 65}, "experts_per_token .* exceeds"),
        ({"active_params": 2.5e9, "moe_layers": 3}, "moe_layers .* exceeds n_layers"),
        ({"active_params": 2.5e9, "expert_params": 80e6}, "leave nothing"),
        ({}, "active parameters per token"),  # 3e9 stated, 2.5e9 from the experts
        ({"active_params": 2.5e9, "routed_experts": 0}, "routed_experts"),
        ({"active_params": 2.5e9, "expert_params": -1.0}, "expert_params"),
    ],
)
def test_inconsistent_experts_are_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        TargetModel(name="moe", **{**MOE_FIELDS, **changes})  # type: ignore[arg-type]


def test_numbers_are_stored_as_floats() -> None:
    chip = ChipProfile(name="x", **{**CHIP_FIELDS, "memory_bytes": 10_000_000_000})  # type: ignore[arg-type]
    assert isinstance(chip.memory_bytes, float)


def test_step_table_prints_both_chips(capsys: pytest.CaptureFixture[str]) -> None:
    assert table_main(["--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) == {"gpu-a", "gpu-b"}
    steps_a, steps_b = figures["gpu-a"]["steps"], figures["gpu-b"]["steps"]
    prefill = "prefill 8192-token chunk, empty context"
    decode = "decode batch 32 at 65536 context"
    assert steps_a[prefill]["seconds"] < steps_b[prefill]["seconds"]
    assert steps_b[decode]["seconds"] < steps_a[decode]["seconds"]
    assert steps_a[prefill]["bound"] == "compute" and steps_b[decode]["bound"] == "memory"
    assert table_main([]) == 0
    assert "| KV capacity (tokens) |" in capsys.readouterr().out
