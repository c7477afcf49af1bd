"""The WAN classes benchmark at small size: on pddemu's own connections, a control message
waits behind bulk KV in a fifo WAN and not in a prio one (the roles' marks at work)."""

from __future__ import annotations

from pddemu.bench.wan_classes import control_behind_kv
from tests.netem.conftest import run_name  # noqa: F401 - the fixture, for this module
from tests.netem.helpers import measured_twice


def _bulk_filled_the_link(row: dict) -> bool:
    return row["bulk_goodput_bps"] > 0.8 * 20e6  # so a queue could build


def test_control_waits_behind_kv_in_fifo_and_not_in_prio(run_name: str) -> None:  # noqa: F811
    # a small bandwidth-delay product, so the bulk flow fills fifo's queue within the warm-up
    sizes = {"rate_bps": 20e6, "delay_s": 0.005, "seconds": 1.5, "warmup_s": 1.5, "idle_probes": 20}

    def fifo_queues(row: dict) -> bool:
        return _bulk_filled_the_link(row) and row["excess_p50_ms"] >= 10.0

    def prio_keeps_control_apart(row: dict) -> bool:
        # relative, not the benchmark's absolute targets: one busy process runs both ends here
        return _bulk_filled_the_link(row) and row["excess_p50_ms"] < fifo["excess_p50_ms"] / 3

    # the bulk's goodput and the probes' delays are read on the host, which loses CPU now and
    # then: a row that misses is measured once more (tests.netem.helpers); a prio that lets
    # control wait behind KV, or a fifo that does not, misses both times
    fifo = measured_twice(
        lambda: control_behind_kv("fifo", name=f"{run_name}f", **sizes), fifo_queues
    )
    assert fifo_queues(fifo), fifo
    prio = measured_twice(
        lambda: control_behind_kv("prio", name=f"{run_name}p", **sizes), prio_keeps_control_apart
    )
    assert prio_keeps_control_apart(prio), (fifo, prio)
