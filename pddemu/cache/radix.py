"""Radix prefix cache: a page-granular prefix tree over integer keys with pinning and LRU eviction.

One structure serves every prefix cache of the emulator: the prefill instance's cache (keys =
token ids, a page = e.g. 16 tokens, one KV tensor per page), the decode side's radix cache (DRC)
and trace statistics (keys = block ids, page = 1 key worth `key_tokens` tokens, no payload).

Edges are compressed (a node holds a run of pages) and stored as numpy arrays, so matching a
14K-block context costs a few vectorised comparisons rather than 14K dictionary look-ups.

Invariants that make the LRU order exact at page granularity:
- every page of a node shares the node's last-access tick and pin count (a partial match splits
  the node, so the matched part can be touched and pinned on its own);
- each operation touches a single root-to-node path with one fresh tick, so no two evictable
  leaves ever share a tick and "least recently used" is always a unique leaf;
- eviction trims pages from the end of that leaf, so the cache never drops more than it must.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class CacheError(ValueError):
    """Invalid use of the cache: bad keys, wrong number of handles, unpinning what is not pinned."""


@dataclass(frozen=True)
class RadixCacheConfig:
    """How keys group into pages and what the capacity counts.

    Capacity is in tokens (a page costs `page_size * key_tokens`) unless `handle_size` is given,
    in which case a page costs `handle_size(handle)` (e.g. the bytes of its KV tensor) and the
    capacity is in those units. `capacity=None` means unbounded. `on_evict`, if given, is told
    the handles of the pages each eviction drops (in their order on the path), so that a record
    kept beside the cache (the decode side's index of its pages by hash) can drop them too; it
    must not use the cache.
    """

    page_size: int = 1
    key_tokens: int = 1
    capacity: int | None = None
    handle_size: Callable[[Any], int] | None = None
    on_evict: Callable[[list[Any]], None] | None = None

    def __post_init__(self) -> None:
        for name in ("page_size", "key_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CacheError(f"{name} must be a positive integer, got {value!r}")
        if self.capacity is not None and (
            not isinstance(self.capacity, int)
            or isinstance(self.capacity, bool)
            or self.capacity < 0
        ):
            raise CacheError(
                f"capacity must be a non-negative integer or None, got {self.capacity!r}"
            )


class RadixNode:
    """A run of pages on one edge of the tree; the object is also the caller's pin handle."""

    __slots__ = ("keys", "handles", "children", "parent", "lock_ref", "tick", "cost")

    def __init__(
        self,
        keys: np.ndarray,
        handles: list[Any],
        parent: RadixNode | None,
        tick: int,
        cost: int,
        lock_ref: int = 0,
    ) -> None:
        self.keys = keys
        self.handles = handles
        self.children: dict[bytes, RadixNode] = {}
        self.parent = parent
        self.lock_ref = lock_ref
        self.tick = tick
        self.cost = cost


@dataclass(frozen=True)
class PrefixMatch:
    """Result of `match`: `length` keys (a multiple of the page size) are cached.

    `handles` holds one handle per matched page, in order. `node` ends the matched path; pass it
    to `pin`/`unpin`.
    """

    length: int
    handles: list[Any]
    node: RadixNode


@dataclass(frozen=True)
class InsertResult:
    """Result of `insert`: the first `existing` keys were already cached (their handles were kept
    and the caller's duplicates for them were not stored); `node` ends the inserted path."""

    existing: int
    node: RadixNode


def _common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    differ = a[:n] != b[:n]
    first = int(differ.argmax())  # argmax stops at the first True of a boolean array
    return first if differ[first] else n


class RadixCache:
    """Prefix tree of pages with reference-count pinning and LRU eviction of unpinned leaves.

    Keys past the last full page are ignored by `match` and `insert`. After every `insert` and
    `unpin`, least-recently-used unpinned leaf pages are evicted until the size fits the capacity
    (or only pinned pages are left). Pin a path right after matching or inserting it: an unpinned
    path may be shortened by a later eviction.
    """

    def __init__(self, config: RadixCacheConfig | None = None) -> None:
        self.config = config or RadixCacheConfig()
        self._page = self.config.page_size
        self._page_cost = self.config.page_size * self.config.key_tokens
        # The root holds no pages and is permanently pinned, so it is never an eviction candidate.
        self._root = RadixNode(np.empty(0, dtype=np.int64), [], None, 0, 0, lock_ref=1)
        self._clock = itertools.count(1)
        self._seq = itertools.count()
        self._lru: list[tuple[int, int, RadixNode]] = []
        self._nodes = 0
        self._pages = 0
        self._size = 0
        self._pinned = 0

    @property
    def size(self) -> int:
        """Cost of all cached pages (tokens, or `handle_size` units)."""
        return self._size

    @property
    def pinned_size(self) -> int:
        return self._pinned

    @property
    def num_pages(self) -> int:
        return self._pages

    @property
    def num_nodes(self) -> int:
        return self._nodes

    def match(self, keys: Sequence[int] | np.ndarray, *, pin: bool = False) -> PrefixMatch:
        """Longest cached prefix of `keys`, in whole pages; touches it for LRU."""
        keys = self._as_keys(keys)
        tick = next(self._clock)
        node, length = self._descend(keys, tick)
        handles: list[Any] = []
        path = []
        walker = node
        while walker is not self._root:
            path.append(walker)
            walker = walker.parent
        for step in reversed(path):
            handles.extend(step.handles)
        if pin:
            self.pin(node)
        self._offer_leaf(node)
        return PrefixMatch(length, handles, node)

    def insert(
        self,
        keys: Sequence[int] | np.ndarray,
        handles: Sequence[Any] | None = None,
        *,
        pin: bool = False,
    ) -> InsertResult:
        """Cache `keys` with one handle per full page (`None` handles when not given).

        Pages already cached keep their handles. With `pin`, the path is pinned before eviction
        runs, so it cannot be evicted to make room for itself.
        """
        keys = self._as_keys(keys)
        pages = keys.shape[0] // self._page
        if handles is None:
            new_handles: list[Any] = [None] * pages
        else:
            new_handles = list(handles)
            if len(new_handles) != pages:
                raise CacheError(
                    f"insert needs one handle per full page: {pages} pages of {self._page} keys, "
                    f"got {len(new_handles)} handles"
                )
        tick = next(self._clock)
        node, existing = self._descend(keys, tick)
        if existing < keys.shape[0]:
            node = self._append(
                node, keys[existing:].copy(), new_handles[existing // self._page :], tick
            )
        if pin:
            self.pin(node)
        self._offer_leaf(node)
        self._evict_to_capacity()
        return InsertResult(existing, node)

    def pin(self, node: RadixNode) -> None:
        """Protect the path from the root to `node` from eviction (reference-counted)."""
        self._check_attached(node)
        while node is not self._root:
            if node.lock_ref == 0:
                self._pinned += node.cost
            node.lock_ref += 1
            node = node.parent

    def unpin(self, node: RadixNode) -> None:
        """Release one `pin` of the path ending at `node`; then enforce the capacity."""
        self._check_attached(node)
        if node is not self._root and node.lock_ref == 0:
            raise CacheError("unpin of a path that is not pinned")
        start = node
        while node is not self._root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._pinned -= node.cost
            node = node.parent
        self._offer_leaf(start)
        self._evict_to_capacity()

    def evict(self, amount: int) -> int:
        """Evict least-recently-used unpinned pages worth at least `amount`; returns the cost
        freed (less than `amount` only when nothing unpinned is left)."""
        freed = 0
        while freed < amount:
            leaf = self._pop_lru_leaf()
            if leaf is None:
                break
            freed += self._trim(leaf, amount - freed)
        return freed

    def _as_keys(self, keys: Sequence[int] | np.ndarray) -> np.ndarray:
        array = np.asarray(keys)
        if array.ndim != 1:
            raise CacheError(f"keys must be one-dimensional, got shape {array.shape}")
        if array.size == 0:
            return np.empty(0, dtype=np.int64)
        if array.dtype.kind not in "iu":
            raise CacheError(f"keys must be integers, got dtype {array.dtype}")
        if array.dtype != np.int64:
            if array.dtype == np.uint64 and int(array.max()) > np.iinfo(np.int64).max:
                raise CacheError("keys must fit in int64")
            array = array.astype(np.int64)
        full = array.shape[0] - array.shape[0] % self._page
        return array[:full]

    def _check_attached(self, node: RadixNode) -> None:
        if node is not self._root and node.parent is None:
            raise CacheError("node is no longer in the cache (it was evicted)")

    def _descend(self, keys: np.ndarray, tick: int) -> tuple[RadixNode, int]:
        """Walk the longest cached page-aligned prefix, splitting a partially matched node and
        touching every node on the way; returns the path's end and its length in keys."""
        node = self._root
        pos = 0
        total = keys.shape[0]
        page = self._page
        while pos < total:
            child = node.children.get(keys[pos : pos + page].tobytes())
            if child is None:
                break
            edge_len = child.keys.shape[0]
            common = _common_prefix_length(child.keys, keys[pos : pos + edge_len])
            common -= common % page
            if common < edge_len:
                child = self._split(child, common)
            child.tick = tick
            node = child
            pos += common
            if common < edge_len:
                break
        return node, pos

    def _split(self, node: RadixNode, length: int) -> RadixNode:
        """Cut `node` after `length` keys; the new upper part is returned and `node` keeps the
        rest, so a caller holding `node` still holds the same path end."""
        pages = length // self._page
        upper_handles = node.handles[:pages]
        upper_cost = self._cost(upper_handles)
        parent = node.parent
        upper = RadixNode(
            node.keys[:length], upper_handles, parent, node.tick, upper_cost, node.lock_ref
        )
        node.keys = node.keys[length:]
        node.handles = node.handles[pages:]
        node.cost -= upper_cost
        node.parent = upper
        upper.children[node.keys[: self._page].tobytes()] = node
        parent.children[upper.keys[: self._page].tobytes()] = upper
        self._nodes += 1
        return upper

    def _append(
        self, node: RadixNode, keys: np.ndarray, handles: list[Any], tick: int
    ) -> RadixNode:
        cost = self._cost(handles)
        self._size += cost
        self._pages += len(handles)
        if node is not self._root and not node.children and node.lock_ref == 0:
            # Extending an unpinned leaf in place keeps a growing conversation one node deep
            # instead of a chain of one node per turn.
            node.keys = np.concatenate((node.keys, keys))
            node.handles.extend(handles)
            node.cost += cost
            node.tick = tick
            return node
        child = RadixNode(keys, handles, node, tick, cost)
        node.children[keys[: self._page].tobytes()] = child
        self._nodes += 1
        return child

    def _cost(self, handles: list[Any]) -> int:
        size_of = self.config.handle_size
        if size_of is None:
            return len(handles) * self._page_cost
        return sum(int(size_of(h)) for h in handles)

    def _offer_leaf(self, node: RadixNode) -> None:
        """Register `node` as an eviction candidate if it is an unpinned leaf."""
        if node is self._root or node.children or node.lock_ref or node.parent is None:
            return
        heapq.heappush(self._lru, (node.tick, next(self._seq), node))
        if len(self._lru) > 2 * self._nodes + 64:
            self._rebuild_lru()

    def _rebuild_lru(self) -> None:
        """Drop stale heap entries (nodes touched again, grown, pinned or evicted since)."""
        live = [
            entry
            for entry in self._lru
            if self._is_candidate(entry[2]) and entry[0] == entry[2].tick
        ]
        unique = {id(entry[2]): entry for entry in live}
        self._lru = list(unique.values())
        heapq.heapify(self._lru)

    def _is_candidate(self, node: RadixNode) -> bool:
        return node.parent is not None and not node.children and node.lock_ref == 0

    def _pop_lru_leaf(self) -> RadixNode | None:
        while self._lru:
            tick, _, node = self._lru[0]
            if tick == node.tick and self._is_candidate(node):
                return node
            heapq.heappop(self._lru)
        return None

    def _trim(self, leaf: RadixNode, amount: int) -> int:
        """Evict pages from the end of `leaf` worth at least `amount` (or all of it)."""
        size_of = self.config.handle_size
        pages = len(leaf.handles)
        if size_of is None:
            drop = min(pages, -(-amount // self._page_cost))
            freed = drop * self._page_cost
        else:
            drop = 0
            freed = 0
            while drop < pages and freed < amount:
                drop += 1
                freed += int(size_of(leaf.handles[pages - drop]))
        keep = pages - drop
        self._size -= freed
        self._pages -= drop
        leaf.cost -= freed
        if self.config.on_evict is not None:
            self.config.on_evict(leaf.handles[keep:])
        if keep:
            del leaf.handles[keep:]
            leaf.keys = leaf.keys[: keep * self._page].copy()
            return freed
        parent = leaf.parent
        del parent.children[leaf.keys[: self._page].tobytes()]
        leaf.parent = None
        leaf.handles = []
        self._nodes -= 1
        self._offer_leaf(parent)
        return freed

    def _evict_to_capacity(self) -> None:
        capacity = self.config.capacity
        if capacity is not None and self._size > capacity:
            self.evict(self._size - capacity)
