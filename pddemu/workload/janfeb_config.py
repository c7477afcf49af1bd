"""Parameters of the pdd-janfeb generator, their checks, and the day-by-day hit-rate drift.

Every parameter carries `help` and `source` metadata: "PDD" when it comes from PDD's published
aggregates, "WEKA" or "Mooncake" when measured on or taken from those public traces, "ours" when
it is a choice of this project. `pddemu trace gen` builds its options from them and
docs/traces.md lists them all.

Drift: the hit-rate bucket mixture of day d (0-based, of D days) is
    p(d) = (1 - w(d)) * hit_mix_first_day + w(d) * hit_mix_last_day,
    w(d) = (1 - cos(pi * d / (D - 1))) / 2,
a cosine ramp: flat at both ends of the window, fastest in mid-window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from datetime import date, timedelta
from statistics import NormalDist
from typing import Any

import numpy as np

from pddemu.workload.liso import LISO_MAX_OUTPUT_TOKENS, LISO_MIN_INPUT_TOKENS
from pddemu.workload.stats import HIT_BUCKET_EDGES_PERMILLE

BUCKETS = len(HIT_BUCKET_EDGES_PERMILLE) + 1
# Least share of a lognormal that a truncation range must keep for rejection sampling to be quick.
_MIN_TRUNCATED_MASS = 0.01
_MIX_SUM_TOLERANCE = 1e-3


class GeneratorError(ValueError):
    """A generator parameter out of its domain; the message names the parameter."""


def _param(default: Any, source: str, help: str) -> Any:
    return field(default=default, metadata={"source": source, "help": help})


@dataclass(frozen=True)
class PddJanFebConfig:
    requests: int = _param(2000, "ours", "number of requests, spread evenly over the days")
    first_day: str = _param(
        "2026-01-01", "PDD", "first day of the window (ISO date): the Jan-Feb 2026 traces"
    )
    last_day: str = _param("2026-02-28", "PDD", "last day of the window (ISO date)")
    arrival_rate: float = _param(
        1.0, "ours", "Poisson arrival rate, requests per modelled second, over the whole window"
    )
    block_tokens: int = _param(512, "Mooncake", "tokens per hash_ids block (Mooncake's block size)")
    context_median_tokens: int = _param(
        57_000,
        "PDD+ours",
        "median input of a fresh context (cold start or rewrite); calibrated so that the "
        "median input of all requests, continuations grown, is PDD's 64K",
    )
    context_sigma: float = _param(0.35, "ours", "log-space sigma of fresh context lengths")
    min_input_tokens: int = _param(
        32_768, "ours", "least input of any request (fresh contexts truncated here)"
    )
    max_input_tokens: int = _param(
        262_144, "ours", "largest fresh context; a continuation past it rewrites its context"
    )
    output_median_tokens: int = _param(
        1024, "PDD", "median output of a regular request: PDD's 1K output"
    )
    output_sigma: float = _param(0.35, "ours", "log-space sigma of regular outputs")
    max_output_tokens: int = _param(4096, "ours", "largest regular output")
    hit_mix_first_day: tuple[float, ...] = _param(
        (0.155, 0.145, 0.044, 0.052, 0.140, 0.183, 0.281),
        "PDD+WEKA",
        "bucket shares (0-90, 90-95, 95-97, 97-98, 98-99, 99-99.5, 99.5-100 %) on the first day",
    )
    hit_mix_last_day: tuple[float, ...] = _param(
        (0.100, 0.100, 0.051, 0.060, 0.160, 0.208, 0.321),
        "PDD+WEKA",
        "bucket shares on the last day",
    )
    system_prompt_tokens: int = _param(
        14_948, "WEKA", "system prompt + tools shared by every session (WEKA median)"
    )
    concurrent_sessions: int = _param(
        16, "ours", "sessions open at once; a session's mean turn gap is this / arrival_rate"
    )
    min_turn_gap_s: float = _param(
        30.0,
        "ours",
        "a session's next turn comes at least this long after its previous one (an agent waits "
        "for the answer: ~1K tokens at ~30 ms each); sessions are picked among those ready",
    )
    session_start_fraction: float = _param(
        0.5, "ours", "share of 0-90 % requests that open a new session (others rewrite one)"
    )
    liso_share: float = _param(
        0.035, "PDD", "share of long-input short-output requests (PDD: 3-4 %)"
    )
    liso_low_hit_fraction: float = _param(
        0.8, "ours", "share of long-input short-output requests in the 0-90 % bucket"
    )
    liso_min_output_tokens: int = _param(
        16, "ours", "least output of a long-input short-output request (log-uniform up to 499)"
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "hit_mix_first_day", self._mixture("hit_mix_first_day"))
        object.__setattr__(self, "hit_mix_last_day", self._mixture("hit_mix_last_day"))
        self._check()

    @property
    def days(self) -> list[str]:
        first, last = self._date("first_day"), self._date("last_day")
        return [(first + timedelta(days=d)).isoformat() for d in range((last - first).days + 1)]

    def mixture_on(self, day_index: int) -> np.ndarray:
        """Bucket shares of day `day_index` (0-based): the cosine ramp of the module docstring."""
        span = len(self.days) - 1
        weight = 0.0 if span == 0 else (1 - math.cos(math.pi * day_index / span)) / 2
        first = np.asarray(self.hit_mix_first_day)
        return (1 - weight) * first + weight * np.asarray(self.hit_mix_last_day)

    def _fail(self, name: str, problem: str) -> GeneratorError:
        return GeneratorError(f"pdd-janfeb parameter {name!r} = {getattr(self, name)!r}: {problem}")

    def _date(self, name: str) -> date:
        value = getattr(self, name)
        try:
            return date.fromisoformat(value)
        except (TypeError, ValueError):
            raise self._fail(name, "not an ISO date (YYYY-MM-DD)") from None

    def _mixture(self, name: str) -> tuple[float, ...]:
        value = getattr(self, name)
        try:
            shares = tuple(float(x) for x in value)
        except (TypeError, ValueError):
            raise self._fail(name, f"must be {BUCKETS} numbers") from None
        if len(shares) != BUCKETS:
            raise self._fail(name, f"must have {BUCKETS} bucket shares, got {len(shares)}")
        if any(not math.isfinite(x) or x < 0 for x in shares):
            raise self._fail(name, "shares must be finite and non-negative")
        if abs(sum(shares) - 1) > _MIX_SUM_TOLERANCE:
            raise self._fail(name, f"shares must sum to 1, sum to {sum(shares):.4f}")
        return tuple(x / sum(shares) for x in shares)

    def _integer(self, name: str, minimum: int) -> int:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(name, "must be an integer")
        if value < minimum:
            raise self._fail(name, f"must be at least {minimum}")
        return value

    def _number(self, name: str, low: float, high: float, closed_high: bool = True) -> float:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._fail(name, "must be a number")
        inside = low <= value <= high if closed_high else low <= value < high
        if not math.isfinite(value) or not inside:
            raise self._fail(name, f"must lie in [{low}, {high}{']' if closed_high else ')'}")
        return float(value)

    def _check(self) -> None:
        self._integer("requests", 1)
        if self._date("last_day") < self._date("first_day"):
            raise self._fail("last_day", f"is before first_day {self.first_day}")
        rate = self._number("arrival_rate", 0, math.inf, closed_high=False)
        if rate == 0:
            raise self._fail("arrival_rate", "must be positive")
        block = self._integer("block_tokens", 1)
        low = self._integer("min_input_tokens", max(4096, 8 * block))
        high = self._integer("max_input_tokens", low)
        self._lognormal("context_median_tokens", "context_sigma", low, high)
        self._integer("max_output_tokens", LISO_MAX_OUTPUT_TOKENS + 1)
        self._lognormal(
            "output_median_tokens",
            "output_sigma",
            LISO_MAX_OUTPUT_TOKENS + 1,
            self.max_output_tokens,
        )
        self._integer("concurrent_sessions", 1)
        self._number("min_turn_gap_s", 0, math.inf, closed_high=False)
        self._number("session_start_fraction", 0, 1)
        share = self._number("liso_share", 0, 1)
        low_hit = self._number("liso_low_hit_fraction", 0, 1)
        self._integer("liso_min_output_tokens", 1)
        if self.liso_min_output_tokens > LISO_MAX_OUTPUT_TOKENS:
            raise self._fail("liso_min_output_tokens", f"must be at most {LISO_MAX_OUTPUT_TOKENS}")
        if share > 0 and low < LISO_MIN_INPUT_TOKENS:
            raise self._fail(
                "min_input_tokens",
                f"must be at least {LISO_MIN_INPUT_TOKENS} (the long-input "
                "bound) while liso_share > 0",
            )
        system = self._integer("system_prompt_tokens", 0)
        if 10 * system >= 9 * low:
            raise self._fail(
                "system_prompt_tokens",
                "must stay under 90 % of min_input_tokens, so that a "
                "new session's first request is a 0-90 % hit",
            )
        # The share of low-hit requests that are long-input short-output, liso_share *
        # liso_low_hit_fraction / p0, is a probability on every day; the mixture is linear in
        # the ramp weight, so the two end days bound it.
        for name in ("hit_mix_first_day", "hit_mix_last_day"):
            p0 = getattr(self, name)[0]
            low_liso, high_liso = share * low_hit, share * (1 - low_hit)
            if low_liso > p0 + 1e-12:
                raise self._fail(
                    name,
                    f"its 0-90 % share {p0:.3f} is below the long-input short-output requests "
                    f"meant to be there (liso_share x liso_low_hit_fraction = {low_liso:.3f})",
                )
            if high_liso > 1 - p0 + 1e-12:
                raise self._fail(
                    name,
                    f"its share above 90 % ({1 - p0:.3f}) is below the long-input short-output "
                    f"requests meant to be there (liso_share x (1 - liso_low_hit_fraction) = "
                    f"{high_liso:.3f})",
                )

    def _lognormal(self, median_name: str, sigma_name: str, low: int, high: int) -> None:
        median = self._integer(median_name, 1)
        sigma = self._number(sigma_name, 0, 5)
        if sigma == 0:
            if not low <= median <= high:
                raise self._fail(median_name, f"must lie in [{low}, {high}] when sigma is 0")
            return
        normal = NormalDist(math.log(median), sigma)
        if normal.cdf(math.log(high + 0.5)) - normal.cdf(math.log(low)) < _MIN_TRUNCATED_MASS:
            raise self._fail(
                median_name,
                f"with {sigma_name} = {sigma}, less than 1 % of the lengths fall "
                f"in [{low}, {high}]",
            )


def parameter_fields() -> list[Any]:
    """The dataclass fields of the parameters, in declaration order (for the CLI and docs)."""
    return list(fields(PddJanFebConfig))
