"""The radix cache against a deliberately naive model: an uncompressed trie with one node per
page, each page carrying its own last-access tick and pin count, and eviction by scanning every
page for the least-recently-used unpinned leaf. Random workloads from hypothesis must give the
same matches, the same kept handles, the same sizes and the same cached pages."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pddemu.cache import RadixCache, RadixCacheConfig, RadixNode


class _Page:
    def __init__(self, parent: _Page | None, handle: Any) -> None:
        self.parent = parent
        self.handle = handle
        self.children: dict[tuple[int, ...], _Page] = {}
        self.tick = 0
        self.refs = 0


class ReferenceCache:
    def __init__(
        self, page_size: int, capacity: int | None, page_cost: Callable[[Any], int]
    ) -> None:
        self.page_size = page_size
        self.capacity = capacity
        self.page_cost = page_cost
        self.root = _Page(None, None)
        self.clock = itertools.count(1)

    def _pages_of(self, keys: list[int]) -> list[tuple[int, ...]]:
        p = self.page_size
        return [tuple(keys[i : i + p]) for i in range(0, len(keys) - len(keys) % p, p)]

    def _walk(self, keys: list[int]) -> list[_Page]:
        path = []
        node = self.root
        for page in self._pages_of(keys):
            if page not in node.children:
                break
            node = node.children[page]
            path.append(node)
        return path

    def match(self, keys: list[int], pin: bool) -> tuple[int, list[Any]]:
        tick = next(self.clock)
        path = self._walk(keys)
        for page in path:
            page.tick = tick
            page.refs += pin
        return len(path) * self.page_size, [page.handle for page in path]

    def insert(self, keys: list[int], handles: list[Any], pin: bool) -> int:
        tick = next(self.clock)
        node = self.root
        existing = 0
        for page, handle in zip(self._pages_of(keys), handles, strict=True):
            if page in node.children:
                existing += self.page_size
            else:
                node.children[page] = _Page(node, handle)
            node = node.children[page]
            node.tick = tick
            node.refs += pin
        self._evict_to_capacity()
        return existing

    def unpin(self, keys: list[int]) -> None:
        for page in self._walk(keys):
            assert page.refs > 0
            page.refs -= 1
        self._evict_to_capacity()

    def all_pages(self) -> list[tuple[tuple[tuple[int, ...], ...], _Page]]:
        found = []
        stack: list[tuple[tuple[tuple[int, ...], ...], _Page]] = [((), self.root)]
        while stack:
            prefix, node = stack.pop()
            for page, child in node.children.items():
                found.append((prefix + (page,), child))
                stack.append((prefix + (page,), child))
        return found

    def size(self) -> int:
        return sum(self.page_cost(page.handle) for _, page in self.all_pages())

    def pinned_size(self) -> int:
        return sum(self.page_cost(p.handle) for _, p in self.all_pages() if p.refs > 0)

    def evict(self, amount: int) -> int:
        freed = 0
        while freed < amount:
            leaves = [(p.tick, k, p) for k, p in self.all_pages() if not p.children and not p.refs]
            if not leaves:
                break
            leaves.sort(key=lambda item: item[0])
            assert len(leaves) == 1 or leaves[0][0] < leaves[1][0], "two LRU leaves share a tick"
            _, key, victim = leaves[0]
            del victim.parent.children[key[-1]]
            freed += self.page_cost(victim.handle)
        return freed

    def _evict_to_capacity(self) -> None:
        if self.capacity is not None and self.size() > self.capacity:
            self.evict(self.size() - self.capacity)


def _cached_pages(cache: RadixCache, page_size: int) -> dict[tuple[tuple[int, ...], ...], Any]:
    """Every cached page of the real cache, keyed by its page path from the root."""
    found: dict[tuple[tuple[int, ...], ...], Any] = {}
    stack: list[tuple[tuple[tuple[int, ...], ...], RadixNode]] = [((), cache._root)]
    while stack:
        prefix, node = stack.pop()
        for child in node.children.values():
            keys = child.keys.tolist()
            path = prefix
            for i, handle in enumerate(child.handles):
                path = path + (tuple(keys[i * page_size : (i + 1) * page_size]),)
                found[path] = handle
            stack.append((path, child))
    return found


_keys = st.lists(st.integers(0, 3), max_size=12)
_op = st.one_of(
    st.tuples(st.just("match"), _keys, st.booleans()),
    st.tuples(st.just("insert"), _keys, st.booleans()),
    st.tuples(st.just("unpin"), st.integers(0, 50), st.just(False)),
    st.tuples(st.just("evict"), st.integers(0, 12), st.just(False)),
)


def _run(
    page_size: int, capacity: int | None, sized: bool, ops: list[tuple[str, Any, bool]]
) -> None:
    if sized:
        config = RadixCacheConfig(
            page_size=page_size, capacity=capacity, handle_size=lambda h: h[1]
        )

        def page_cost(handle: Any) -> int:
            return handle[1]
    else:
        config = RadixCacheConfig(page_size=page_size, key_tokens=2, capacity=capacity)

        def page_cost(handle: Any) -> int:
            return 2 * page_size

    cache = RadixCache(config)
    model = ReferenceCache(page_size, capacity, page_cost)
    pinned: list[tuple[RadixNode, list[int]]] = []
    for step, (kind, arg, pin) in enumerate(ops):
        if kind == "match":
            got = cache.match(arg, pin=pin)
            want = model.match(arg, pin)
            assert (got.length, got.handles) == want
            if pin:
                pinned.append((got.node, arg[: got.length]))
        elif kind == "insert":
            pages = len(arg) // page_size
            handles = [(f"h{step}.{i}", 1 + (step + i) % 3) for i in range(pages)]
            got_insert = cache.insert(arg, handles, pin=pin)
            assert got_insert.existing == model.insert(arg, handles, pin)
            if pin:
                pinned.append((got_insert.node, arg[: pages * page_size]))
        elif kind == "unpin" and pinned:
            node, keys = pinned.pop(arg % len(pinned))
            cache.unpin(node)
            model.unpin(keys)
        elif kind == "evict":
            assert cache.evict(arg) == model.evict(arg)
        assert cache.size == model.size()
        assert cache.pinned_size == model.pinned_size()
        if capacity is not None:
            assert cache.size <= max(capacity, cache.pinned_size)
        reference_pages = {key: page.handle for key, page in model.all_pages()}
        assert _cached_pages(cache, page_size) == reference_pages
        assert cache.num_pages == len(reference_pages)


@settings(max_examples=300, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 3]),
    capacity=st.sampled_from([None, 0, 4, 8, 14, 24]),
    ops=st.lists(_op, max_size=40),
)
def test_token_capacity_matches_reference(
    page_size: int, capacity: int | None, ops: list[tuple[str, Any, bool]]
) -> None:
    _run(page_size, capacity, sized=False, ops=ops)


@settings(max_examples=300, deadline=None)
@given(
    page_size=st.sampled_from([1, 2]),
    capacity=st.sampled_from([None, 0, 3, 7, 12]),
    ops=st.lists(_op, max_size=40),
)
def test_byte_capacity_matches_reference(
    page_size: int, capacity: int | None, ops: list[tuple[str, Any, bool]]
) -> None:
    _run(page_size, capacity, sized=True, ops=ops)
