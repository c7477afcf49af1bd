"""Queueing disciplines of the shaper's bottleneck, one file each, composed by name.

    fifo            one drop-tail queue (the default of `netem up`)
    fq              per-flow fair queueing by 5-tuple, deficit round robin
    fq_codel        fq with CoDel on each flow's queue (Linux's default; pddemu's default WAN)
    prio[:REST]     strict priority bands by DSCP; the lowest band is REST (fifo, fq or
                    fq_codel; fifo when not given)

Every discipline takes time as an argument and never reads a clock, so the fake-clock tests
and the shaper drive the same code.
"""

from __future__ import annotations

from netem.qdisc.base import Qdisc, Queued
from netem.qdisc.codel import CodelParams
from netem.qdisc.fifo import Fifo
from netem.qdisc.fq import FairQueue, FqCodel
from netem.qdisc.prio import BANDS, Prio, band_of

QDISCS = ("fifo", "fq", "fq_codel", "prio")
PRIO_RESTS = ("fifo", "fq", "fq_codel")

__all__ = [
    "QDISCS",
    "CodelParams",
    "FairQueue",
    "Fifo",
    "FqCodel",
    "Prio",
    "Qdisc",
    "Queued",
    "band_of",
    "check_qdisc",
    "make_qdisc",
]


def check_qdisc(name: str) -> str:
    """The name if it is a known discipline; ValueError naming the choices otherwise."""
    kind, _, rest = name.partition(":")
    if kind not in QDISCS or (rest and (kind != "prio" or rest not in PRIO_RESTS)):
        raise ValueError(
            f"unknown qdisc {name!r}: use fifo, fq, fq_codel, prio, prio:fq or prio:fq_codel"
        )
    return name


def make_qdisc(name: str, limit_bytes: int, mtu: int) -> Qdisc:
    """A fresh discipline by name, holding at most `limit_bytes`; `mtu` is the round-robin
    quantum and the packet size below which CoDel never drops."""
    kind, _, rest = check_qdisc(name).partition(":")
    if kind == "fifo":
        return Fifo(limit_bytes)
    if kind == "fq":
        return FairQueue(limit_bytes, quantum=mtu)
    if kind == "fq_codel":
        return FqCodel(limit_bytes, quantum=mtu, params=CodelParams(mtu=mtu))
    bands = [Fifo(limit_bytes) for _ in range(BANDS - 1)]
    return Prio([*bands, make_qdisc(rest or "fifo", limit_bytes, mtu)])
