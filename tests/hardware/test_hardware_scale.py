"""Scale model: the factors, round trips, the emulated WAN, and validation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pddemu.model import ModelConfig
from pddemu.scale import ScaleError, ScaleModel

GENUINE_KV = ModelConfig().kv_bytes_per_token
TARGET_KV = 51200


def default_scale(**changes: object) -> ScaleModel:
    settings: dict[str, object] = {
        "genuine_kv_bytes_per_token": GENUINE_KV,
        "target_kv_bytes_per_token": TARGET_KV,
    }
    settings.update(changes)
    return ScaleModel(**settings)  # type: ignore[arg-type]


def test_default_factors() -> None:
    scale = default_scale()
    assert GENUINE_KV == 1024  # 2 layers x (K, V) x 2 KV heads x 32 dims x 4 B
    assert scale.token_scale == 32 and scale.time_scale == 4.0
    assert scale.byte_scale == pytest.approx(1024 / 32 / 51200)
    assert scale.describe() == {
        "token_scale": 0.03125,
        "time_scale": 4.0,
        "byte_scale": pytest.approx(0.000625),
        "genuine_kv_bytes_per_token": 1024,
        "target_kv_bytes_per_token": 51200,
    }


def test_default_wan_is_emulated_at_25_mbit() -> None:
    rate, delay, jitter = default_scale().emulated_link(10e9, 0.020, 0.002)
    assert rate == pytest.approx(25e6)
    assert delay == pytest.approx(0.005)
    assert jitter == pytest.approx(0.0005)


def test_genuine_tokens_round_up() -> None:
    scale = default_scale()
    assert [scale.genuine_tokens(m) for m in (0, 1, 31, 32, 33, 65536)] == [0, 1, 1, 1, 2, 2048]
    assert scale.modelled_tokens(2048) == 65536


@given(
    token_scale=st.integers(1, 64),
    time_scale=st.floats(0.1, 100),
    genuine_kv=st.integers(1, 1 << 16),
    target_kv=st.integers(1, 1 << 20),
    modelled=st.integers(0, 1 << 24),
    seconds=st.floats(0, 1e6),
)
def test_round_trips(
    token_scale: int,
    time_scale: float,
    genuine_kv: int,
    target_kv: int,
    modelled: int,
    seconds: float,
) -> None:
    scale = ScaleModel(
        genuine_kv_bytes_per_token=genuine_kv,
        target_kv_bytes_per_token=target_kv,
        token_scale=token_scale,
        time_scale=time_scale,
    )
    genuine = scale.genuine_tokens(modelled)
    assert scale.genuine_tokens(scale.modelled_tokens(genuine)) == genuine
    assert modelled <= scale.modelled_tokens(genuine) < modelled + token_scale
    assert scale.wall_to_modelled(scale.modelled_to_wall(seconds)) == pytest.approx(seconds)
    # The genuine KV of whole genuine tokens stands for exactly the target's KV of their tokens.
    genuine_bytes = genuine * genuine_kv
    assert scale.modelled_bytes(genuine_bytes) == pytest.approx(
        scale.modelled_tokens(genuine) * target_kv
    )


@given(
    token_scale=st.integers(1, 64),
    time_scale=st.floats(0.25, 64),
    genuine_tokens=st.integers(1, 1 << 14),
    rate_bps=st.floats(1e8, 4e11),
    delay_s=st.floats(0, 0.2),
)
def test_genuine_transfer_takes_modelled_time_over_time_scale(
    token_scale: int, time_scale: float, genuine_tokens: int, rate_bps: float, delay_s: float
) -> None:
    scale = default_scale(token_scale=token_scale, time_scale=time_scale)
    modelled_tokens = scale.modelled_tokens(genuine_tokens)
    modelled_time = delay_s + modelled_tokens * TARGET_KV * 8 / rate_bps
    rate, delay, _ = scale.emulated_link(rate_bps, delay_s, 0.0)
    wall_time = delay + genuine_tokens * GENUINE_KV * 8 / rate
    assert wall_time == pytest.approx(scale.modelled_to_wall(modelled_time))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"token_scale": 0}, "token_scale"),
        ({"token_scale": 16.0}, "token_scale"),
        ({"token_scale": True}, "token_scale"),
        ({"time_scale": 0}, "time_scale"),
        ({"time_scale": -4}, "time_scale"),
        ({"time_scale": math.nan}, "time_scale"),
        ({"time_scale": math.inf}, "time_scale"),
        ({"time_scale": "4"}, "time_scale"),
        ({"genuine_kv_bytes_per_token": 0}, "genuine_kv_bytes_per_token"),
        ({"target_kv_bytes_per_token": 51.2}, "target_kv_bytes_per_token"),
    ],
)
def test_bad_factors_are_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ScaleError, match=message):
        default_scale(**changes)


def test_factors_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        ScaleModel(16, 4.0, 1024, 51200)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.genuine_tokens(-1), "modelled_tokens"),
        (lambda s: s.genuine_tokens(1.5), "modelled_tokens"),
        (lambda s: s.modelled_tokens(-1), "genuine_tokens"),
        (lambda s: s.modelled_tokens(False), "genuine_tokens"),
        (lambda s: s.modelled_bytes(-1), "genuine_bytes"),
        (lambda s: s.wall_to_modelled(math.nan), "seconds"),
        (lambda s: s.modelled_to_wall(-0.5), "seconds"),
        (lambda s: s.emulated_link(0, 0.02, 0.0), "rate_bps"),
        (lambda s: s.emulated_link(10e9, -0.02, 0.0), "delay_s"),
        (lambda s: s.emulated_link(10e9, 0.02, math.inf), "jitter_s"),
    ],
)
def test_bad_quantities_are_refused(call: object, message: str) -> None:
    with pytest.raises(ScaleError, match=message):
        call(default_scale())  # type: ignore[operator]
