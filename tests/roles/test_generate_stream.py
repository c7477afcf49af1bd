"""The replayer's door (`POST /generate`): a line per token as they come, or the record alone
when the client asks for it (`stream_tokens`: false, what the replayer asks). Driven
in-process over real HTTP, the relay's tokens handed to the frontend's handler directly."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from tests.roles.in_process import OUTPUT, tokens
from tests.roles.test_front_door_limits import running_frontend, until


def test_the_record_alone_is_streamed_when_the_client_asks_for_no_token_lines() -> None:
    async def scenario() -> tuple[dict[object, list[dict]], int]:
        fe, task, url, key = await running_frontend()
        lines: dict[object, list[dict]] = {}
        try:
            async with aiohttp.ClientSession(headers=key) as session:
                for streamed in (None, True, False):  # None: the default
                    rid = f"r-{streamed}"
                    body = {
                        "rid": rid,
                        "prompt_ids": [1, 2, 3],
                        "input_tokens": 96,
                        "output_tokens": OUTPUT,
                    }
                    if streamed is not None:
                        body["stream_tokens"] = streamed
                    async with session.post(url + "/generate", json=body) as reply:
                        await until(lambda rid=rid: rid in fe.flights, "the request admitted")
                        flight = fe.flights[rid]
                        for index in (0, 1):
                            await fe.on_tokens(tokens(rid, index, "RLD"))
                        flight.abandon("test: given up after two outputs")
                        lines[streamed] = [json.loads(line) async for line in reply.content]
                bad = {**body, "rid": "r-bad", "stream_tokens": "no"}
                async with session.post(url + "/generate", json=bad) as reply:
                    status = reply.status
        finally:
            fe.stopping.set()
            await task
        return lines, status

    lines, status = asyncio.run(scenario())
    for streamed in (None, True):
        assert [line.get("index") for line in lines[streamed][:-1]] == [0, 1]
    assert len(lines[False]) == 1
    for got in lines.values():
        record = got[-1]["record"]
        assert record["failure_reason"] == "test: given up after two outputs"
        assert len(record["token_times_s"]) == 1 + (OUTPUT - 1) // 2  # outputs 0 and 1
    assert status == 400
