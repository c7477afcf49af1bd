"""The trace record every reader yields, whatever the file format."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, the line and the problem."""


@dataclass(frozen=True, eq=False)
class TraceRequest:
    """One request of a trace, as recorded (no arrival process is invented here).

    - `arrival_s`: seconds since the trace start when the file has a global clock (Mooncake,
      Bailian, BurstGPT, CSV); `None` for WEKA, whose conversations have no common clock, for
      Mooncake sessions of delays only, and for ShareGPT, which has no times.
    - `session`, `t_in_session_s`: the conversation and, where there is no global clock, the
      request's time since that conversation started (a WEKA subagent's request: its entry's
      `t` plus its own `t`).
    - `block_ids`: int64 cache keys of the prompt's blocks, unique across the whole file (two
      requests share their first k ids exactly when they share their first k blocks);
      `None` for a length-only trace. Chained ids (every format but Bailian's per-block
      hashes) are strictly increasing within a request.
    - `block_tokens`: tokens per block (the last Mooncake block may be partial).
    - `source_line`: 1-based line of the file the request came from (WEKA: its conversation's;
      ShareGPT: the conversation's position in the array).
    - `model`, `agent`: the model the request went to (WEKA, BurstGPT) and, for a WEKA
      subagent's request, the subagent's id.
    - `day`: the calendar day (ISO date) the request stands for, in traces that carry one
      (generated pdd-janfeb traces); `None` elsewhere.

    Equality is identity (`eq=False`): the numpy id array has no single truth value.
    """

    index: int
    arrival_s: float | None
    session: str | None
    t_in_session_s: float | None
    input_tokens: int
    output_tokens: int
    block_ids: np.ndarray | None
    block_tokens: int | None
    source_line: int
    model: str | None = None
    agent: str | None = None
    day: str | None = None
