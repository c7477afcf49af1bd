"""Field checks shared by the profile and instance dataclasses: positive, finite numbers."""

from __future__ import annotations

import math


def positive_number(owner: str, name: str, value: object, error: type[Exception]) -> float:
    """`value` as a float if it is a finite number above zero, else `error` naming the field."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"{owner}: {name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise error(f"{owner}: {name} must be positive and finite, got {value!r}")
    return float(value)


def positive_int(owner: str, name: str, value: object, error: type[Exception]) -> int:
    """`value` if it is an int of at least 1 (bools refused), else `error` naming the field."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(f"{owner}: {name} must be a positive integer, got {value!r}")
    return value


def fraction(owner: str, name: str, value: object, error: type[Exception]) -> float:
    """`value` if it is a number in (0, 1], else `error` naming the field."""
    number = positive_number(owner, name, value, error)
    if number > 1:
        raise error(f"{owner}: {name} must be at most 1 (a fraction of peak), got {value!r}")
    return number
