"""MD's answer to the frontend's `match`: the whole pages of the prompt its DRC holds (a prefix
that ends mid-page counts its whole pages only, and never the whole prompt: its last token must
be computed), pinned for the request until it is released; a match read after the request's KV
began to come (the frontend gave up waiting) pins nothing. The match names prefixes by their
chained page hashes: MD holds only what it can prove, the longest it knows (a prefix its DRC
holds, or one of a prompt whose KV is coming here). The DRC's insert keys the prompt by the held prefix's ids and
those its `kv_begin` brings."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from pddemu.cache.page_hashes import PrefixIndex
from pddemu.roles.main_decode import MainDecodeInstance
from pddemu.runtime.channel import Envelope
from pddemu.wire import TokenIds
from pddemu.wire.tensors import kv_chunk_from_tensor
from tests.roles.in_process import KvLinkEnd, instance, keep_in_drc, match_naming_every_page


class Frontend:
    """The frontend's end of MD's connection: the answers written on it."""

    peer = "FE0"

    def __init__(self) -> None:
        self.answers: list[dict] = []

    async def control(
        self, kind: str, body: dict, handed: Callable[[], None] | None = None
    ) -> None:
        assert kind == "matched"
        self.answers.append(body)
        if handed is not None:
            handed()


def cached_md(prompt: list[int]) -> MainDecodeInstance:
    """An MD whose DRC holds `prompt`'s whole pages, pinned by nothing."""
    md = instance(MainDecodeInstance, "MD")
    kv, _ = md.model.prefill(prompt, None, len(prompt))
    keep_in_drc(md, prompt, kv)
    return md


async def match(md: MainDecodeInstance, rid: str, prompt: list[int]) -> int:
    frontend = Frontend()
    await md.on_match(match_naming_every_page(md, rid, prompt, frontend))
    (answer,) = frontend.answers
    return int(answer["hit"])


PAGES = 5


@pytest.mark.parametrize(
    ("shared_tokens", "prompt_pages", "pages_hit"),
    [
        (3, 6, 3),  # the prompt leaves the cached one one token into its 4th page: 3 pages
        (PAGES, PAGES, PAGES - 1),  # the cached prompt itself: all but its last page
        (PAGES, PAGES + 2, PAGES),  # a later turn of its session: every cached page
        (0, 4, 0),  # one token in common: no whole page
    ],
)
def test_the_hit_is_the_whole_pages_held_pinned_until_released(
    shared_tokens: int, prompt_pages: int, pages_hit: int
) -> None:
    async def scenario() -> tuple[int, int, int, int]:
        md = cached_md(cached)
        page = md.page_tokens
        shared = cached[: shared_tokens * page + (1 if shared_tokens < PAGES else 0)]
        prompt = (shared + [900 + i for i in range(prompt_pages * page)])[: prompt_pages * page]
        hit = await match(md, "r", prompt)
        pinned = md.store.cache.pinned_size
        await md.on_release(Envelope("release", {"rid": "r", "kv_expected": False}, [], None))
        return page, hit, pinned, md.store.cache.pinned_size

    cached = [1 + i for i in range(PAGES * 2)]  # the default page: 2 genuine tokens
    page, hit, pinned, after = asyncio.run(scenario())
    assert page == 2
    assert hit == pages_hit * page
    assert pinned >= hit  # the hit's pages are pinned (the match's path, whole pages)
    assert after == 0  # released with the request


def test_a_match_read_after_the_kv_began_pins_nothing() -> None:
    async def scenario() -> tuple[int, int]:
        md = cached_md(cached)
        md.kv_begun.add("r")  # its KV began to come: the frontend routed it with no hit here
        hit = await match(md, "r", cached + [99, 98])
        return hit, md.store.cache.pinned_size

    cached = [1 + i for i in range(PAGES * 2)]
    assert asyncio.run(scenario()) == (0, 0)


META = {"input_tokens": 14 * 32, "output_tokens": 40, "frontend": "FE0", "pipeline": "P-RLD-MD"}


async def transfer(md: MainDecodeInstance, rid: str, prompt: list[int], offset: int) -> None:
    """P's transfer of `prompt`'s KV from `offset`, its ids with its `kv_begin` as P sends
    them to a decode instance with a DRC."""
    link = KvLinkEnd()
    begin = {"rid": rid, "prompt_tokens": len(prompt), "offset": offset, "meta": META}
    ids = [TokenIds.from_ints(rid, offset, prompt[offset:])]
    await md.on_kv_begin(Envelope("kv_begin", begin, ids, link))
    kv, _ = md.model.prefill(prompt, None, len(prompt))
    increment = kv.token_slice(offset, len(prompt)).tensor
    await md.on_kv_chunk(kv_chunk_from_tensor(rid, 0, offset, increment), link)
    await md.on_kv_end(Envelope("kv_end", {"rid": rid, "first_token": 7}, [], link))
    while md.expects(rid):  # its intake runs beside
        await asyncio.sleep(0.001)


def test_the_drc_keys_a_prompt_by_the_held_prefix_and_the_ids_its_kv_begin_brings() -> None:
    """The match tells MD the prefix it holds; `kv_begin` brings the ids beyond it: the DRC
    then holds the whole prompt, which the session's next turn finds."""

    async def scenario() -> tuple[int, int, int]:
        md = cached_md(cached)
        page = md.page_tokens
        prompt = cached[: 3 * page + 1] + [200 + i for i in range(4 * page - 1)]  # 7 pages
        hit = await match(md, "r", prompt)
        await transfer(md, "r", prompt, hit)
        next_turn = await match(md, "s", [*prompt, 1, 2, 3])
        return page, hit, next_turn

    cached = [1 + i for i in range(PAGES * 2)]
    page, hit, next_turn = asyncio.run(scenario())
    assert hit == 3 * page
    assert next_turn == 7 * page


