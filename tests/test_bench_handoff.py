"""The handoff micro-benchmark's setup, without a network: its phases and workload (warm-ups,
bulk KV paced alike in every phase), which handoffs it counts, that warm-ups stay out of a
cell's figures, and that every cell gets its N handoffs however many samples miss."""

from __future__ import annotations

import argparse
import itertools
import json
import threading
from dataclasses import replace

import pytest

from pddemu.bench import handoff as bench_handoff
from pddemu.bench.handoff import (
    BULK_CLEAR_S,
    BULK_INTERVAL_S,
    PHASE_LEAD_S,
    SAMPLE_SPACING_S,
    WARMUP_SAMPLES,
    Cell,
    ShortCellError,
    benchmark,
    bulk_offset,
    effective_samples,
    handoffs,
    lag1_autocorrelation,
    measure,
    merged,
    overlapping,
    phase_slots,
    phases,
    sample_cap,
    schedule_text,
    verdict,
    workload,
)
from pddemu.config import load_config
from pddemu.metrics.records import RequestRecord
from pddemu.sweep import provenance

FIFO_2 = Cell("extend", 2.0, "fifo")
PRIO_10 = Cell("kv-delta", 10.0, "prio")


def test_each_cell_is_a_phase_of_warmups_then_paced_samples() -> None:
    plan = phases(
        [(FIFO_2, (0, 1, 2, 3)), (Cell("extend", 10.0, "prio"), (0, 2, 3))],
        size=4,
        bulk_offset_s=1.0,
        warmup=2,
    )
    assert plan[0].start_s == 0.0 and plan[1].start_s == plan[0].end_s
    assert schedule_text(plan).splitlines() == [
        "0.000 jitter=2ms qdisc=fifo",
        f"{plan[1].start_s:.3f} jitter=10ms qdisc=prio",
    ]
    requests = workload(load_config(), plan, eager=100, seed=0)
    sent = [r for r in requests if not r.request_id.startswith("bulk:")]
    assert [r.request_id for r in sent[:6]] == [
        "warmup:0:0",
        "warmup:0:1",
        *(f"sample:0:{i}" for i in range(4)),
    ]
    assert len(sent) == 2 + 4 + 2 + 3 and all(r.output_tokens > 100 for r in sent)
    first_phase = [r.arrival_s for r in sent[:6]]
    assert first_phase[0] == PHASE_LEAD_S
    assert all(b - a == pytest.approx(SAMPLE_SPACING_S) for a, b in itertools.pairwise(first_phase))
    # a phase sending slots 0, 2, 3 leaves slot 1's point empty and is as long as the first
    assert [r.request_id for r in sent[6:]] == ["warmup:1:0", "warmup:1:1"] + [
        f"sample:1:{slot}" for slot in (0, 2, 3)
    ]
    assert sent[8].arrival_s - plan[1].start_s == pytest.approx(PHASE_LEAD_S + 2 * SAMPLE_SPACING_S)
    assert plan[1].end_s - plan[1].start_s == pytest.approx(plan[0].end_s)
    assert all(
        p.start_s + PHASE_LEAD_S <= r.arrival_s < p.end_s
        for p, r in zip([plan[0]] * 6 + [plan[1]] * 5, sent, strict=True)
    )
    arrivals = [r.arrival_s for r in requests]
    assert arrivals == sorted(arrivals)


