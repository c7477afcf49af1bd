"""Message orders the protocol must survive, driven in-process (no network: `tell` recorded)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from pddemu.roles.decode import DecodeRequest
from pddemu.roles.main_decode import MainDecodeInstance
from pddemu.roles.recent import KEPT, Recent
from pddemu.roles.relay import Handoff, RelayInstance
from pddemu.runtime.channel import Envelope
from pddemu.wire import TokenIds
from pddemu.wire.tensors import kv_chunk_from_tensor
from tests.roles.in_process import (
    KvLinkEnd,
    admit,
    frontend,
    instance,
    match_naming_every_page,
    tokens,
)

META = {
    "input_tokens": 40 * 32,
    "output_tokens": 400,
    "genuine_output_tokens": 14,
    "frontend": "FE0",
    "pipeline": "P-RLD-MD",
    "rld": "RLD0",
    "md": "MD0",
}


def prompt_request(made: Any, rid: str) -> DecodeRequest:
    prompt = list(range(40))
    kv, _ = made.model.prefill(prompt, None, 64)
    return DecodeRequest(rid, dict(META), kv, len(prompt))


def test_a_release_racing_a_handoff_part_leaves_the_decode_loop_running() -> None:
    async def scenario() -> tuple[list[str], bool]:
        md = instance(MainDecodeInstance, "MD")
        await md.start()
        md.requests["r1"] = prompt_request(md, "r1")
        md.known["r1"] = []
        part = {"rid": "r1", "start": 0, "end": 3, "final": False, "payload": "extend"}
        part["sent_at"] = md.clock.now()
        await md.on_handoff(
            Envelope("handoff", part, [TokenIds.from_ints("r1", 0, [1, 2, 3])], None)
        )
        await md.on_release(Envelope("release", {"rid": "r1", "kv_expected": False}, [], None))
        await asyncio.sleep(0.3)
        # a late part for the released request is ignored, and the loop still serves others
        await md.on_handoff(
            Envelope("handoff", part, [TokenIds.from_ints("r1", 0, [1, 2, 3])], None)
        )
        loop_alive = any(not task.done() for task in md._tasks)
        return md.errors, loop_alive

    errors, loop_alive = asyncio.run(scenario())
    assert errors == [] and loop_alive


def test_md_ready_before_the_relay_has_the_request_still_starts_the_handoff() -> None:
    async def scenario() -> set[str]:
        rld = instance(RelayInstance, "RLD")
        await rld.on_md_ready(Envelope("md_ready", {"rid": "r2"}, [], None))  # KV not here yet
        request = prompt_request(rld, "r2")
        await rld.reserve_memory(request)
        await rld.kv_arrived(request, first_token=7, begin={}, genuine_bytes=0)
        return set(rld.handoffs)

    assert asyncio.run(scenario()) == {"r2"}


def test_a_step_after_idling_never_starts_before_its_work_arrived() -> None:
    async def scenario() -> tuple[float, float]:
        md = instance(MainDecodeInstance, "MD")
        md.last_end = md.clock.now() - 0.01  # a step ended a moment ago, then the loop idled
        ready = md.clock.now() + 0.02
        return md._start_time(ready), ready

    started, ready = asyncio.run(scenario())
    assert started >= ready


def test_a_handoff_part_md_cannot_take_leaves_the_relays_step_and_stream_going() -> None:
    """MD0 is gone before the router has said so: the relay's handoff part to it cannot be sent
    (its port refuses). The relay finishes that request itself, as when the router tells it MD
    was lost, and the other request of the same step streams on. On the code before, the
    failed send failed the step, which dropped both requests and told nobody: their tokens
    stopped at a group's end and the frontend waited for the rest until the request timeout
    (as test_failover's request did in CI: 577 of 1300 tokens, MD0 killed)."""
    output = 3 * 32 + 1  # genuine outputs 0-3

    async def scenario() -> tuple[dict[str, int], list[str]]:
        rld = instance(RelayInstance, "RLD")
        delivered: dict[str, int] = {}

        async def tell(name: str, kind: str, body: dict, *attachments: Any) -> int:
            if name == "MD0":
                raise ConnectionRefusedError(111, "Connection refused")
            if kind == "tokens":
                delivered[body["rid"]] = body["first"] + len(body["times"])
            return 0

        rld.tell = tell
        await rld.start()
        for rid, handoff in (("to-lost-md", True), ("relay-only", False)):
            request = prompt_request(rld, rid)
            request.meta.update(output_tokens=output, genuine_output_tokens=4)
            await rld.reserve_memory(request)
            if handoff:  # MD0 said it had the KV before it was lost
                await rld.on_md_ready(Envelope("md_ready", {"rid": rid}, [], None))
            await rld.kv_arrived(request, first_token=7, begin={}, genuine_bytes=0)
        deadline = time.monotonic() + 20
        while rld.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return delivered, rld.errors

    delivered, errors = asyncio.run(scenario())
    assert delivered == {"to-lost-md": output, "relay-only": output}, (delivered, errors)
    assert errors == []


def test_md_lost_while_the_relay_sends_its_final_part_leaves_the_request_on_the_relay() -> None:
    """The router says MD was lost while the relay is still sending the final part (the part
    reaches a dying MD): the relay does not hand the request over at the switch but streams
    it to its end. On the code before, it dropped the request at the switch (one-shot: the
    switch is where the final part leaves), and no one streamed on from there."""
    output = 3 * 32 + 1

    async def scenario() -> dict[str, int]:
        rld = instance(RelayInstance, "RLD")
        rld.config = rld.config.with_policy(handoff_mode="one-shot")
        delivered: dict[str, int] = {}

        async def tell(name: str, kind: str, body: dict, *attachments: Any) -> int:
            if name == "MD0" and kind == "handoff" and body["final"]:
                await rld.on_md_lost(Envelope("md_lost", {"rid": body["rid"]}, [], None))
            if kind == "tokens":
                delivered[body["rid"]] = body["first"] + len(body["times"])
            return 0

        rld.tell = tell
        await rld.start()
        request = prompt_request(rld, "r")
        request.meta.update(output_tokens=output, genuine_output_tokens=4)
        await rld.reserve_memory(request)
        await rld.on_md_ready(Envelope("md_ready", {"rid": "r"}, [], None))
        await rld.kv_arrived(request, first_token=7, begin={}, genuine_bytes=0)
        deadline = time.monotonic() + 20
        while rld.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return delivered

    assert asyncio.run(scenario()) == {"r": output}


def test_a_failed_step_tells_the_frontend_its_requests_streams_are_lost() -> None:
    """A step that fails drops its requests; the frontend is told of each (`stream_lost`, as
    an instance that no longer holds a request says), so it moves them rather than waiting
    for their tokens until the request timeout."""

    async def scenario() -> list[tuple[str, str, dict]]:
        md = instance(MainDecodeInstance, "MD")
        await md.start()

        def broken(*_args: Any) -> Any:
            raise RuntimeError("a step that fails")

        md.model.decode_batch = broken
        for rid in ("a", "b"):
            request = prompt_request(md, rid)
            request.outputs, request.emitted = [7], 1  # P's token out: the next output is due
            md.requests[rid] = request
            md.start_decoding(request)
        deadline = time.monotonic() + 10
        while md.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)
        return md.told

    told = asyncio.run(scenario())
    lost = sorted(body["rid"] for name, kind, body in told if kind == "stream_lost")
    assert lost == ["a", "b"], told


