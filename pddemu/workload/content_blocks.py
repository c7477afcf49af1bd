"""Block ids for traces that carry their text rather than ids (ShareGPT, AIPerf's Mooncake
`text_input`): the prompt in the model's byte tokens, cut into full blocks, each block keyed by
its predecessor's id and a digest of its bytes (a chained prefix hash, as Mooncake's and WEKA's
ids are), and numbered in order of first appearance across the file, so a request's ids are
strictly increasing and two requests share their first k ids exactly when their first k blocks
are the same bytes.
"""

from __future__ import annotations

import hashlib

import numpy as np

CONTENT_BLOCK_TOKENS = 64  # byte tokens per block (WEKA's block size)


def byte_token_count(text: str) -> int:
    """Tokens of `text` for the model's byte tokenizer: BOS and one per UTF-8 byte
    (`pddemu.model.ByteTokenizer.encode`, without importing the model)."""
    return 1 + len(text.encode("utf-8"))


class ContentBlocks:
    """Numbers the blocks of every prompt of one file."""

    def __init__(self, block_tokens: int = CONTENT_BLOCK_TOKENS) -> None:
        self.block_tokens = block_tokens
        self._ids: dict[tuple[int, bytes], int] = {}

    def ids(self, text: str) -> np.ndarray:
        """Ids of the full blocks of BOS + the UTF-8 bytes of `text`."""
        tokens = b"\x00" + text.encode("utf-8")  # a stand-in byte for BOS: every prompt has it
        ids = []
        previous = -1
        for start in range(0, len(tokens) - self.block_tokens + 1, self.block_tokens):
            digest = hashlib.blake2b(tokens[start : start + self.block_tokens], digest_size=8)
            key = (previous, digest.digest())
            previous = self._ids.setdefault(key, len(self._ids))
            ids.append(previous)
        block_ids = np.asarray(ids, dtype=np.int64)
        block_ids.flags.writeable = False
        return block_ids