def test_bulk_kv_is_paced_alike_in_every_phase_from_the_seed() -> None:
    """Bulk requests used to arrive by a Poisson process over the whole run, so phases met 0 to
    5 of them: a confound between cells. Now phases of one size meet the same bulk KV at the
    same points, and the offset is the seed's, the same in every deployment."""
    assert bulk_offset(3) == bulk_offset(3) and 0 <= bulk_offset(3) < BULK_INTERVAL_S
    assert bulk_offset(3) != bulk_offset(4)
    cells = [Cell("kv-delta", j, q) for q in ("fifo", "prio") for j in (2.0, 0.0, 5.0, 10.0)]
    for offset in (0.0, 2.5, bulk_offset(0), BULK_INTERVAL_S - 0.01):
        plan = phases([(cell, tuple(range(33))) for cell in cells], 33, bulk_offset_s=offset)
        relative = {tuple(round(t - p.start_s, 9) for t in p.bulk_s) for p in plan}
        assert len(relative) == 1  # the same count at the same points in every phase
        (points,) = relative
        assert points and points[0] == pytest.approx(offset)
        assert all(b - a == pytest.approx(BULK_INTERVAL_S) for a, b in itertools.pairwise(points))
        assert all(t <= p.end_s - BULK_CLEAR_S for p in plan for t in p.bulk_s)
        requests = workload(load_config(), plan, eager=100, seed=0)
        bulk = [r for r in requests if r.request_id.startswith("bulk:")]
        assert [r.arrival_s for r in bulk] == [t for p in plan for t in p.bulk_s]
        assert all(r.output_tokens == 1 and r.input_tokens == 65536 for r in bulk)


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


def test_a_deployment_with_requests_routed_unmatched_is_not_valid() -> None:
    """Its handoffs would be the emulator's: MD's answer to their match came late."""
    lagging = {"valid": False, "invalid_reason": "mean handler lag 9.00 ms is over its bound"}
    clean = [record("sample:0:0", 100), record("bulk:0", 100)]
    late = [record("sample:0:0", 100), replace(record("bulk:0", 100), unmatched=True)]
    assert verdict({"valid": True, "invalid_reason": None}, clean) == {
        "valid": True,
        "invalid_reason": None,
        "unmatched": 0,
    }
    judged = verdict({"valid": True, "invalid_reason": None}, late)
    assert judged["valid"] is False and judged["unmatched"] == 1
    assert judged["invalid_reason"].startswith("1 requests routed with no decode-side hit")
    both = verdict(lagging, late)
    assert both["invalid_reason"].startswith("mean handler lag 9.00 ms is over its bound; 1 ")


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


def test_the_effective_sample_count_shrinks_with_positive_autocorrelation() -> None:
    assert effective_samples(100, 0.0) == 100
    assert effective_samples(100, 0.5) == pytest.approx(100 / 3, abs=0.1)
    assert effective_samples(100, None) is None and effective_samples(100, -1.0) is None
    both = lag1_autocorrelation([[0.1, 0.2, 0.3, 0.4, 0.5, 0.4, 0.3, 0.2]])
    r = both["lag1_autocorrelation"]
    assert r > 0
    assert both["effective_samples"] == pytest.approx(8 * (1 - r) / (1 + r), abs=0.05)


def test_the_effective_sample_count_never_exceeds_the_samples() -> None:
    """n(1-r)/(1+r) is over n for any negative r: a cell of 101 handoffs at r = -0.06 read as
    worth 114. It is capped at n."""
    assert effective_samples(100, -0.2) == 100
    assert effective_samples(101, -0.06) == 101
    alternating = lag1_autocorrelation([[0.05, 0.08, 0.05, 0.08, 0.05, 0.07, 0.05, 0.08]])
    assert alternating["lag1_autocorrelation"] < 0
    assert alternating["effective_samples"] == 8


def lossy_source(lose_every: int, sent: dict[Cell, int]):
    """A fake sample source: every `lose_every`-th sample of a cell gives no handoff (it missed
    its phase, or the relay handed over late); a handoff is its slot's number."""

    def run_round(asks: dict[Cell, tuple[int, ...]]) -> dict[Cell, dict[int, int]]:
        got = {}
        for cell, slots in asks.items():
            numbers = range(sent.get(cell, 0), sent.get(cell, 0) + len(slots))
            sent[cell] = sent.get(cell, 0) + len(slots)
            got[cell] = {
                slot: slot
                for n, slot in zip(numbers, slots, strict=True)
                if lose_every == 0 or n % lose_every != lose_every - 1
            }
        return got

    return run_round