@pytest.mark.parametrize(
    ("failed", "expected"),
    [
        # the relay's step failed: MD, which holds (or gets) the prompt's KV, resumes the stream
        ("RLD0", {("MD0", "resume"), ("RLD0", "release")}),
        # MD's step failed before it took over: the relay finishes it, P's transfer to MD is cut
        ("MD0", {("RLD0", "md_lost"), ("P0", "cut"), ("MD0", "release")}),
    ],
)
def test_a_failed_step_before_md_took_over_fails_the_request_over(
    failed: str, expected: set[tuple[str, str]]
) -> None:
    """A P-RLD-MD request, the relay streaming, MD to take over: the step of one of them fails
    and it says it no longer holds the request (`stream_lost`). The frontend fails it over as
    from a lost instance: the other goes on with the leg, and what the failed one held is
    released. On the code before, the request moved to a new leg with only the failed instance
    released: the other's reservation for the old leg was never released, nor P's transfer to
    MD cut (here, with no other decode instance, the request failed)."""

    async def scenario() -> tuple[set[tuple[str, str]], str, str, list[str]]:
        fe = frontend()
        flight = admit(fe, "r")
        flight.record.pipeline = "P-RLD-MD"
        flight.p, flight.rld, flight.decode = "P0", "RLD0", "MD0"
        flight.transfers = {"RLD0", "MD0"}
        for name in ("P0", "RLD0", "MD0"):
            fe.liveness.state[name] = "up"
        await fe.on_tokens(tokens("r", 0, "RLD"))
        lost = {"rid": "r", "instance": failed}
        await fe.on_stream_lost(Envelope("stream_lost", lost, [], None))
        told = {(name, kind) for name, kind, body in fe.told if body.get("rid") == "r"}
        return told, flight.leg, flight.abandoned, flight.legs

    told, leg, abandoned, legs = asyncio.run(scenario())
    assert expected <= told, told
    assert (leg, abandoned, legs) == ("r", "", ["r"])


