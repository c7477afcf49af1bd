"""MD's DRC reports reach the frontend's record of it (`drc_report`), and the frontend's match
says which it applied (`heard`): a real MainDecodeInstance and Frontend driven in-process, MD's
reports and the frontend's matches carried between them as their bodies cross the wire. A
report that could not be sent, or that went on a connection since closed, is sent again: with
the next, or at a match that has not heard it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pddemu.cache.page_hashes import HASH_BYTES, chained_page_hashes
from pddemu.metrics.records import RequestRecord
from pddemu.roles import frontend as frontend_module
from pddemu.roles import routed_prompts as routed_prompts_module
from pddemu.roles.frontend import Flight, Frontend
from pddemu.roles.main_decode import MainDecodeInstance
from pddemu.roles.routed_prompts import RoutedPrompts
from pddemu.roles.spec import Address
from pddemu.runtime.channel import Envelope
from pddemu.wire import TokenIds
from pddemu.wire.tensors import kv_chunk_from_tensor
from tests.roles.in_process import KvLinkEnd, frontend, instance
from tests.roles.test_match_exchange import META, PAGES
from tests.roles.test_match_exchange import Frontend as AnswerEnd


class Connection:
    """MD's control connection to the frontend: what crosses it is read there."""

    peer = "MD0"
    closed = False


class Deployment:
    """An MD and a frontend whose messages to each other are handed over in-process."""

    def __init__(self) -> None:
        self.md: MainDecodeInstance = instance(MainDecodeInstance, "MD")
        self.md.spec.peers["FE0"] = Address("FE0", "FE", "127.0.0.1", 3, 4)
        self.fe: Frontend = frontend()
        self.fe.decode_names.append("MD0")  # the frontend takes DRC reports from its MDs only
        self.connection = Connection()
        self.failing = False  # MD's sends fail (its connection reset)
        self.lost: list[dict] = []  # sent, never read (the connection closed after)
        self.md.peer = self.peer  # type: ignore[method-assign]
        self.md.tell = self.md_tells  # type: ignore[method-assign]

    async def peer(self, name: str) -> Any:
        return self.connection

    async def md_tells(self, name: str, kind: str, body: dict, *attachments: Any) -> int:
        if kind != "drc_report":
            return 0
        if self.failing:
            raise ConnectionResetError("reset")
        if self.connection.closed:
            self.lost.append(body)
            return 0
        await self.fe.on_drc_report(Envelope("drc_report", body, [], self.connection))
        return 1

    def reconnect(self) -> None:
        self.connection = Connection()

    async def keep(self, leg: str, prompt: list[int]) -> int:
        """The frontend asks MD's hit for the leg, routes its KV there, and it comes: MD's
        hit."""
        flight, hit = await self.match(leg, prompt)
        self.fe.routed_there("MD0", leg, flight)
        await transfer(self.md, leg, prompt, hit)
        await self.reports_sent()
        return hit

    async def match(self, leg: str, prompt: list[int]) -> tuple[Flight, int]:
        """The frontend asks MD's hit for the leg: its flight, and MD's hit."""
        record = RequestRecord(
            request_id=leg,
            system="pdd",
            arrival_s=0.0,
            input_tokens=32 * len(prompt),
            expected_output_tokens=8,
        )
        flight = Flight(record, prompt, None)
        await self.fe.ask_match("MD0", leg, flight)
        _, kind, body = self.fe.told[-1]
        assert kind == "match"
        answers = AnswerEnd()
        await self.md.on_match(Envelope("match", body, [], answers))
        return flight, int(answers.answers[-1]["hit"])

    async def reports_sent(self) -> None:
        """Until MD's sender has sent what it was woken for (a send here returns or fails
        at once, unless a test stalls it)."""
        while self.md.reports_due.is_set():
            await asyncio.sleep(0)

    def held(self) -> set[int]:
        return set(self.fe.prompts_routed_to("MD0").held)


async def transfer(md: MainDecodeInstance, rid: str, prompt: list[int], offset: int) -> None:
    """P's transfer of `prompt`'s KV from `offset` (its kv_begin, one chunk, its kv_end)."""
    link = KvLinkEnd()
    begin = {"rid": rid, "prompt_tokens": len(prompt), "offset": offset, "meta": META | RLD}
    ids = [TokenIds.from_ints(rid, offset, prompt[offset:])]
    await md.on_kv_begin(Envelope("kv_begin", begin, ids, link))
    kv, _ = md.model.prefill(prompt, None, len(prompt))
    increment = kv.token_slice(offset, len(prompt)).tensor
    await md.on_kv_chunk(kv_chunk_from_tensor(rid, 0, offset, increment), link)
    await md.on_kv_end(Envelope("kv_end", {"rid": rid, "first_token": 7}, [], link))
    while md.expects(rid):  # its intake runs beside
        await asyncio.sleep(0.001)
    await md.on_release(Envelope("release", {"rid": rid, "kv_expected": False}, [], None))


