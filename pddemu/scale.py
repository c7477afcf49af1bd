"""The scale model: how a laptop's genuine tokens, bytes and seconds stand for a real cluster's.

Three factors, each a ratio the emulator keeps constant so the behaviour that matters (which
transfer finishes first, how long a WAN crossing takes relative to a decode step) is preserved:

- token scale: one genuine token of the tiny model stands for `token_scale` modelled tokens, so
  attention over a "64K" context stays cheap; the cost model sees modelled lengths.
- byte scale: the genuine KV of one modelled token (genuine KV bytes per token / token_scale)
  is `byte_scale` times the target model's KV bytes per token; the WAN's emulated rate is scaled
  by it so a genuine KV transfer takes as long as the modelled one.
- time scale: the emulation runs `time_scale` times faster than modelled time; every reported
  time is converted back to modelled seconds.

The formulas and a worked example are in docs/hardware.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class ScaleError(ValueError):
    """A scale factor or a quantity to convert is invalid; the message names it."""


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScaleError(f"{name} must be a positive integer, got {value!r}")
    return value


def _number(name: str, value: object, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScaleError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ScaleError(
            f"{name} must be {'positive' if positive else 'non-negative'}, got {value!r}"
        )
    return float(value)


@dataclass(frozen=True, kw_only=True)
class ScaleModel:
    """Conversions between genuine (emulated) and modelled tokens, bytes and seconds.

    `token_scale` is modelled tokens per genuine token; `time_scale` is modelled seconds per
    wall-clock second; the two KV sizes are bytes per token of the tiny model
    (`pddemu.model.ModelConfig.kv_bytes_per_token`) and of the target model.
    """

    genuine_kv_bytes_per_token: int
    target_kv_bytes_per_token: int
    token_scale: int = 32
    time_scale: float = 4.0

    def __post_init__(self) -> None:
        _positive_int("genuine_kv_bytes_per_token", self.genuine_kv_bytes_per_token)
        _positive_int("target_kv_bytes_per_token", self.target_kv_bytes_per_token)
        _positive_int("token_scale", self.token_scale)
        object.__setattr__(
            self, "time_scale", _number("time_scale", self.time_scale, positive=True)
        )

    @property
    def byte_scale(self) -> float:
        """Genuine bytes sent per byte of modelled KV."""
        genuine_per_modelled_token = self.genuine_kv_bytes_per_token / self.token_scale
        return genuine_per_modelled_token / self.target_kv_bytes_per_token

    def modelled_bytes(self, genuine_bytes: float) -> float:
        """Bytes of target-model KV that `genuine_bytes` of genuine KV stand for."""
        return _number("genuine_bytes", genuine_bytes, positive=False) / self.byte_scale

    def genuine_tokens(self, modelled_tokens: int) -> int:
        """Genuine tokens needed to stand for `modelled_tokens` (rounded up: never fewer)."""
        if isinstance(modelled_tokens, bool) or not isinstance(modelled_tokens, int):
            raise ScaleError(f"modelled_tokens must be an integer, got {modelled_tokens!r}")
        if modelled_tokens < 0:
            raise ScaleError(f"modelled_tokens must be non-negative, got {modelled_tokens!r}")
        return -(-modelled_tokens // self.token_scale)

    def modelled_tokens(self, genuine_tokens: int) -> int:
        """Modelled tokens that `genuine_tokens` genuine tokens stand for."""
        if isinstance(genuine_tokens, bool) or not isinstance(genuine_tokens, int):
            raise ScaleError(f"genuine_tokens must be an integer, got {genuine_tokens!r}")
        if genuine_tokens < 0:
            raise ScaleError(f"genuine_tokens must be non-negative, got {genuine_tokens!r}")
        return genuine_tokens * self.token_scale

    def wall_to_modelled(self, seconds: float) -> float:
        """Modelled seconds that `seconds` of wall-clock time stand for."""
        return _number("seconds", seconds, positive=False) * self.time_scale

    def modelled_to_wall(self, seconds: float) -> float:
        """Wall-clock seconds the emulation takes for `seconds` of modelled time."""
        return _number("seconds", seconds, positive=False) / self.time_scale

    def emulated_link(
        self, rate_bps: float, delay_s: float, jitter_s: float = 0.0
    ) -> tuple[float, float, float]:
        """The emulated WAN's (rate bit/s, one-way delay s, jitter s) for a modelled WAN.

        Genuine KV crosses the emulated link, so the rate shrinks by `byte_scale` and grows by
        `time_scale`; delay and jitter shrink by `time_scale`. A transfer of genuine KV then takes
        its modelled time divided by `time_scale` of wall-clock time.
        """
        rate = _number("rate_bps", rate_bps, positive=True)
        delay = _number("delay_s", delay_s, positive=False)
        jitter = _number("jitter_s", jitter_s, positive=False)
        return (
            rate * self.byte_scale * self.time_scale,
            delay / self.time_scale,
            jitter / self.time_scale,
        )

    def describe(self) -> dict[str, Any]:
        """The factors for a report; `token_scale` here is genuine/modelled (e.g. 0.0625)."""
        return {
            "token_scale": 1 / self.token_scale,
            "time_scale": self.time_scale,
            "byte_scale": self.byte_scale,
            "genuine_kv_bytes_per_token": self.genuine_kv_bytes_per_token,
            "target_kv_bytes_per_token": self.target_kv_bytes_per_token,
        }
