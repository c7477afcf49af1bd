"""Mean and percentiles of a sample, with one convention for every metric of a run.

Percentiles interpolate linearly between the two nearest ranks (numpy's default `linear`
method, also what vLLM's benchmark reports); the convention comes from the trace statistics so
that the whole project states percentiles one way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pddemu.workload.stats import PERCENTILE_METHOD

PERCENTILES: tuple[int, ...] = (50, 90, 99)


def describe(values: Sequence[float] | np.ndarray) -> dict[str, float | int | None]:
    """{mean, p50, p90, p99, max, count}; every statistic is None for an empty sample."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        empty: dict[str, float | int | None] = {"mean": None}
        empty.update({f"p{q}": None for q in PERCENTILES})
        empty.update({"max": None, "count": 0})
        return empty
    result: dict[str, float | int | None] = {"mean": float(array.mean())}
    quantiles = np.percentile(array, PERCENTILES, method=PERCENTILE_METHOD)
    result.update({f"p{q}": float(v) for q, v in zip(PERCENTILES, quantiles, strict=True)})
    result.update({"max": float(array.max()), "count": int(array.size)})
    return result


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    """One percentile under the same convention; None for an empty sample."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        return None
    return float(np.percentile(array, q, method=PERCENTILE_METHOD))
