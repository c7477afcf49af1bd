"""Causal grouped-query attention of a batch of requests' new tokens over their own pasts.

Every step is exact (`exact.py`): scores q.k are integers; a key's softmax weight is an
integer computed exactly from how far its score is below the row's maximum (`_softmax_weights`);
the weighted sums of values and of weights are exact integers; the output is their ratio (one
correctly rounded division), requantised. A query's output is therefore the same bits however
many queries share the call, whatever the other requests in the batch, and however its keys
are split between "past" and "new": prefill chunks, decode steps and extend passes agree.

Each request's past is read in place (a growth buffer is fine): its products with the past's
keys and values are views of the caller's KV, never copies.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pddemu.model.exact import ACT_BOUND, EXACT_LIMIT, PROB_BOUND, exact_matmul, exact_sum

# Scores are integers: one logit unit is 2**SCORE_BITS of them (the softmax temperature);
# softmax weights are computed from the gap to the row's best in steps of 2**-STEP_BITS logit.
SCORE_BITS = 10
STEP_BITS = 4
# The output is the weighted mean of values times 2**OUT_BITS before rounding.
OUT_BITS = 1
# Queries are taken in blocks of new tokens whose score matrix has about this many elements.
SCORE_BLOCK_ELEMENTS = 2**19  # 2 MiB of float32, cache-sized; any size gives the same bits
# A past's keys are taken in chunks of KEY_CHUNK: a chunk's weighted sum of values stays below
# 2**24, exact in float32 (512 x 256 x 127 = 16,646,144).
KEY_CHUNK = 512
assert KEY_CHUNK * PROB_BOUND * ACT_BOUND < EXACT_LIMIT[torch.float32]


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
    tokens up to the last query's ([batch, 2, kv_heads, new, head_dim]).

    Keys come in three segments, each with its own score tensor (-inf where hidden): a past's
    whole KEY_CHUNK-key chunks [batch, kv_heads, chunks, rows, KEY_CHUNK], its remainder
    [batch, kv_heads, rows, remainder] and the new tokens [batch, kv_heads, rows, new].
    """
    batch, kv_heads, rows, _ = queries.shape
    n_new = new_kv.shape[3]
    group = rows // (n_new - first)
    chunks = [length // KEY_CHUNK for length in past_lens]
    remainders = [length % KEY_CHUNK for length in past_lens]

    chunk_scores = _past_scores(queries, pasts, chunks, remainders, whole=True)
    rest_scores = _past_scores(queries, pasts, chunks, remainders, whole=False)
    new_scores = exact_matmul(queries, new_kv[:, 0].transpose(2, 3), ACT_BOUND, ACT_BOUND)
    hidden = torch.arange(n_new) > first + torch.arange(rows)[:, None] // group
    new_scores.masked_fill_(hidden, -torch.inf)

    row_max = new_scores.amax(dim=-1)
    if chunk_scores is not None:
        row_max = torch.maximum(row_max, chunk_scores.amax(dim=(2, 4)))
    if rest_scores is not None:
        row_max = torch.maximum(row_max, rest_scores.amax(dim=-1))
    row_max = row_max.unsqueeze(-1)

    # Weighted sums of values and sums of weights: exact integers, per segment (every chunk's
    # product stays below 2**24 in float32), added in float64.
    new_weights = _softmax_weights(new_scores, row_max)
    total = exact_sum(new_weights, PROB_BOUND).double()
    weighted = exact_matmul(new_weights, new_kv[:, 1], PROB_BOUND, ACT_BOUND).double()
    if rest_scores is not None:
        rest_weights = _softmax_weights(rest_scores, row_max)
        total += exact_sum(rest_weights, PROB_BOUND)
        for i, past in enumerate(pasts):
            if remainders[i]:
                assert past is not None
                weighted[i] += exact_matmul(
                    rest_weights[i, ..., : remainders[i]],
                    past[1, :, chunks[i] * KEY_CHUNK :],
                    PROB_BOUND,
                    ACT_BOUND,
                )
    if chunk_scores is not None:
        chunk_weights = _softmax_weights(chunk_scores, row_max.unsqueeze(2))
        total += exact_sum(chunk_weights, PROB_BOUND).sum(dim=2, dtype=torch.float64)
        for i, past in enumerate(pasts):
            for h in range(kv_heads if chunks[i] else 0):
                assert past is not None
                per_chunk = exact_matmul(
                    chunk_weights[i, h, : chunks[i]],
                    _chunks(past[1, h], chunks[i]),
                    PROB_BOUND,
                    ACT_BOUND,
                )
                weighted[i, h] += per_chunk.sum(dim=0, dtype=torch.float64)
    # The weighted mean of the values, times 2**OUT_BITS: one correctly rounded division.
    mean = weighted * 2**OUT_BITS / total.unsqueeze(-1)
    return torch.round(mean).clamp_(-ACT_BOUND, ACT_BOUND).to(queries.dtype)


def _past_scores(
    queries: torch.Tensor,
    pasts: Sequence[torch.Tensor | None],
    chunks: list[int],
    remainders: list[int],
    whole: bool,
) -> torch.Tensor | None:
    """Scores of the pasts' whole chunks (whole=True) or of their remainders, read in place
    (one product per request and KV head: 3-D operands that are views, never copies); None when
    no request has any. -inf where a request has fewer keys than the widest."""
    counts = chunks if whole else remainders
    width = max(counts)
    if not width:
        return None
    batch, kv_heads, rows, head_dim = queries.shape
    shape = (batch, kv_heads, width, rows, KEY_CHUNK) if whole else (batch, kv_heads, rows, width)
    out = queries.new_empty(shape)
    for i, past in enumerate(pasts):
        if counts[i] < width:
            (out[i, :, counts[i] :] if whole else out[i, ..., counts[i] :]).fill_(-torch.inf)
        for h in range(kv_heads if counts[i] else 0):
            assert past is not None
            if whole:
                keys = _chunks(past[0, h], counts[i]).transpose(1, 2)
                query = queries[i, h].expand(counts[i], rows, head_dim)
                exact_matmul(query, keys, ACT_BOUND, ACT_BOUND, out=out[i, h, : counts[i]])
            else:
                keys = past[0, h, chunks[i] * KEY_CHUNK :].transpose(0, 1)
                out[i, h, :, : counts[i]] = exact_matmul(queries[i, h], keys, ACT_BOUND, ACT_BOUND)
    return out


def _chunks(x: torch.Tensor, count: int) -> torch.Tensor:
    """The first `count` whole chunks of x [tokens, head_dim], a view [count, KEY_CHUNK, d]."""
    return x[: count * KEY_CHUNK].unflatten(0, (count, KEY_CHUNK))


def _softmax_weights(scores: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    """Integer softmax numerators 0..PROB_BOUND, in place of `scores`.

    A key x logits below its row's best weighs 256 (1 - x/4)**4 for x < 4, else 0 (the limit
    (1 - x/n)**n -> exp(-x) at n = 4): with t = 64 - floor(16 x) clamped to 0..64, the weight
    is floor(t**4 / 2**16). Every intermediate is an integer below 2**24 (or a power-of-two
    multiple of one), so every operation is exact; hidden keys (-inf) weigh 0.
    """
    t = torch.sub(scores, row_max - 64 * 2 ** (SCORE_BITS - STEP_BITS), out=scores)
    t.mul_(2.0 ** (STEP_BITS - SCORE_BITS)).ceil_().clamp_(min=0)
    return t.square_().square_().mul_(2.0**-16).floor_()
