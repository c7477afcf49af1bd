"""pdd-janfeb: a seeded reconstruction of the agentic workload PDD describes.

PDD's Jan-Feb 2026 production traces are not public; only aggregates are: long agentic contexts
(its experiments use 64K), about 1K output, 70-80 % of requests above 95 % prefix hit in seven
buckets with a mean near 90 %, and 3-4 % long-input short-output requests. This generator
rebuilds a workload with those aggregates; every parameter is in `janfeb_config`.

Each request's hit rate is realised structurally, in chained block ids:
- every request gets a day (the N requests are spread evenly over the window), a hit-rate bucket
  drawn from that day's mixture, a rate uniform inside the bucket (0-90 %: uniform in [0, 0.9)),
  and a session: one of `concurrent_sessions` open sessions, picked uniformly among those whose
  last turn is at least `min_turn_gap_s` old (the least recently used one when none is);
- a 0-90 % request opens a new session with probability `session_start_fraction`: its prompt is
  the shared system prompt and then new blocks (a cold start: only the system prompt hits);
- otherwise a 0-90 % request rewrites its session's context: it keeps the first
  floor(rate x input / block) blocks of the session's last prompt (at most all its full blocks)
  and replaces the rest with new blocks, its input a fresh context length;
- a request of any other bucket continues its session: it keeps all full blocks of the last
  prompt and appends new tokens, its input the kept tokens / rate, moved to the nearest length
  whose exact hit rate lies in the bucket; past `max_input_tokens` it rewrites instead, keeping
  floor(rate x fresh length / block) blocks;
- long-input short-output requests are drawn given the bucket, with probabilities chosen so
  that they make `liso_share` of all requests and `liso_low_hit_fraction` of them are 0-90 %
  requests (PDD: they matter because their large uncached increment would eat the WAN).
New blocks get fresh ids from one counter, so a request's ids are strictly increasing and its
hit under an infinite cache in arrival order is exactly the kept blocks: `intended_hit_tokens`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pddemu.workload.arrivals import (
    ARRIVAL_STREAM,
    STRUCTURE_STREAM,
    poisson_arrivals,
    stream,
)
from pddemu.workload.janfeb_config import BUCKETS, GeneratorError, PddJanFebConfig
from pddemu.workload.liso import LISO_MAX_OUTPUT_TOKENS
from pddemu.workload.records import TraceRequest
from pddemu.workload.stats import HIT_BUCKET_EDGES_PERMILLE, hit_buckets

PDD_JANFEB = "pdd-janfeb"
_LOWER_PERMILLE = (0, *HIT_BUCKET_EDGES_PERMILLE)
_UPPER_PERMILLE = (*HIT_BUCKET_EDGES_PERMILLE, 1000)
_MAX_REDRAWS = 1000


@dataclass(frozen=True, eq=False)
class GeneratedTrace:
    """The generated requests in arrival order, with what the generator meant each to be."""

    config: PddJanFebConfig
    seed: int
    records: list[TraceRequest]
    intended_hit_tokens: np.ndarray
    long_input_short_output: np.ndarray
    day_index: np.ndarray
    day_mixtures: np.ndarray

    def intended_bucket_shares(self, requests: np.ndarray | None = None) -> np.ndarray:
        """Expected bucket shares of the requests selected by `requests` (all by default):
        the mean of their days' mixtures."""
        days = self.day_index if requests is None else self.day_index[requests]
        return self.day_mixtures[days].mean(axis=0)

    def buckets(self) -> np.ndarray:
        inputs = np.array([r.input_tokens for r in self.records], dtype=np.int64)
        return hit_buckets(self.intended_hit_tokens, inputs)


@dataclass
class _Session:
    name: str
    prompt: np.ndarray
    input_tokens: int
    last_turn_s: float = -math.inf


