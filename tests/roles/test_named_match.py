"""The match by hashes gives the hit the match by ids gave, request for request: pdd-janfeb's
prompts replayed through the router's record (`RoutedPrompts`) and MD's index (`PrefixIndex`)
beside a DRC matched by the prompts' own ids, the two DRCs fed the same inserts, under LRU
eviction (the replay holds the DRC's capacity 11 times over), with transfers that never begin,
begin and are cut mid-way, or complete, the router hearing of them and of MD's DRC reports
late, and MD restarted once (the router seeing it down). Both records stay bounded by the
DRC's capacity in pages and what is in flight."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pddemu.bench.match_records import deep_size
from pddemu.cache.page_hashes import PrefixIndex, chained_page_hashes, parse_hash
from pddemu.roles.prefix_store import PrefixKVStore
from pddemu.roles.routed_prompts import RoutedPrompts
from pddemu.wire import Control, encode, frame_size
from pddemu.workload.replay_source import load_workload

PAGE = 2  # the default DRC page in genuine tokens (64 modelled at token scale 32)
REQUESTS = 300
CAPACITY = 60_000  # genuine tokens: about 27 prompts, so the LRU evicts all along
REPORT_LAG = 3  # the router hears of a transfer's end and of MD's reports this many requests later


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
        self.prefixes = PrefixIndex(PAGE)
        self.store = PrefixKVStore(PAGE, CAPACITY, None if by_ids else self.prefixes)
        self.hashes: list[int] | None = None  # the prompt's, held from its kv_begin

    def hit(self, prompt: list[int], named: list[tuple[int, int]], heard: list) -> tuple[int, Any]:
        if not self.by_ids:
            self.prefixes.heard(*heard)
        prefix = prompt if self.by_ids else self.prefixes.longest(named)
        length, node, _ = self.store.match(prefix, len(prompt))
        return length, node

    def kv_begins(self, prompt: list[int]) -> None:
        if not self.by_ids:
            self.hashes = self.prefixes.hold(prompt)

    def kv_ends(self, leg: str, prompt: list[int], node: Any, tokens: int) -> dict | None:
        """The transfer ended with `tokens` of the prompt's KV here: kept, the match let go;
        returns MD's report to the router (None if nothing changed)."""
        if tokens:
            if not self.by_ids:
                self.prefixes.kept(leg, tokens)
            kept = self.store.insert(prompt[:tokens], Pages(), self.hashes or ())  # type: ignore[arg-type]
            self.store.release(kept)
        self.store.release(node)
        if self.hashes is not None:
            if not tokens:
                self.prefixes.kept(leg, 0)
            self.prefixes.let_go(self.hashes)
            self.hashes = None
        return self.prefixes.report()

    def page_hashes(self) -> set[int]:
        """The hashes of the pages the DRC holds."""
        return {tag for _, _, tag in _handles(self.store.cache._root)}


def _handles(node: Any) -> list:
    found = list(node.handles)
    for child in node.children.values():
        found.extend(_handles(child))
    return found


def named_by(router: RoutedPrompts, prompt: list[int]) -> list[tuple[int, int]]:
    """What the frontend's match names (`RoutedPrompts.named`, as `Frontend.ask_match` sends
    it), as MD parses it."""
    hashes = chained_page_hashes(prompt, PAGE)
    return [(int(point), parse_hash(value)) for point, value in router.named(prompt, hashes)]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("down_at", [40, 60, 200])  # MD found down before this request
