"""Prefix caches: the radix tree shared by the prefill cache, the decode-side DRC and trace stats."""

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
