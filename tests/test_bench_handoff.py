"""The handoff micro-benchmark's setup, without a network: its workload and which handoffs it
counts (exactly the asked number of eager tokens, completed, MD's side measured)."""

from __future__ import annotations

from pddemu.bench.handoff import BULK_EVERY, handoffs, workload
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
