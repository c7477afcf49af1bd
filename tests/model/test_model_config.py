from __future__ import annotations

import pytest
import torch

from pddemu.model import VOCAB_SIZE, ConfigError, ModelConfig


def test_defaults_are_small_and_consistent() -> None:
    config = ModelConfig()
    assert (config.n_layers, config.d_model, config.n_heads, config.n_kv_heads) == (2, 128, 4, 2)
    assert config.head_dim == 32
    assert config.vocab_size == VOCAB_SIZE == 258
    assert config.seed == 0
    assert config.torch_dtype is torch.float32


def test_kv_bytes_per_token_counts_k_and_v_of_every_layer() -> None:
    # 2 layers x (K, V) x 2 KV heads x 32 dims x 4 bytes
    assert ModelConfig().kv_bytes_per_token == 2 * 2 * 2 * 32 * 4
    assert ModelConfig(dtype="float64").kv_bytes_per_token == 2 * 2 * 2 * 32 * 8
    assert ModelConfig(n_kv_heads=4).kv_bytes_per_token == 2 * 2 * 4 * 32 * 4


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"n_layers": 0}, "n_layers"),
        ({"d_model": -8}, "d_model"),
        ({"n_heads": 2.0}, "n_heads"),
        ({"n_kv_heads": True}, "n_kv_heads"),
        ({"d_ff": 0}, "d_ff"),
        ({"vocab_size": 100}, "vocab_size"),
        ({"seed": -1}, "seed"),
        ({"d_model": 130}, "d_model"),
        ({"n_heads": 4, "n_kv_heads": 3}, "n_kv_heads"),
        ({"d_model": 12, "n_heads": 4}, "head_dim"),
        ({"rope_theta": 0}, "rope_theta"),
        ({"norm_eps": -1e-5}, "norm_eps"),
        ({"dtype": "float16"}, "dtype"),
    ],
)
def test_invalid_field_raises_naming_it(fields: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        ModelConfig(**fields)


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        ModelConfig(dtype="bfloat16")
