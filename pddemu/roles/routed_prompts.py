"""The router's record of what one decode instance's DRC may hold, as a KV-aware router keeps
one fed by its workers' stored/removed events: what it names in its `match` instead of the
prompt's ids.

Two parts. The pages the DRC holds, by chained page hash (`pddemu.cache.page_hashes`), as the
instance's reports say (`drc_report`: the part of a prompt it took in, as the request's id and a
token count; each run of pages it dropped, as its last page's hash and a page count; in the
order they happened): a prefix-closed set, at most the DRC's capacity in pages. And the
prompts routed there whose fate the instance has not reported yet (P is told to send their KV
there: those in flight, and those whose fate never comes, P lost with the transfer cut before
any token, each kept until `KEPT` later legs push it out): a pinned prefix tree of their ids,
each leg with its prompt's page hashes.

A match names, deepest first, where the prompt leaves the prompts in flight (whole pages), then
how far the reported pages go along it: each by its chained hash. The instance takes the
longest point its index knows (`PrefixIndex`) and matches that prefix's ids against its DRC:
the same hit as the prompt's own ids would give. Whatever the DRC holds of the prompt was
either reported (the reported pages reach at least as far, and the index keeps what it dropped
since until the router has heard that), or taken in from a prompt still in flight here (the
point where the prompt leaves it reaches as far, and the index holds that prompt's prefixes).
The match says which reports the router had heard (`heard`), so the index forgets what they
dropped.

An instance found down (paused, cut off, or restarted) is `doubtful` until its next report:
the router names every point it knows, since a restarted instance holds none of the pages
reported, only what it took in of the prompts in flight. That report says which it was: the
same process (its next number) goes on from the pages reported; another process starts the set
anew and drops the legs routed before the instance was found down (they went to the old one).
The instance keeps its reports until a match acknowledges them and sends them again after a
failed sending or on a new connection (what the closed one carried may not have been read),
with its next report or at a match that has not heard them: the router skips those it applied.
A report missed all the same empties the set: the router then names less than the instance
holds until prompts are kept there again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pddemu.cache import RadixCache, RadixCacheConfig, RadixNode
from pddemu.cache.page_hashes import hash_text, parse_hash
from pddemu.roles.recent import KEPT


def checked_report(body: dict[str, Any]) -> tuple[str, int, list[tuple[str, Any, int]]]:
    """A `drc_report`'s process, number and changes, each checked before any is applied (a
    report applied in part would be acknowledged whole); ValueError naming what is wrong."""
    since, number, changes = body.get("since"), body.get("report"), body.get("changes")
    if not isinstance(since, str) or type(number) is not int or number < 1:
        raise ValueError(f"a DRC report needs a process (text) and a number >= 1: {body!r:.80}")
    if not isinstance(changes, list):
        raise ValueError(f"a DRC report's changes are a list, got {changes!r:.60}")
    checked: list[tuple[str, Any, int]] = []
    for change in changes:
        if not isinstance(change, list) or len(change) != 3 or change[0] not in ("kept", "evicted"):
            raise ValueError(f"a DRC report's change is [kept|evicted, ..., count]: {change!r:.60}")
        kind, what, count = change
        if type(count) is not int or count < 0:
            raise ValueError(f"a DRC report's count is a whole number >= 0: {change!r:.60}")
        if kind == "kept" and not isinstance(what, str):
            raise ValueError(f"a kept change names its leg: {change!r:.60}")
        checked.append((kind, what if kind == "kept" else parse_hash(what), count))
    return since, number, checked


class RoutedPrompts:
    def __init__(self, page_tokens: int) -> None:
        self.page_tokens = page_tokens
        # the DRC's pages by hash, as reported, each with its parent's (0: a prompt's first),
        # so that an eviction reported as its last page and a count is followed up its path
        self.held: dict[int, int] = {}
        self.since = ""  # the reporting process, and its last report applied
        self.heard = 0
        # prompts in flight, each path pinned (a leaf is never extended in place, so each
        # prompt's end stays a node's end); one whose fate is known goes (capacity 0)
        self.in_flight = RadixCache(RadixCacheConfig(page_size=page_tokens, capacity=0))
        # leg -> its prompt's end, page hashes, and how many times the instance had been
        # found down then
        self.legs: dict[str, tuple[RadixNode, np.ndarray, int]] = {}
        self.downs = 0
        self.doubtful = False  # found down since the last report: it may have restarted

    def points(self, prompt: Sequence[int], hashes: Sequence[int]) -> list[int]:
        """Where `prompt` leaves the prompts in flight (genuine tokens, whole pages), deepest
        first, down to how far the reported pages go along it (`hashes`: the prompt's); all of
        them while the instance is `doubtful` (a restarted one holds none of the pages
        reported, only some of the prompts in flight)."""
        reported = 0
        while reported < len(hashes) and hashes[reported] in self.held:
            reported += 1
        reach = reported * self.page_tokens
        found = self.in_flight.match(prompt)
        node, depth = found.node, found.length
        deeper: list[int] = []
        shallower: list[int] = []
        while node.parent is not None and depth > 0:
            if depth > reach:
                deeper.append(depth)
            elif not self.doubtful:
                break
            elif depth < reach:
                shallower.append(depth)
            depth -= node.keys.shape[0]
            node = node.parent
        return deeper + ([reach] if reach else []) + shallower

    def named(self, prompt: Sequence[int], hashes: Sequence[int]) -> list[list[int | str]]:
        """The match's `prefixes`: each point (`points`) with the chained hash of the prompt's
        pages up to it (`hashes`: the prompt's), as it crosses the wire."""
        points = self.points(prompt, hashes)
        return [[point, hash_text(hashes[point // self.page_tokens - 1])] for point in points]

    def acknowledged(self) -> list[str | int]:
        """The reports applied, as the match tells the instance (`heard`)."""
        return [self.since, self.heard]

    def routed(self, leg: str, prompt: Sequence[int], hashes: Sequence[int]) -> None:
        """P is told to send the leg's KV there (`hashes`: its prompt's, kept with the leg for
        the pages the instance reports it took in)."""
        self.forget(leg)
        end = self.in_flight.insert(prompt, pin=True).node
        self.legs[leg] = (end, np.asarray(hashes, dtype=np.uint64), self.downs)
        if len(self.legs) > KEPT:  # one never heard of again (its P lost with it)
            self.forget(next(iter(self.legs)))

    def never_came(self, leg: str) -> None:
        """None of the leg's KV was sent there."""
        self.forget(leg)

    def forget(self, leg: str) -> None:
        known = self.legs.pop(leg, None)
        if known is not None:
            self.in_flight.unpin(known[0])

    def reported(self, body: dict[str, Any]) -> None:
        """The instance's `drc_report`: apply its changes, in order. Another process's report
        starts the set anew (a restart: the legs routed before it was last found down went to
        the one before); a report missed empties it."""
        since, number, changes = checked_report(body)
        restarted = since != self.since
        if not restarted and number <= self.heard:
            return  # one applied already
        if restarted or number != self.heard + 1:
            self.held.clear()
            self.since = since
        self.heard = number
        self.doubtful = False
        for change in changes:
            if change[0] == "kept":
                _, leg, tokens = change
                known = self.legs.get(leg)
                if known is not None:
                    pages = known[1][: tokens // self.page_tokens].tolist()
                    # each page's parent is the page before it (0: the first has none); a
                    # prompt kept short of a whole page has no page to add
                    for at, page in enumerate(pages):
                        self.held.setdefault(page, pages[at - 1] if at else 0)
                    self.forget(leg)
            else:
                self.dropped(change[1], change[2])
        if restarted:
            for leg in [leg for leg, known in self.legs.items() if known[2] < self.downs]:
                self.forget(leg)

    def dropped(self, last: int, pages: int) -> None:
        """The DRC dropped `pages` pages ending with `last` (a leaf's last ones): up its path."""
        for _ in range(pages):
            parent = self.held.pop(last, None)
            if parent is None:
                return
            last = parent

    def lost(self) -> None:
        """The instance was found down: paused or cut off (its DRC as it was, its reports
        going on from the next number) or restarted (empty, its reports numbered anew). Until
        its next report says which, every point is named; what was reported, and the legs sent
        before, are kept until then."""
        self.doubtful = True
        self.downs += 1

    def __len__(self) -> int:
        """Entries kept: reported pages and the pages of prompts in flight."""
        return len(self.held) + self.in_flight.num_pages
