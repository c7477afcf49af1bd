"""Rotary position embeddings in integer fixed point, the same on every machine.

A position's rotation angle for frequency i is its phase in turns, position * step_i, kept
as an exact integer count of 2**-PHASE_FRAC_BITS turns (int64 arithmetic); its top
TABLE_BITS fractional bits index a cos table of 2**TABLE_BITS entries in units of
2**-VALUE_BITS (`tables.cos_table`). Rotating integer activations by integer cos/sin gives
integers below 2**22, exact in float32; they are requantised back to activations.
"""

from __future__ import annotations

import torch

from pddemu.model.errors import ModelError
from pddemu.model.exact import requantize
from pddemu.model.tables import cos_table, rotary_phase_steps

TABLE_BITS = 14  # phase resolution: 2**14 steps per turn
VALUE_BITS = 14  # cos and sin in units of 2**-14
PHASE_FRAC_BITS = 40
# position * step must stay inside int64: steps are below 2**38 (at most 1/(2 pi) turn).
MAX_POSITION = 2**24


class RotaryTable:
    """cos/sin of position x frequency for rotate-half rotary embeddings."""

    def __init__(self, head_dim: int, theta: float, dtype: torch.dtype) -> None:
        self._steps = torch.tensor(rotary_phase_steps(head_dim, theta, PHASE_FRAC_BITS))
        self._cos = torch.tensor(cos_table(TABLE_BITS, VALUE_BITS), dtype=dtype)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate integer x [rows, heads, head_dim] by each row's position (rotate-half);
        returns activations (requantised, clamped)."""
        if int(positions.max()) >= MAX_POSITION:
            raise ModelError(f"position {int(positions.max())} is beyond {MAX_POSITION - 1}")
        phase = (positions[:, None] * self._steps) >> (PHASE_FRAC_BITS - TABLE_BITS)
        mask = 2**TABLE_BITS - 1
        cos = self._cos[phase & mask].unsqueeze(1)
        sin = self._cos[(phase - 2 ** (TABLE_BITS - 2)) & mask].unsqueeze(1)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return requantize(rotated, VALUE_BITS)
