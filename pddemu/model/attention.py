"""Causal grouped-query attention of a batch of requests' new tokens over their own pasts.

Keys are cut into blocks of KEY_BLOCK tokens at absolute positions (0, 64, 128, ...). Every
block is handled by products of the same shape, and per-block partial sums are combined by a
position-shaped tree (see `invariant.py`), so a query's output does not depend on how many
queries share the call, on the other requests in the batch, or on how its keys are split
between "past" and "new": prefill chunks, decode steps and extend passes give the same bits.

Each request's past is read in place: its whole blocks ("full" blocks) are views of the
caller's KV (a growth buffer is fine); only the past's last partial block is copied, together
with the new tokens, into the "tail" blocks. Products with full blocks run per request and KV
head; the tail, the softmax and the tree run once for the whole batch. Only tail blocks need a
causal mask: every query sees every key of its request's full blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pddemu.model.invariant import padded_rows, tree_sum

KEY_BLOCK = 64


def causal_attention(
    q: torch.Tensor, pasts: Sequence[torch.Tensor | None], new_kv: torch.Tensor
) -> torch.Tensor:
    """Attention output [batch, new, heads, head_dim] of queries q [batch, new, heads, head_dim].

    q must already be scaled by 1/sqrt(head_dim) and rotated. pasts[i] is request i's past
    KV of this layer, [2, kv_heads, past_i, head_dim], or None; new_kv is the new tokens' KV,
    [batch, 2, kv_heads, new, head_dim]. Query j of request i sits at position past_i + j and
    sees keys 0 .. past_i + j.
    """
    batch, n_new, n_heads, head_dim = q.shape
    kv_heads = new_kv.shape[2]
    group = n_heads // kv_heads
    past_lens = [0 if p is None else p.shape[2] for p in pasts]
    full_blocks = [length // KEY_BLOCK for length in past_lens]
    max_full = max(full_blocks)
    tail_blocks = max(-(-(length % KEY_BLOCK + n_new) // KEY_BLOCK) for length in past_lens)
    # Request i's tail block j is its block full_blocks[i] + j; block slots past its last key
    # hold zeros, which the tree sum ignores.
    blocks = max_full + tail_blocks
    tail_slots = (
        torch.arange(batch)[:, None],
        torch.tensor(full_blocks)[:, None] + torch.arange(tail_blocks),
    )

    # Product rows per KV head: token-major, then the query heads sharing that KV head;
    # zero rows pad them to a row-invariant count.
    rows = n_new * group
    rows_padded = padded_rows(rows)
    queries = q.new_zeros((batch, kv_heads, rows_padded, head_dim))
    queries[:, :, :rows] = (
        q.reshape(batch, n_new, kv_heads, group, head_dim)
        .permute(0, 2, 1, 3, 4)
        .reshape(batch, kv_heads, rows, head_dim)
    )
    tail_k, tail_v = _tail(pasts, past_lens, new_kv, tail_blocks)

    # Scores, then softmax numerators in place: exp(score - row max), 0 where hidden.
    full_w = q.new_empty((batch, kv_heads, max_full, rows_padded, KEY_BLOCK))
    for i, past in enumerate(pasts):
        full = full_blocks[i]
        for h in range(kv_heads if full else 0):
            assert past is not None
            keys = _blocks(past[0, h], full).transpose(1, 2)
            torch.bmm(queries[i, h].expand(full, -1, -1), keys, out=full_w[i, h, :full])
        full_w[i, :, full:] = -torch.inf
    tail_w = torch.bmm(
        queries.unsqueeze(2).expand(-1, -1, tail_blocks, -1, -1).reshape(-1, rows_padded, head_dim),
        tail_k.reshape(-1, KEY_BLOCK, head_dim).transpose(1, 2),
    ).view(batch, kv_heads, tail_blocks, rows_padded, KEY_BLOCK)
    tail_w.masked_fill_(_tail_hidden(past_lens, n_new, group, rows_padded, tail_blocks), -torch.inf)
    row_max = tail_w.amax(dim=(2, 4), keepdim=True)
    if max_full:
        row_max = torch.maximum(row_max, full_w.amax(dim=(2, 4), keepdim=True))
    full_w.sub_(row_max).exp_()
    tail_w.sub_(row_max).exp_()

    # Per block: weight sums and weights @ values, laid out by absolute block index.
    sums = q.new_zeros((batch, kv_heads, blocks, rows_padded))
    sums[:, :, :max_full] = full_w.sum(dim=4)
    sums.transpose(1, 2)[tail_slots] = tail_w.sum(dim=4).transpose(1, 2)
    outs = q.new_empty((batch, kv_heads, blocks, rows_padded, head_dim))
    for i, past in enumerate(pasts):
        full = full_blocks[i]
        for h in range(kv_heads if full else 0):
            assert past is not None
            torch.bmm(full_w[i, h, :full], _blocks(past[1, h], full), out=outs[i, h, :full])
        outs[i, :, full + tail_blocks :] = 0.0
    tail_outs = torch.bmm(
        tail_w.reshape(-1, rows_padded, KEY_BLOCK), tail_v.reshape(-1, KEY_BLOCK, head_dim)
    )
    outs.transpose(1, 2)[tail_slots] = tail_outs.view(
        batch, kv_heads, tail_blocks, rows_padded, head_dim
    ).transpose(1, 2)

    out = tree_sum(outs, dim=2) / tree_sum(sums, dim=2).unsqueeze(-1)
    out = out[:, :, :rows].reshape(batch, kv_heads, n_new, group, head_dim)
    return out.permute(0, 2, 1, 3, 4).reshape(batch, n_new, n_heads, head_dim)


def _blocks(x: torch.Tensor, count: int) -> torch.Tensor:
    """The first `count` whole blocks of x [tokens, head_dim], a view [count, KEY_BLOCK, d]."""
    return x[: count * KEY_BLOCK].unflatten(0, (count, KEY_BLOCK))


def _tail(
    pasts: Sequence[torch.Tensor | None],
    past_lens: list[int],
    new_kv: torch.Tensor,
    tail_blocks: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per request, its keys and values from its last whole past block on (the past's
    remainder, then the new tokens), zero-padded: two [batch, kv_heads, tail_blocks,
    KEY_BLOCK, head_dim] tensors."""
    batch, _, kv_heads, n_new, head_dim = new_kv.shape
    tail = new_kv.new_zeros((batch, 2, kv_heads, tail_blocks * KEY_BLOCK, head_dim))
    remainders = [length % KEY_BLOCK for length in past_lens]
    for i, past in enumerate(pasts):
        if remainders[i]:
            assert past is not None
            tail[i, :, :, : remainders[i]] = past[:, :, past_lens[i] - remainders[i] :]
    new_slots = torch.tensor(remainders)[:, None] + torch.arange(n_new)
    tail.permute(0, 3, 1, 2, 4)[torch.arange(batch)[:, None], new_slots] = new_kv.permute(
        0, 3, 1, 2, 4
    )
    tail = tail.unflatten(3, (tail_blocks, KEY_BLOCK))
    return tail[:, 0], tail[:, 1]


def _tail_hidden(
    past_lens: list[int], n_new: int, group: int, rows_padded: int, tail_blocks: int
) -> torch.Tensor:
    """[batch, 1, tail_blocks, rows_padded, KEY_BLOCK]: is this tail key slot hidden from the
    row (after the row's query position, or padding)?

    Tail slot (b, j) of request i holds position (past_i // KEY_BLOCK + b) * KEY_BLOCK + j.
    Padding rows get the last query's mask so that they stay finite; their output is dropped.
    """
    past = torch.tensor(past_lens).view(-1, 1)
    query_offset = past % KEY_BLOCK + (torch.arange(rows_padded) // group).clamp(max=n_new - 1)
    key_offset = torch.arange(tail_blocks * KEY_BLOCK).view(1, tail_blocks, 1, KEY_BLOCK)
    return (key_offset > query_offset.view(-1, 1, rows_padded, 1)).unsqueeze(1)
