"""Parsing of rates, durations, sizes and percentages, in tc's syntax for rates and times.

Every parser raises `UnitError` naming the text and what was expected, so the CLI can print one
line and exit 2. A bare number is refused for rates, durations and sizes (an unit-less "20"
is ambiguous: tc reads it as microseconds, people mean milliseconds); a bare number is a
percentage for loss, as in tc.
"""

from __future__ import annotations

import re

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_PATTERN = re.compile(r"^\s*(-?)\s*" + _NUMBER + r"\s*([a-zA-Z%]*)\s*$")

# Rates follow tc: "bit" units count bits, "bps" units count bytes; k/m/g are powers of 1000.
_RATE_UNITS = {
    "bit": 1.0,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 8.0,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
    "tbps": 8e12,
}
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6, "ns": 1e-9}
# Sizes are explicit: kb/mb/gb are powers of 1000 and kib/mib/gib powers of 1024 (tc reads
# "kb" as 1024 bytes; an explicit unit leaves no doubt).
_SIZE_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}


class UnitError(ValueError):
    """A quantity that cannot be parsed or is out of range."""


def _split(text: str, what: str) -> tuple[float, str]:
    match = _PATTERN.match(str(text))
    if not match:
        raise UnitError(f"cannot read {what} {text!r}: expected a number with a unit")
    sign, number, unit = match.groups()
    value = float(number)
    if sign:
        raise UnitError(f"{what} {text!r} is negative")
    return value, unit.lower()


def parse_rate(text: str, allow_zero: bool = False) -> float:
    """Rate in bit/s from e.g. '100mbit', '1gbit', '12.5mbps' (bytes/s, as in tc). With
    `allow_zero`, '0' (any unit or none) is a stalled link's rate."""
    value, unit = _split(text, "rate")
    if allow_zero and value == 0 and (unit == "" or unit in _RATE_UNITS):
        return 0.0
    if unit not in _RATE_UNITS:
        raise UnitError(f"unknown rate unit in {text!r}: use one of {', '.join(_RATE_UNITS)}")
    rate = value * _RATE_UNITS[unit]
    if rate <= 0:
        raise UnitError(f"rate {text!r} must be above zero")
    return rate


def parse_duration(text: str) -> float:
    """Duration in seconds from e.g. '20ms', '1.5s', '200us'. Zero needs no unit."""
    value, unit = _split(text, "duration")
    if unit == "" and value == 0:
        return 0.0
    if unit not in _TIME_UNITS:
        raise UnitError(f"unknown time unit in {text!r}: use one of {', '.join(_TIME_UNITS)}")
    return value * _TIME_UNITS[unit]


def parse_size(text: str) -> int:
    """Size in bytes from e.g. '64kb', '5MB', '1mib', '1500b'."""
    value, unit = _split(text, "size")
    if unit not in _SIZE_UNITS:
        raise UnitError(f"unknown size unit in {text!r}: use one of {', '.join(_SIZE_UNITS)}")
    size = int(round(value * _SIZE_UNITS[unit]))
    if size <= 0:
        raise UnitError(f"size {text!r} must be above zero")
    return size


def parse_percent(text: str) -> float:
    """Probability in [0, 1] from '0.5%' or '0.5' (percent, as tc reads a bare number)."""
    value, unit = _split(text, "percentage")
    if unit not in ("", "%"):
        raise UnitError(f"unknown unit in percentage {text!r}: write e.g. '0.5%'")
    if value > 100:
        raise UnitError(f"percentage {text!r} is over 100%")
    return value / 100.0
