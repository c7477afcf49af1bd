"""Unit tests of the radix prefix cache: matching, page alignment, handles, pinning, eviction."""

from __future__ import annotations

import numpy as np
import pytest

from pddemu.cache import CacheError, RadixCache, RadixCacheConfig


def test_empty_cache_matches_nothing() -> None:
    cache = RadixCache()
    match = cache.match([1, 2, 3])
    assert match.length == 0
    assert match.handles == []
    assert cache.size == 0


def test_match_returns_longest_prefix_and_its_handles() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], ["a", "b", "c", "d"])
    cache.insert([1, 2, 7], ["x", "y", "z"])
    match = cache.match([1, 2, 3, 9])
    assert match.length == 3
    assert match.handles == ["a", "b", "c"]
    assert cache.match([1, 2, 7, 8]).handles == ["a", "b", "z"]
    assert cache.match([5]).length == 0


def test_hit_length_is_whole_pages() -> None:
    cache = RadixCache(RadixCacheConfig(page_size=4))
    tokens = np.arange(100, 111, dtype=np.int64)
    result = cache.insert(tokens, ["p0", "p1"])
    assert result.existing == 0
    assert cache.num_pages == 2
    assert cache.size == 8
    # Diverging inside the second page only keeps the first page.
    query = np.concatenate((tokens[:6], [0, 0, 0, 0]))
    match = cache.match(query)
    assert match.length == 4
    assert match.handles == ["p0"]


def test_existing_pages_keep_their_handles() -> None:
    cache = RadixCache(RadixCacheConfig(page_size=2))
    cache.insert([1, 2, 3, 4], ["old0", "old1"])
    result = cache.insert([1, 2, 3, 4, 5, 6], ["new0", "new1", "new2"])
    assert result.existing == 4
    assert cache.match([1, 2, 3, 4, 5, 6]).handles == ["old0", "old1", "new2"]


def test_insert_requires_one_handle_per_full_page() -> None:
    cache = RadixCache(RadixCacheConfig(page_size=2))
    with pytest.raises(CacheError, match="one handle per full page: 2 pages"):
        cache.insert([1, 2, 3, 4, 5], ["only-one"])


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        (np.zeros((2, 2), dtype=np.int64), "one-dimensional"),
        (np.array([1.5, 2.0]), "integers"),
        (np.array([True, False]), "integers"),
    ],
)
def test_bad_keys_are_rejected(keys: np.ndarray, problem: str) -> None:
    with pytest.raises(CacheError, match=problem):
        RadixCache().match(keys)


@pytest.mark.parametrize(
    "kwargs", [{"page_size": 0}, {"key_tokens": -1}, {"capacity": -5}, {"page_size": True}]
)
def test_bad_config_is_rejected(kwargs: dict[str, int]) -> None:
    with pytest.raises(CacheError):
        RadixCacheConfig(**kwargs)


def test_lru_evicts_least_recently_used_leaf_first() -> None:
    cache = RadixCache(RadixCacheConfig(capacity=6))
    cache.insert([1, 1, 1])
    cache.insert([2, 2, 2])
    cache.match([1, 1, 1])  # now [2, 2, 2] is the least recently used
    cache.insert([3, 3, 3])
    assert cache.match([1, 1, 1]).length == 3
    assert cache.match([2, 2, 2]).length == 0
    assert cache.match([3, 3, 3]).length == 3
    assert cache.size == 6


def test_eviction_trims_a_leaf_from_its_end_only_as_far_as_needed() -> None:
    cache = RadixCache(RadixCacheConfig(key_tokens=10, capacity=100))
    cache.insert(np.arange(8))
    cache.insert([100, 101, 102])  # 110 tokens: one key of the older leaf must go
    assert cache.size == 100
    assert cache.match(np.arange(8)).length == 7


def test_eviction_tells_which_pages_it_dropped() -> None:
    dropped: list[list[str]] = []
    cache = RadixCache(RadixCacheConfig(page_size=2, capacity=8, on_evict=dropped.append))
    cache.insert([1, 1, 2, 2, 3, 3], ["a", "b", "c"])
    cache.insert([1, 1, 4, 4], ["a", "d"])
    assert dropped == []
    cache.insert([5, 5, 6, 6], ["e", "f"])  # 12 tokens: the oldest leaf's two pages go
    assert dropped == [["b", "c"]]
    cache.insert([7, 7, 8, 8], ["g", "h"])  # then the next leaf, and the page it left alone
    assert dropped == [["b", "c"], ["d"], ["a"]]
    assert cache.size == 8


def test_shared_prefix_survives_while_a_child_uses_it() -> None:
    cache = RadixCache(RadixCacheConfig(capacity=5))
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 4])
    cache.insert([9, 9])  # 7 keys: two evicted, leaves first
    assert cache.size == 5
    assert cache.match([1, 2]).length == 2
    assert cache.match([9, 9]).length == 2


def test_pinned_pages_are_never_evicted() -> None:
    cache = RadixCache(RadixCacheConfig(capacity=4))
    pinned = cache.insert([1, 2, 3, 4], pin=True).node
    assert cache.pinned_size == 4
    cache.insert([5, 6])
    # Only the new, unpinned pages could go; the pinned path stays whole.
    assert cache.match([1, 2, 3, 4]).length == 4
    assert cache.match([5, 6]).length == 0
    assert cache.evict(100) == 0
    cache.unpin(pinned)
    assert cache.pinned_size == 0
    assert cache.evict(100) == 4
    assert cache.size == 0


def test_pins_are_reference_counted() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3])
    first = cache.match([1, 2, 3], pin=True).node
    second = cache.match([1, 2], pin=True).node
    assert cache.pinned_size == 3
    cache.unpin(first)
    assert cache.pinned_size == 2
    assert cache.evict(10) == 1
    cache.unpin(second)
    assert cache.evict(10) == 2


def test_unpin_over_capacity_evicts_at_once() -> None:
    cache = RadixCache(RadixCacheConfig(capacity=2))
    node = cache.insert([1, 2, 3, 4], pin=True).node
    assert cache.size == 4
    cache.unpin(node)
    assert cache.size == 2
    assert cache.match([1, 2, 3, 4]).length == 2


def test_unpin_without_pin_and_pin_of_evicted_node_are_errors() -> None:
    cache = RadixCache()
    node = cache.insert([1, 2]).node
    with pytest.raises(CacheError, match="not pinned"):
        cache.unpin(node)
    cache.evict(10)
    with pytest.raises(CacheError, match="evicted"):
        cache.pin(node)


def test_byte_capacity_uses_handle_size() -> None:
    kv = [np.zeros((2, 16, 8), dtype=np.float16) for _ in range(6)]  # 512 bytes a page
    config = RadixCacheConfig(page_size=16, capacity=2048, handle_size=lambda t: t.nbytes)
    cache = RadixCache(config)
    tokens = np.arange(96)
    cache.insert(tokens, kv)
    assert cache.size == 2048
    match = cache.match(tokens)
    assert match.length == 64
    assert all(a is b for a, b in zip(match.handles, kv[:4], strict=True))


def test_growing_context_stays_one_node() -> None:
    cache = RadixCache(RadixCacheConfig(key_tokens=64))
    context = np.arange(14_000, dtype=np.int64)
    cache.insert(context)
    follow_up = np.concatenate((context, np.arange(14_000, 14_050)))
    assert cache.match(follow_up).length == 14_000
    cache.insert(follow_up)
    # Extending an unpinned leaf grows it in place instead of chaining nodes.
    assert cache.num_nodes == 1
    assert cache.size == 14_050 * 64
