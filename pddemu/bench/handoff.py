"""PDD's handoff micro-benchmark: a handoff of exactly 100 eager tokens from the relay to MD
over a jittery WAN shared with bulk KV, with each payload (Extend-Decode: token ids; KV-delta:
the eager tokens' KV). PDD reports, for a 100-token handoff: KV-delta mean 185 ms, peak
512.6 ms, plus 24.5 ms of GPU memory copy; recompute mean 305 ms, max 321.4 ms, std 4.8 ms
("slower on average, immune to jitter and queueing").

    pddemu bench handoff [--samples N] [--eager-tokens 100] [--out FILE]
                         [--payload extend|kv-delta]... [--qdisc fifo|prio]...
                         [--jitter-ms MS]...

`--payload`, `--qdisc` and `--jitter-ms` run part of the grid; the cells measured are merged
into FILE, replacing the same cells of an earlier run of the same setup and keeping the others
(another payload's cells among them) with their deployments.

Real runs of the emulator (namespaces, the shaper, one process per instance), on the default
config except what the setup states. A cell is a payload x WAN jitter x queueing discipline.
The cells of one payload differ only in what the WAN's schedule sets live (jitter, queueing
discipline), so they share one deployment: one phase each, in turn, the schedule switching
the WAN at each phase's start. In a phase:
- requests paced SAMPLE_SPACING_S apart: fresh prompts small enough that MD holds their KV
  well before the relay has streamed `eager_tokens` tokens; the relay hands over one-shot at
  exactly that position (`policy.handoff_after_eager_tokens`); a handoff counts when the relay
  delivered exactly `eager_tokens` tokens and MD the rest, and the handoff (the relay's first
  part to MD's first token) lies inside the phase. The first WARMUP_SAMPLES are warm-ups:
  reported per cell apart (`warmup`), never in its figures (a deployment's first handoffs are
  slow);
- bulk requests paced alike in every phase (`phases`): fresh 64K-token prompts of one output
  token, at the same offsets from each phase's start (the first drawn once from the seed, then
  one per BULK_INTERVAL_S), whose KV crosses the WAN while the samples hand over (the queueing
  PDD's KV-delta suffers from); the anomaly filter is off so their transfers are not cut off.
Every phase of a benchmark has the same sample slots (N plus a margin) at the same points
beside the same bulk KV. A cell keeps sending samples until it has N handoffs (`measure`): the
first round sends every slot; a round after it sends each short cell's slots that gave no
handoff yet, each at its own point in a phase of the same length, beside the same bulk KV, in
one deployment per payload; a cell still short after CAP_FACTOR x N + CAP_EXTRA samples is an
error naming it. A cell's figures take at most one handoff per slot, so a top-up sample meets
the bulk KV its slot meets in every other cell (top-ups used to be short phases of their own,
with no bulk request in them, pooled into the cells they topped up).

The queueing disciplines: `fifo` (the handoff's ids share one queue with the bulk KV) and
`prio` (the roles mark control and token-id connections AF21, bulk KV AF11, and `prio` serves
the control class first).

Reported per cell: the MD-side handoff latency (the relay sends its part -> MD produces its
first token), the user-visible stall (the gap at the switch minus the request's TPOT) and the
gap itself, each as mean, p50, p99, max and std (population), in modelled ms; the TCP segments
the run's namespaces retransmitted during the cell's phases (the kernel's per-namespace
counters, /proc/net/snmp, read as the run's clock passes); and what says whether the samples
are independent: the lag-1 autocorrelation of the MD-side latency in arrival order beside its
95 % band under independence (+-1.96/sqrt(n)), and how many handoffs overlapped another
sample's handoff. Per deployment (`runs`): its wall time, the replay's modelled length and
speed-up, so setup and sampling cost can be told apart, the cells it ran and the host's
1-minute load average before and after it; each cell lists the deployments (indices into
`runs`) that measured it, so its figures can be traced to the load they ran under; a
deployment over the lag bound says why (`invalid_reason`, `lag_mean_by_kind_s`). The file's
`wall_s` is the sum of the wall times of the deployments its cells list (in a file merged from
several jobs, not any one job's time; `python -m pddemu.bench` writes its own job time over it);
the command prints the job's own wall time. The figures
are reported beside the paper's, not fitted to them: docs/validation.md compares them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from netem.clock import SharedClock
from netem.nsexec import command_in
from netem.topology import Network
from pddemu.config import Config, load_config
from pddemu.help_format import HelpFormatter
from pddemu.metrics.records import RequestRecord
from pddemu.metrics.summary import UNMATCHED_CAUSE
from pddemu.sweep.provenance import code_version
from pddemu.workload.replay_source import WorkloadRequest

PAPER = {
    "kv_delta": {"mean_ms": 185.0, "peak_ms": 512.6, "gpu_copy_ms": 24.5},
    "extend": {"mean_ms": 305.0, "max_ms": 321.4, "std_ms": 4.8},
}
PAYLOADS = ("extend", "kv-delta")
JITTERS_MS = (2.0, 0.0, 5.0, 10.0)  # the default first
QDISCS = ("fifo", "prio")
SAMPLE_PROMPT_TOKENS = 4096
SAMPLE_EXTRA_OUTPUT = 100  # tokens MD produces after the switch
SAMPLE_SPACING_S = 0.5  # modelled seconds between a phase's sample arrivals
PHASE_LEAD_S = 0.5  # a phase's WAN settings are in force this long before its first sample
PHASE_TAIL_S = 2.5  # after its last sample arrives, before the next phase's settings
WARMUP_SAMPLES = 2  # each phase's first handoffs: reported apart, never in the cell's figures
BULK_PROMPT_TOKENS = 65536
BULK_INTERVAL_S = 8.0  # modelled seconds between a phase's bulk requests: about half the WAN
BULK_CLEAR_S = 6.0  # a phase's last bulk request arrives at least this long before it ends
OVERRIDES = [
    "policy.routing=always-relay",
    "policy.handoff_mode=one-shot",
    "policy.anomaly_filter=false",
]
# Samples sent per handoff still wanted (a few miss their phase's window); exact, as
# ceil(100 x 1.1) in floats is 111
MARGIN = Fraction(11, 10)
CAP_FACTOR, CAP_EXTRA = 2, 5  # a cell sends at most CAP_FACTOR * N + CAP_EXTRA samples
POLL_S = 0.2  # wall seconds between readings of the TCP counters
STATS = ("mean", "p50", "p99", "max", "std")
# Setup keys a cell records of its own (`measured`): a file merges cells measured at another N
PER_CELL_SETUP = ("samples_per_cell", "slots_per_phase", "top_up")


@dataclass(frozen=True)
class Cell:
    payload: str
    jitter_ms: float
    qdisc: str

    def __str__(self) -> str:
        return f"{self.payload}, jitter {self.jitter_ms:g} ms, {self.qdisc}"


class ShortCellError(RuntimeError):
    """A cell could not get its handoffs within its cap of samples."""


T = TypeVar("T")


# Rounds in a row without a new handoff after which a short cell is given up (its slots fail
# at the same points every time: a top-up cannot help)
STALE_ROUNDS = 2


def sample_cap(wanted: int) -> int:
    return CAP_FACTOR * wanted + CAP_EXTRA


def phase_slots(wanted: int) -> int:
    """The sample slots of every phase: `wanted` plus MARGIN (a few miss their phase)."""
    return math.ceil(wanted * MARGIN)


def measure(
    cells: Iterable[Cell],
    wanted: int,
    run_round: Callable[[dict[Cell, tuple[int, ...]]], dict[Cell, dict[int, T]]],
) -> dict[Cell, dict[int, T]]:
    """Each cell's measured handoffs by slot, at least `wanted` of them: `run_round` is asked
    which slots to send per cell and answers with the handoffs they gave, by slot (some give
    none). The first round sends every slot; rounds go on for the cells still short, each
    sending the slots without a handoff. A top-up re-sends the same slots at the same points,
    so slots that fail every time can never make up the shortfall: raises ShortCellError,
    naming the cell and those slots, when STALE_ROUNDS rounds in a row add no handoff to a
    short cell, or when it has sent its `sample_cap` samples."""
    kept: dict[Cell, dict[int, T]] = {cell: {} for cell in cells}
    sent = dict.fromkeys(kept, 0)
    fruitless = dict.fromkeys(kept, 0)  # rounds in a row that added no handoff to the cell
    cap, size = sample_cap(wanted), phase_slots(wanted)
    while short := [cell for cell, got in kept.items() if len(got) < wanted]:
        stuck = [cell for cell in short if sent[cell] >= cap or fruitless[cell] >= STALE_ROUNDS]
        if stuck:
            raise ShortCellError(
                "; ".join(
                    f"cell {cell}: {len(kept[cell])} handoffs of {wanted} after {sent[cell]} "
                    + (
                        "samples (the cap)"
                        if sent[cell] >= cap
                        else f"samples; slots {_missing(kept[cell], size)} gave none in "
                        f"{STALE_ROUNDS} rounds in a row"
                    )
                    for cell in stuck
                )
            )
        asks = {
            cell: tuple(slot for slot in range(size) if slot not in kept[cell])[: cap - sent[cell]]
            for cell in short
        }
        got = run_round(asks)
        for cell, slots in asks.items():
            sent[cell] += len(slots)
            before = len(kept[cell])
            kept[cell].update((slot, h) for slot, h in got.get(cell, {}).items() if slot in slots)
            fruitless[cell] = fruitless[cell] + 1 if len(kept[cell]) == before else 0
    return kept


def _missing(kept: dict[int, T], size: int) -> str:
    return ", ".join(str(slot) for slot in range(size) if slot not in kept)


@dataclass(frozen=True)
class Phase:
    cell: Cell
    slots: tuple[int, ...]  # the sample slots sent in this phase (a top-up sends a few)
    size: int  # the sample slots of every phase: they fix its length and bulk KV
    start_s: float  # modelled seconds from the replay's start: the WAN takes its settings
    end_s: float  # the next phase's start
    warmup: int = WARMUP_SAMPLES
    bulk_s: tuple[float, ...] = ()  # the bulk requests' arrivals, from the replay's start

    @property
    def samples(self) -> int:
        return len(self.slots)

    def arrival(self, i: int) -> float:
        """The i-th position's arrival: warm-ups first (i < warmup), then the slots."""
        return self.start_s + PHASE_LEAD_S + i * SAMPLE_SPACING_S

    def slot_arrival(self, slot: int) -> float:
        return self.arrival(self.warmup + slot)


