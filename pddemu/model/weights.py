"""Integer weights drawn from a fixed seed: every machine that builds a config gets the same bits.

Each weight is the sum of four uniform 6-bit draws minus 126: an integer in [-126, 126]
(`exact.WEIGHT_BOUND`), bell-shaped with standard deviation ~36.9. The draws come from
Python's `random.Random(seed).getrandbits` (the Mersenne Twister, the same stream on every
platform), not from a library's normal sampler, whose vectorised paths round differently on
different CPUs. Weights are stored as [in, out] so that a layer is `x @ weight`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from pddemu.model.config import ModelConfig

_DRAWS = 4  # uniform draws summed per weight
_DRAW_MAX = 63  # each draw is 0..63
_CENTRE = _DRAWS * _DRAW_MAX // 2
# Variance of a weight: four times that of a uniform draw over 64 values, (64**2 - 1) / 12.
WEIGHT_VARIANCE = _DRAWS * ((_DRAW_MAX + 1) ** 2 - 1) // 12


@dataclass(frozen=True)
class LayerWeights:
    qkv: torch.Tensor  # [d_model, (n_heads + 2 * n_kv_heads) * head_dim]
    out: torch.Tensor  # [n_heads * head_dim, d_model]
    gate_up: torch.Tensor  # [d_model, 2 * d_ff]
    down: torch.Tensor  # [d_ff, d_model]


@dataclass(frozen=True)
class Weights:
    embedding: torch.Tensor  # [vocab, d_model]
    layers: tuple[LayerWeights, ...]
    lm_head: torch.Tensor  # [d_model, vocab]

    @property
    def n_parameters(self) -> int:
        tensors = [self.embedding, self.lm_head]
        for layer in self.layers:
            tensors += [layer.qkv, layer.out, layer.gate_up, layer.down]
        return sum(t.numel() for t in tensors)


def init_weights(config: ModelConfig) -> Weights:
    """All weights of `config`, drawn in a fixed order from `config.seed`."""
    rng = random.Random(config.seed)

    def draw(rows: int, cols: int) -> torch.Tensor:
        count = rows * cols * _DRAWS
        raw = np.frombuffer(rng.getrandbits(8 * count).to_bytes(count, "little"), np.uint8)
        sums = (raw & _DRAW_MAX).reshape(rows * cols, _DRAWS).sum(axis=1, dtype=np.int32)
        return torch.from_numpy((sums - _CENTRE).reshape(rows, cols)).to(config.torch_dtype)

    d, hd = config.d_model, config.head_dim
    qkv_cols = (config.n_heads + 2 * config.n_kv_heads) * hd
    embedding = draw(config.vocab_size, d)
    layers = tuple(
        LayerWeights(
            qkv=draw(d, qkv_cols),
            out=draw(config.n_heads * hd, d),
            gate_up=draw(d, 2 * config.d_ff),
            down=draw(config.d_ff, d),
        )
        for _ in range(config.n_layers)
    )
    return Weights(embedding=embedding, layers=layers, lm_head=draw(d, config.vocab_size))
