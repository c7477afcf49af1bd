"""Max-goodput search: the highest arrival rate whose SLO attainment stays at or above a target.

The convention of vLLM's benchmark sweep (`vllm bench sweep serve_sla`): probe a rate, keep the
highest rate that met the criterion and the lowest that did not, and narrow between the two.
Here the criterion is SLO attainment (requests meeting every SLO ÷ requests, the mean over the
probe's seeds) ≥ the target, and the narrowing is plain bisection:

1. start at the configured arrival rate; double while it passes (up to `rate_max`), halve while
   it fails (down to `rate_min`), until one passing and one failing rate bracket the answer;
   given a `lower` rate expected to pass (a lower bound of capacity, `capacity.py`), the first
   failure is followed by it rather than by half the failing rate;
2. bisect the bracket until the failing rate is within `tolerance` (relative) of the passing one.

The answer is the highest passing rate. It assumes attainment falls as the rate rises; a probe
that contradicts a finished probe cannot widen the bracket (every bisection probe lies inside
it), so noise costs precision, never termination. Goodput there is vLLM's: requests meeting
every SLO ÷ the run's duration (`goodput_rps`).

This module is the search alone, fed one measured attainment at a time, so it can be checked on
any function; `driver` runs its probes as sweep points.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RATE_DIGITS = 4  # significant digits of a probed rate (it names the point: keep it readable)


class SearchError(ValueError):
    """Search parameters that cannot describe a search."""


@dataclass(frozen=True)
class Probe:
    rate: float
    attainment: float
    passed: bool


def rounded(rate: float) -> float:
    return float(f"{rate:.{RATE_DIGITS}g}")


@dataclass
class GoodputSearch:
    target: float  # SLO attainment a rate must reach, in (0, 1]
    start: float  # requests per second
    rate_min: float
    rate_max: float
    tolerance: float = 0.1  # stop when (failing - passing) <= tolerance x passing
    max_probes: int = 16
    lower: float | None = None  # probed after the start fails, before any halving
    probes: list[Probe] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 < self.target <= 1:
            raise SearchError(f"--slo-attainment must be in (0, 1], got {self.target}")
        if not 0 < self.rate_min <= self.start <= self.rate_max:
            raise SearchError(
                f"rates must satisfy 0 < --rate-min ({self.rate_min:g}) <= start "
                f"({self.start:g}) <= --rate-max ({self.rate_max:g})"
            )
        if not 0 < self.tolerance < 1:
            raise SearchError(f"--rate-tolerance must be in (0, 1), got {self.tolerance}")
        if self.lower is not None and not self.rate_min <= self.lower <= self.start:
            raise SearchError(
                f"the lower rate ({self.lower:g}) must lie between --rate-min "
                f"({self.rate_min:g}) and the start ({self.start:g})"
            )
        if self.max_probes < 1:
            raise SearchError(f"--max-probes must be at least 1, got {self.max_probes}")

    def record(self, rate: float, attainment: float) -> None:
        self.probes.append(Probe(rate, attainment, attainment >= self.target))

    @property
    def failing(self) -> float | None:
        """The lowest rate that missed the target."""
        return min((p.rate for p in self.probes if not p.passed), default=None)

    @property
    def passing(self) -> float | None:
        """The highest rate that met the target below every failing one: the answer so far."""
        ceiling = self.failing
        rates = [p.rate for p in self.probes if p.passed and (ceiling is None or p.rate < ceiling)]
        return max(rates, default=None)

    def next_rate(self) -> float | None:
        """The rate to probe next, or None when the search is over (see `status`)."""
        if self.status != "searching":
            return None
        if not self.probes:
            return rounded(self.start)
        passing, failing = self.passing, self.failing
        if failing is None:
            return min(rounded(2 * passing), self.rate_max)
        if passing is None:
            lower = None if self.lower is None else max(rounded(self.lower), self.rate_min)
            if lower is not None and lower < failing and all(p.rate != lower for p in self.probes):
                return lower
            return max(rounded(failing / 2), self.rate_min)
        return rounded((passing + failing) / 2)

    @property
    def status(self) -> str:
        """searching; found (bracketed within the tolerance); at-max (passes at rate_max);
        below-min (fails at rate_min); probe-limit (max_probes used first)."""
        passing, failing = self.passing, self.failing
        if failing is None and passing is not None and passing >= self.rate_max:
            return "at-max"
        if passing is None and failing is not None and failing <= self.rate_min:
            return "below-min"
        if passing is not None and failing is not None:
            middle = rounded((passing + failing) / 2)
            if failing - passing <= self.tolerance * passing or middle in (passing, failing):
                return "found"
        if len(self.probes) >= self.max_probes:
            return "probe-limit"
        return "searching"