def test_md_lost_during_a_paced_lead_sends_what_the_relay_holds_at_once() -> None:
    """The relay holds its lead's token groups back, paced to end one MD step before MD's
    first token (MD said: 60 s from now). MD is then lost: the relay finishes the request, and
    the groups it holds go at once, at the times they were produced. On the code before, they
    stayed paced toward that MD's token (none left by the end of the test)."""

    async def scenario() -> tuple[list[dict], list[list[float]]]:
        rld = instance(RelayInstance, "RLD")
        await rld.start()
        request = prompt_request(rld, "r")
        rld.requests["r"] = request
        now = rld.clock.now()
        lead = Handoff("catch_up", [], switch=3 * 32, pace_s=1.0, paced_from=1, delivered_at=now)
        lead.md_first_at, lead.md_step_s = now + 60.0, 0.05
        rld.leads["r"] = lead
        produced = [
            [now + 0.001 * i for i in range(1, 33)],
            [now + 0.05 + 0.001 * i for i in range(32)],
        ]
        for index, times in enumerate(produced, start=1):
            body = {"rid": "r", "index": index, "id": 5 + index, "first": 1 + 32 * (index - 1)}
            await rld.send_tokens(
                request, {**body, "times": times, "source": "RLD0", "role": "RLD"}
            )
        await asyncio.sleep(0.2)
        held_before = [body for name, kind, body in rld.told if kind == "tokens"]
        assert held_before == []  # paced: the first group is due some 20 s on
        await rld.on_md_lost(Envelope("md_lost", {"rid": "r"}, [], None))
        deadline = time.monotonic() + 5
        while len(rld.told) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return [body for name, kind, body in rld.told if kind == "tokens"], produced

    sent, produced = asyncio.run(scenario())
    assert [body["times"] for body in sent] == produced


def test_a_failed_step_of_a_relay_streaming_alone_after_md_was_lost_moves_the_request() -> None:
    """MD took the stream over, was lost, and the request moved to the relay (no MD left).
    The relay's step then fails: the request does not wait for tokens that never come (here,
    with no instance left to move to, it fails at once)."""

    async def scenario() -> tuple[str, list[str]]:
        fe = frontend()
        flight = admit(fe, "r")
        flight.record.pipeline = "P-RLD-MD"
        flight.p, flight.rld, flight.decode = "P0", "RLD0", ""  # moved to the relay
        flight.record.md_tokens = 1  # MD had taken over before it was lost
        for name in ("P0", "RLD0"):
            fe.liveness.state[name] = "up"
        lost = {"rid": "r", "instance": "RLD0"}
        await fe.on_stream_lost(Envelope("stream_lost", lost, [], None))
        return flight.abandoned, flight.legs

    abandoned, legs = asyncio.run(scenario())
    assert abandoned or len(legs) > 1, "left waiting for the failed relay's tokens"


@pytest.mark.parametrize("stage", ["admitting", "receiving", "arriving"])
def test_a_release_while_a_failed_requests_kv_is_here_leaves_no_memory_held(stage: str) -> None:
    """A P-RLD-MD request fails at the frontend after P had sent MD all its KV: the release
    says no KV is expected (P was told to cancel), but the transfer is already at MD, waiting
    for memory (`admitting`), read up to its end (`receiving`) or being taken in (`arriving`).
    MD drops it when it is complete: no memory held, nothing told the relay. On the code
    before, MD kept the request (and its 1580 tokens of memory) for good and told the relay,
    which had released it, that its KV was ready."""

    async def scenario() -> tuple[int, list[str], set[str], list[str]]:
        md = instance(MainDecodeInstance, "MD")
        await md.start()
        prompt = list(range(1, 41))
        kv, _ = md.model.prefill(prompt, None, len(prompt))
        connection = KvLinkEnd()
        meta = {**META, "predicted_output_tokens": 300}
        begin = Envelope(
            "kv_begin",
            {"rid": "r", "prompt_tokens": len(prompt), "offset": 0, "meta": meta},
            [TokenIds.from_ints("r", 0, prompt)],
            connection,
        )
        release = Envelope("release", {"rid": "r", "kv_expected": False}, [], None)
        if stage == "admitting":  # the memory is full: the transfer waits at its begin
            others = await md.reserve_tokens(md.cost.kv_capacity_tokens())
            beginning = asyncio.ensure_future(md.on_kv_begin(begin))
            await asyncio.sleep(0.02)
            await md.on_release(release)
            await md.release_tokens(others)
            await beginning
            await connection.admitted("r")
        else:
            await md.on_kv_begin(begin)
        await md.on_kv_chunk(kv_chunk_from_tensor("r", 0, 0, kv.tensor), connection)
        if stage == "receiving":
            await md.on_release(release)
        await md.on_kv_end(Envelope("kv_end", {"rid": "r", "first_token": 7}, [], connection))
        if stage == "arriving":
            await md.on_release(release)
        await asyncio.sleep(0.2)
        told = [kind for name, kind, body in md.told if name == "RLD0"]
        return md.kv_reserved, sorted(md.requests), sorted(md.released), told

    reserved, requests, released, told_relay = asyncio.run(scenario())
    assert (reserved, requests, released, told_relay) == (0, [], [], [])


class Answers:
    """The frontend's end of MD's control connection: what MD answers is dropped."""

    peer = "FE0"

    async def control(
        self, kind: str, body: dict, handed: Callable[[], None] | None = None
    ) -> None:
        if handed is not None:  # written at once: MD's hold on the routing exchange goes
            handed()