@dataclass(frozen=True)
class _Draws:
    """Every random choice of a run, drawn up front in vectors from the structure stream."""

    bucket: np.ndarray
    rate: np.ndarray
    liso: np.ndarray
    fresh_input: np.ndarray
    regular_output: np.ndarray
    liso_output: np.ndarray
    slot: np.ndarray
    opens_session: np.ndarray

    @classmethod
    def make(
        cls, config: PddJanFebConfig, mixtures: np.ndarray, rng: np.random.Generator
    ) -> _Draws:
        n = mixtures.shape[0]
        bounds = np.cumsum(mixtures, axis=1)[:, :-1]
        bucket = (_stratified(rng, n)[:, None] >= bounds).sum(axis=1)
        lower = np.asarray(_LOWER_PERMILLE)[bucket] / 1000
        upper = np.asarray(_UPPER_PERMILLE)[bucket] / 1000
        rate = lower + (upper - lower) * rng.random(n)
        p0 = mixtures[:, 0]
        share, low_hit = config.liso_share, config.liso_low_hit_fraction
        with np.errstate(divide="ignore", invalid="ignore"):
            liso_if_low = np.where(p0 > 0, share * low_hit / p0, 0.0)
            liso_if_high = np.where(p0 < 1, share * (1 - low_hit) / (1 - p0), 0.0)
        liso_chance = np.where(bucket == 0, liso_if_low, liso_if_high)
        liso = np.zeros(n, dtype=bool)
        for members in (np.flatnonzero(bucket == 0), np.flatnonzero(bucket != 0)):
            liso[members] = _stratified(rng, members.size) < liso_chance[members]
        fresh_input = _truncated_lognormal(
            rng,
            n,
            config.context_median_tokens,
            config.context_sigma,
            config.min_input_tokens,
            config.max_input_tokens,
        )
        regular_output = _truncated_lognormal(
            rng,
            n,
            config.output_median_tokens,
            config.output_sigma,
            LISO_MAX_OUTPUT_TOKENS + 1,
            config.max_output_tokens,
        )
        log_low = math.log(config.liso_min_output_tokens)
        log_high = math.log(LISO_MAX_OUTPUT_TOKENS + 1)
        liso_output = np.floor(np.exp(rng.uniform(log_low, log_high, n))).astype(np.int64)
        liso_output = np.clip(liso_output, config.liso_min_output_tokens, LISO_MAX_OUTPUT_TOKENS)
        slot = rng.integers(0, config.concurrent_sessions, n)
        opens_session = rng.random(n) < config.session_start_fraction
        return cls(
            bucket, rate, liso, fresh_input, regular_output, liso_output, slot, opens_session
        )


def _stratified(rng: np.random.Generator, n: int) -> np.ndarray:
    """n uniforms in [0, 1), one in each stratum [k/n, (k+1)/n), in random order (Latin
    hypercube): thresholded, they give counts within a few requests of the expected ones, where
    independent draws would scatter by sqrt(n)."""
    return (rng.permutation(n) + rng.random(n)) / n


def _truncated_lognormal(
    rng: np.random.Generator, n: int, median: int, sigma: float, low: int, high: int
) -> np.ndarray:
    """Integer lengths round(median x exp(sigma x N(0,1))) redrawn until inside [low, high]."""
    values = np.rint(median * np.exp(sigma * rng.standard_normal(n))).astype(np.int64)
    for _ in range(_MAX_REDRAWS):
        outside = (values < low) | (values > high)
        if not outside.any():
            return values
        redrawn = median * np.exp(sigma * rng.standard_normal(int(outside.sum())))
        values[outside] = np.rint(redrawn).astype(np.int64)
    raise GeneratorError(f"lengths around {median} almost never fall in [{low}, {high}]")


