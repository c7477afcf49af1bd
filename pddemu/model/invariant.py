"""Row-invariant building blocks: a row's result never depends on what else is in the call.

Greedy token streams must be identical whether a token is computed in a prefill chunk, in a
decode batch beside other requests, or in an extend pass (the emulator counts any difference as
a `token_mismatch`). Floating-point results depend on summation order, and library kernels pick
their order from the shape of the call. Measured with this project's torch build (MKL) by
`python -m pddemu.bench --only model` (section `kernel_variance`; docs/model.md):

- a row of a matrix product gets different bits when the product has 1-3 rows than inside a
  large product (float32 and float64); in float64 also for other counts that are not a multiple
  of 4; with two threads, for some shapes, even for multiples of 4;
- a product's reduction over a varying inner length (attention weights x values over all past
  tokens) changes with that length even when the extra terms are zeros (float32);
- `torch.nn.functional.silu` gives an element different bits depending on where it falls in
  the tensor (vectorised body versus scalar tail); `torch.exp` does not.

So: one thread; every product has a row count rounded up to a multiple of 4 and a fixed inner
length; sums over a variable number of terms use a pairwise tree whose shape depends only on the
terms' positions; SiLU is written with `exp`.
"""

from __future__ import annotations

import torch

ROW_MULTIPLE = 4


def enable_determinism() -> None:
    """One intra-op thread and deterministic algorithms, process-wide.

    With two threads the product kernels split large products between threads and a row's
    bits can change with the split (measured, see above), so bit-exactness needs one thread.
    The emulator runs several instances on few cores anyway.
    """
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def padded_rows(n: int) -> int:
    """`n` rounded up to the row multiple at which products are row-invariant."""
    return max(ROW_MULTIPLE, -(-n // ROW_MULTIPLE) * ROW_MULTIPLE)


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """`x` with zero rows appended along dim -2 up to `rows` rows."""
    missing = rows - x.shape[-2]
    if missing == 0:
        return x
    pad = x.new_zeros((*x.shape[:-2], missing, x.shape[-1]))
    return torch.cat([x, pad], dim=-2)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [rows, in] @ weight[out, in].T with every row computed independently of the others."""
    rows = x.shape[0]
    return torch.nn.functional.linear(pad_rows(x, padded_rows(rows)), weight)[:rows]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square normalisation over the last dim (a fixed-length per-row reduction)."""
    return x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps) * weight


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x), built from elementwise ops whose results do not depend on position."""
    return x / (1.0 + torch.exp(-x))


def tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` by adding neighbours pairwise, level by level (dim is removed).

    Terms at positions 2i and 2i+1 are added first whatever the total count (an odd last
    term moves up a level unchanged), so appending zero terms (blocks of keys a query cannot
    see, slots of a shorter request in a batch) leaves the result bit-identical.
    """
    while x.shape[dim] > 1:
        n = x.shape[dim]
        half = n // 2
        pairs = x.narrow(dim, 0, 2 * half).unflatten(dim, (half, 2))
        shape = list(x.shape)
        shape[dim] = n - half
        level = x.new_empty(shape)
        torch.add(
            pairs.select(dim + 1, 0), pairs.select(dim + 1, 1), out=level.narrow(dim, 0, half)
        )
        if n % 2:
            level.narrow(dim, half, 1).copy_(x.narrow(dim, n - 1, 1))
        x = level
    return x.squeeze(dim)