RLD = {"rld": "RLD0"}


def turns() -> list[list[int]]:
    first = [1 + i for i in range(PAGES * 2)]
    return [first, [*first, *range(50, 56)], [*range(70, 80)]]


def test_md_reports_what_its_drc_kept_and_the_frontends_match_names_it() -> None:
    async def scenario() -> tuple[Deployment, int]:
        deployment = Deployment()
        for leg, prompt in [("a", turns()[0]), ("c", turns()[2])]:
            await deployment.keep(leg, prompt)
        hit = await deployment.keep("b", turns()[1])  # named by the pages reported
        return deployment, hit

    deployment, hit = asyncio.run(scenario())
    md, record = deployment.md, deployment.fe.prompts_routed_to("MD0")
    assert hit == PAGES * 2
    matches = [body for _, kind, body in deployment.fe.told if kind == "match"]
    assert [body["heard"] for body in matches] == [
        ["", 0],
        [md.prefixes.since, 1],
        [md.prefixes.since, 2],
    ]
    assert record.acknowledged() == [md.prefixes.since, 3]
    assert [body["report"] for body in md.prefixes.unheard] == [3]  # b's, not yet acknowledged
    assert set(record.held) >= set(chained_page_hashes(turns()[1], md.page_tokens))
    assert md.report_bytes["count"] == 3


def test_a_report_whose_sending_failed_is_sent_again_with_the_next() -> None:
    async def scenario() -> Deployment:
        deployment = Deployment()
        deployment.failing = True
        await deployment.keep("a", turns()[0])
        deployment.failing = False
        await deployment.keep("c", turns()[2])
        return deployment

    deployment = asyncio.run(scenario())
    pages = [set(chained_page_hashes(turn, deployment.md.page_tokens)) for turn in turns()]
    assert deployment.held() == pages[0] | pages[2]
    assert deployment.fe.prompts_routed_to("MD0").heard == 2


def test_reports_sent_on_a_connection_since_closed_are_sent_again_on_the_next() -> None:
    async def scenario() -> Deployment:
        deployment = Deployment()
        await deployment.keep("a", turns()[0])
        deployment.connection.closed = True  # what goes on it now is never read
        await deployment.keep("c", turns()[2])
        deployment.reconnect()
        await deployment.keep("d", [*range(90, 100)])
        return deployment

    deployment = asyncio.run(scenario())
    page = deployment.md.page_tokens
    assert [body["report"] for body in deployment.lost] == [2]
    expected = set()
    for turn in [turns()[0], turns()[2], [*range(90, 100)]]:
        expected |= set(chained_page_hashes(turn, page))
    assert deployment.held() == expected


@pytest.mark.parametrize("lost", ["failed", "closed"])
def test_a_match_that_has_not_heard_the_reports_lost_has_them_sent_again(lost: str) -> None:
    """A quiet MD (no change after the reports lost: a failed sending, or sent on a
    connection since closed) sends them again when a match says they were not heard."""

    async def scenario() -> Deployment:
        deployment = Deployment()
        deployment.failing = lost == "failed"
        deployment.connection.closed = lost == "closed"
        await deployment.keep("a", turns()[0])
        deployment.failing = False
        deployment.reconnect()
        await deployment.match("b", turns()[2])
        await deployment.reports_sent()
        return deployment

    deployment = asyncio.run(scenario())
    md = deployment.md
    assert deployment.held() == set(chained_page_hashes(turns()[0], md.page_tokens))
    record = deployment.fe.prompts_routed_to("MD0")
    assert record.acknowledged() == [md.prefixes.since, md.prefixes.reports]


def test_a_match_behind_the_reports_sent_sends_nothing_again() -> None:
    """Reports in flight (sent on a connection still open) are not sent again for a match
    that left before they were read."""

    async def scenario() -> Deployment:
        deployment = Deployment()
        await deployment.keep("a", turns()[0])
        deployment.fe.prompts_routed_to("MD0").heard = 0  # as if not read yet
        await deployment.match("b", turns()[2])
        await deployment.reports_sent()
        return deployment

    deployment = asyncio.run(scenario())
    assert deployment.md.report_bytes["count"] == deployment.md.prefixes.reports