def phases(
    asks: list[tuple[Cell, tuple[int, ...]]],
    size: int,
    bulk_offset_s: float = 0.0,
    warmup: int = WARMUP_SAMPLES,
) -> list[Phase]:
    """One phase per cell, back to back from the replay's start, each `size` slots long
    whichever of its slots it sends. Every phase paces its bulk requests alike: one
    `bulk_offset_s` after the phase's start, then one every BULK_INTERVAL_S, the last at least
    BULK_CLEAR_S before the phase ends (so its KV has crossed before the next phase's
    samples): a slot meets the same bulk KV at the same point in every phase, whatever the
    cell or round."""
    out, at = [], 0.0
    length = PHASE_LEAD_S + (warmup + size - 1) * SAMPLE_SPACING_S + PHASE_TAIL_S
    room = length - BULK_CLEAR_S - bulk_offset_s
    count = math.floor(room / BULK_INTERVAL_S) + 1 if room >= 0 else 0
    for cell, slots in asks:
        if any(not 0 <= slot < size for slot in slots):
            raise ValueError(f"slots {slots} outside a phase of {size}")
        bulk = tuple(at + bulk_offset_s + m * BULK_INTERVAL_S for m in range(count))
        out.append(Phase(cell, tuple(slots), size, at, at + length, warmup, bulk))
        at += length
    return out