def test_a_request_dropped_by_a_failed_step_unpins_its_prompt_in_the_drc() -> None:
    """A P-MD request's prompt, in MD's DRC since its KV came, is pinned while it decodes. Its
    step fails: the request is dropped and the frontend told, and the prompt's pages are
    unpinned (evictable again). On the code before, MD kept them pinned for good (the
    frontend's later release found no request left to unpin them for)."""

    async def scenario() -> tuple[dict, int, list[str]]:
        md = instance(MainDecodeInstance, "MD")
        await md.start()

        def broken(*_args: Any) -> Any:
            raise RuntimeError("a step that fails")

        md.model.decode_batch = broken
        prompt = list(range(1, 4 * md.page_tokens + 1))
        kv, _ = md.model.prefill(prompt, None, len(prompt))
        ids = [TokenIds.from_ints("r", 0, prompt)]
        await md.on_match(match_naming_every_page(md, "r", prompt, Answers()))
        connection = KvLinkEnd()
        meta = {**META, "pipeline": "P-MD", "predicted_output_tokens": 300}
        begin = {"rid": "r", "prompt_tokens": len(prompt), "offset": 0, "meta": meta}
        await md.on_kv_begin(Envelope("kv_begin", begin, ids, connection))
        await md.on_kv_chunk(kv_chunk_from_tensor("r", 0, 0, kv.tensor), connection)
        await md.on_kv_end(Envelope("kv_end", {"rid": "r", "first_token": 7}, [], connection))
        deadline = time.monotonic() + 10
        while not any(kind == "stream_lost" for _, kind, _ in md.told):
            assert time.monotonic() < deadline, "the step never failed"
            await asyncio.sleep(0.02)
        await md.on_release(Envelope("release", {"rid": "r", "kv_expected": True}, [], None))
        return md.held, md.store.cache.pinned_size, sorted(md.released)

    held, pinned, released = asyncio.run(scenario())
    assert (held, pinned, released) == ({}, 0, [])


@pytest.mark.parametrize("payload", ["extend", "kv-delta"])
def test_a_handoff_part_md_cannot_take_loses_the_request_there(payload: str) -> None:
    """MD gets a handoff part it cannot take (here one out of order: from output 3, MD has
    none; for KV-delta, KV of 2 tokens for 3 ids): the error still counts, and MD drops the
    request and says it no longer holds it (`stream_lost`), so the frontend has the relay
    finish it (or moves it) rather than wait for MD's tokens after the switch. On the code
    before, MD kept the request and its memory, and told no one."""

    async def scenario() -> tuple[list[str], int]:
        md = instance(MainDecodeInstance, "MD")
        await md.start()
        request = prompt_request(md, "r")
        await md.reserve_memory(request)
        md.requests["r"] = request
        md.known["r"] = []
        part = {"rid": "r", "end": 3, "final": False, "sent_at": md.clock.now()}
        if payload == "extend":
            part.update(start=3, payload="extend")
            attachments = [TokenIds.from_ints("r", 0, [1, 2, 3])]
        else:
            part.update(start=0, payload="kv_delta", ids=[1, 2, 3])
            kv, _ = md.model.prefill([1, 2], None, 2)
            attachments = [kv_chunk_from_tensor("r", 0, 0, kv.tensor)]
        try:
            await md.on_handoff(Envelope("handoff", part, attachments, None))
        except ValueError as error:
            md.errors.append(repr(error))  # as the dispatch counts a handler's error
        await asyncio.sleep(0.1)
        told = [kind for name, kind, body in md.told if name == "FE0"]
        return sorted(md.requests), told, md.kv_reserved

    requests, told, reserved = asyncio.run(scenario())
    assert (requests, told, reserved) == ([], ["stream_lost"], 0)


def relay_refused(md: Any) -> None:
    """`md.tell` as when relay RLD0 is gone (its port refuses); the rest recorded."""

    async def tell(name: str, kind: str, body: dict, *attachments: Any) -> int:
        if name == "RLD0":
            raise ConnectionRefusedError(111, "Connection refused")
        md.told.append((name, kind, body))
        return 0

    md.tell = tell


@pytest.mark.parametrize("payload", ["extend", "kv_delta"])
def test_a_relay_lost_while_md_takes_in_a_handoff_part_keeps_md_s_requests(payload: str) -> None:
    """The relay is gone (its port refuses) while MD takes in a non-final handoff part: MD
    cannot tell it `caught_up`, which only the relay needed. MD keeps the request (the
    frontend's `resume` then gives it the stream) and the P-MD request decoding beside it
    streams on. On the code before, the failed `caught_up` failed MD's step (Extend-Decode:
    every request of the batch lost, the P-MD one too) or the KV-delta copy (its request
    lost)."""

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        md = instance(MainDecodeInstance, "MD")
        relay_refused(md)
        await md.start()
        beside = prompt_request(md, "p-md")
        beside.meta.update(pipeline="P-MD")
        beside.outputs, beside.emitted, beside.streaming = [7], 1, True
        await md.reserve_memory(beside)
        md.requests["p-md"] = beside
        md.start_decoding(beside)
        handed = prompt_request(md, "r")
        await md.reserve_memory(handed)
        md.requests["r"] = handed
        md.known["r"] = []
        part = {"rid": "r", "start": 0, "end": 3, "final": False, "sent_at": md.clock.now()}
        if payload == "extend":
            part.update(payload="extend")
            attachments = [TokenIds.from_ints("r", 0, [1, 2, 3])]
        else:
            part.update(payload="kv_delta", ids=[1, 2, 3])
            kv, _ = md.model.prefill([1, 2, 3], None, 3)
            attachments = [kv_chunk_from_tensor("r", 0, 0, kv.tensor)]
        await md.on_handoff(Envelope("handoff", part, attachments, None))
        await asyncio.sleep(0.5)
        lost = [body["rid"] for name, kind, body in md.told if kind == "stream_lost"]
        return sorted(md.requests), lost, md.errors

    requests, lost, errors = asyncio.run(scenario())
    assert (requests, lost, errors) == (["p-md", "r"], [], [])