@pytest.mark.parametrize("lose_every", [0, 2, 3, 5])
def test_every_cell_gets_at_least_n_handoffs_however_many_samples_miss(lose_every: int) -> None:
    """One sample in 5 (or 3, or 2) missing: the old rule (send 1.15 N, once) fell short."""
    sent: dict[Cell, int] = {}
    kept = measure([FIFO_2, PRIO_10], 40, lossy_source(lose_every, sent))
    assert all(len(kept[cell]) >= 40 for cell in (FIFO_2, PRIO_10))
    assert all(set(kept[cell]) <= set(range(phase_slots(40))) for cell in kept)
    assert all(sent[cell] <= sample_cap(40) for cell in sent)


def test_the_slots_per_phase_are_n_plus_a_tenth_rounded_up_exactly() -> None:
    """ceil(100 x 1.1) in floats is 111 (1.1 is 1.100000000000000088...): 110 exactly."""
    assert [phase_slots(n) for n in (1, 10, 30, 31, 100, 1000)] == [2, 11, 33, 35, 110, 1100]


def test_each_deployment_records_the_host_load_before_and_after_it(monkeypatch) -> None:
    """One job's runs are merged with earlier jobs' runs: the load is kept per deployment
    (a job-wide figure kept only the newest job's), with the cells it ran and, when it was
    over the lag bound, why."""
    import contextlib
    import types

    import pddemu.emulate
    import pddemu.emulated_network

    loads = iter([(3.25, 0, 0), (0.5, 0, 0)])
    monkeypatch.setattr(bench_handoff.os, "getloadavg", lambda: next(loads))
    monkeypatch.setattr(
        pddemu.emulated_network, "network_for", lambda *a, **k: contextlib.nullcontext()
    )

    class NoCounters:
        error = None

        def __init__(self, network) -> None: ...

        def __enter__(self):
            return self

        def __exit__(self, *_) -> None: ...

        def between(self, start: float, end: float) -> int:
            return 0

    monkeypatch.setattr(bench_handoff, "TcpCounters", NoCounters)

    async def no_system(system, config, network, requests, out):
        timing = {
            "valid": False,
            "invalid_reason": "mean handler lag 9.00 ms is over its bound 3.50 ms",
            "lag": {"mean_by_kind": {"handler": 0.009}},
        }
        return types.SimpleNamespace(records=[], replay_start_s=0.0, timing=timing, partial=[])

    monkeypatch.setattr(pddemu.emulate, "run_system", no_system)
    plan = phases([(PRIO_10, (0, 1)), (FIFO_2, (0,))], size=2, bulk_offset_s=1.0)
    _, cost = bench_handoff.run_payload(load_config(), plan, 100, 0, None)
    assert cost["host_load"] == {"before": 3.25, "after": 0.5}
    assert cost["invalid_reason"].startswith("mean handler lag 9.00 ms")
    assert cost["lag_mean_by_kind_s"] == {"handler": 0.009}
    assert cost["grid"] == [
        {"qdisc": "prio", "jitter_ms": 10.0},
        {"qdisc": "fifo", "jitter_ms": 2.0},
    ]


def test_a_cell_that_cannot_get_its_handoffs_is_named() -> None:
    def run_round(asks: dict[Cell, tuple[int, ...]]) -> dict[Cell, dict[int, int]]:
        return {
            cell: {} if cell == PRIO_10 else {s: s for s in slots} for cell, slots in asks.items()
        }

    with pytest.raises(
        ShortCellError, match=r"cell kv-delta, jitter 10 ms, prio: 0 handoffs of 10"
    ):
        measure([FIFO_2, PRIO_10], 10, run_round)


def grid_cell(qdisc: str, handoffs: int = 5, **fields) -> dict:
    """A measured cell as `merged` and `judge` read it: extend at 2 ms unless `fields` say."""
    base = {"qdisc": qdisc, "jitter_ms": 2.0, "payload": "extend", "handoffs": handoffs}
    return {**base, "duplicate_tokens": 0, "gap_tokens": 0, **fields}


