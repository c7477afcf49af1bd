"""When P offered a transfer's KV to the WAN, from what a run directory keeps: MD's transfer,
its sender P's prefill steps and the request's record."""

from __future__ import annotations

from dataclasses import replace

from metrics_samples import completed

from pddemu.metrics.figure_inputs import kv_offered, wan_transfers
from pddemu.metrics.plots import WanTransfer


def test_kv_is_offered_from_mds_hit_on_as_p_computes_it_from_the_routing_on() -> None:
    """A prompt of 100 tokens, 20 in P's cache, 10 in MD's: 90 tokens' KV (900 B) crosses.
    P computes 30 tokens in a step ending at 0.4 s, before the routing at 0.5 s, and the last
    50 by 1.0 s: 40 of the 90 tokens (400 B) are offered at the routing, 500 B at 1.0 s."""
    record = completed("r1", 0.0, [1.1], input_tokens=100, p_hit_tokens=20, md_hit_tokens=10)
    record = replace(record, routed_s=0.5)
    transfer = WanTransfer(0.55, 1.2, 900, [(0.9, 400), (1.2, 500)], "r1", [(0.4, 30), (1.0, 50)])
    assert kv_offered(transfer, record) == [(0.5, 400), (1.0, 500)]
    assert kv_offered(replace(transfer, prefill_steps=[(0.4, 30)]), record) == []  # 50 missing
    assert kv_offered(transfer, replace(record, routed_s=None)) == []


def test_a_transfer_takes_the_prefill_steps_of_its_sender_for_its_leg() -> None:
    def step(rid: str, end_s: float, tokens: int) -> dict[str, object]:
        return {
            "kind": "prefill_chunk",
            "rid": rid,
            "start_s": 0.0,
            "end_s": end_s,
            "tokens": tokens,
        }

    transfer = {"kind": "kv_transfer", "rid": "r1~1", "start_s": 1.0, "end_s": 2.0}
    stats = {
        "P0": {"role": "P", "events": [step("r1", 0.5, 10), step("r1~1", 0.9, 7)]},
        "P1": {"role": "P", "events": [step("r1~1", 0.8, 99)]},
        "MD0": {"role": "MD", "events": [{**transfer, "source": "P0", "genuine_bytes": 70}]},
    }
    (found,) = wan_transfers(stats)
    assert found.request_id == "r1" and found.prefill_steps == [(0.9, 7)]
