"""Prefix caches: one radix tree for the prefill cache, the decode-side DRC and trace stats."""

from __future__ import annotations

from pddemu.cache.radix import (
    CacheError,
    InsertResult,
    PrefixMatch,
    RadixCache,
    RadixCacheConfig,
    RadixNode,
)

__all__ = [
    "CacheError",
    "InsertResult",
    "PrefixMatch",
    "RadixCache",
    "RadixCacheConfig",
    "RadixNode",
]
