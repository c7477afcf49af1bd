"""Prompt KV kept across requests: P's prefix cache and MD's decode-side radix cache (DRC).

A radix cache over genuine token ids whose page handles point into the KV tensors of the
requests that inserted them (a view and an offset, never a copy), so a hit is assembled from a
few contiguous slices. Capacity is in genuine tokens; pinned pages (requests in flight) are
never evicted. MD's store tells its index of pages by hash (`PrefixIndex`) which pages it took
in and which it dropped: each page's handle carries its hash.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pddemu.cache import RadixCache, RadixCacheConfig, RadixNode
from pddemu.cache.page_hashes import PrefixIndex
from pddemu.model.kv import KV


class PrefixKVStore:
    def __init__(
        self, page_tokens: int, capacity_tokens: int | None, index: PrefixIndex | None = None
    ) -> None:
        self.page_tokens = page_tokens
        self.index = index
        on_evict = None if index is None else self._evicted
        self.cache = RadixCache(
            RadixCacheConfig(page_size=page_tokens, capacity=capacity_tokens, on_evict=on_evict)
        )

    def match(
        self, tokens: Sequence[int] | np.ndarray, prompt_tokens: int | None = None
    ) -> tuple[int, RadixNode, list]:
        """The usable cached prefix of a prompt, pinned until `release`: whole pages, and never
        the whole prompt (its last token must be computed: its logits give the first output).
        `tokens` may be a prefix of the prompt (of `prompt_tokens`; by default, the prompt)."""
        found = self.cache.match(np.asarray(tokens, dtype=np.int64), pin=True)
        usable = min(found.length, (len(tokens) if prompt_tokens is None else prompt_tokens) - 1)
        return usable - usable % self.page_tokens, found.node, found.handles

    def assemble(self, handles: list, length: int) -> KV | None:
        """The KV of the first `length` tokens of a match, from the pages' views."""
        if length == 0:
            return None
        pieces: list[KV] = []
        run_kv, run_start, run_end = None, 0, 0
        for kv, offset, _ in handles[: length // self.page_tokens]:
            if kv is run_kv and offset == run_end:
                run_end += self.page_tokens
                continue
            if run_kv is not None:
                pieces.append(run_kv.token_slice(run_start, run_end))
            run_kv, run_start, run_end = kv, offset, offset + self.page_tokens
        pieces.append(run_kv.token_slice(run_start, run_end))  # type: ignore[union-attr]
        return pieces[0].clone() if len(pieces) == 1 else KV.concat(pieces)

    def insert(
        self, tokens: Sequence[int] | np.ndarray, kv: KV, hashes: Sequence[int] = ()
    ) -> RadixNode:
        """Cache the full pages of `tokens` whose KV is `kv` (same length), pinned. With an
        index, `hashes` are the pages' chained hashes (at least one a page)."""
        keys = np.asarray(tokens, dtype=np.int64)
        pages = len(keys) // self.page_tokens
        frozen = kv.token_slice(0, pages * self.page_tokens)
        tags = list(hashes[:pages]) if self.index is not None else [None] * pages
        if len(tags) != pages:
            raise ValueError(f"{pages} pages to insert, {len(tags)} hashes for them")
        handles = [(frozen, i * self.page_tokens, tags[i]) for i in range(pages)]
        # the path is pinned before the insert evicts: none of its pages is among those dropped
        done = self.cache.insert(keys[: pages * self.page_tokens], handles, pin=True)
        if self.index is not None:
            self.index.stored(tags[done.existing // self.page_tokens :])
        return done.node

    def _evicted(self, handles: list) -> None:
        self.index.evicted([tag for _, _, tag in handles])  # type: ignore[union-attr]

    def release(self, node: RadixNode) -> None:
        self.cache.unpin(node)

    @property
    def size_tokens(self) -> int:
        return self.cache.size
