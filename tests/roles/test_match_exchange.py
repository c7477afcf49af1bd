"""MD's answer to the frontend's `match`: the whole pages of the prompt its DRC holds (a prefix
that ends mid-page counts its whole pages only, and never the whole prompt: its last token must
be computed), pinned for the request until it is released; a match read after the request's KV
began to come (the frontend gave up waiting) pins nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from pddemu.roles.main_decode import MainDecodeInstance
from pddemu.runtime.channel import Envelope
from pddemu.wire import TokenIds
from tests.roles.in_process import instance


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
    md.store.release(md.store.insert(prompt, kv))
    return md


async def match(md: MainDecodeInstance, rid: str, prompt: list[int]) -> int:
    frontend = Frontend()
    ids = [TokenIds.from_ints(rid, 0, prompt)]
    await md.on_match(Envelope("match", {"rid": rid}, ids, frontend))
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