def test_a_grid_measured_in_parts_is_merged_per_cell(tmp_path) -> None:
    setup = {"samples_per_cell": 5, "eager_tokens": 100}
    out = tmp_path / "handoff.json"
    earlier = {
        "setup": setup,
        "cells": [grid_cell("prio", 3), grid_cell("fifo", 9)],
        "runs": [{"wall_s": 2.0}],
    }
    out.write_text(json.dumps(earlier))
    fresh = {
        "setup": setup,
        "cells": [grid_cell("fifo", 5, runs=[0])],
        "runs": [{"wall_s": 1.0, "host_load": {"before": 0.5, "after": 0.25}}],
    }
    combined = merged(fresh, out)
    assert [(c["qdisc"], c["handoffs"]) for c in combined["cells"]] == [("fifo", 5), ("prio", 3)]
    assert combined["wall_s"] == 3.0
    # the fresh cell points at its own deployment, after the earlier ones, and its load
    assert combined["cells"][0]["runs"] == [1]
    assert combined["runs"][1]["host_load"] == {"before": 0.5, "after": 0.25}
    assert not combined["targets"]["at least 5 handoffs of exactly 100 eager tokens per cell"]
    other = {"setup": {**setup, "eager_tokens": 50}, "cells": [], "runs": []}
    assert merged(other, out)["cells"] == []  # another setup's file is replaced, not merged


def test_cells_measured_at_another_n_are_merged_and_each_judged_by_its_own(tmp_path) -> None:
    """The grid is measured in parts; a part at N = 100 keeps the other parts' cells measured
    at N = 30, each saying its own N (and commit) in `measured`, each judged by its own N."""

    def cell(qdisc: str, handoffs: int, n: int) -> dict:
        measured = {"commit": "abc", "samples_per_cell": n, "slots_per_phase": None}
        return grid_cell(qdisc, handoffs, measured=measured)

    out = tmp_path / "handoff.json"
    setup = {"samples_per_cell": 30, "eager_tokens": 100}
    out.write_text(json.dumps({"setup": setup, "cells": [cell("prio", 31, 30)], "runs": []}))
    fresh = {
        "setup": {**setup, "samples_per_cell": 100, "slots_per_phase": 110},
        "cells": [cell("fifo", 103, 100)],
        "runs": [],
    }
    combined = merged(fresh, out)
    assert [(c["qdisc"], c["measured"]["samples_per_cell"]) for c in combined["cells"]] == [
        ("fifo", 100),
        ("prio", 30),
    ]
    target = "at least each cell's N handoffs of exactly 100 eager tokens per cell"
    assert combined["targets"][target]
    fresh["cells"] = [cell("fifo", 99, 100)]  # short of its own N, though over the other's
    assert not merged(fresh, out)["targets"][target]


def test_only_the_deployments_behind_a_cell_are_judged_and_timed(tmp_path) -> None:
    """A cell measured again replaces the earlier one; the earlier deployment stays in `runs`
    but stands behind no figure: its lag verdict and wall time no longer count."""

    setup = {"samples_per_cell": 5, "eager_tokens": 100}
    out = tmp_path / "handoff.json"
    earlier = {
        "setup": setup,
        "cells": [grid_cell("fifo", runs=[0]), grid_cell("prio", runs=[1])],
        "runs": [{"valid": False, "wall_s": 7.0}, {"valid": True, "wall_s": 2.0}],
    }
    out.write_text(json.dumps(earlier))
    target = "every deployment within the lag bound"
    fresh_run = [{"valid": True, "wall_s": 1.0}]
    fresh = {"setup": setup, "cells": [grid_cell("fifo", runs=[0])], "runs": fresh_run}
    combined = merged(fresh, out)
    assert [c["runs"] for c in combined["cells"]] == [[2], [1]]
    assert len(combined["runs"]) == 3  # the replaced deployment is kept, not judged
    assert combined["targets"][target]
    assert combined["wall_s"] == 3.0
    # the same replaced run still counts while its cell is in the file
    fresh["cells"] = [grid_cell("prio", runs=[0])]
    assert not merged(fresh, out)["targets"][target]
    assert merged(fresh, out)["wall_s"] == 8.0


