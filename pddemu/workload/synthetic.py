"""`synthetic`: requests of one fixed shape, for experiments that fix PDD's setup (64K input,
90 % hit, 1K output) instead of drawing it from a trace.

Every request has `input_tokens` of prompt and `output_tokens` of output. Its prompt starts
with a prefix shared by all requests, `hit_rate` of the prompt (in whole cache pages), and
continues with pages of its own, so once an instance has served one request, every later one
finds exactly that share in its cache; the first request each instance serves finds nothing.
At least one page is always its own (a prompt entirely in cache still computes its last
token), so a hit rate of 1 is one page short of the whole prompt. Requests have no session:
the router places each on the least loaded instance. Arrivals are Poisson at the workload's
`arrival_rate`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pddemu.workload.records import TraceRequest

SYNTHETIC = "synthetic"
# Tokens per block id: the radix caches' default page (Config.cache_page_tokens), so the shared
# prefix ends on a page boundary and the hit is exactly what was asked for.
SYNTHETIC_BLOCK_TOKENS = 64


@dataclass(frozen=True)
class SyntheticShape:
    """The shape of every request (modelled tokens; `hit_rate` in [0, 1])."""

    input_tokens: int
    output_tokens: int
    hit_rate: float


def synthetic_records(count: int, shape: SyntheticShape) -> list[TraceRequest]:
    """`count` requests sharing the first round(hit_rate x pages) pages of their prompts."""
    input_tokens, output_tokens, hit_rate = shape.input_tokens, shape.output_tokens, shape.hit_rate
    pages = -(-input_tokens // SYNTHETIC_BLOCK_TOKENS)
    shared = min(round(hit_rate * input_tokens / SYNTHETIC_BLOCK_TOKENS), pages - 1)
    prefix = np.arange(shared, dtype=np.int64)
    own = pages - shared
    return [
        TraceRequest(
            index=i,
            arrival_s=None,
            session=None,
            t_in_session_s=None,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            block_ids=np.concatenate([prefix, shared + i * own + np.arange(own, dtype=np.int64)]),
            block_tokens=SYNTHETIC_BLOCK_TOKENS,
            source_line=i + 1,
        )
        for i in range(count)
    ]
