"""Genuine token sequences for modelled requests: block ids become byte-vocabulary token ids.

The emulator's tiny model runs over sequences `token_scale` (G) times shorter than the modelled
ones. Genuine token j stands for modelled tokens [jG, (j+1)G) and is a hash of the id of the
block holding modelled token jG and of jG's offset inside that block. A chained block id names
its whole prefix, so two prompts that share their first k blocks share their first ceil(kB/G)
genuine tokens, and the radix caches see exactly the trace's prefix sharing; a block of B/G
tokens collides with a different block with probability 256^-(B/G).

Modelled tokens past the last block id (WEKA hashes full blocks only; length-only traces have
a shared prefix and nothing else) are hashed from a key of the request itself instead, so they
are shared with no other request.
"""

from __future__ import annotations

import numpy as np

# The tiny model's byte vocabulary: genuine prompt tokens are ids 0..255.
GENUINE_VOCAB = 256

_BLOCK_SALT = np.uint64(0x6A09E667F3BCC909)
_REQUEST_SALT = np.uint64(0xBB67AE8584CAA73B)


class ExpansionError(ValueError):
    """Lengths or a token scale that no genuine sequence can be made from."""


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic): a well-spread hash."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def check_token_scale(token_scale: int) -> None:
    if isinstance(token_scale, bool) or not isinstance(token_scale, int) or token_scale < 1:
        raise ExpansionError(f"token_scale must be an integer >= 1, got {token_scale!r}")


def genuine_input_length(input_tokens: int, token_scale: int) -> int:
    """ceil(L / G): every genuine prompt token stands for G modelled ones."""
    check_token_scale(token_scale)
    if input_tokens < 1:
        raise ExpansionError(f"input must be at least 1 token, got {input_tokens}")
    return -(-input_tokens // token_scale)


def genuine_output_length(output_tokens: int, token_scale: int) -> int:
    """1 + ceil((O - 1) / G): the first token (the prefill's) stands for one modelled token,
    every later one for G."""
    check_token_scale(token_scale)
    if output_tokens < 1:
        raise ExpansionError(f"output must be at least 1 token, got {output_tokens}")
    return 1 + -(-(output_tokens - 1) // token_scale)


def output_group_start(index: int, token_scale: int) -> int:
    """Modelled output position where genuine output `index` begins."""
    return 0 if index == 0 else 1 + (index - 1) * token_scale


def output_index(position: int, token_scale: int) -> int:
    """Which genuine output stands for modelled output `position`."""
    return 0 if position == 0 else 1 + (position - 1) // token_scale


def expand_prompt(
    block_ids: np.ndarray | None,
    block_tokens: int | None,
    input_tokens: int,
    token_scale: int,
    request_key: int,
) -> np.ndarray:
    """The genuine prompt (int32 ids in 0..255) of a modelled prompt of `input_tokens` tokens.

    `block_ids` cover the first `len(block_ids) * block_tokens` modelled tokens (the last block
    may be partial); `request_key` must be unique among the requests of one workload.
    """
    length = genuine_input_length(input_tokens, token_scale)
    positions = np.arange(length, dtype=np.uint64) * np.uint64(token_scale)
    request_base = _mix(np.array([request_key], dtype=np.int64).view(np.uint64) ^ _REQUEST_SALT)
    hashed = _mix(request_base + positions)
    if block_ids is not None and block_ids.size:
        if block_tokens is None or block_tokens < 1:
            raise ExpansionError(f"block ids need a block size of at least 1, got {block_tokens}")
        block_of = positions // np.uint64(block_tokens)
        covered = block_of < np.uint64(block_ids.size)
        ids = np.asarray(block_ids, dtype=np.int64).view(np.uint64)[block_of[covered]]
        offsets = positions[covered] % np.uint64(block_tokens)
        hashed[covered] = _mix(_mix(ids ^ _BLOCK_SALT) + offsets)
    return (hashed & np.uint64(GENUINE_VOCAB - 1)).astype(np.int32)