def test_a_failed_step_loses_only_the_requests_it_still_holds() -> None:
    """A step finishes request "a" (its last token out, its record on its way) and then fails
    on request "b": only "b" is lost. On the code before, "a" was reported lost too, a
    `stream_lost` racing its finished record (the frontend could move a complete request)."""

    async def scenario() -> tuple[list[str], list[str]]:
        md = instance(MainDecodeInstance, "MD")
        await md.start()
        for rid in ("a", "b"):
            request = prompt_request(md, rid)
            request.meta.update(pipeline="P-MD", output_tokens=2 if rid == "a" else 400)
            request.outputs, request.emitted, request.streaming = [7], 1, True
            md.requests[rid] = request
            md.start_decoding(request)

        async def broken(_request: DecodeRequest) -> None:
            raise RuntimeError("after-step work that fails")

        md.requests["b"].on_step = broken
        deadline = time.monotonic() + 10
        while md.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)
        finished = [body["rid"] for name, kind, body in md.told if kind == "tokens"]
        lost = [body["rid"] for name, kind, body in md.told if kind == "stream_lost"]
        return finished, lost

    finished, lost = asyncio.run(scenario())
    assert (finished, lost) == (["a"], ["b"])


def p_md_transfer(made: Any, rid: str, meta: dict[str, Any]) -> list[Envelope]:
    """A request's whole KV from P as the decode side reads it: begin, one chunk, end."""
    prompt = list(range(1, 41))
    kv, _ = made.model.prefill(prompt, None, len(prompt))
    connection = KvLinkEnd()
    begin = {"rid": rid, "prompt_tokens": len(prompt), "offset": 0, "meta": meta}
    return [
        Envelope("kv_begin", begin, [TokenIds.from_ints(rid, 0, prompt)], connection),
        kv_chunk_from_tensor(rid, 0, 0, kv.tensor),
        Envelope("kv_end", {"rid": rid, "first_token": 7}, [], connection),
    ]


async def deliver(made: Any, messages: list[Any]) -> None:
    begin, chunk, end = messages
    await made.on_kv_begin(begin)
    await made.on_kv_chunk(chunk, begin.channel)
    await made.on_kv_end(end)


@pytest.mark.parametrize("role", ["MD", "RLD"])
def test_a_stream_that_cannot_start_gives_its_memory_back_and_says_so(role: str) -> None:
    """A moved request's KV reaches its new decode instance (MD, or the relay when no MD is
    left) with the user's outputs to resume from, but P's first token is not the user's
    (here: the user holds 8, P computed 7): the stream cannot start. The instance gives the
    request's memory back and tells the frontend it does not hold the request (`stream_lost`),
    which moves it on. On the code before, the reservation (1580 tokens) was held for good and
    no one was told: the request waited for tokens to its timeout."""

    async def scenario() -> tuple[int, list[str], list[str]]:
        made = instance(MainDecodeInstance if role == "MD" else RelayInstance, role)
        await made.start()
        pipeline = "P-MD" if role == "MD" else "RLD-only"
        meta = {
            **META,
            "pipeline": pipeline,
            "predicted_output_tokens": 300,
            "resume": {"ids": [8, 9], "position": 1 + 32},
        }
        await deliver(made, p_md_transfer(made, "r", meta))
        await asyncio.sleep(0.2)
        lost = [body["rid"] for name, kind, body in made.told if kind == "stream_lost"]
        return made.kv_reserved, sorted(made.requests), lost

    assert asyncio.run(scenario()) == (0, [], ["r"])


def test_md_reports_the_kv_arrived_before_the_first_token() -> None:
    """A P-MD request whose only output is P's token: MD's `kv_arrived` report reaches the
    frontend before that token, which ends the request (the frontend records a request's KV
    arrival only while the request is in flight). On the code before, the token went first."""

    async def scenario() -> list[str]:
        md = instance(MainDecodeInstance, "MD")
        await md.start()
        meta = {**META, "pipeline": "P-MD", "output_tokens": 1, "predicted_output_tokens": 1}
        await deliver(md, p_md_transfer(md, "r", meta))
        await asyncio.sleep(0.1)
        return [kind for name, kind, body in md.told if name == "FE0"]

    assert asyncio.run(scenario()) == ["kv_arrived", "tokens"]