def _fit_input(hit: int, bucket: int, want: int) -> int:
    """The input closest to `want` whose exact hit rate hit/input lies in `bucket`.

    Same integer arithmetic as the statistics: hit x 1000 >= lower‰ x input and, below the top
    bucket, hit x 1000 < upper‰ x input; an input always exceeds its hit by at least a token.
    """
    lowest = hit + 1
    if bucket < BUCKETS - 1:
        lowest = max(lowest, hit * 1000 // _UPPER_PERMILLE[bucket] + 1)
    lower = _LOWER_PERMILLE[bucket]
    highest = hit * 1000 // lower if lower else max(want, lowest)
    if lowest > highest:
        raise GeneratorError(f"no input puts a hit of {hit} tokens in hit-rate bucket {bucket}")
    return min(max(want, lowest), highest)


class _Builder:
    """Sessions, block ids and lengths, one request at a time."""

    def __init__(self, config: PddJanFebConfig) -> None:
        self.config = config
        self.block = config.block_tokens
        system_blocks = config.system_prompt_tokens // self.block
        self.system_ids = np.arange(system_blocks, dtype=np.int64)
        self.next_id = system_blocks
        self.system_seen = False
        self.slots: list[_Session | None] = [None] * config.concurrent_sessions
        self.sessions_opened = 0

    def live_session(self, slot: int) -> tuple[int, _Session | None]:
        """The session in `slot`, or the first open one after it (cyclically)."""
        count = len(self.slots)
        for step in range(count):
            session = self.slots[(slot + step) % count]
            if session is not None:
                return (slot + step) % count, session
        return slot, None

    def ready_slot(self, slot: int, now: float) -> int:
        """`slot`, unless its session had a turn less than `min_turn_gap_s` ago: then the
        first ready slot after it (cyclically), or the least recently used one."""
        count = len(self.slots)
        gap = self.config.min_turn_gap_s
        for step in range(count):
            candidate = (slot + step) % count
            session = self.slots[candidate]
            if session is None or now - session.last_turn_s >= gap:
                return candidate
        return min(range(count), key=lambda k: self.slots[k].last_turn_s)  # type: ignore[union-attr]

    def request(self, draws: _Draws, i: int, now: float) -> tuple[_Session, np.ndarray, int, int]:
        """(session, block ids, input tokens, intended hit tokens) of request `i` at `now`."""
        bucket, rate = int(draws.bucket[i]), float(draws.rate[i])
        fresh = int(draws.fresh_input[i])
        slot = self.ready_slot(int(draws.slot[i]), now)
        session = self.slots[slot]
        if session is None and bucket != 0:
            slot, session = self.live_session(slot)
        if session is None or (bucket == 0 and draws.opens_session[i]):
            session = _Session(f"s{self.sessions_opened:05d}", self.system_ids, 0)
            self.sessions_opened += 1
            self.slots[slot] = session
            kept, input_tokens = self.system_ids.size, fresh
            hit = kept * self.block if self.system_seen else 0
            self.system_seen = True
        else:
            full_blocks = session.input_tokens // self.block
            if bucket == 0:
                kept = min(int(rate * fresh) // self.block, full_blocks)
                input_tokens = fresh
            elif full_blocks * self.block / rate > self.config.max_input_tokens:
                kept = int(rate * fresh) // self.block
                input_tokens = _fit_input(kept * self.block, bucket, fresh)
            else:
                kept = full_blocks
                want = round(full_blocks * self.block / rate)
                input_tokens = _fit_input(kept * self.block, bucket, want)
            hit = kept * self.block
        new_blocks = -(-input_tokens // self.block) - kept
        ids = np.concatenate(
            [session.prompt[:kept], np.arange(self.next_id, self.next_id + new_blocks)]
        )
        self.next_id += new_blocks
        ids.flags.writeable = False
        session.prompt, session.input_tokens, session.last_turn_s = ids, input_tokens, now
        return session, ids, input_tokens, hit


def check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise GeneratorError(f"seed must be a non-negative integer, got {seed!r}")
    return seed


def generate_pdd_janfeb(config: PddJanFebConfig, seed: int) -> GeneratedTrace:
    """The requests of one seeded run, in arrival order (timestamps rounded to whole ms, as the
    Mooncake file holds them, so a written and re-read trace is the same workload)."""
    check_seed(seed)
    n = config.requests
    days = config.days
    day_index = (np.arange(n) * len(days)) // n
    day_mixtures = np.stack([config.mixture_on(d) for d in range(len(days))])
    draws = _Draws.make(config, day_mixtures[day_index], stream(seed, STRUCTURE_STREAM))
    arrival_ms = np.rint(
        poisson_arrivals(n, config.arrival_rate, stream(seed, ARRIVAL_STREAM)) * 1000
    ).astype(np.int64)
    builder = _Builder(config)
    records: list[TraceRequest] = []
    hits = np.empty(n, dtype=np.int64)
    for i in range(n):
        session, ids, input_tokens, hits[i] = builder.request(draws, i, arrival_ms[i] / 1000.0)
        output = draws.liso_output[i] if draws.liso[i] else draws.regular_output[i]
        records.append(
            TraceRequest(
                index=i,
                arrival_s=int(arrival_ms[i]) / 1000.0,
                session=session.name,
                t_in_session_s=None,
                input_tokens=input_tokens,
                output_tokens=int(output),
                block_ids=ids,
                block_tokens=config.block_tokens,
                source_line=i + 1,
                day=days[day_index[i]],
            )
        )
    return GeneratedTrace(
        config=config,
        seed=seed,
        records=records,
        intended_hit_tokens=hits,
        long_input_short_output=draws.liso.copy(),
        day_index=day_index,
        day_mixtures=day_mixtures,
    )
