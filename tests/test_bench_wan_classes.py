"""The WAN classes benchmark at small size: on pddemu's own connections, a control message
waits behind bulk KV in a fifo WAN and not in a prio one (the roles' marks at work)."""

from __future__ import annotations

from pddemu.bench.wan_classes import control_behind_kv
from tests.netem.conftest import run_name  # noqa: F401 - the fixture, for this module


def test_control_waits_behind_kv_in_fifo_and_not_in_prio(run_name: str) -> None:  # noqa: F811
    # a small bandwidth-delay product, so the bulk flow fills fifo's queue within the warm-up
    sizes = {"rate_bps": 20e6, "delay_s": 0.005, "seconds": 1.5, "warmup_s": 1.5, "idle_probes": 20}
    fifo = control_behind_kv("fifo", name=f"{run_name}f", **sizes)
    prio = control_behind_kv("prio", name=f"{run_name}p", **sizes)
    for result in (fifo, prio):  # the bulk filled the link, so a queue could build
        assert result["bulk_goodput_bps"] > 0.8 * 20e6, result
    assert fifo["excess_p50_ms"] >= 10.0, fifo
    # relative, not the benchmark's absolute targets: one busy process runs both ends here
    assert prio["excess_p50_ms"] < fifo["excess_p50_ms"] / 3, (fifo, prio)
