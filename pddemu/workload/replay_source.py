"""The emulator's one entry to workloads: `load_workload` turns a generator name or a trace file
into timed requests with genuine token sequences.

Order and time: requests are replayed in arrival order. Mooncake, Bailian, BurstGPT and CSV
files have a global clock (shifted so the first request is at 0). WEKA files, and Mooncake files
whose turns give only a `delay`, have per-session times only: sessions start at Poisson spacing
(`session_rate` per modelled second, seeded), in file order, each keeping its recorded offsets.
ShareGPT files, and Mooncake files whose lines give no timestamp, delay or session, have no
times at all: they replay in file order at `arrival_rate`, which must be given (a line of that
kind in a file of sessions is a session of its own). `arrival_rate` re-times any order as a Poisson process. `requests=N` keeps the first N
requests in arrival order, which keeps every session's prefix structure (a random subset would
cut sessions apart); for pdd-janfeb it is the number of requests generated over the whole
window.

`expected_hit_tokens` is the hit of a request under an infinite cache over the replayed
requests in arrival order (the same rule as `trace stats`); `None` for length-only traces.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pddemu.workload.arrivals import (
    ARRIVAL_STREAM,
    SESSION_START_STREAM,
    ArrivalError,
    check_rate,
    poisson_arrivals,
    poisson_starts,
    stream,
)
from pddemu.workload.expansion import expand_prompt, genuine_output_length
from pddemu.workload.formats import detect_format, read_trace
from pddemu.workload.janfeb import PDD_JANFEB, generate_pdd_janfeb
from pddemu.workload.janfeb_config import PddJanFebConfig
from pddemu.workload.liso import LISO_RULE, LongInputShortOutputRule
from pddemu.workload.records import TraceError, TraceRequest
from pddemu.workload.stats import PrefixHitCounter
from pddemu.workload.synthetic import SYNTHETIC, SyntheticShape, synthetic_records

# WEKA conversations started per modelled second: with the file's mean of 69.5 requests per
# conversation, about 1.2 requests/s once the conversations overlap.
DEFAULT_SESSION_RATE = 1 / 60
# Length-only traces: every prompt starts with the same prefix of this many tokens (whole
# blocks of LENGTH_ONLY_BLOCK_TOKENS), a common system prompt; the rest is its own.
DEFAULT_LENGTH_ONLY_PREFIX_TOKENS = 1024
LENGTH_ONLY_BLOCK_TOKENS = 512


class WorkloadError(ValueError):
    """Arguments of `load_workload` that describe no workload; the message names the argument."""


@dataclass(frozen=True, eq=False)
class WorkloadRequest:
    """One request to replay. Token counts are modelled unless named genuine.

    - `request_id`: stable, "<source>:<index in the source>" (the file's order, or the
      generator's), whatever the sampling and arrival process;
    - `arrival_s`: modelled seconds from the start of the replay (the first request at 0);
    - `prompt_ids`: int32 genuine token ids in 0..255, ceil(input_tokens / token_scale) of them;
    - `genuine_output_tokens`: 1 + ceil((output_tokens - 1) / token_scale);
    - `output_tokens`: at least 1 (the prefill's first token): a recorded 0 is replayed as 1;
    - `long_input_short_output`: by `pddemu.workload.liso`'s rule (input >= 32K, output < 500).

    Equality is identity (`eq=False`): the numpy id array has no single truth value.
    """

    request_id: str
    arrival_s: float
    input_tokens: int
    output_tokens: int
    prompt_ids: np.ndarray
    genuine_output_tokens: int
    session: str | None
    day: str | None
    expected_hit_tokens: int | None
    long_input_short_output: bool
    token_scale: int

    @property
    def genuine_input_tokens(self) -> int:
        return int(self.prompt_ids.size)


def _check_arguments(
    requests: int | None, seed: int, token_scale: int, length_only_prefix_tokens: int
) -> None:
    if requests is not None and (
        isinstance(requests, bool) or not isinstance(requests, int) or requests < 1
    ):
        raise WorkloadError(f"requests must be None or an integer >= 1, got {requests!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise WorkloadError(f"seed must be a non-negative integer, got {seed!r}")
    if isinstance(token_scale, bool) or not isinstance(token_scale, int) or token_scale < 1:
        raise WorkloadError(f"token_scale must be an integer >= 1, got {token_scale!r}")
    if (
        isinstance(length_only_prefix_tokens, bool)
        or not isinstance(length_only_prefix_tokens, int)
        or length_only_prefix_tokens < 0
    ):
        raise WorkloadError(
            f"length_only_prefix_tokens must be a non-negative integer, "
            f"got {length_only_prefix_tokens!r}"
        )


def load_workload(
    source: str | Path,
    *,
    requests: int | None,
    seed: int,
    token_scale: int,
    arrival_rate: float | None = None,
    session_rate: float = DEFAULT_SESSION_RATE,
    format: str | None = None,
    janfeb: PddJanFebConfig | None = None,
    length_only_prefix_tokens: int = DEFAULT_LENGTH_ONLY_PREFIX_TOKENS,
    liso_rule: LongInputShortOutputRule = LISO_RULE,
    block_size: int | None = None,
    synthetic: SyntheticShape | None = None,
) -> list[WorkloadRequest]:
    """The requests of `source` ("pdd-janfeb", "synthetic" of the shape `synthetic`, or a trace
    file of any supported format) in arrival order; the same arguments always give the same
    workload. `block_size`: tokens per hash id of a Mooncake file whose lines do not say."""
    _check_arguments(requests, seed, token_scale, length_only_prefix_tokens)
    try:
        if arrival_rate is not None:
            check_rate(arrival_rate, "arrival_rate")
        check_rate(session_rate, "session_rate")
    except ArrivalError as exc:
        raise WorkloadError(str(exc)) from None
    if str(source) == PDD_JANFEB:
        if format is not None:
            raise WorkloadError(f"format applies to trace files, not to {PDD_JANFEB!r}")
        config = janfeb or PddJanFebConfig()
        if requests is not None:
            config = replace(config, requests=requests)
        if arrival_rate is not None:
            config = replace(config, arrival_rate=arrival_rate)
        records = generate_pdd_janfeb(config, seed).records
        arrivals = np.array([r.arrival_s for r in records], dtype=np.float64)
        name = PDD_JANFEB
    elif str(source) == SYNTHETIC:
        if synthetic is None or requests is None or arrival_rate is None:
            raise WorkloadError(
                f"{SYNTHETIC!r} needs its request shape, a request count and an arrival rate"
            )
        records = synthetic_records(requests, synthetic)
        arrivals = poisson_arrivals(len(records), arrival_rate, stream(seed, ARRIVAL_STREAM))
        arrivals = arrivals - arrivals[0]
        name = SYNTHETIC
    else:
        if janfeb is not None:
            raise WorkloadError(f"janfeb parameters apply to {PDD_JANFEB!r} only, not {source}")
        path = Path(source)
        format = format or detect_format(path)
        arrivals, records = _in_arrival_order(
            path, format, requests, session_rate, seed, block_size
        )
        if arrivals is None and arrival_rate is None:
            raise WorkloadError(
                f"{path} ({format}) records no arrival times: replay it at an arrival rate "
                "(workload.arrival_rate)"
            )
        if arrival_rate is not None or arrivals is None:
            arrivals = poisson_arrivals(len(records), arrival_rate, stream(seed, ARRIVAL_STREAM))
        arrivals = arrivals - arrivals[0]
        name = path.name
    return _workload_requests(
        name, records, arrivals, token_scale, length_only_prefix_tokens, liso_rule
    )


def _in_arrival_order(
    path: Path,
    format: str,
    requests: int | None,
    session_rate: float,
    seed: int,
    block_size: int | None = None,
) -> tuple[np.ndarray | None, list[TraceRequest]]:
    """The first `requests` records of the file in arrival order, with their arrival times
    (None for a file that has none: its first `requests` in file order)."""
    starts = poisson_starts(session_rate, stream(seed, SESSION_START_STREAM))
    if format == "weka":
        timed = _weka_timed(path, requests, starts)
    else:
        records = list(read_trace(path, format, block_size))
        if all(r.arrival_s is None and r.t_in_session_s is None for r in records):
            return None, records[:requests]
        timed = []
        session_starts: dict[str, float] = {}
        for record in records:
            arrival = record.arrival_s
            if arrival is None:  # a session-relative turn: its session starts at replay
                key = record.session if record.session is not None else str(record.index)
                if key not in session_starts:
                    session_starts[key] = next(starts)
                arrival = session_starts[key] + (record.t_in_session_s or 0.0)
            timed.append((arrival, record.index, record))
    timed.sort(key=lambda item: (item[0], item[1]))
    timed = timed[:requests]
    return np.array([t for t, _, _ in timed], dtype=np.float64), [r for _, _, r in timed]


def _weka_timed(
    path: Path, requests: int | None, starts: Iterator[float]
) -> list[tuple[float, int, TraceRequest]]:
    """Requests timed at their conversation's start plus their offset. Conversations start in
    file order, so reading stops once one starts after the requests-th earliest arrival."""
    timed: list[tuple[float, int, TraceRequest]] = []
    earliest: list[float] = []  # max-heap (negated) of the `requests` earliest arrivals
    conversation_line, start = -1, 0.0
    with closing(read_trace(path, "weka")) as records:
        for record in records:
            if record.source_line != conversation_line:
                conversation_line, start = record.source_line, next(starts)
                if requests is not None and len(earliest) == requests and start > -earliest[0]:
                    break
            assert record.t_in_session_s is not None
            arrival = start + record.t_in_session_s
            timed.append((arrival, record.index, record))
            if requests is None:
                continue
            if len(earliest) < requests:
                heapq.heappush(earliest, -arrival)
            elif arrival < -earliest[0]:
                heapq.heapreplace(earliest, -arrival)
    return timed


def _workload_requests(
    name: str,
    records: list[TraceRequest],
    arrivals: np.ndarray,
    token_scale: int,
    length_only_prefix_tokens: int,
    liso_rule: LongInputShortOutputRule,
) -> list[WorkloadRequest]:
    shared_prefix = np.arange(length_only_prefix_tokens // LENGTH_ONLY_BLOCK_TOKENS)
    counter: PrefixHitCounter | None = None
    result: list[WorkloadRequest] = []
    for arrival, record in zip(arrivals, records, strict=True):
        block_ids, block_tokens = record.block_ids, record.block_tokens
        expected: int | None = None
        if block_ids is not None and block_tokens is not None:
            if counter is None:
                counter = PrefixHitCounter(block_tokens, None)
            elif block_tokens != counter.block_tokens:
                raise TraceError(
                    f"{name}:{record.source_line}: block size {block_tokens} differs from the "
                    f"first request's {counter.block_tokens}; one cache cannot hold both"
                )
            expected = counter.observe(block_ids, record.input_tokens)
        else:
            blocks = min(shared_prefix.size, -(-record.input_tokens // LENGTH_ONLY_BLOCK_TOKENS))
            block_ids, block_tokens = shared_prefix[:blocks], LENGTH_ONLY_BLOCK_TOKENS
        output_tokens = max(record.output_tokens, 1)
        result.append(
            WorkloadRequest(
                request_id=f"{name}:{record.index}",
                arrival_s=float(arrival),
                input_tokens=record.input_tokens,
                output_tokens=output_tokens,
                prompt_ids=expand_prompt(
                    block_ids, block_tokens, record.input_tokens, token_scale, record.index
                ),
                genuine_output_tokens=genuine_output_length(output_tokens, token_scale),
                session=record.session,
                day=record.day,
                expected_hit_tokens=expected,
                long_input_short_output=liso_rule.applies(record.input_tokens, output_tokens),
                token_scale=token_scale,
            )
        )
    return result