@pytest.mark.parametrize("down", ["restarted", "paused", "restarted, its report read first"])
def test_hits_by_hashes_equal_hits_by_ids_request_for_request(
    seed: int, down_at: int, down: str
) -> None:
    """Found down while reports are still unheard (40, 60): restarted (the old process's reports
    read before its connection closed), where its reports or legs could otherwise count for
    the new one; paused (or cut off), where its DRC
    is as it was and the pages reported before must still be named; restarted but seen down
    only once the new process's first report was read (the reports going on after it)."""
    requests = load_workload("pdd-janfeb", requests=REQUESTS, seed=seed, token_scale=32)
    fate = random.Random(seed)
    router = RoutedPrompts(PAGE)
    by_ids, by_hashes = MainDecodeSide(by_ids=True), MainDecodeSide(by_ids=False)
    unheard: list[tuple[int, Any]] = []  # (request, what): what the router hears of later
    hits, named = [], []
    longest = max(len(request.prompt_ids) for request in requests) // PAGE
    seen_down_late = False
    unknowing = range(0)
    for index, request in enumerate(requests):
        if index == down_at:
            if down.startswith("restarted"):  # a fresh process: empty DRC and index
                by_ids, by_hashes = MainDecodeSide(by_ids=True), MainDecodeSide(by_ids=False)
                # what the old one sent is read before its connection's close
                for heard in [what for _, what in unheard if isinstance(what, dict)]:
                    router.reported(heard)
                unheard = [(at, what) for at, what in unheard if isinstance(what, str)]
            if down == "restarted, its report read first":
                seen_down_late = True
            else:
                router.lost()
        while unheard and unheard[0][0] <= index - REPORT_LAG:
            heard = unheard.pop(0)[1]
            if isinstance(heard, str):
                router.never_came(heard)  # P's transfer_done: no token sent
                continue
            router.reported(heard)
            if seen_down_late and heard["since"] == by_hashes.prefixes.since:
                unknowing = range(down_at, index)  # the router held the old one's pages
                router.lost()
                seen_down_late = False
        # bounded by the DRC's capacity in pages, and by what the last reports left unheard
        assert len(router.held) <= CAPACITY // PAGE
        assert router.in_flight.num_pages <= (REPORT_LAG + 1) * longest
        assert len(by_hashes.prefixes) <= CAPACITY // PAGE + (REPORT_LAG + 1) * longest
        prompt = [int(x) for x in request.prompt_ids]
        leg = f"r{index}"
        names = named_by(router, prompt)
        old, old_node = by_ids.hit(prompt, [], [])
        new, new_node = by_hashes.hit(prompt, names, router.acknowledged())
        hits.append((old, new))
        named.append(len(names))
        outcome = fate.choice(["relay only", "never began", "cut", "arrived", "arrived"])
        if outcome != "relay only":  # P is told to send it there
            router.routed(leg, prompt, chained_page_hashes(prompt, PAGE))
        kept = 0
        if outcome in ("cut", "arrived"):
            for side in (by_ids, by_hashes):
                side.kv_begins(prompt)
            sent = fate.randrange(old, len(prompt)) if outcome == "cut" else len(prompt)
            kept = sent - sent % PAGE if outcome == "cut" else len(prompt)
        elif outcome == "never began":
            unheard.append((index, leg))
        by_ids.kv_ends(leg, prompt, old_node, kept)
        report = by_hashes.kv_ends(leg, prompt, new_node, kept)
        if report is not None:
            unheard.append((index, report))
    # but while the router did not know of the restart: naming the old one's pages, it may
    # name too few points for the new one's (as the match did before the DRC's reports)
    assert [new for at, (_, new) in enumerate(hits) if at not in unknowing] == [
        old for at, (old, _) in enumerate(hits) if at not in unknowing
    ]
    assert sum(1 for old, _ in hits if old) > REQUESTS // 3  # the trace's hits are exercised
    assert by_hashes.store.cache.size == by_ids.store.cache.size
    for _, heard in unheard:  # every report heard: the router's record is the DRC's pages
        router.reported(heard) if isinstance(heard, dict) else router.never_came(heard)
    assert set(router.held) == by_hashes.page_hashes()
    assert router.in_flight.num_pages == 0
    # few hashes a match: the prompt's ids were about 1,100 pages' worth
    assert max(named) <= 40 and sum(named) / len(named) < 8, named


def test_the_points_go_down_the_prompts_in_flight_to_the_pages_reported() -> None:
    router = RoutedPrompts(PAGE)
    turns = [list(range(1, 11)), list(range(1, 21)), list(range(1, 31))]
    for leg, turn in enumerate(turns):
        router.routed(str(leg), turn, chained_page_hashes(turn, PAGE))
    prompt = list(range(1, 41))
    hashes = chained_page_hashes(prompt, PAGE)
    assert router.points(prompt, hashes) == [30, 20, 10]  # nothing reported yet
    report = {"since": "a", "report": 1, "changes": [["kept", "1", 20]]}
    router.reported(report)  # the 2nd turn's KV is in the DRC
    assert router.points(prompt, hashes) == [30, 20]
    evicted = ["evicted", f"{hashes[9]:016x}", 3]
    router.reported({"since": "a", "report": 2, "changes": [evicted]})
    assert router.points(prompt, hashes) == [30, 20, 14]  # MD dropped pages 8-10
    router.reported(report)  # applied already: nothing changes
    assert router.points(prompt, hashes) == [30, 20, 14]
    router.reported({"since": "a", "report": 4, "changes": []})  # the 3rd was missed
    assert router.points(prompt, hashes) == [30, 20, 10]


