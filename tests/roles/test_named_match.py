"""The match by hashes gives the hit the match by ids gave, request for request: pdd-janfeb's
prompts replayed through the router's record (`RoutedPrompts`) and MD's index (`PrefixIndex`)
beside a DRC matched by the prompts' own ids, the two DRCs fed the same inserts, under LRU
eviction, with transfers that never begin, begin and are cut mid-way, or complete, the
router hearing of them late, and MD restarted once (the router seeing it down)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pddemu.cache.page_hashes import PrefixIndex, parse_hash
from pddemu.roles.prefix_store import PrefixKVStore
from pddemu.roles.routed_prompts import RoutedPrompts
from pddemu.workload.replay_source import load_workload

PAGE = 2  # the default DRC page in genuine tokens (64 modelled at token scale 32)
REQUESTS = 300
CAPACITY = 60_000  # genuine tokens: about 27 prompts, so the LRU evicts all along
REPORT_LAG = 3  # the router hears of a transfer's beginning this many requests later


class Pages:
    """Stands for a prompt's KV in the DRC (the hit is under test, not the tensors)."""

    def token_slice(self, _start: int, _end: int) -> Pages:
        return self

    def clone(self) -> Pages:
        return self


class MainDecodeSide:
    """MD's DRC and index, as `MainDecodeInstance` uses them; or, with `by_ids`, the DRC alone,
    matched by the prompt's ids as the match carried them before."""

    def __init__(self, by_ids: bool) -> None:
        self.by_ids = by_ids
        self.store = PrefixKVStore(PAGE, CAPACITY)
        self.prefixes = PrefixIndex(PAGE)

    def hit(self, prompt: list[int], named: list[tuple[int, int]]) -> tuple[int, Any]:
        prefix = prompt if self.by_ids else self.prefixes.longest(named)
        length, node, _ = self.store.match(prefix, len(prompt))
        return length, node

    def kv_begins(self, prompt: list[int]) -> None:
        self.prefixes.add(prompt)

    def kv_ends(self, prompt: list[int], node: Any, tokens: int) -> None:
        """The transfer ended with `tokens` of the prompt's KV here: kept, the match let go."""
        if tokens:
            self.store.release(self.store.insert(prompt[:tokens], Pages()))  # type: ignore[arg-type]
        self.store.release(node)


def named_by(router: RoutedPrompts, prompt: list[int]) -> list[tuple[int, int]]:
    """What the frontend's match names (`RoutedPrompts.named`, as `Frontend.ask_match` sends
    it), as MD parses it."""
    return [(int(point), parse_hash(value)) for point, value in router.named(prompt)]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("restart_at", [40, 60, 200])  # MD restarts before this request
def test_hits_by_hashes_equal_hits_by_ids_request_for_request(seed: int, restart_at: int) -> None:
    """A restart while beginnings are still unheard (40, 60) is where a leg sent to the old
    process would otherwise count as reached on the new one."""
    requests = load_workload("pdd-janfeb", requests=REQUESTS, seed=seed, token_scale=32)
    fate = random.Random(seed)
    router = RoutedPrompts(PAGE)
    by_ids, by_hashes = MainDecodeSide(by_ids=True), MainDecodeSide(by_ids=False)
    unheard: list[tuple[int, str]] = []  # (request, leg): beginnings the router hears of later
    hits, named = [], []
    for index, request in enumerate(requests):
        if index == restart_at:  # a fresh process: empty DRC and index; the router saw it down
            by_ids, by_hashes = MainDecodeSide(by_ids=True), MainDecodeSide(by_ids=False)
            router.lost()
        while unheard and unheard[0][0] <= index - REPORT_LAG:
            router.began(unheard.pop(0)[1])
        prompt = [int(x) for x in request.prompt_ids]
        leg = f"r{index}"
        names = named_by(router, prompt)
        old, old_node = by_ids.hit(prompt, [])
        new, new_node = by_hashes.hit(prompt, names)
        hits.append((old, new))
        named.append(len(names))
        outcome = fate.choice(["relay only", "never began", "cut", "arrived", "arrived"])
        if outcome != "relay only":  # P is told to send it there
            router.routed(leg, prompt)
        kept = 0
        if outcome in ("cut", "arrived"):
            for side in (by_ids, by_hashes):
                side.kv_begins(prompt)
            unheard.append((index, leg))
            sent = fate.randrange(old, len(prompt)) if outcome == "cut" else len(prompt)
            kept = sent - sent % PAGE if outcome == "cut" else len(prompt)
        by_ids.kv_ends(prompt, old_node, kept)
        by_hashes.kv_ends(prompt, new_node, kept)
    assert [new for _, new in hits] == [old for old, _ in hits]
    assert sum(1 for old, _ in hits if old) > REQUESTS // 3  # the trace's hits are exercised
    assert by_hashes.store.cache.size == by_ids.store.cache.size
    # few hashes a match: the prompt's ids were about 1,100 pages' worth
    assert max(named) <= 40 and sum(named) / len(named) < 8, named


def test_the_points_stop_at_the_end_of_a_prompt_that_reached_it() -> None:
    router = RoutedPrompts(PAGE)
    turns = [list(range(1, 11)), list(range(1, 21)), list(range(1, 31))]
    for leg, turn in enumerate(turns):
        router.routed(str(leg), turn)
    prompt = list(range(1, 41))
    assert router.points(prompt) == [30, 20, 10]  # none known to have reached it
    router.began("1")
    assert router.points(prompt) == [30, 20]  # the 2nd turn reached it: MD knows up to 20
    router.lost()
    assert router.points(prompt) == [30, 20, 10]
    other = [*range(1, 15), 99, 98]  # leaves the turns inside the 2nd's pages
    assert router.points(other) == [14, 10]