def test_the_command_prints_its_own_job_time_not_the_merged_files(
    tmp_path, monkeypatch, capsys
) -> None:
    """A 444 s job merged into a file whose earlier deployments took 4,000 s printed
    "(4444 s)": the file's wall_s is the listed deployments' sum, the job's time is its own."""
    setup = {"samples_per_cell": 5, "eager_tokens": 100}
    out = tmp_path / "handoff.json"
    earlier = {"setup": setup, "cells": [grid_cell("prio", runs=[0])], "runs": [{"wall_s": 4e3}]}
    out.write_text(json.dumps(earlier))
    now = iter([1000.0, 1444.0])
    monkeypatch.setattr(bench_handoff.time, "monotonic", lambda: next(now))
    fresh = {"setup": setup, "cells": [grid_cell("fifo", runs=[0])], "runs": [{"wall_s": 440.0}]}
    monkeypatch.setattr(bench_handoff, "benchmark", lambda *args: fresh)
    args = argparse.Namespace(
        report=False,
        doc=None,
        samples=5,
        eager_tokens=100,
        seed=0,
        qdisc=None,
        jitter_ms=None,
        payload=None,
    )
    bench_handoff.run_cli(argparse.Namespace(**vars(args), out=out))
    assert f"wrote {out} (this job 444 s)" in capsys.readouterr().err
    assert json.loads(out.read_text())["wall_s"] == 4440.0


def test_one_payload_is_measured_again_and_the_other_payloads_cells_are_kept(
    tmp_path, monkeypatch
) -> None:
    """`--payload kv-delta` re-measures that payload's cells only (runs 27, 29 and 31 had dated
    the delta's part by its header): one deployment, of kv-delta; merged into the file, the
    extend cells keep their figures and their deployments, the kv-delta cells point at the new
    one, and the earlier kv-delta deployment, over the lag bound, no longer stands behind a
    figure."""
    payloads_deployed = []

    def fake_run_payload(config, plan, eager, seed, scratch):
        payloads_deployed.append(config.policy.handoff_payload)
        cells = {}
        for k, phase in enumerate(plan):
            samples = [
                record(f"sample:{k}:{slot}", eager, at=phase.slot_arrival(slot) + 1.0)
                for slot in phase.slots
            ]
            cells[phase.cell] = fake_cell(phase, samples, [])
        valid = len(payloads_deployed) != 2  # the first job's kv-delta deployment is not
        return cells, {"valid": valid, "wall_s": 1.0, "payload": config.policy.handoff_payload}

    monkeypatch.setattr(bench_handoff, "run_payload", fake_run_payload)
    out = tmp_path / "handoff.json"
    part = {"only_qdiscs": ("prio",), "only_jitters_ms": (2.0,)}
    bench_handoff.write(benchmark(5, 100, **part), out)
    earlier = json.loads(out.read_text())
    assert payloads_deployed == ["extend", "kv-delta"]
    assert not earlier["targets"]["every deployment within the lag bound"]

    fresh = benchmark(5, 100, **part, only_payloads=("kv-delta",))
    assert payloads_deployed[2:] == ["kv-delta"]  # no extend deployment
    assert [c["payload"] for c in fresh["cells"]] == ["kv-delta"]
    combined = merged(fresh, out)
    assert [(c["payload"], c["runs"]) for c in combined["cells"]] == [
        ("extend", [0]),
        ("kv-delta", [2]),
    ]
    assert combined["cells"][0] == earlier["cells"][0]  # extend's cell, figures and all
    assert [r["payload"] for r in combined["runs"]] == ["extend", "kv-delta", "kv-delta"]
    assert combined["targets"]["every deployment within the lag bound"]
    assert combined["wall_s"] == 2.0  # runs 0 and 2, not the replaced run 1


