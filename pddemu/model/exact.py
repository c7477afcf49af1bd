"""Integer-valued arithmetic in floating point: results that are the same bits on every CPU.

Floating-point sums depend on their order, and library kernels choose the order (blocking,
vector width, FMA, threads) by CPU, instruction set, shape and thread count. So the model
never lets a rounding happen where a kernel chooses the order:

- Every value that enters a product is an integer of small magnitude stored in a float tensor
  (activations and weights |x| <= 127, softmax weights 0..256; all exactly representable even
  in bfloat16). Every product goes through `exact_matmul`, which sizes the inner dimension so
  that every partial sum is an integer below 2**24 (float32) or 2**53 (float64): every
  addition is exact, so any order, blocking, vector width, FMA or thread split gives the
  same bits. Float32 matmul precision is held at full IEEE (`require_ieee_matmul`).
- Between products, values are requantised: multiplied by powers of two (exact) and rounded
  with `torch.round` (ties to even, the same everywhere), then clamped.
- Non-linear steps use only correctly rounded IEEE operations (+, -, *, /, sqrt, on tensors,
  never fused), comparisons, rounding, clamping and lookups in integer tables (`tables.py`);
  never libm functions (exp, sin, rsqrt, ...), whose vectorised and scalar paths differ.
  The softmax's exp is a polynomial in exact integer steps (`attention._softmax_weights`).
"""

from __future__ import annotations

import torch

from pddemu.model.errors import ModelError

ACT_BOUND = 127  # |activation| entering a product (after requantisation)
WEIGHT_BOUND = 126  # |weight| (sum of four 6-bit draws, centred: see weights.py)
PROB_BOUND = 256  # softmax weights are integers 0 .. 256

# Integers of magnitude up to these are exact in the dtype, and so is every sum of them.
EXACT_LIMIT = {torch.float32: 2**24, torch.float64: 2**53}


def require_ieee_matmul() -> None:
    """Hold float32 products at full IEEE precision, process-wide (no TF32/bfloat16 inputs).

    The model's operands are exact in bfloat16 too, so a down-converting kernel would still
    be exact; this removes the question instead of relying on that.
    """
    torch.set_float32_matmul_precision("highest")
    torch.backends.fp32_precision = "ieee"
    torch.backends.mkldnn.matmul.fp32_precision = "ieee"


def check_ieee_matmul() -> None:
    """Raise ModelError if float32 matmul precision was lowered since `require_ieee_matmul`."""
    if (
        torch.get_float32_matmul_precision() != "highest"
        or torch.backends.mkldnn.matmul.fp32_precision != "ieee"
    ):
        raise ModelError(
            "float32 matmul precision was lowered (torch.set_float32_matmul_precision or "
            "torch.backends.*.fp32_precision) since the model was built; it needs 'highest'/'ieee'"
        )


def exact_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    a_bound: int,
    b_bound: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """a [..., M, K] @ b [..., K, N] for integer-valued a, b with |a| <= a_bound, |b| <= b_bound.

    The model's one product. The callers guarantee the bounds by construction (clamps,
    tables). When K * a_bound * b_bound stays below the dtype's exact limit, one product in
    a's dtype (written into `out` if given); otherwise (float32 only) the inner dimension is
    cut into chunks that stay below it and their partial products are added in float64, where
    the total is exact. The result holds the exact integers, in a's dtype or float64.
    """
    inner = a.shape[-1]
    term = a_bound * b_bound
    limit = EXACT_LIMIT[a.dtype]
    if inner * term < limit:
        return torch.matmul(a, b, out=out)
    if out is not None:
        raise ModelError(f"a product over {inner} terms of up to {term} needs float64 chunks")
    if inner * term >= EXACT_LIMIT[torch.float64]:
        raise ModelError(f"a product over {inner} terms of up to {term} is not exact in float64")
    chunk = 1 << ((limit - 1) // term).bit_length() - 1  # largest power of two that fits
    whole = inner // chunk * chunk
    blocks = torch.matmul(
        a[..., :whole].unflatten(-1, (-1, chunk)).movedim(-2, -3),
        b[..., :whole, :].unflatten(-2, (-1, chunk)),
    )
    out = blocks.sum(dim=-3, dtype=torch.float64)
    if whole < inner:
        out += torch.matmul(a[..., whole:], b[..., whole:, :])
    return out


def exact_sum(x: torch.Tensor, bound: int) -> torch.Tensor:
    """Sum over the last dim of integer-valued x with |x| <= bound: exact, like exact_matmul
    (in x's dtype when every partial sum fits, else chunk sums added in float64)."""
    inner = x.shape[-1]
    limit = EXACT_LIMIT[x.dtype]
    if inner * bound < limit:
        return x.sum(dim=-1)
    chunk = 1 << ((limit - 1) // bound).bit_length() - 1
    whole = inner // chunk * chunk
    out = x[..., :whole].unflatten(-1, (-1, chunk)).sum(dim=-1).sum(dim=-1, dtype=torch.float64)
    return out + x[..., whole:].sum(dim=-1)


def requantize(y: torch.Tensor, shift: int, bound: int = ACT_BOUND) -> torch.Tensor:
    """round(y / 2**shift) clamped to [-bound, bound]: exact scaling, ties to even."""
    return torch.round(y * 2.0**-shift).clamp_(-bound, bound)


def rms_quantize(x: torch.Tensor, gain: int, eps: float) -> torch.Tensor:
    """RMS normalisation of integer rows x [..., d] to activations of rms ~ gain / sqrt(d).

    round(x * gain / sqrt(sum(x**2) + d * eps)), clamped, in float64: the sum of squares of
    integers is exact, the rest are single correctly rounded IEEE operations.
    """
    x = x.to(torch.float64)
    sum_squares = (x * x).sum(dim=-1, keepdim=True) + x.shape[-1] * eps
    return torch.round(x * gain / torch.sqrt(sum_squares)).clamp_(-ACT_BOUND, ACT_BOUND)
