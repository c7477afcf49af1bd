"""Causal grouped-query attention of a batch of requests' new tokens over their own pasts.

Every step is exact (`exact.py`): scores q.k are integers; a key's softmax weight is an
integer from a table of exp indexed by how far its score is below the row's maximum
(`tables.exp_table`); the weighted sums of values and of weights are exact integers; the
output is their ratio (one correctly rounded division), requantised. A query's output is
therefore the same bits however many queries share the call, whatever the other requests
in the batch, and however its keys are split between "past" and "new": prefill chunks,
decode steps and extend passes agree exactly.

Each request's past is read in place (a growth buffer is fine): its products with the past's
keys and values are views of the caller's KV, never copies.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pddemu.model.exact import ACT_BOUND, PROB_BITS, PROB_BOUND, exact_matmul, exact_sum
from pddemu.model.tables import exp_table

# Scores are integers: one logit unit is 2**SCORE_BITS of them (the softmax temperature), and
# the exp table advances in steps of 2**-STEP_BITS logit units.
SCORE_BITS = 10
STEP_BITS = 4
# The output is the weighted mean of values times 2**OUT_BITS before rounding.
OUT_BITS = 1
# Queries are taken in blocks of new tokens whose score matrix has about this many elements.
SCORE_BLOCK_ELEMENTS = 2**17


def causal_attention(
    q: torch.Tensor, pasts: Sequence[torch.Tensor | None], new_kv: torch.Tensor
) -> torch.Tensor:
    """Attention output [batch, new, heads, head_dim] of queries q [batch, new, heads, head_dim].

    q, keys and values are integer activations (|x| <= ACT_BOUND), q and keys rotated.
    pasts[i] is request i's past KV of this layer, [2, kv_heads, past_i, head_dim], or None;
    new_kv is the new tokens' KV, [batch, 2, kv_heads, new, head_dim]. Query j of request i
    sits at position past_i + j and sees keys 0 .. past_i + j.

    Queries are processed in blocks of new tokens sized to keep the score matrix small
    (cache-resident); rows are independent by construction, so the blocking changes no bit.
    """
    batch, n_new, n_heads, head_dim = q.shape
    kv_heads = new_kv.shape[2]
    group = n_heads // kv_heads
    queries = q.reshape(batch, n_new, kv_heads, group, head_dim).permute(0, 2, 1, 3, 4)
    past_lens = [0 if p is None else p.shape[2] for p in pasts]
    width = max(past_lens)
    block = max(1, SCORE_BLOCK_ELEMENTS // (batch * n_heads * (width + n_new)))
    out = q.new_empty((batch, kv_heads, n_new, group, head_dim))
    for start in range(0, n_new, block):
        stop = min(start + block, n_new)
        out[:, :, start:stop] = _attend(
            queries[:, :, start:stop].reshape(batch, kv_heads, -1, head_dim),
            pasts,
            past_lens,
            new_kv[..., :stop, :],
            start,
        ).unflatten(2, (stop - start, group))
    return out.permute(0, 2, 1, 3, 4).reshape(batch, n_new, n_heads, head_dim)


def _attend(
    queries: torch.Tensor,
    pasts: Sequence[torch.Tensor | None],
    past_lens: list[int],
    new_kv: torch.Tensor,
    first: int,
) -> torch.Tensor:
    """Attention of the new tokens first.. (queries [batch, kv_heads, rows, head_dim], rows
    token-major then the query heads sharing a KV head) over the pasts and new_kv, the new
    tokens up to the last query's ([batch, 2, kv_heads, new, head_dim])."""
    batch, kv_heads, rows, _ = queries.shape
    n_new = new_kv.shape[3]
    group = rows // (n_new - first)
    width = max(past_lens)

    # Scores [batch, kv_heads, rows, width + new]: request i's past keys in columns
    # [0, past_i), the new keys in [width, width + new); -inf where a key is hidden.
    scores = queries.new_empty((batch, kv_heads, rows, width + n_new))
    for i, past in enumerate(pasts):
        if past_lens[i]:
            assert past is not None
            scores[i, :, :, : past_lens[i]] = exact_matmul(
                queries[i], past[0].transpose(1, 2), ACT_BOUND, ACT_BOUND
            )
        scores[i, :, :, past_lens[i] : width] = -torch.inf
    new_scores = scores[..., width:]
    new_scores.copy_(exact_matmul(queries, new_kv[:, 0].transpose(2, 3), ACT_BOUND, ACT_BOUND))
    hidden = torch.arange(n_new) > first + torch.arange(rows)[:, None] // group
    new_scores.masked_fill_(hidden, -torch.inf)

    weights = _softmax_weights(scores)
    total = exact_sum(weights, PROB_BOUND)
    weighted = exact_matmul(weights[..., width:], new_kv[:, 1], PROB_BOUND, ACT_BOUND).double()
    for i, past in enumerate(pasts):
        if past_lens[i]:
            assert past is not None
            weighted[i] += exact_matmul(
                weights[i, :, :, : past_lens[i]], past[1], PROB_BOUND, ACT_BOUND
            )
    # The weighted mean of the values, times 2**OUT_BITS: one correctly rounded division.
    mean = weighted * 2**OUT_BITS / total.unsqueeze(-1)
    return torch.round(mean).clamp_(-ACT_BOUND, ACT_BOUND).to(queries.dtype)


def _softmax_weights(scores: torch.Tensor) -> torch.Tensor:
    """Integer softmax numerators 0..PROB_BOUND: exp_table[floor((row max - score) / step)]
    (the row's maximum gets PROB_BOUND, hidden keys 0), in the scores' dtype."""
    table = _exp_table(scores.dtype)
    steps = scores.amax(dim=-1, keepdim=True) - scores
    # Non-negative, so the integer conversion's truncation is the floor.
    steps.mul_(2.0 ** (STEP_BITS - SCORE_BITS)).clamp_(max=len(table) - 1)
    return table.index_select(0, steps.int().view(-1)).view(scores.shape)


_TABLES: dict[torch.dtype, torch.Tensor] = {}


def _exp_table(dtype: torch.dtype) -> torch.Tensor:
    if dtype not in _TABLES:
        _TABLES[dtype] = torch.tensor(exp_table(PROB_BITS, 2**STEP_BITS), dtype=dtype)
    return _TABLES[dtype]
