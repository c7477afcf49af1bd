"""Lookup tables of the model's non-linear functions, identical on every machine.

The model evaluates SiLU and the rotary cos/sin only by looking them up in integer tables (`exact.py` says why: libm's vectorised and scalar paths round differently,
and differently on different CPUs). The tables are built here with Python's `decimal` module
(its `exp` and `ln` are correctly rounded) and Python integers, in a private context:
platform-independent arithmetic, so every machine builds the same integers. Built once per
process (cached).
"""

from __future__ import annotations

import functools
from decimal import ROUND_HALF_EVEN, Context, Decimal, localcontext

_CONTEXT = Context(prec=50, rounding=ROUND_HALF_EVEN)
_NEGLIGIBLE = Decimal(10) ** -60


def _round(x: Decimal) -> int:
    """Nearest integer, ties to even."""
    return int(x.to_integral_value(rounding=ROUND_HALF_EVEN))


@functools.cache
def silu_table(frac_bits: int, bound: int) -> tuple[int, ...]:
    """round(2**frac_bits * silu(g / 2**frac_bits)) for g = -bound .. bound (index g + bound).

    silu(x) = x / (1 + exp(-x)). Input and output share the fixed-point unit 2**-frac_bits,
    so |entry| <= |g| <= bound.
    """
    with localcontext(_CONTEXT):
        return tuple(
            _round(g / (1 + (Decimal(-g) / 2**frac_bits).exp())) for g in range(-bound, bound + 1)
        )


def _pi() -> Decimal:
    """pi by Machin's formula, 16 atan(1/5) - 4 atan(1/239) (call inside the private context)."""

    def atan_inverse(n: int) -> Decimal:
        total = term = Decimal(1) / n
        k = 1
        while term > _NEGLIGIBLE:
            term /= n * n
            k += 2
            total += term / k if k % 4 == 1 else -term / k
        return total

    return 16 * atan_inverse(5) - 4 * atan_inverse(239)


@functools.cache
def cos_table(phase_bits: int, value_bits: int) -> tuple[int, ...]:
    """round(2**value_bits * cos(2 pi k / 2**phase_bits)) for k = 0 .. 2**phase_bits - 1.

    Built by rotating a 128-bit fixed-point unit vector one table step at a time (Python
    integers; the drift over the whole table is a few units of 2**-128). sin(x) = cos(x - pi/2)
    is the same table read a quarter turn later.
    """
    size = 2**phase_bits
    bits = 128
    with localcontext(_CONTEXT):
        step = 2 * _pi() / size
        cos_step, sin_step, term, k = Decimal(1), step, Decimal(1), 0
        while abs(term) > _NEGLIGIBLE:  # Taylor series of the step angle's cos and sin
            k += 2
            term = -term * step * step / (k * (k - 1))
            cos_step += term
            sin_step += term * step / (k + 1)
        c_step, s_step = int(cos_step * 2**bits), int(sin_step * 2**bits)
    c, s = 1 << bits, 0
    shift = bits - value_bits
    out = []
    for _ in range(size):
        out.append((c + (1 << (shift - 1))) >> shift)
        c, s = (c * c_step - s * s_step) >> bits, (s * c_step + c * s_step) >> bits
    return tuple(out)


@functools.cache
def rotary_phase_steps(head_dim: int, theta: float, frac_bits: int) -> tuple[int, ...]:
    """For each rotary frequency i < head_dim / 2, the turns per position,
    theta**(-2i / head_dim) / (2 pi), as an integer count of 2**-frac_bits turns (rounded)."""
    with localcontext(_CONTEXT):
        two_pi = 2 * _pi()
        log_theta = Decimal(theta).ln()
        return tuple(
            _round((-log_theta * 2 * i / head_dim).exp() / two_pi * 2**frac_bits)
            for i in range(head_dim // 2)
        )