def test_an_instance_found_down_is_named_every_point_until_its_next_report_says_which() -> None:
    router = RoutedPrompts(PAGE)
    prompt = list(range(1, 41))
    hashes = chained_page_hashes(prompt, PAGE)
    router.routed("a", prompt[:20], hashes[:10])
    router.reported({"since": "s", "report": 1, "changes": [["kept", "a", 20]]})
    router.routed("b", prompt[:10], hashes[:5])
    assert router.points(prompt, hashes) == [20]  # what the DRC holds reaches past b's end
    router.lost()  # paused, cut off, or restarted: b's part may be all it holds
    assert router.points(prompt, hashes) == [20, 10]
    router.reported({"since": "s", "report": 2, "changes": []})  # paused: as it was
    assert router.points(prompt, hashes) == [20]
    router.lost()
    router.reported({"since": "t", "report": 1, "changes": []})  # restarted: b went to "s"
    assert router.points(prompt, hashes) == []
    assert len(router) == 0


def test_an_instance_seen_down_after_its_new_process_reported_goes_on_from_that_report() -> None:
    router = RoutedPrompts(PAGE)
    prompt = list(range(1, 41))
    hashes = chained_page_hashes(prompt, PAGE)
    router.routed("a", prompt[:20], hashes[:10])
    router.reported({"since": "s", "report": 1, "changes": [["kept", "a", 20]]})
    router.routed("b", prompt[:30], hashes[:15])
    router.reported({"since": "t", "report": 1, "changes": [["kept", "b", 30]]})
    router.lost()  # the old process's connection closed after the new one reported
    router.reported({"since": "t", "report": 2, "changes": []})
    assert router.points(prompt, hashes) == [30]
    assert router.acknowledged() == ["t", 2]


def test_the_index_forgets_a_page_dropped_once_the_router_heard_so() -> None:
    index = PrefixIndex(PAGE)
    store = PrefixKVStore(PAGE, 4, index)
    prompt = [1, 2, 3, 4]
    hashes = index.hold(prompt)
    index.kept("a", 4)
    store.release(store.insert(prompt, Pages(), hashes))  # type: ignore[arg-type]
    index.let_go(hashes)
    assert index.report() == {"since": index.since, "report": 1, "changes": [["kept", "a", 4]]}
    named = [(4, hashes[1]), (2, hashes[0])]
    store.release(store.insert([5, 6], Pages(), index.hold([5, 6])))  # type: ignore[arg-type]
    assert index.report()["changes"] == [["evicted", f"{hashes[1]:016x}", 1]]
    index.heard(index.since, 1)  # the router may still name [1, 2, 3, 4]
    assert index.longest(named) == prompt
    index.heard("another process", 2)
    assert index.longest(named) == prompt
    index.heard(index.since, 2)
    assert index.longest(named) == [1, 2]


def test_a_process_names_its_reports_by_8_random_bytes() -> None:
    """A restarted MD whose process id were its predecessor's would have the router skip its
    reports as applied already (numbered from 1 again): 8 bytes make that a 2^-64 chance."""
    ids = {PrefixIndex(PAGE).since for _ in range(100)}
    assert len(ids) == 100
    assert {len(bytes.fromhex(since)) for since in ids} == {8}


def test_a_leg_in_flight_is_kept_in_a_few_bytes_a_token() -> None:
    """Its ids in the prefix tree (8 bytes), its page hashes (8 bytes a page), not a list of
    Python ints (about 36 bytes a token)."""
    router = RoutedPrompts(PAGE)
    empty = deep_size(router)
    prompt = [1000 + (7919 * i) % 150_000 for i in range(20_000)]
    router.routed("a", prompt, chained_page_hashes(prompt, PAGE))
    del prompt
    assert (deep_size(router) - empty) / 20_000 < 20


def test_a_report_of_an_eviction_is_a_few_bytes_however_many_pages_it_dropped() -> None:
    """Its last page's hash and a count, not a hash a page: the report crosses the WAN on MD's
    control connection, ahead of its tokens."""
    index = PrefixIndex(PAGE)
    store = PrefixKVStore(PAGE, 2_000, index)
    for first in (1, 5_000):  # the second evicts the first's 1,000 pages
        prompt = list(range(first, first + 2_000))
        hashes = index.hold(prompt)
        store.release(store.insert(prompt, Pages(), hashes))  # type: ignore[arg-type]
        index.let_go(hashes)
    report = index.report()
    assert report is not None and report["changes"][-1][0] == "evicted"
    assert frame_size(encode(Control("drc_report", report))) < 150
    router = RoutedPrompts(PAGE)
    router.routed("a", list(range(1, 2_001)), chained_page_hashes(list(range(1, 2_001)), PAGE))
    router.reported({**report, "changes": [["kept", "a", 2_000], report["changes"][-1]]})
    assert router.held == {}
