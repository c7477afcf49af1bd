"""Rotary position embeddings with a cos/sin table that is bit-identical in every process."""

from __future__ import annotations

import torch

_TABLE_BLOCK = 1024


class RotaryTable:
    """cos/sin of position x frequency, grown on demand in fixed blocks of positions.

    Elementwise kernels may treat an element differently depending on where it falls in the
    tensor, so each block is computed with the same shape: position p gets the same bits
    whatever length the table had when p was first needed.
    """

    def __init__(self, head_dim: int, theta: float, dtype: torch.dtype) -> None:
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
        self._inv_freq = 1.0 / (theta**exponents)
        self._dtype = dtype
        self._cos = torch.empty((0, head_dim // 2), dtype=dtype)
        self._sin = torch.empty((0, head_dim // 2), dtype=dtype)

    def _extend_to(self, positions: int) -> None:
        cos, sin = [self._cos], [self._sin]
        start = self._cos.shape[0]
        while start < positions:
            pos = torch.arange(start, start + _TABLE_BLOCK, dtype=torch.float64)
            angles = torch.outer(pos, self._inv_freq)
            cos.append(torch.cos(angles).to(self._dtype))
            sin.append(torch.sin(angles).to(self._dtype))
            start += _TABLE_BLOCK
        self._cos, self._sin = torch.cat(cos), torch.cat(sin)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x [rows, heads, head_dim] by the position of each row (rotate-half layout)."""
        needed = int(positions.max()) + 1
        if needed > self._cos.shape[0]:
            self._extend_to(needed)
        cos = self._cos[positions].unsqueeze(1)
        sin = self._sin[positions].unsqueeze(1)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