def schedule_text(plan: list[Phase]) -> str:
    """The WAN's schedule ([wan] schedule): each phase's jitter and discipline at its start."""
    return "".join(
        f"{p.start_s:.3f} jitter={p.cell.jitter_ms:g}ms qdisc={p.cell.qdisc}\n" for p in plan
    )


def bulk_offset(seed: int) -> float:
    """Where, after a phase's start, its first bulk request arrives: drawn once per benchmark
    from its seed, the same in every phase and deployment."""
    return float(np.random.default_rng(seed).uniform(0.0, BULK_INTERVAL_S))


def request_id(kind: str, phase: int, i: int) -> str:
    return f"{kind}:{phase}:{i}"


def workload(config: Config, plan: list[Phase], eager: int, seed: int) -> list[WorkloadRequest]:
    """Each phase's warm-ups and samples, paced, and its bulk requests, paced alike."""
    rng = np.random.default_rng(seed)
    scale = config.scale.token_scale
    sent = [
        (request_id("warmup", k, i), p.arrival(i))
        for k, p in enumerate(plan)
        for i in range(p.warmup)
    ] + [
        (request_id("sample", k, slot), p.slot_arrival(slot))
        for k, p in enumerate(plan)
        for slot in p.slots
    ]
    requests = [
        _request(rid, at, SAMPLE_PROMPT_TOKENS, eager + SAMPLE_EXTRA_OUTPUT, scale, rng)
        for rid, at in sorted(sent, key=lambda x: x[1])
    ]
    bulk = [t for p in plan for t in p.bulk_s]
    requests += [
        _request(f"bulk:{j}", t, BULK_PROMPT_TOKENS, 1, scale, rng) for j, t in enumerate(bulk)
    ]
    return sorted(requests, key=lambda r: r.arrival_s)