def test_the_payload_flag_is_repeatable_and_checked() -> None:
    parser = argparse.ArgumentParser()
    bench_handoff.add_parser(parser.add_subparsers())
    args = parser.parse_args(["handoff", "--payload", "kv-delta", "--payload", "extend"])
    assert args.payload == ["kv-delta", "extend"]
    assert parser.parse_args(["handoff"]).payload is None  # both
    with pytest.raises(SystemExit):
        parser.parse_args(["handoff", "--payload", "kv"])


def fake_cell(phase, samples: list[RequestRecord], warm: list[RequestRecord]) -> dict:
    """What `run_payload` reports of one phase, for a fake deployment whose handoffs have the
    records given (each one's gap and stall set to its MD-side latency)."""
    for r in warm + samples:
        r.handoff_gap_s = r.handoff_stall_s = r.handoff_latency_s
    return {
        "records": samples,
        "warmup_records": warm,
        "warmup_sent": phase.warmup,
        "bulk_requests": len(phase.bulk_s),
        "samples_sent": phase.samples,
        "duplicate_tokens": 0,
        "gap_tokens": 0,
        "overlapping_handoffs": 0,
    }


def test_warmup_handoffs_are_reported_apart_and_kept_out_of_the_cell(monkeypatch) -> None:
    """A deployment's first handoffs were slow (a start-up transient) and sat in the cells'
    figures; now each phase's first WARMUP_SAMPLES are warm-ups: shown per cell, never in its
    statistics or its lag-1 autocorrelation. A fake deployment stands in for the emulator:
    warm-ups take 500 ms, samples 50-80 ms."""
    deployments = []

    def fake_run_payload(config, plan, eager, seed, scratch):
        deployments.append(plan)
        cells = {}
        for k, phase in enumerate(plan):
            warm = [
                record(f"warmup:{k}:{i}", eager, at=phase.arrival(i) + 1.0)
                for i in range(phase.warmup)
            ]
            for r in warm:
                r.handoff_resumed_s = r.handoff_started_s + 0.5
            samples = [
                record(f"sample:{k}:{slot}", eager, at=phase.slot_arrival(slot) + 1.0)
                for slot in phase.slots
            ]
            for i, r in enumerate(samples):
                r.handoff_resumed_s = r.handoff_started_s + 0.05 + 0.01 * (i % 4)
            cells[phase.cell] = fake_cell(phase, samples, warm)
        return cells, {"valid": True, "wall_s": 1.0}

    monkeypatch.setattr(bench_handoff, "run_payload", fake_run_payload)
    # 15 samples: a phase long enough for a bulk request (at 6 it would meet none, and the
    # bulk check below would compare 0 with 0)
    result = benchmark(15, 100, only_qdiscs=("prio",), only_jitters_ms=(0.0, 10.0))
    code = provenance.code_version()
    assert code is not None  # the tests run from the checkout
    assert all({k: c["measured"][k] for k in code} == code for c in result["cells"])
    assert len(deployments) == 2  # one per payload, every cell's phase in it
    assert all(p.warmup == WARMUP_SAMPLES for plan in deployments for p in plan)
    assert result["setup"]["warmup_samples_per_phase"] == WARMUP_SAMPLES
    assert result["setup"]["bulk_offset_s"] == pytest.approx(bulk_offset(0), abs=1e-3)
    for cell in result["cells"]:
        assert cell["handoffs"] >= 15 and cell["md_latency_ms"]["max"] == pytest.approx(80.0)
        assert cell["warmup"]["handoffs"] == WARMUP_SAMPLES
        assert cell["warmup"]["md_latency_ms"]["mean"] == pytest.approx(500.0)
        assert all(x < 100 for one in cell["md_latency_ms_by_round"] for x in one)
        assert cell["bulk_requests"] == len(deployments[0][0].bulk_s) >= 1
    # wall_s is the deployments' sum, as in a file merged from several jobs
    assert result["wall_s"] == 2.0


