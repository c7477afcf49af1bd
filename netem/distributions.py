"""Jitter distributions as netem builds them: a table of quantiles with unit standard deviation.

The kernel backend sends the table to sch_netem (as int16 in units of 1/8192, so values are cut
at about 4 standard deviations); the userspace shaper draws from the same table, so both
backends produce the same distribution for the same parameters. The cut matters for pareto:
an uncut pareto tail delays a packet by many deviations now and then, and without reordering
every packet behind it waits too. After the cut the table is re-centred and re-scaled, so its
standard deviation is exactly the configured jitter.
"""

from __future__ import annotations

import functools
import math
import statistics

TABLE_SIZE = 4096
NETEM_DIST_SCALE = 8192  # netem table units per standard deviation (include/net/pkt_sched.h)
TAIL_LIMIT = 32767 / NETEM_DIST_SCALE  # the largest |value| an int16 table entry can hold
PARETO_SHAPE = 3.0
TABLE_DISTRIBUTIONS = ("normal", "pareto")


@functools.cache
def unit_table(dist: str) -> tuple[float, ...]:
    """TABLE_SIZE quantiles of `dist`, cut at +-TAIL_LIMIT, with mean 0 and standard deviation 1."""
    quantiles = [(i + 0.5) / TABLE_SIZE for i in range(TABLE_SIZE)]
    if dist == "normal":
        normal = statistics.NormalDist()
        values = [normal.inv_cdf(q) for q in quantiles]
    elif dist == "pareto":
        shape = PARETO_SHAPE
        mean = shape / (shape - 1)
        std = math.sqrt(shape / ((shape - 1) ** 2 * (shape - 2)))
        values = [((1 - q) ** (-1 / shape) - mean) / std for q in quantiles]
    else:
        known = ", ".join(TABLE_DISTRIBUTIONS)
        raise ValueError(f"no table for jitter distribution {dist!r}: have {known}")
    for _ in range(50):  # cutting moves mean and deviation: repeat until the cut table is unit
        values = [max(-TAIL_LIMIT, min(TAIL_LIMIT, v)) for v in values]
        centre, spread = statistics.fmean(values), statistics.pstdev(values)
        values = [(v - centre) / spread for v in values]
    return tuple(values)