def test_a_release_read_while_md_reports_the_kv_arrived_sends_no_token() -> None:
    """The request fails at the frontend while MD tells it the KV arrived: MD reads the release
    during that report and drops the request, and its first token (here its only output) is
    not sent after. On the code before, the token went to the frontend, which had failed the
    request, and MD finished the request it had dropped."""

    async def scenario() -> tuple[list[str], int]:
        md = instance(MainDecodeInstance, "MD")
        await md.start()
        told = md.tell

        async def tell_then_read_the_release(name: str, kind: str, body: dict) -> int:
            await told(name, kind, body)
            if kind == "kv_arrived":
                release = Envelope("release", {"rid": "r", "kv_expected": False}, [], None)
                await md.on_release(release)
            return 0

        md.tell = tell_then_read_the_release
        meta = {**META, "pipeline": "P-MD", "output_tokens": 1, "predicted_output_tokens": 1}
        await deliver(md, p_md_transfer(md, "r", meta))
        await asyncio.sleep(0.1)
        return [kind for name, kind, body in md.told if name == "FE0"], md.kv_reserved

    assert asyncio.run(scenario()) == (["kv_arrived"], 0)


@pytest.mark.parametrize("pipeline", ["P-MD", "P-RLD-MD"])
def test_a_release_before_the_kv_begins_here_leaves_no_memory_held(pipeline: str) -> None:
    """A request fails at the frontend while P's transfer to MD is under way, P done sending
    before it reads its cancel: MD reads the release (which says no KV is expected) before
    the transfer's beginning. MD drops the KV when it has come: no memory held, nothing
    streamed, nothing told the relay. On the code before, MD forgot the release and took the
    request in: a P-MD one streamed (its tokens to a frontend that had failed it) with its
    memory held until its end; a P-RLD-MD one was kept for good and the relay told."""

    async def scenario() -> tuple[int, list[str], list[tuple[str, str]]]:
        md = instance(MainDecodeInstance, "MD")
        await md.start()
        await md.on_release(Envelope("release", {"rid": "r", "kv_expected": False}, [], None))
        meta = {**META, "pipeline": pipeline, "predicted_output_tokens": 300}
        await deliver(md, p_md_transfer(md, "r", meta))
        await asyncio.sleep(0.2)
        told = [(name, kind) for name, kind, body in md.told if kind != "kv_arrived"]
        return md.kv_reserved, sorted(md.requests), told

    assert asyncio.run(scenario()) == (0, [], [])


def test_the_ids_kept_for_late_messages_are_bounded() -> None:
    """Releases of requests whose KV never comes here (P cancelled before sending it), and
    `md_ready` for requests the relay does not hold, leave ids behind, kept so that a late
    message for them is ignored: each record keeps the most recent KEPT only (a serve runs
    without end). The latest is still kept. `md_lost` for a request the relay does not hold
    leaves nothing (it says so: `stream_lost`). On the code before, each grew by one id a
    message, for good (5000 here)."""
    count = KEPT + 904

    class Replies:
        peer = "FE0"

        async def control(self, kind: str, body: dict) -> None:
            pass

    async def scenario() -> tuple[dict[str, tuple[int, bool]], tuple[int, int]]:
        md = instance(MainDecodeInstance, "MD")
        rld = instance(RelayInstance, "RLD")
        for i in range(count):
            release = Envelope("release", {"rid": f"r{i}", "kv_expected": True}, [], None)
            await md.on_release(release)
            await rld.on_release(release)
            await rld.on_md_ready(Envelope("md_ready", {"rid": f"m{i}"}, [], None))
            await rld.on_md_lost(Envelope("md_lost", {"rid": f"l{i}"}, [], Replies()))
        last = str(count - 1)
        return {
            "MD released": (len(md.released), f"r{last}" in md.released),
            "RLD released": (len(rld.released), f"r{last}" in rld.released),
            "RLD md_ready_unknown": (len(rld.md_ready_unknown), f"m{last}" in rld.md_ready_unknown),
        }, (len(rld.md_lost), len(rld.md_ready_early))

    kept, live = asyncio.run(scenario())
    assert kept == dict.fromkeys(kept, (KEPT, True)), kept
    assert live == (0, 0)


def test_what_the_relay_keeps_for_a_live_request_outlasts_any_number_of_others() -> None:
    """A held request whose MD was lost, and one waiting for memory here whose MD was ready
    first, keep their entries however many other requests' messages come meanwhile, and lose
    them when they end. On the code before, both records kept the latest KEPT ids only: the
    first request's entry went, and its hand_over handed it to its lost MD; the second's, and
    its handoff never opened."""

    class Replies:
        peer = "FE0"

        async def control(self, kind: str, body: dict) -> None:
            pass

    async def scenario() -> tuple[tuple[bool, bool], tuple[int, int]]:
        rld = instance(RelayInstance, "RLD")
        held = prompt_request(rld, "held")
        rld.requests["held"] = held
        rld.admitting.add("waiting")  # its KV transfer begun, waiting for memory
        await rld.on_md_lost(Envelope("md_lost", {"rid": "held"}, [], Replies()))
        await rld.on_md_ready(Envelope("md_ready", {"rid": "waiting"}, [], None))
        for i in range(KEPT + 1):
            await rld.on_md_ready(Envelope("md_ready", {"rid": f"m{i}"}, [], None))
            await rld.on_md_lost(Envelope("md_lost", {"rid": f"l{i}"}, [], Replies()))
        kept = ("held" in rld.md_lost, "waiting" in rld.md_ready_early)
        await rld.drop(held)
        rld.admitting.discard("waiting")
        rld.transfer_cut("waiting", held.kv)
        return kept, (len(rld.md_lost), len(rld.md_ready_early))

    assert asyncio.run(scenario()) == ((True, True), (0, 0))


