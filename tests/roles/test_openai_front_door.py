"""The OpenAI front door over loopback HTTP, with the frontend's flights played in-process: usage
for benchmark clients, failed requests as OpenAI errors, and bodies OpenAI accepts or refuses."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from pddemu.config import ServeConfig
from pddemu.model import VOCAB_SIZE, ByteTokenizer
from pddemu.roles.frontend import Flight, Frontend
from pddemu.workload.expansion import genuine_output_length
from tests.roles.in_process import OUTPUT, SCALE, frontend, tokens

Play = Callable[[Frontend, Flight], Awaitable[None]]


async def answer(fe: Frontend, flight: Flight) -> None:
    scale = fe.config.scale.token_scale
    for index in range(genuine_output_length(flight.record.expected_output_tokens, scale)):
        await fe.on_tokens(tokens(flight.record.request_id, index, "MD"))


async def crash(_fe: Frontend, _flight: Flight) -> None:
    raise RuntimeError("P0 went away")


async def with_front_door(
    play: Play, client: Callable[[str], Awaitable[Any]], serve: ServeConfig | None = None
) -> Any:
    """Serve the front door on an ephemeral loopback port, flights played by `play` (`serve`:
    another `[serve]` section)."""
    fe = frontend()
    if serve is not None:
        fe.config = fe.config.model_copy(update={"serve": serve})
    fe.run_flight = lambda flight: play(fe, flight)
    app = web.Application()
    fe.add_routes(app)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        return await client(f"http://127.0.0.1:{port}/v1")
    finally:
        await runner.cleanup()


def test_include_usage_ends_the_stream_with_the_token_counts() -> None:
    async def client(url: str) -> list[Any]:
        api = openai.AsyncOpenAI(base_url=url, api_key="unused")
        stream = await api.completions.create(
            model="pddemu",
            prompt="abc",
            max_tokens=OUTPUT,
            stream=True,
            stream_options={"include_usage": True},
        )
        return [chunk async for chunk in stream]

    chunks = asyncio.run(with_front_door(answer, client))
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 3  # genuine tokens: the text the client got
    assert chunks[-1].usage.prompt_tokens == len(ByteTokenizer(VOCAB_SIZE).encode("abc"))


def test_a_failed_request_is_an_openai_error_whole_or_streamed() -> None:
    flights = []

    async def crash_counted(fe: Frontend, flight: Flight) -> None:
        flights.append(flight.record.request_id)
        await crash(fe, flight)

    async def client(url: str) -> tuple[int, dict]:
        api = openai.AsyncOpenAI(base_url=url, api_key="unused")  # default: retries on 5xx
        with pytest.raises(openai.APIError, match="P0 went away"):
            stream = await api.completions.create(
                model="pddemu", prompt="abc", max_tokens=OUTPUT, stream=True
            )
            async for _chunk in stream:
                pass
        with pytest.raises(openai.InternalServerError, match="P0 went away"):
            await api.completions.create(model="pddemu", prompt="abc", max_tokens=OUTPUT)
        async with aiohttp.ClientSession() as session:
            body = {"model": "pddemu", "prompt": "abc", "max_tokens": OUTPUT}
            async with session.post(f"{url}/completions", json=body) as reply:
                return reply.status, await reply.json()

    status, body = asyncio.run(with_front_door(crash_counted, client))
    assert len(flights) == 3  # one each: the client did not retry the failed whole request
    assert status == 500
    assert body["error"]["type"] == "server_error" and "P0 went away" in body["error"]["message"]
    assert body["pddemu"]["state"] == "failed"


def test_null_stream_options_and_an_assistant_turn_without_content_are_accepted() -> None:
    async def client(url: str) -> tuple[int, str, int]:
        async with aiohttp.ClientSession() as session:
            body = {
                "model": "pddemu",
                "prompt": "x",
                "stream": True,
                "stream_options": {"include_usage": None},
            }
            async with session.post(f"{url}/completions", json=body) as reply:
                streamed = reply.status, await reply.text()
            messages = [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None},
                {"role": "user", "content": "again"},
            ]
            body = {"model": "pddemu", "messages": messages, "max_tokens": 4}
            async with session.post(f"{url}/chat/completions", json=body) as reply:
                return (*streamed, reply.status)

    stream_status, events, chat_status = asyncio.run(with_front_door(answer, client))
    assert stream_status == 200 and events.endswith("data: [DONE]\n\n")
    assert '"usage"' not in events  # include_usage null is its default, false
    assert chat_status == 200


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("completions", {"prompt": "x", "max_tokens": None, "n": None, "user": None}, 200, None),
        (
            "chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "max_completion_tokens": None,
                "max_tokens": 4,
            },
            200,
            None,
        ),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]},
            200,
            None,
        ),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            400,
            "messages[0].content[0].text",
        ),
        (
            "chat/completions",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            400,
            "messages[0].content[0]",
        ),
        ("completions", {"prompt": "x", "user": 123}, 400, "user"),
        ("completions", {"prompt": "x" * ServeConfig().max_prompt_tokens}, 400, "prompt"),
        (
            "completions",
            {"prompt": "x", "stream_options": {"include_usage": True}},
            400,
            "stream_options",
        ),
        (
            "completions",
            {"prompt": "x", "stream": True, "stream_options": {"include_usage": 1}},
            400,
            "stream_options",
        ),
    ],
)
def test_bodies_openai_accepts_pass_and_others_name_the_field(
    path: str, body: dict, status: int, param: str | None
) -> None:
    async def client(url: str) -> tuple[int, dict]:
        async with aiohttp.ClientSession() as session:
            sent = {"model": "pddemu", **body}
            async with session.post(f"{url}/{path}", data=json.dumps(sent)) as reply:
                return reply.status, await reply.json()

    code, reply = asyncio.run(with_front_door(answer, client))
    assert code == status, reply
    if status == 400:
        assert reply["error"]["param"] == param and reply["error"]["message"]
    else:
        assert reply["usage"]["completion_tokens"] >= 1


async def half_then_crash(fe: Frontend, flight: Flight) -> None:
    await fe.on_tokens(tokens(flight.record.request_id, 0, "MD"))
    raise RuntimeError("MD0 went away")


def test_a_stream_failing_midway_is_an_error_event_and_an_incomplete_response() -> None:
    """What vLLM's benchmark (aiohttp, success unless an exception) and AIPerf (`event: error`)
    both count as a failed request, after a first token they already counted."""

    async def client(url: str) -> tuple[bytes, BaseException | None]:
        body = {"model": "pddemu", "prompt": "abc", "max_tokens": OUTPUT, "stream": True}
        received = b""
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/completions", json=body) as reply:
                assert reply.status == 200
                try:
                    async for chunk in reply.content.iter_any():
                        received += chunk
                except aiohttp.ClientPayloadError as cut:
                    return received, cut
        return received, None

    received, cut = asyncio.run(with_front_door(half_then_crash, client))
    assert cut is not None, "the stream ended cleanly: a benchmark client would count a success"
    events = received.decode().split("\n\n")
    assert events[0].startswith("data: ") and json.loads(events[0][6:])["choices"]
    error = next(e for e in events if e.startswith("event: error"))
    lines = error.split("\n")
    assert lines[1].startswith(": the request failed") and "MD0 went away" in lines[1]
    assert json.loads(lines[2].removeprefix("data: "))["error"]["type"] == "server_error"
    assert "[DONE]" not in received.decode()


def test_token_id_prompts_are_taken_as_they_are() -> None:
    async def client(url: str) -> tuple[Any, int, dict]:
        api = openai.AsyncOpenAI(base_url=url, api_key="unused")
        reply = await api.completions.create(
            model="pddemu", prompt=[72, 105, 33, 257], max_tokens=OUTPUT
        )
        async with aiohttp.ClientSession() as session:
            body = {
                "model": "pddemu",
                "prompt": [1, frontend().model_config.vocab_size],
                "max_tokens": 2,
            }
            async with session.post(f"{url}/completions", json=body) as refused:
                return reply, refused.status, await refused.json()

    reply, status, body = asyncio.run(with_front_door(answer, client))
    assert reply.usage.prompt_tokens == 4  # no BOS added to ids the client chose
    assert status == 400 and body["error"]["param"] == "prompt"


def test_the_prompt_cap_is_the_serve_config_key() -> None:
    """`[serve] max_prompt_tokens` moves the cap both ways: a prompt over the default is taken
    under a larger cap, one over a smaller cap refused (the count includes the BOS)."""

    async def client(url: str) -> list[Any]:
        api = openai.AsyncOpenAI(base_url=url, api_key="unused")
        outcomes = []
        for prompt in ("x" * 39, "x" * 40):
            try:
                reply = await api.completions.create(model="pddemu", prompt=prompt, max_tokens=2)
                outcomes.append(reply.usage.prompt_tokens)
            except openai.BadRequestError as refused:
                outcomes.append(refused.body["code"])
        return outcomes

    small = asyncio.run(with_front_door(answer, client, ServeConfig(max_prompt_tokens=40)))
    assert small == [40, "context_length_exceeded"]
    default = ServeConfig().max_prompt_tokens
    large = ServeConfig(max_prompt_tokens=default + 100)

    async def over_default(url: str) -> int:
        api = openai.AsyncOpenAI(base_url=url, api_key="unused")
        reply = await api.completions.create(model="pddemu", prompt="x" * default, max_tokens=2)
        return reply.usage.prompt_tokens

    assert asyncio.run(with_front_door(answer, over_default, large)) == default + 1


PRODUCER_LATE_S = (
    0.020  # the first token sent this long after its modelled time (its step ran over)
)


async def first_token_sent_late(fe: Frontend, flight: Flight) -> None:
    """MD's first step outlasts its modelled length: the token is dated at the step's modelled
    end and sent PRODUCER_LATE_S after it; the others on time."""
    rid = flight.record.request_id
    await asyncio.sleep(0.030)  # the prefill
    for index in range(genuine_output_length(flight.record.expected_output_tokens, SCALE)):
        message = tokens(rid, index, "MD")
        now = fe.clock.now()
        first = message.body["first"]
        if index == 0:
            message.body.update(times=[now - PRODUCER_LATE_S], sent=now)
        else:
            count = len(message.body["times"])
            message.body.update(times=[now + 1e-4 * (first + i) for i in range(count)], sent=now)
        await fe.on_tokens(message)


def test_the_record_says_when_the_first_token_was_served_and_why_later_than_modelled() -> None:
    """The door's record of a streamed request holds what its client was served beside what
    was modelled: the door's TTFT from its receipt to the first chunk handed to the kernel,
    equal to the modelled TTFT plus how late the first chunk went out, of which its instance
    sent the token late; a client's TTFT contains the door's."""

    async def client(url: str) -> tuple[float, float, dict]:
        body = {"model": "pddemu", "prompt": "abc", "max_tokens": OUTPUT, "stream": True}
        events = b""
        async with aiohttp.ClientSession() as session:
            sent = time.monotonic()
            async with session.post(f"{url}/completions", json=body) as reply:
                first = None
                async for chunk in reply.content.iter_any():
                    first = time.monotonic() if first is None else first
                    events += chunk
        data = [e[6:] for e in events.decode().split("\n\n") if e.startswith("data: {")]
        return sent, first, json.loads(data[-1])["pddemu"]

    sent, first, record = asyncio.run(with_front_door(first_token_sent_late, client))
    door = record["door"]
    modelled_ttft = record["first_token_s"] - record["arrival_s"]
    assert door["first_token_sent_late_s"] == pytest.approx(PRODUCER_LATE_S, abs=1e-9)
    assert door["first_token_late_s"] >= PRODUCER_LATE_S
    assert door["ttft_s"] == door["first_chunk_s"] - door["received_s"]
    # the clock is read twice at each end (wall and modelled), nothing awaited in between
    assert door["ttft_s"] == pytest.approx(modelled_ttft + door["first_token_late_s"], abs=1e-3)
    assert sent <= door["received_s"] and door["first_chunk_s"] <= first
