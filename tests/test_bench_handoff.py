"""The handoff micro-benchmark's setup, without a network: its workload and which handoffs it
counts (exactly the asked number of eager tokens, completed, MD's side measured)."""

from __future__ import annotations

import json

from pddemu.bench.handoff import BULK_EVERY, handoffs, merged, workload
from pddemu.config import load_config
from pddemu.metrics.records import RequestRecord


def test_the_workload_mixes_samples_and_bulk_transfers() -> None:
    requests = workload(load_config(), samples=20, eager=100, seed=0)
    samples = [r for r in requests if r.request_id.startswith("sample:")]
    bulk = [r for r in requests if r.request_id.startswith("bulk:")]
    assert len(samples) == 20 and len(bulk) == -(-20 // BULK_EVERY)
    assert all(r.output_tokens > 100 for r in samples)
    assert all(r.output_tokens == 1 and r.input_tokens == 65536 for r in bulk)
    arrivals = [r.arrival_s for r in requests]
    assert arrivals == sorted(arrivals)


def test_only_handoffs_of_exactly_the_eager_tokens_count() -> None:
    def record(rid: str, eager: int, state: str = "completed") -> RequestRecord:
        return RequestRecord(
            request_id=rid,
            system="pdd",
            arrival_s=0.0,
            input_tokens=4096,
            expected_output_tokens=300,
            state=state,
            handoff_position=eager,
            rld_tokens=eager,
            handoff_started_s=1.0,
            handoff_resumed_s=1.1,
        )

    records = [
        record("sample:0", 100),
        record("sample:1", 137),  # MD was ready late: more eager tokens
        record("sample:2", 100, state="failed"),
        record("bulk:0", 100),
    ]
    assert [r.request_id for r in handoffs(records, 100)] == ["sample:0"]


def test_a_grid_measured_in_parts_is_merged_per_cell(tmp_path) -> None:
    def cell(qdisc: str, jitter: float, payload: str, handoffs: int) -> dict:
        return {
            "qdisc": qdisc,
            "jitter_ms": jitter,
            "payload": payload,
            "handoffs": handoffs,
            "duplicate_tokens": 0,
            "gap_tokens": 0,
        }

    setup = {"samples_per_cell": 5, "eager_tokens": 100}
    out = tmp_path / "handoff.json"
    earlier = {
        "setup": setup,
        "cells": [cell("prio", 2.0, "extend", 3), cell("fifo", 2.0, "extend", 9)],
    }
    out.write_text(json.dumps(earlier))
    fresh = {"setup": setup, "cells": [cell("fifo", 2.0, "extend", 5)], "wall_s": 1.0}
    combined = merged(fresh, out)
    assert [(c["qdisc"], c["handoffs"]) for c in combined["cells"]] == [("fifo", 5), ("prio", 3)]
    assert not combined["targets"]["at least 5 handoffs of exactly 100 eager tokens per cell"]
    other = {"setup": {**setup, "samples_per_cell": 6}, "cells": [], "wall_s": 1.0}
    assert merged(other, out)["cells"] == []  # another setup's file is replaced, not merged