def _request(
    rid: str, arrival: float, prompt: int, output: int, scale: int, rng: np.random.Generator
) -> WorkloadRequest:
    return WorkloadRequest(
        request_id=rid,
        arrival_s=arrival,
        input_tokens=prompt,
        output_tokens=output,
        prompt_ids=rng.integers(0, 256, -(-prompt // scale), dtype=np.int32),
        genuine_output_tokens=1 + -(-(output - 1) // scale),
        session=None,
        day=None,
        expected_hit_tokens=0,
        long_input_short_output=False,
        token_scale=scale,
    )


def describe_ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return dict.fromkeys(STATS)
    ms = np.asarray(values) * 1e3
    return {
        "mean": float(ms.mean()),
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "max": float(ms.max()),
        "std": float(ms.std()),
    }


def handoffs(records: list[RequestRecord], eager: int, kind: str = "sample") -> list[RequestRecord]:
    """The requests of `kind` (sample, warmup) whose handoff came exactly at `eager` tokens and
    completed."""
    return [
        r
        for r in records
        if r.request_id.startswith(f"{kind}:")
        and r.state == "completed"
        and r.handoff_position == eager
        and r.rld_tokens == eager
        and r.handoff_latency_s is not None
    ]


def phase_of(record: RequestRecord) -> int:
    return int(record.request_id.split(":")[1])


def slot_of(record: RequestRecord) -> int:
    return int(record.request_id.split(":")[2])


def window(record: RequestRecord, origin: float) -> tuple[float, float] | None:
    """A handoff's span (its first part sent -> MD's first token), from the replay's start."""
    if record.handoff_started_s is None or record.handoff_resumed_s is None:
        return None
    return record.handoff_started_s - origin, record.handoff_resumed_s - origin


def overlapping(kept: list[RequestRecord], records: list[RequestRecord]) -> int:
    """How many of `kept`'s handoffs overlapped in time another request's handoff."""
    spans = {r.request_id: w for r in records if (w := window(r, 0.0)) is not None}
    count = 0
    for record in kept:
        start, end = spans[record.request_id]
        count += any(
            s < end and start < e for rid, (s, e) in spans.items() if rid != record.request_id
        )
    return count


def lag1_autocorrelation(rounds: list[list[float]]) -> dict[str, float | None]:
    """The lag-1 autocorrelation of a cell's MD-side latencies in arrival order, beside the
    band it stays within in 95 % of cells if they are independent (+-1.96/sqrt(n)), and the
    effective sample count. Pairs are taken within each round only: two rounds are two
    deployments, not one sequence."""
    pairs = [(a, b) for latencies in rounds for a, b in itertools.pairwise(latencies)]
    n = sum(len(latencies) for latencies in rounds)
    r1 = None
    if len(pairs) > 1:
        x, y = np.asarray(pairs).T
        if x.std() > 0 and y.std() > 0:
            r1 = float(np.corrcoef(x, y)[0, 1])
    return {
        "lag1_autocorrelation": r1,
        "band_95": 1.96 / math.sqrt(n) if n else None,
        "effective_samples": effective_samples(n, r1),
    }


def effective_samples(n: int, r1: float | None) -> float | None:
    """n(1-r)/(1+r): how many independent samples a series of n with lag-1 autocorrelation r
    is worth for its mean (an AR(1) series; the standard error of the mean grows by
    sqrt(n / effective)), at most n: a conservative cap for every negative r (the formula
    gives more than n for any, though a small one is within its noise band), so a series is
    never reported as worth more samples than it has. None when r is unknown or -1."""
    if r1 is None or n == 0 or r1 <= -1:
        return None
    return round(min(n, n * (1 - r1) / (1 + r1)), 1)


class TcpCounters:
    """The TCP segments the run's namespaces retransmitted, read every POLL_S against the run's
    modelled time (a `sleep` in each namespace: its /proc/<pid>/net/snmp is that namespace's)."""

    def __init__(self, network: Network) -> None:
        self.clock = SharedClock(network.clock_path) if network.clock_path else None
        self.sleepers: list[subprocess.Popen] = []
        try:
            for endpoint in (network.a, network.a2, network.b):
                self.sleepers.append(
                    subprocess.Popen(command_in(endpoint.netns, ["sleep", "infinity"]))
                )
        except BaseException:
            self._stop_sleepers()  # `with` calls no __exit__ for an object never made
            raise
        self.error: str | None = None  # why the readings stopped early, if they did
        self.readings: list[tuple[float, int]] = []  # (modelled s, retransmitted so far)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> TcpCounters:
        deadline = time.monotonic() + 10
        while not all(self._entered(p) for p in self.sleepers):
            if time.monotonic() > deadline:
                self._stop_sleepers()  # nor for one whose __enter__ raised
                raise RuntimeError("bench handoff: could not start a reader in each namespace")
            time.sleep(0.01)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._stop_sleepers()

    def _stop_sleepers(self) -> None:
        for sleeper in self.sleepers:
            sleeper.kill()
            sleeper.wait()

    @staticmethod
    def _entered(process: subprocess.Popen) -> bool:
        try:
            return Path(f"/proc/{process.pid}/comm").read_text().strip() == "sleep"
        except OSError:
            return False

    def total(self) -> int:
        total = 0
        for sleeper in self.sleepers:
            lines = Path(f"/proc/{sleeper.pid}/net/snmp").read_text().splitlines()
            header, values = [line.split() for line in lines if line.startswith("Tcp:")]
            total += int(values[header.index("RetransSegs")])
        return total

    def _poll(self) -> None:
        try:
            while True:
                now = self.clock.now() if self.clock else time.monotonic()
                self.readings.append((now, self.total()))
                if self._stop.wait(POLL_S):
                    self.readings.append(
                        (self.clock.now() if self.clock else time.monotonic(), self.total())
                    )
                    return
        except (OSError, ValueError) as error:  # a namespace gone: later spans read None
            self.error = f"TCP counters stopped: {error}"

    def between(self, start: float, end: float) -> int | None:
        """Retransmitted from modelled time `start` to `end` (the first readings at or after
        each: the span is late by up to POLL_S of wall time at both ends). A span that ends
        after the run did (the last phase's tail) ends at the closing reading, taken when the
        run had ended, unless the readings stopped early."""
        at = [next((n for t, n in self.readings if t >= edge), None) for edge in (start, end)]
        if at[1] is None and self.error is None and not self._thread.is_alive():
            at[1] = self.readings[-1][1] if self.readings else None
        if at[0] is None or at[1] is None:
            return None
        return at[1] - at[0]


def run_payload(
    config: Config, plan: list[Phase], eager: int, seed: int, scratch: Path
) -> tuple[dict[Cell, dict[str, Any]], dict[str, Any]]:
    """One deployment running `plan`'s phases: each cell's result, and the run's costs."""
    import uvloop

    from pddemu.emulate import run_system
    from pddemu.emulated_network import network_for, scale_model

    started, load_before = time.time(), os.getloadavg()[0]
    requests = workload(config, plan, eager, seed)
    with (
        network_for(config, scale_model(config), seed=seed) as network,
        TcpCounters(network) as tcp,
    ):
        run = uvloop.run(run_system("pdd", config, network, requests, scratch))
    origin = run.replay_start_s
    kept_all = handoffs(run.records, eager)
    warm_all = handoffs(run.records, eager, "warmup")
    cells = {}
    for k, phase in enumerate(plan):
        samples = [r for r in run.records if r.request_id.startswith(f"sample:{k}:")]
        eager_ok = [r for r in kept_all if phase_of(r) == k]
        inside = sorted(
            (r for r in eager_ok if _within(window(r, origin), phase)),
            key=lambda r: r.arrival_s,
        )
        warm = sorted((r for r in warm_all if phase_of(r) == k), key=lambda r: r.arrival_s)
        cells[phase.cell] = {
            "records": inside,
            "warmup_records": warm,
            "warmup_sent": phase.warmup,
            "bulk_requests": len(phase.bulk_s),
            "samples_sent": len(samples),
            "samples_failed": sum(1 for r in samples if r.state != "completed"),
            "outside_phase": len(eager_ok) - len(inside),
            "duplicate_tokens": sum(r.duplicate_tokens for r in samples),
            "gap_tokens": sum(r.gap_tokens for r in samples),
            "dropped_stale_tokens": sum(r.dropped_stale_tokens for r in samples),
            "tcp_retransmits": tcp.between(origin + phase.start_s, origin + phase.end_s),
            "overlapping_handoffs": overlapping(inside, run.records),
        }
    finished = [r.finish_s for r in run.records if r.finish_s is not None]
    cost = {
        "payload": plan[0].cell.payload,
        "cells": len(plan),
        "grid": [{"qdisc": p.cell.qdisc, "jitter_ms": p.cell.jitter_ms} for p in plan],
        "samples": sum(p.samples for p in plan),
        "bulk": sum(1 for r in requests if r.request_id.startswith("bulk:")),
        "wall_s": round(time.time() - started, 1),
        "host_load": {"before": load_before, "after": os.getloadavg()[0]},
        "replay_modelled_s": round(max(finished) - origin, 1) if finished else None,
        "speedup": (run.timing.get("dilation") or {}).get("speedup"),
        "slowed_by": dict(
            list(((run.timing.get("dilation") or {}).get("slowed_by") or {}).items())[:3]
        ),
        **verdict(run.timing, run.records),
        "lag_mean_by_kind_s": (run.timing.get("lag") or {}).get("mean_by_kind"),
        "partial": run.partial,
        "tcp_counters_error": tcp.error,
    }
    return cells, cost


def verdict(timing: dict[str, Any], records: list[RequestRecord]) -> dict[str, Any]:
    """A deployment's `valid` and `invalid_reason`: its lag's (the worst kind's mean against
    its bound, a share of TPOT p50), and not valid either when a request, sample, bulk or
    warm-up, was routed with no decode-side hit because MD's answer to its match came late
    (`unmatched`, as `pddemu.metrics.judge_unmatched` judges an emulation): its handoff
    would then be the emulator's, not the modelled system's."""
    unmatched = sum(1 for r in records if r.unmatched)
    valid, reason = timing.get("valid"), timing.get("invalid_reason")
    if unmatched:
        why = f"{unmatched} requests {UNMATCHED_CAUSE} (unmatched)"
        valid, reason = False, f"{reason}; {why}" if reason else why
    return {"valid": valid, "invalid_reason": reason, "unmatched": unmatched}


def _within(span: tuple[float, float] | None, phase: Phase) -> bool:
    return span is not None and phase.start_s <= span[0] and span[1] <= phase.end_s


def benchmark(
    samples: int,
    eager: int,
    seed: int = 0,
    only_qdiscs: tuple[str, ...] = (),
    only_jitters_ms: tuple[float, ...] = (),
    only_payloads: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The grid (or the part asked for), at least `samples` handoffs per cell."""
    overrides = [*OVERRIDES, f"policy.handoff_after_eager_tokens={eager}"]
    base = load_config(None, overrides)
    payloads = tuple(p for p in PAYLOADS if not only_payloads or p in only_payloads)
    qdiscs = tuple(q for q in QDISCS if not only_qdiscs or q in only_qdiscs)
    jitters = tuple(j for j in JITTERS_MS if not only_jitters_ms or j in only_jitters_ms)
    grid = [Cell(p, j, q) for p in payloads for q in qdiscs for j in jitters]
    result: dict[str, Any] = {
        "setup": {
            "config": "configs/default.toml",
            "overrides": overrides,
            "samples_per_cell": samples,
            "eager_tokens": eager,
            "sample_prompt_tokens": SAMPLE_PROMPT_TOKENS,
            "sample_output_tokens": eager + SAMPLE_EXTRA_OUTPUT,
            "sample_spacing_s": SAMPLE_SPACING_S,
            "phase_lead_s": PHASE_LEAD_S,
            "phase_tail_s": PHASE_TAIL_S,
            "bulk_prompt_tokens": BULK_PROMPT_TOKENS,
            "bulk_interval_s": BULK_INTERVAL_S,
            "bulk_clear_s": BULK_CLEAR_S,
            "bulk": "paced alike in every phase",
            "warmup_samples_per_phase": WARMUP_SAMPLES,
            "slots_per_phase": phase_slots(samples),
            "top_up": "a short cell's slots without a handoff, in a phase of the same length "
            "beside the same bulk KV",
            "wan": {"rate_bps": base.wan.rate_bps, "delay_s": base.wan.delay_s},
            "jitters_ms": list(JITTERS_MS),
            "qdiscs": list(QDISCS),
        },
        "paper": PAPER,
        "cells": [],
        "runs": [],
    }
    extra: dict[Cell, dict[str, Any]] = {}
    warmups: dict[Cell, list[list[RequestRecord]]] = {}  # per cell, one list per round
    round_of: dict[int, int] = {}  # id(record) -> the round (deployments) that measured it
    runs_of: dict[Cell, list[int]] = {}  # the deployments (indices into `runs`) of each cell
    rounds_run = 0
    offset = bulk_offset(seed)
    result["setup"]["bulk_offset_s"] = round(offset, 3)
    measured_by = {
        **(code_version() or {"commit": None}),
        **{key: result["setup"][key] for key in PER_CELL_SETUP},
    }

    with tempfile.TemporaryDirectory() as scratch:

        def run_round(asks: dict[Cell, tuple[int, ...]]) -> dict[Cell, dict[int, RequestRecord]]:
            nonlocal rounds_run
            got: dict[Cell, dict[int, RequestRecord]] = {}
            for payload in PAYLOADS:
                plan = phases(
                    [(c, slots) for c, slots in asks.items() if c.payload == payload],
                    phase_slots(samples),
                    offset,
                )
                if not plan:
                    continue
                where = Path(scratch) / f"run-{len(result['runs'])}"
                where.mkdir()
                schedule = where / "wan.schedule"
                schedule.write_text(schedule_text(plan))
                first = plan[0].cell
                config = load_config(
                    None,
                    [
                        *overrides,
                        f"policy.handoff_payload={payload}",
                        f"wan.jitter={first.jitter_ms:g}ms",
                        f"wan.qdisc={first.qdisc}",
                        f"wan.schedule={schedule}",
                    ],
                )
                print(
                    f"bench handoff: {payload}, {len(plan)} cells, "
                    f"{sum(p.samples for p in plan)} samples",
                    file=sys.stderr,
                )
                cells, cost = run_payload(config, plan, eager, seed + len(result["runs"]), where)
                result["runs"].append(cost)
                for cell, measured in cells.items():
                    runs_of.setdefault(cell, []).append(len(result["runs"]) - 1)
                    got[cell] = {slot_of(r): r for r in measured.pop("records")}
                    warmups.setdefault(cell, []).append(measured.pop("warmup_records"))
                    for record in got[cell].values():
                        round_of[id(record)] = rounds_run
                    totals = extra.setdefault(cell, {"rounds": 0, "valid": True})
                    totals["rounds"] += 1
                    totals["valid"] = totals["valid"] and bool(cost["valid"])  # every deployment
                    for key, value in measured.items():  # counts, summed over the rounds
                        known = totals.get(key, 0)
                        totals[key] = None if value is None or known is None else known + value
            rounds_run += 1
            return got

        kept = measure(grid, samples, run_round)
    for cell in grid:
        records = [kept[cell][slot] for slot in sorted(kept[cell])]
        totals = extra[cell]
        by_round = [
            [r for r in records if round_of[id(r)] == k]
            for k in sorted({round_of[id(r)] for r in records})
        ]
        result["cells"].append(
            {
                "payload": cell.payload,
                "jitter_ms": cell.jitter_ms,
                "qdisc": cell.qdisc,
                "handoffs": len(records),
                "measured": measured_by,
                "runs": runs_of[cell],
                **totals,
                "md_latency_ms": describe_ms([r.handoff_latency_s for r in records]),
                "stall_ms": describe_ms([r.handoff_stall_s for r in records]),
                "gap_ms": describe_ms([r.handoff_gap_s for r in records]),
                "tpot_ms": describe_ms([r.tpot_s for r in records if r.tpot_s is not None]),
                "md_latency_ms_by_round": [
                    [round(r.handoff_latency_s * 1e3, 2) for r in one if r.handoff_latency_s]
                    for one in by_round
                ],
                "warmup": warmup_summary(warmups[cell]),
                "independence": {
                    **lag1_autocorrelation(
                        [
                            [r.handoff_latency_s for r in one if r.handoff_latency_s]
                            for one in by_round
                        ]
                    ),
                    "overlapping_handoffs": totals["overlapping_handoffs"],
                },
            }
        )
    result["wall_s"] = deployments_wall_s(result)
    judge(result)
    return result


def warmup_summary(rounds: list[list[RequestRecord]]) -> dict[str, Any]:
    """A cell's warm-up handoffs (each phase's first WARMUP_SAMPLES), kept out of its figures
    but shown: a deployment's first handoffs and those right after the WAN's settings change
    are the slow ones."""
    latencies = [[r.handoff_latency_s for r in one if r.handoff_latency_s] for one in rounds]
    return {
        "handoffs": sum(len(one) for one in latencies),
        "md_latency_ms": describe_ms([x for one in latencies for x in one]),
        "md_latency_ms_by_round": [[round(x * 1e3, 2) for x in one] for one in latencies],
    }


def wanted(cell: dict[str, Any], setup: dict[str, Any]) -> int:
    """The N a cell was measured for (its own, in a file merged from runs at several N)."""
    return cell.get("measured", {}).get("samples_per_cell", setup["samples_per_cell"])


def current_runs(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The deployments some cell lists in its `runs`: those of cells since re-measured stay in
    the file's `runs` but no longer stand behind a figure. All of them if a cell lists none
    (a file from before cells listed their deployments)."""
    runs = result.get("runs", [])
    if any("runs" not in c for c in result["cells"]):
        return runs
    return [runs[i] for i in sorted({i for c in result["cells"] for i in c["runs"]})]


def deployments_wall_s(result: dict[str, Any]) -> float:
    """The file's `wall_s`: the wall time of the deployments behind its cells, summed (one
    meaning for a fresh file and one merged from several jobs)."""
    return round(sum(r.get("wall_s", 0) for r in current_runs(result)), 1)


def judge(result: dict[str, Any]) -> None:
    setup = result["setup"]
    ns = {wanted(c, setup) for c in result["cells"]} or {setup["samples_per_cell"]}
    label = f"{ns.pop()}" if len(ns) == 1 else "each cell's N"
    short = [c for c in result["cells"] if c["handoffs"] < wanted(c, setup)]
    result["targets"] = {
        f"at least {label} handoffs of exactly {setup['eager_tokens']} eager tokens per cell": (
            not short
        ),
        "no duplicate or missing token": all(
            c["duplicate_tokens"] == 0 and c["gap_tokens"] == 0 for c in result["cells"]
        ),
        "every deployment within the lag bound": all(r.get("valid") for r in current_runs(result)),
    }


def merged(result: dict[str, Any], earlier_path: Path) -> dict[str, Any]:
    """`result`'s cells with the other cells of an earlier run of the same setup in the file
    (a grid measured in parts, perhaps at another N: each cell says its own in `measured`); a
    file of another setup is replaced."""
    try:
        earlier = json.loads(earlier_path.read_text())
    except (OSError, ValueError):
        return result

    def shared(setup: Any) -> Any:
        if not isinstance(setup, dict):
            return setup
        return {k: v for k, v in setup.items() if k not in PER_CELL_SETUP}

    if not isinstance(earlier, dict) or shared(earlier.get("setup")) != shared(result["setup"]):
        return result

    def key(cell: dict[str, Any]) -> tuple:
        return (cell["payload"], cell["qdisc"], cell["jitter_ms"])

    fresh = {key(c) for c in result["cells"]}
    before = len(earlier.get("runs", []))  # the fresh runs follow the earlier ones
    cells = [c for c in earlier.get("cells", []) if key(c) not in fresh] + [
        {**c, "runs": [i + before for i in c["runs"]]} if "runs" in c else c
        for c in result["cells"]
    ]
    order = {
        (p, q, j): i
        for i, (p, q, j) in enumerate(
            (p, q, j) for p in PAYLOADS for q in QDISCS for j in JITTERS_MS
        )
    }
    cells.sort(key=lambda c: order.get(key(c), len(order)))
    runs = earlier.get("runs", []) + result.get("runs", [])
    combined = {**result, "cells": cells, "runs": runs}
    combined["wall_s"] = deployments_wall_s(combined)
    judge(combined)
    return combined


def run(quick: bool) -> dict[str, Any]:
    """`make bench`: the paper's setup at 100 handoffs per cell (20 with --quick)."""
    return benchmark(20 if quick else 100, 100)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "handoff",
        help="PDD's handoff micro-benchmark (extend vs kv-delta, jitter, queueing)",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--samples", type=int, default=100, help="handoffs per cell (default 100)")
    parser.add_argument("--eager-tokens", type=int, default=100, help="eager tokens per handoff")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the workload and the WAN's draws (default 0)"
    )
    parser.add_argument(
        "--payload",
        action="append",
        choices=PAYLOADS,
        help="only this handoff payload (repeatable; default both)",
    )
    parser.add_argument(
        "--qdisc", action="append", choices=QDISCS, help="only this discipline (repeatable)"
    )
    parser.add_argument(
        "--jitter-ms",
        action="append",
        type=float,
        choices=JITTERS_MS,
        help="only this WAN jitter (repeatable)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results/handoff.json"),
        help="JSON file of the cells, kept between runs (default bench/results/handoff.json)",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="run nothing: print the table of --out's cells as docs/validation.md shows it",
    )
    parser.add_argument(
        "--doc",
        type=Path,
        help="with --report: replace the handoff table in this Markdown file instead of printing",
    )
    parser.set_defaults(func=run_cli)


def write(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def report(out: Path, doc: Path | None) -> int:
    """`--report`: the docs' table from a committed result, no run."""
    from pddemu.bench import _handoff_table

    try:
        result = json.loads(out.read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"pddemu bench handoff --report: cannot read {out}: {error}") from None
    if doc is None:
        print(_handoff_table.table(result), end="")
        return 0
    try:
        changed = _handoff_table.update_doc(doc, result)
    except (OSError, _handoff_table.TableNotFoundError) as error:
        raise SystemExit(f"pddemu bench handoff --report: {doc}: {error}") from None
    print(f"{doc}: table {'updated' if changed else 'already current'}", file=sys.stderr)
    return 0


def run_cli(args: argparse.Namespace) -> int:
    if args.report:
        return report(args.out, args.doc)
    if args.doc is not None:
        raise SystemExit("pddemu bench handoff: --doc goes with --report")
    if args.samples < 1 or args.eager_tokens < 2:
        raise SystemExit("pddemu bench handoff: --samples must be >= 1 and --eager-tokens >= 2")
    started = time.monotonic()
    try:
        result = benchmark(
            args.samples,
            args.eager_tokens,
            args.seed,
            tuple(args.qdisc or ()),
            tuple(args.jitter_ms or ()),
            tuple(args.payload or ()),
        )
    except ShortCellError as error:
        raise SystemExit(f"pddemu bench handoff: {error}") from None
    job_s = time.monotonic() - started  # this job's own, before the merge adds earlier jobs'
    result = merged(result, args.out)
    write(result, args.out)
    print(f"wrote {args.out} (this job {job_s:.0f} s)", file=sys.stderr)
    return 0 if all(result["targets"].values()) else 1
