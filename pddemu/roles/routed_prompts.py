"""The router's record of the prompts it sent one decode instance, as a KV-aware router keeps
one: what it names in its `match` instead of the prompt's ids.

The decode instance's DRC holds prefixes of prompts whose KV began to come to it, each routed
there by this router. So the longest prefix of a new prompt it can hold ends where the prompt
leaves one of the prompts routed there (whole pages): the router names those points only,
each by its chained page hash (`pddemu.cache.page_hashes`), deepest first. The instance
indexes every prefix of every prompt whose KV began (`PrefixIndex`), takes the longest point
it knows and matches that prefix's ids against its DRC: the same hit as the prompt's own ids
would give, since the prefix it knows is at least as long as what its DRC holds of the prompt.

The list stops at the first point that ends a prompt known to have reached the instance (its
KV began there: P sent it some, or it arrived): every point beyond it is one the instance
knows too. In a session, the previous turn's end is usually that point: one or two hashes.
An instance found down forgets what it knew as far as this record goes (a restarted one
starts empty): until the router hears of new transfers, it names every point.
"""

from __future__ import annotations

from collections.abc import Sequence

from pddemu.cache import RadixCache, RadixCacheConfig, RadixNode
from pddemu.cache.page_hashes import chained_page_hashes, hash_text
from pddemu.roles.recent import Recent


class RoutedPrompts:
    def __init__(self, page_tokens: int) -> None:
        # every prompt's path pinned: a leaf is never extended in place, so each prompt's end
        # stays a node's end, and nothing is evicted (no capacity)
        self.page_tokens = page_tokens
        self.tree = RadixCache(RadixCacheConfig(page_size=page_tokens))
        self.reached: set[RadixNode] = set()  # ends of prompts whose KV began there
        self.sent: Recent[RadixNode] = Recent()  # leg -> its prompt's end, until it is known

    def points(self, prompt: Sequence[int]) -> list[int]:
        """Where `prompt` leaves the prompts routed there (genuine tokens, whole pages),
        deepest first, down to the first that ends a prompt known to have reached it."""
        found = self.tree.match(prompt)
        node, depth = found.node, found.length
        points: list[int] = []
        while node.parent is not None and depth > 0:
            points.append(depth)
            if node in self.reached:
                break
            depth -= node.keys.shape[0]
            node = node.parent
        return points

    def named(self, prompt: Sequence[int]) -> list[list[int | str]]:
        """The match's `prefixes`: each point (`points`) with the chained hash of the prompt's
        pages up to it, as it crosses the wire."""
        points = self.points(prompt)
        hashes = chained_page_hashes(prompt[: points[0]], self.page_tokens) if points else []
        return [[point, hash_text(hashes[point // self.page_tokens - 1])] for point in points]

    def routed(self, leg: str, prompt: Sequence[int]) -> None:
        """P is told to send the leg's KV there."""
        self.sent[leg] = self.tree.insert(prompt, pin=True).node

    def began(self, leg: str) -> None:
        """The leg's KV began to come there (P sent some, or it arrived)."""
        node = self.sent.pop(leg, None)
        if node is not None:
            self.reached.add(node)

    def lost(self) -> None:
        """The instance was down: what it knew may be gone (a restart). Legs sent before went
        to the old process: their beginnings, reported after this, say nothing of the new one."""
        self.reached.clear()
        self.sent.clear()