def test_a_copy_of_a_record_keeps_its_bound_and_entries() -> None:
    """On the code before, `Recent.copy` (OrderedDict's) made a copy with the default bound
    (KEPT), not the record's."""
    record: Recent[int] = Recent(2)
    record["a"], record["b"] = 1, 2
    copy = record.copy()
    assert (copy.kept, list(copy.items())) == (2, [("a", 1), ("b", 2)])
    copy["c"] = 3
    assert (list(copy), list(record)) == (["b", "c"], ["a", "b"])


def test_a_match_read_after_its_requests_kv_pins_nothing() -> None:
    """The frontend gave up waiting for MD's answer to a leg's match and routed it with no hit
    here (its answer late, `Frontend.decode_side_hit`); the match itself is read only after
    the request's KV came and the request finished on MD. Its prompt is in the DRC (an earlier
    turn's, matched on time), and the late match pins nothing: those pages stay evictable.
    On the code before, the late match pinned them for good (no message after it lets a pin
    go: MD ends a P-MD request itself)."""

    async def scenario() -> tuple[int, list[str], int]:
        md = instance(MainDecodeInstance, "MD")
        await md.start()
        prompt = list(range(1, 4 * md.page_tokens + 1))
        kv, _ = md.model.prefill(prompt, None, len(prompt))

        async def served(rid: str) -> None:
            connection = KvLinkEnd()
            meta = {**META, "pipeline": "P-MD", "output_tokens": 2, "predicted_output_tokens": 2}
            begin = {"rid": rid, "prompt_tokens": len(prompt), "offset": 0, "meta": meta}
            ids = [TokenIds.from_ints(rid, 0, prompt)]
            await md.on_kv_begin(Envelope("kv_begin", begin, ids, connection))
            await md.on_kv_chunk(kv_chunk_from_tensor(rid, 0, 0, kv.tensor), connection)
            end = {"rid": rid, "first_token": 7}
            await md.on_kv_end(Envelope("kv_end", end, [], connection))
            deadline = time.monotonic() + 10
            while rid not in md.ended:
                assert time.monotonic() < deadline, f"{rid} never finished"
                await asyncio.sleep(0.02)

        await md.on_match(match_naming_every_page(md, "a", prompt, Answers()))  # on time
        await served("a")
        await served("r")  # routed with no hit: its match still on its way
        await md.on_match(match_naming_every_page(md, "r", prompt, Answers()))
        return md.store.cache.pinned_size, sorted(md.matches), md.store.size_tokens

    pinned, matches, cached = asyncio.run(scenario())
    assert cached > 0, "the prompt never reached the DRC: nothing to pin"
    assert (pinned, matches) == (0, [])


def test_a_newer_transfer_of_a_request_on_its_link_ends_the_earlier_one() -> None:
    """A `kv_begin` for a request that still has a transfer on the same link (its sender cut
    that one, and the cut is queued behind this begin) ends the earlier transfer as its cut
    would (its memory given back); the earlier one's `kv_cut`, read after, is stale: the
    newer transfer goes on and completes."""

    async def scenario() -> RelayInstance:
        rld = instance(RelayInstance, "RLD")
        await rld.start()
        prompt = list(range(1, 41))
        kv, _ = rld.model.prefill(prompt, None, len(prompt))
        link = KvLinkEnd()
        meta = {**META, "predicted_output_tokens": 300}
        reserved = []
        for seq in (1, 2):
            body = {"rid": "r", "prompt_tokens": 40, "offset": 0, "meta": meta, "seq": seq}
            await rld.on_kv_begin(Envelope("kv_begin", body, [], link))
            await link.admitted("r")
            link.said.clear()
            await asyncio.sleep(0.01)  # a release runs beside
            reserved.append(rld.kv_reserved)
        await rld.on_kv_cut(Envelope("kv_cut", {"rid": "r", "seq": 1}, [], link))
        assert rld.receiving["r"]["seq"] == 2
        assert reserved == [40 * 32 + 300] * 2 and rld.kv_reserved == reserved[0]  # one's
        await rld.on_kv_chunk(kv_chunk_from_tensor("r", 0, 0, kv.tensor), link)
        end = {"rid": "r", "seq": 2, "first_token": 7, "ready": 0.0}
        await rld.on_kv_end(Envelope("kv_end", end, [], link))
        await asyncio.sleep(0.05)
        await rld.end_tasks()
        return rld

    rld = asyncio.run(scenario())
    assert rld.transfers_cut == 1 and rld.stale_link_messages == 1
    assert "r" in rld.requests and rld.errors == [], rld.errors