def test_the_last_phase_counts_retransmits_up_to_the_closing_reading() -> None:
    """The run ends before its last phase's tail does (its bulk stops 6 s before the end), so
    no reading lies at or after that phase's end: the closing reading stands for it, unless
    the readings stopped early."""
    counters = object.__new__(bench_handoff.TcpCounters)
    counters.readings = [(0.0, 0), (1.0, 5), (2.0, 9)]
    counters.error = None
    counters._thread = threading.Thread(target=lambda: None)  # never started: not alive
    assert counters.between(0.5, 1.5) == 4
    assert counters.between(0.5, 3.0) == 4
    assert counters.between(0.0, 3.0) == 9
    counters.error = "TCP counters stopped: gone"
    assert counters.between(0.5, 3.0) is None


def test_top_up_samples_meet_the_bulk_kv_of_their_slot(monkeypatch) -> None:
    """Top-up rounds (2-6 handoffs in 10 of 16 cells) were short phases of their own with no
    bulk request in them, pooled into the cells' figures: a confound between cells. A fake
    deployment loses every sample arriving within 1 s after a bulk request in the first round:
    the top-up round sends those slots again, each at its own point in a phase as long as the
    first round's, beside the same bulk KV, and a cell takes one handoff per slot."""
    deployments = []

    def fake_run_payload(config, plan, eager, seed, scratch):
        deployments.append(plan)
        first_round = len(deployments) <= 2
        cells = {}
        for k, phase in enumerate(plan):
            samples = []
            for slot in phase.slots:
                at = phase.slot_arrival(slot)
                if first_round and any(0 <= at - b < 1.0 for b in phase.bulk_s):
                    continue  # no handoff: a top-up must send this slot again
                samples.append(record(f"sample:{k}:{slot}", eager, at=at + 1.0))
            cells[phase.cell] = fake_cell(phase, samples, [])
        return cells, {"valid": True, "wall_s": 1.0}

    monkeypatch.setattr(bench_handoff, "run_payload", fake_run_payload)
    result = benchmark(30, 100, only_qdiscs=("fifo",), only_jitters_ms=(2.0, 10.0))
    assert len(deployments) == 4  # a first round and a top-up, one deployment per payload each
    first, top_up = deployments[0], deployments[2]
    assert top_up[0].samples < first[0].samples  # the top-up sends the lost slots only

    def layout(phase):
        return (
            round(phase.end_s - phase.start_s, 9),
            tuple(round(t - phase.start_s, 9) for t in phase.bulk_s),
        )

    assert first[0].bulk_s and {layout(p) for plan in deployments for p in plan} == {
        layout(first[0])
    }
    lost = [
        s
        for s in first[0].slots
        if any(0 <= first[0].slot_arrival(s) - b < 1 for b in first[0].bulk_s)
    ]
    assert top_up[0].slots == tuple(lost)
    for cell in result["cells"]:
        assert cell["handoffs"] == phase_slots(30) >= 30  # one handoff per slot, none twice
        # its deployments: the first round's and the top-up's of its payload
        assert cell["runs"] == ([0, 2] if cell["payload"] == "extend" else [1, 3])
        assert [len(one) for one in cell["md_latency_ms_by_round"]] == [
            phase_slots(30) - len(lost),
            len(lost),
        ]


def test_slots_that_fail_every_time_stop_the_benchmark_early_and_are_named() -> None:
    """Top-ups re-send a cell's failed slots at the same points: 4 slots that never give a
    handoff leave the cell 1 short for good. After STALE_ROUNDS rounds without a new handoff
    the benchmark stops naming those slots (before: top-ups until the cap, ~65 s each)."""
    rounds: list[dict[Cell, tuple[int, ...]]] = []

    def run_round(asks: dict[Cell, tuple[int, ...]]) -> dict[Cell, dict[int, int]]:
        rounds.append(asks)
        return {
            cell: {s: s for s in slots if s not in (3, 7, 11, 19)} for cell, slots in asks.items()
        }

    with pytest.raises(ShortCellError, match=r"29 handoffs of 30 .* slots 3, 7, 11, 19 gave none"):
        measure([FIFO_2], 30, run_round)
    assert len(rounds) == 1 + bench_handoff.STALE_ROUNDS
