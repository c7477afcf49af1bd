"""Shape and numerics of the tiny transformer, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pddemu.model.errors import ConfigError
from pddemu.model.tokenizer import VOCAB_SIZE

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class ModelConfig:
    """Decoder-only transformer sizes. Defaults fit two CPU cores (~0.4 M parameters).

    `n_kv_heads < n_heads` gives grouped-query attention: each KV head serves
    `n_heads // n_kv_heads` query heads, so the KV that crosses the wire is smaller.
    """

    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 256
    vocab_size: int = VOCAB_SIZE
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative int, got {self.seed!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(
                f"head_dim = d_model / n_heads = {self.head_dim} must be even for rotary positions"
            )
        if self.vocab_size < VOCAB_SIZE:
            raise ConfigError(
                f"vocab_size ({self.vocab_size}) must hold the byte tokenizer's {VOCAB_SIZE} ids"
            )
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"{name} must be a positive number, got {value!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V that one genuine token adds to a request's KV (all layers)."""
        itemsize = torch.empty((), dtype=self.torch_dtype).element_size()
        return self.n_layers * 2 * self.n_kv_heads * self.head_dim * itemsize
