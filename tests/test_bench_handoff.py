"""The handoff micro-benchmark's setup, without a network: its phases and workload, which
handoffs it counts, and that every cell gets its N handoffs however many samples miss."""

from __future__ import annotations

import itertools
import json

import pytest

from pddemu.bench.handoff import (
    PHASE_LEAD_S,
    SAMPLE_SPACING_S,
    Cell,
    ShortCellError,
    handoffs,
    lag1_autocorrelation,
    measure,
    merged,
    overlapping,
    phases,
    sample_cap,
    schedule_text,
    workload,
)
from pddemu.config import load_config
from pddemu.metrics.records import RequestRecord

FIFO_2 = Cell("extend", 2.0, "fifo")
PRIO_10 = Cell("kv-delta", 10.0, "prio")


def test_each_cell_is_a_phase_of_paced_samples_with_bulk_transfers_throughout() -> None:
    plan = phases([(FIFO_2, 4), (Cell("extend", 10.0, "prio"), 3)])
    assert plan[0].start_s == 0.0 and plan[1].start_s == plan[0].end_s
    assert schedule_text(plan).splitlines() == [
        "0.000 jitter=2ms qdisc=fifo",
        f"{plan[1].start_s:.3f} jitter=10ms qdisc=prio",
    ]
    requests = workload(load_config(), plan, eager=100, seed=0)
    samples = [r for r in requests if r.request_id.startswith("sample:")]
    assert [r.request_id for r in samples[:4]] == [f"sample:0:{i}" for i in range(4)]
    assert len(samples) == 7 and all(r.output_tokens > 100 for r in samples)
    first_phase = [r.arrival_s for r in samples[:4]]
    assert first_phase[0] == PHASE_LEAD_S
    assert all(b - a == pytest.approx(SAMPLE_SPACING_S) for a, b in itertools.pairwise(first_phase))
    assert all(
        p.start_s + PHASE_LEAD_S <= r.arrival_s < p.end_s
        for p, r in zip([plan[0]] * 4 + [plan[1]] * 3, samples, strict=True)
    )
    bulk = [r for r in requests if r.request_id.startswith("bulk:")]
    assert all(r.output_tokens == 1 and r.input_tokens == 65536 for r in bulk)
    assert all(0 < r.arrival_s < plan[-1].end_s for r in bulk)
    arrivals = [r.arrival_s for r in requests]
    assert arrivals == sorted(arrivals)


def record(rid: str, eager: int, state: str = "completed", at: float = 1.0) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        system="pdd",
        arrival_s=0.0,
        input_tokens=4096,
        expected_output_tokens=300,
        state=state,
        handoff_position=eager,
        rld_tokens=eager,
        handoff_started_s=at,
        handoff_resumed_s=at + 0.1,
    )


def test_only_handoffs_of_exactly_the_eager_tokens_count() -> None:
    records = [
        record("sample:0:0", 100),
        record("sample:0:1", 137),  # MD was ready late: more eager tokens
        record("sample:0:2", 100, state="failed"),
        record("bulk:0", 100),
    ]
    assert [r.request_id for r in handoffs(records, 100)] == ["sample:0:0"]


def test_overlapping_handoffs_and_the_autocorrelation_are_reported() -> None:
    records = [
        record("sample:0:0", 100, at=1.0),
        record("sample:0:1", 100, at=1.05),
        record("sample:0:2", 100, at=2.0),
    ]
    assert overlapping(records, records) == 2
    assert lag1_autocorrelation([[0.1, 0.2] * 8])["lag1_autocorrelation"] == pytest.approx(-1.0)
    assert lag1_autocorrelation([[0.1] * 16])["band_95"] == pytest.approx(1.96 / 4)
    # two rounds are two deployments: the pair across their boundary is not a lag-1 pair
    rising = [0.1, 0.2, 0.3, 0.4]
    assert lag1_autocorrelation([rising, rising])["lag1_autocorrelation"] == pytest.approx(1.0)
    assert lag1_autocorrelation([rising + rising])["lag1_autocorrelation"] < 0.5
    assert lag1_autocorrelation([rising, rising])["band_95"] == pytest.approx(1.96 / 8**0.5)


def lossy_source(lose_every: int, sent: dict[Cell, int]):
    """A fake sample source: every `lose_every`-th sample of a cell gives no handoff (it missed
    its phase, or the relay handed over late)."""

    def run_round(asks: dict[Cell, int]) -> dict[Cell, list[int]]:
        got = {}
        for cell, count in asks.items():
            numbers = range(sent.get(cell, 0), sent.get(cell, 0) + count)
            sent[cell] = sent.get(cell, 0) + count
            got[cell] = [n for n in numbers if lose_every == 0 or n % lose_every != lose_every - 1]
        return got

    return run_round


@pytest.mark.parametrize("lose_every", [0, 2, 3, 5])
def test_every_cell_gets_at_least_n_handoffs_however_many_samples_miss(lose_every: int) -> None:
    """One sample in 5 (or 3, or 2) missing: the old rule (send 1.15 N, once) fell short."""
    sent: dict[Cell, int] = {}
    kept = measure([FIFO_2, PRIO_10], 40, lossy_source(lose_every, sent))
    assert all(len(kept[cell]) >= 40 for cell in (FIFO_2, PRIO_10))
    assert all(sent[cell] <= sample_cap(40) for cell in sent)


def test_a_cell_that_cannot_get_its_handoffs_is_named() -> None:
    def run_round(asks: dict[Cell, int]) -> dict[Cell, list[int]]:
        return {cell: [] if cell == PRIO_10 else list(range(count)) for cell, count in asks.items()}

    with pytest.raises(
        ShortCellError, match=r"cell kv-delta, jitter 10 ms, prio: 0 handoffs of 10"
    ):
        measure([FIFO_2, PRIO_10], 10, run_round)


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
        "runs": [{"wall_s": 2.0}],
    }
    out.write_text(json.dumps(earlier))
    fresh = {"setup": setup, "cells": [cell("fifo", 2.0, "extend", 5)], "runs": [{"wall_s": 1.0}]}
    combined = merged(fresh, out)
    assert [(c["qdisc"], c["handoffs"]) for c in combined["cells"]] == [("fifo", 5), ("prio", 3)]
    assert combined["wall_s"] == 3.0
    assert not combined["targets"]["at least 5 handoffs of exactly 100 eager tokens per cell"]
    other = {"setup": {**setup, "samples_per_cell": 6}, "cells": [], "runs": []}
    assert merged(other, out)["cells"] == []  # another setup's file is replaced, not merged