def test_a_kv_begin_whose_ids_do_not_make_its_prompt_is_refused_naming_them() -> None:
    async def scenario() -> list[tuple[str, dict]]:
        md = cached_md(cached)
        prompt = cached[:7] + [200, 201, 202]
        hit = await match(md, "r", prompt)
        link = KvLinkEnd()
        begin = {"rid": "r", "prompt_tokens": len(prompt), "offset": hit, "meta": META}
        ids = [TokenIds.from_ints("r", hit, prompt[hit + 1 :])]  # one id short
        with pytest.raises(ValueError, match="kv_begin carries 3 ids from token 6 of a prompt"):
            await md.on_kv_begin(Envelope("kv_begin", begin, ids, link))
        return link.said

    cached = [1 + i for i in range(PAGES * 2)]
    ((kind, body),) = asyncio.run(scenario())
    assert kind == "kv_refused" and "kv_begin carries" in body["reason"]


@pytest.mark.parametrize(("rid", "shift"), [("r", 1), ("q", 0)])
def test_a_kv_begin_whose_ids_are_not_the_requests_from_its_offset_is_refused(
    rid: str, shift: int
) -> None:
    """As many ids as the prompt needs, but from another position or of another request:
    inserted, they would key the DRC's pages by the wrong ids."""

    async def scenario() -> list[tuple[str, dict]]:
        md = cached_md(cached)
        prompt = cached[:7] + [200, 201, 202]
        hit = await match(md, "r", prompt)
        link = KvLinkEnd()
        begin = {"rid": "r", "prompt_tokens": len(prompt), "offset": hit, "meta": META}
        ids = [TokenIds.from_ints(rid, hit + shift, prompt[hit:])]
        with pytest.raises(ValueError, match="kv_begin's ids from token 6 expected"):
            await md.on_kv_begin(Envelope("kv_begin", begin, ids, link))
        return link.said

    cached = [1 + i for i in range(PAGES * 2)]
    ((kind, body),) = asyncio.run(scenario())
    assert kind == "kv_refused" and "expected" in body["reason"]


def test_a_prefix_named_by_hashes_md_does_not_know_holds_nothing() -> None:
    """A restarted MD (or one whose index lost the prompt) cannot tell what a hash names: the
    hit is what it can prove, here 0, however much of the prompt its DRC holds."""

    async def scenario() -> tuple[int, int]:
        md = cached_md(cached)
        md.prefixes = PrefixIndex(md.page_tokens)  # knows no prompt
        return await match(md, "r", [*cached, 3, 4]), md.store.cache.pinned_size

    cached = [1 + i for i in range(PAGES * 2)]
    assert asyncio.run(scenario()) == (0, 0)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"prompt_tokens": 0, "prefixes": []}, "prompt_tokens"),
        ({"prompt_tokens": 10, "prefixes": "00"}, "prefixes must be a list"),
        ({"prompt_tokens": 10, "prefixes": [[4]]}, "a named prefix is"),
        ({"prompt_tokens": 10, "prefixes": [[12, "0" * 16]]}, "tokens must be"),
        ({"prompt_tokens": 10, "prefixes": [[4, "xyz"]]}, "a page hash is 16"),
        ({"prompt_tokens": 10, "prefixes": [[4, "g" * 16]]}, "hexadecimal"),
        ({"prompt_tokens": 10, "prefixes": [], "heard": ["a", -1]}, "heard must be"),
    ],
)
def test_a_malformed_match_is_refused_naming_what_is_wrong(body: dict, named: str) -> None:
    """And the shaper's hold at the match's release is let go (across the WAN it would
    otherwise stand until its cap, the clock still)."""
    md = cached_md([1, 2, 3, 4])
    let_go: list[object] = []
    md.clock.let_routing_go = lambda *held: let_go.append(held) or True  # type: ignore[method-assign]
    message = Envelope("match", {"rid": "r", **body}, [], Frontend())
    with pytest.raises(ValueError, match=named):
        asyncio.run(md.on_match(message))
    assert md.matches == {}
    assert len(let_go) == 1


def test_a_second_kv_begin_for_a_request_lets_the_first_ones_hold_go() -> None:
    """A kv_begin repeated on the same link (the request's match still pinned) holds the
    prompt's prefixes in the index again: the first hold is let go, or they are never
    forgotten once the request ends."""

    async def scenario() -> int:
        md = instance(MainDecodeInstance, "MD")
        prompt = [1 + i for i in range(PAGES * 2)]
        await match(md, "r", prompt)
        begin = {"rid": "r", "prompt_tokens": len(prompt), "offset": 0, "meta": META}
        for _ in range(2):
            ids = [TokenIds.from_ints("r", 0, prompt)]
            md.prompt_begun(Envelope("kv_begin", begin, ids, KvLinkEnd()))
        await md.on_release(Envelope("release", {"rid": "r", "kv_expected": False}, [], None))
        md.prefixes.heard(md.prefixes.since, md.prefixes.reports)  # the router heard it all
        return len(md.prefixes)

    assert asyncio.run(scenario()) == 0