def test_a_newer_transfer_with_a_hit_is_admitted_where_it_replaces_an_earlier_one() -> None:
    """MD holds a prefix for the request (its match's pin): the earlier transfer on the link
    ends, and the pin stays for the newer one, sent from the same offset."""

    async def scenario() -> list[tuple[str, Any, Any]]:
        md = instance(MainDecodeInstance, "MD")
        await md.start()
        prompt = list(range(1, 4 * md.page_tokens + 1))
        kv, _ = md.model.prefill(prompt, None, len(prompt))
        meta = {**META, "pipeline": "P-MD", "output_tokens": 2, "predicted_output_tokens": 2}
        link = KvLinkEnd()
        await md.on_match(match_naming_every_page(md, "a", prompt, Answers()))
        begin = {"rid": "a", "prompt_tokens": len(prompt), "offset": 0, "meta": meta, "seq": 1}
        await md.on_kv_begin(
            Envelope("kv_begin", begin, [TokenIds.from_ints("a", 0, prompt)], link)
        )
        await md.on_kv_chunk(kv_chunk_from_tensor("a", 0, 0, kv.tensor), link)
        await md.on_kv_end(Envelope("kv_end", {"rid": "a", "seq": 1, "first_token": 7}, [], link))
        deadline = time.monotonic() + 10
        while "a" not in md.ended:  # the prompt is in the DRC: the next one hits it
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await md.on_match(match_naming_every_page(md, "r", prompt, Answers()))
        hit = 2 * md.page_tokens
        for seq in (2, 3):
            body = {"rid": "r", "prompt_tokens": len(prompt), "offset": hit, "meta": meta}
            ids = [TokenIds.from_ints("r", hit, prompt[hit:])]
            await md.on_kv_begin(Envelope("kv_begin", {**body, "seq": seq}, ids, link))
            await asyncio.sleep(0.01)
        said = [(k, b.get("seq"), b.get("reason")) for k, b in link.said if b.get("rid") == "r"]
        await md.end_tasks()
        return said

    said = asyncio.run(scenario())
    assert ("kv_admitted", 3, None) in said and not [s for s in said if s[0] == "kv_refused"]


def test_a_newer_transfer_waiting_for_memory_stays_expected_where_it_replaces_one() -> None:
    """Both wait for memory: the earlier one's wait, cancelled, ends after the newer one began
    to wait, and must not take the newer one off the admissions."""

    async def scenario() -> tuple[bool, bool, Any]:
        rld = instance(RelayInstance, "RLD")
        await rld.start()
        filler = await rld.reserve_tokens(rld.cost.kv_capacity_tokens() - 1)
        link = KvLinkEnd()
        for seq in (1, 2):
            body = {"rid": "r", "prompt_tokens": 40, "offset": 0, "meta": dict(META), "seq": seq}
            await rld.on_kv_begin(Envelope("kv_begin", body, [], link))
            await asyncio.sleep(0.01)
        state = ("r" in rld.admitting, rld.expects("r"), rld.admissions["r"].seq)
        await rld.release_tokens(filler)
        await rld.end_tasks()
        return state

    assert asyncio.run(scenario()) == (True, True, 2)


@pytest.mark.parametrize("first", ["admitted", "waiting for memory"])
def test_a_transfer_of_a_request_on_another_link_is_refused_and_the_first_goes_on(
    first: str,
) -> None:
    """A request's KV comes from its one sender on its one link (each routing or move is a
    leg of its own, and a newer transfer on the same link supersedes the earlier: above). A
    `kv_begin` for it from another link while its transfer is here is refused
    (`kv_refused`), and the first transfer's state is untouched: its chunks and end are
    taken, and only its memory is held. On the code before, the second overwrote the
    first's state: the first's chunks and end were errors and its memory never came back."""

    async def scenario() -> tuple[list[str], int, int, bool]:
        rld = instance(RelayInstance, "RLD")
        await rld.start()
        prompt = list(range(1, 41))
        kv, _ = rld.model.prefill(prompt, None, len(prompt))
        meta = {**META, "predicted_output_tokens": 300}
        need = 40 * 32 + 300
        filler = None
        if first == "waiting for memory":
            filler = await rld.reserve_tokens(rld.cost.kv_capacity_tokens() - 1)
        link, other = KvLinkEnd("P0"), KvLinkEnd("P1")
        body = {"rid": "r", "prompt_tokens": 40, "offset": 0, "meta": meta, "seq": 1}
        await rld.on_kv_begin(Envelope("kv_begin", body, [], link))
        with pytest.raises(ValueError, match="another link"):
            await rld.on_kv_begin(Envelope("kv_begin", body, [], other))
        refused = [kind for kind, said in other.said if said.get("rid") == "r"]
        if filler is not None:
            await rld.release_tokens(filler)
        await link.admitted("r")
        held = rld.kv_reserved
        await rld.on_kv_chunk(kv_chunk_from_tensor("r", 0, 0, kv.tensor), link)
        end = {"rid": "r", "seq": 1, "first_token": 7, "ready": 0.0}
        await rld.on_kv_end(Envelope("kv_end", end, [], link))
        await asyncio.sleep(0.05)
        arrived = "r" in rld.requests
        await rld.end_tasks()
        return refused, held, need, arrived

    refused, held, need, arrived = asyncio.run(scenario())
    assert refused == ["kv_refused"] and held == need and arrived