def test_the_frontend_hashes_a_prompt_once_for_its_match_and_the_pages_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hashed: list[int] = []

    def counted(ids: Any, page_tokens: int) -> list[int]:
        hashed.append(len(ids))
        return chained_page_hashes(ids, page_tokens)

    monkeypatch.setattr(frontend_module, "chained_page_hashes", counted)
    monkeypatch.setattr(routed_prompts_module, "chained_page_hashes", counted, raising=False)

    async def scenario() -> Deployment:
        deployment = Deployment()
        for leg, prompt in [("a", turns()[0]), ("b", turns()[1])]:
            await deployment.keep(leg, prompt)
        return deployment

    deployment = asyncio.run(scenario())
    assert hashed == [len(turns()[0]), len(turns()[1])]
    assert deployment.held() >= set(chained_page_hashes(turns()[1], deployment.md.page_tokens))


@pytest.mark.parametrize(
    "body",
    [
        {"since": "p1", "report": -1, "changes": []},
        {"since": "p1", "report": 2, "changes": [["kept", "r1", -64]]},
        {"since": "p1", "report": 2, "changes": [["evicted", "00" * HASH_BYTES, 1], ["x", 1, 1]]},
        {"since": "p1", "report": 2, "changes": [["evicted", "not a hash", 1]]},
        {"since": 7, "report": 2, "changes": []},
    ],
)
def test_a_malformed_report_changes_nothing(body: dict) -> None:
    """Checked whole before any change is applied: one applied in part would be
    acknowledged whole (`heard`), and a negative count would slice from the prompt's end."""
    router = RoutedPrompts(16)
    router.reported({"since": "p1", "report": 1, "changes": []})
    with pytest.raises(ValueError):
        router.reported(body)
    assert (router.since, router.heard, len(router.held)) == ("p1", 1, 0)


def test_a_report_from_a_peer_that_is_no_decode_instance_makes_no_record() -> None:
    fe = frontend()
    fe.decode_names.append("MD0")

    class FromP:
        peer = "P0"

    body = {"since": "p1", "report": 1, "changes": []}
    with pytest.raises(ValueError, match="not a decode instance"):
        asyncio.run(fe.on_drc_report(Envelope("drc_report", body, [], FromP())))
    assert "P0" not in fe.routed_prompts


def test_one_task_sends_the_reports_however_long_a_send_stalls() -> None:
    """A send that stalls (a full connection) holds the later reports back in MD's one
    sender, not in a task each; once it goes on, each reaches the frontend once, in order."""

    async def scenario() -> tuple[Deployment, int, list[int]]:
        deployment = Deployment()
        md, sent = deployment.md, deployment.md_tells
        flowing = asyncio.Event()
        read: list[int] = []

        async def stalling(name: str, kind: str, body: dict, *attachments: Any) -> int:
            await flowing.wait()
            read.append(body["report"])
            return await sent(name, kind, body, *attachments)

        md.tell = stalling  # type: ignore[method-assign]
        for leg in "abcde":
            md.prefixes.kept(leg, 0)
            md.report_drc()
            await asyncio.sleep(0)
        tasks = len(asyncio.all_tasks()) - 1  # this one aside
        flowing.set()
        await deployment.reports_sent()
        return deployment, tasks, read

    deployment, tasks, read = asyncio.run(scenario())
    assert tasks == 1
    assert read == [1, 2, 3, 4, 5]
    assert deployment.fe.prompts_routed_to("MD0").heard == 5


def test_a_prompt_kept_short_of_a_page_adds_no_page() -> None:
    """MD reports a prompt kept with fewer tokens than a page (or none): nothing of it is in
    its DRC. It failed the frontend's handler on every such report (a pages/parents zip of
    unequal lengths), and the reports after it in the same message were not applied."""
    router = RoutedPrompts(16)
    prompt = list(range(100, 140))
    router.routed("short", prompt, chained_page_hashes(prompt, 16))
    router.routed("whole", prompt, chained_page_hashes(prompt, 16))
    router.reported(
        {"since": "p1", "report": 1, "changes": [["kept", "short", 5], ["kept", "whole", 32]]}
    )
    assert set(router.held) == set(chained_page_hashes(prompt, 16)[:2])
    assert router.heard == 1
