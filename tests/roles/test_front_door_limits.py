"""The frontend's doors hold a bounded number of requests, and a client that goes away frees
its request at once. Driven in-process over real HTTP; the instances behind the frontend are
left unreachable (what the frontend tells them is recorded), so every request waits for P's
answer until it is given up."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import aiohttp

from pddemu.config import config_to_json, load_config
from pddemu.roles.client_gone import CLIENT_GONE
from pddemu.roles.frontend import Frontend
from pddemu.roles.spec import Address, InstanceSpec
from pddemu.runtime.auth import RunSecret

CAP = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def running_frontend() -> tuple[Frontend, asyncio.Task, str, dict[str, str]]:
    config = load_config(overrides=[f"serve.max_concurrent_requests={CAP}"])
    peers = {
        name: Address(name, role, "127.0.0.1", 1, 2)
        for name, role in (("P0", "P"), ("RLD0", "RLD"), ("MD0", "MD"))
    }
    me = Address("FE0", "FE", "127.0.0.1", free_port(), free_port())
    peers["FE0"] = me
    fe = Frontend(InstanceSpec(me, "pdd", "", peers, config_to_json(config), time.monotonic()))
    secret = RunSecret.new()
    fe.use_secret(secret)
    fe.told = []

    async def tell(name: str, kind: str, body: dict, *attachments: Any) -> int:
        fe.told.append((name, kind, body["rid"]))
        return 0

    fe.tell = tell
    task = asyncio.create_task(fe.run())
    url = f"http://127.0.0.1:{me.http_port}"
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            try:
                async with session.get(url + "/health") as reply:
                    if reply.status == 200:
                        return fe, task, url, secret.headers()
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise AssertionError("the frontend did not start")


async def until(condition: Any, what: str) -> None:
    for _ in range(400):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


COMPLETION = {"model": "pddemu", "prompt": "hello", "max_tokens": 8, "stream": True}


def test_a_client_going_away_gives_its_request_up_and_frees_its_place() -> None:
    async def scenario() -> None:
        fe, task, url, key = await running_frontend()
        try:
            sessions = [aiohttp.ClientSession(headers=key) for _ in range(CAP + 1)]
            held = [
                asyncio.ensure_future(s.post(url + "/v1/completions", json=COMPLETION))
                for s in sessions[:CAP]
            ]
            await until(lambda: len(fe.flights) == CAP, "both requests admitted")
            async with sessions[CAP].post(url + "/v1/completions", json=COMPLETION) as reply:
                assert reply.status == 429
                assert reply.headers["Retry-After"] == "1"
                assert (await reply.json())["error"]["code"] == "rate_limit_exceeded"
            rids = set(fe.flights)
            records = {rid: fe.flights[rid].record for rid in rids}
            await sessions[0].close()  # the first client goes away mid-request
            await until(lambda: len(fe.flights) == CAP - 1, "the abandoned request released")
            (gone,) = rids - set(fe.flights)
            assert records[gone].state == "failed" and records[gone].failure_reason == CLIENT_GONE
            assert ("P0", "cancel", gone) in fe.told  # P stops working on it
            async with sessions[CAP].post(url + "/v1/completions", json=COMPLETION) as reply:
                assert reply.status == 200  # its place is free again (the stream has begun)
            for s in sessions[1:]:
                await s.close()
            for future in held:
                future.cancel()
            await until(lambda: not fe.flights, "every request released")
        finally:
            fe.stopping.set()
            await task

    asyncio.run(scenario())


def test_the_replayers_door_also_cancels_a_request_whose_client_is_gone() -> None:
    async def scenario() -> None:
        fe, task, url, key = await running_frontend()
        body = {"rid": "r1", "prompt_ids": [1, 2, 3], "input_tokens": 96, "output_tokens": 64}
        try:
            session = aiohttp.ClientSession(headers=key)
            pending = asyncio.ensure_future(session.post(url + "/generate", json=body))
            await until(lambda: "r1" in fe.flights, "the request admitted")
            record = fe.flights["r1"].record
            await session.close()
            pending.cancel()
            await until(lambda: "r1" not in fe.flights, "the request released")
            assert record.failure_reason == CLIENT_GONE
        finally:
            fe.stopping.set()
            await task

    asyncio.run(scenario())


def test_sizes_a_client_sends_are_bounded() -> None:
    async def scenario() -> None:
        fe, task, url, key = await running_frontend()
        limit = fe.max_request_tokens
        try:
            async with aiohttp.ClientSession(headers=key) as session:
                for body in (
                    {"rid": "a", "prompt_ids": [1], "input_tokens": 1, "output_tokens": 10**15},
                    {"rid": "b", "prompt_ids": [1], "input_tokens": limit, "output_tokens": 1},
                    {
                        "rid": "c",
                        "prompt_ids": [1] * (limit + 1),
                        "input_tokens": 1,
                        "output_tokens": 1,
                    },
                ):
                    async with session.post(url + "/generate", json=body) as reply:
                        assert reply.status == 400, body["rid"]
                        assert "at most" in (await reply.text()) or "fit" in (await reply.text())
                big = b"[" + b"1," * (9 << 20) + b"1]"
                async with session.post(
                    url + "/generate", data=big, headers={"Content-Type": "application/json"}
                ) as reply:
                    assert reply.status == 413
            assert not fe.flights
        finally:
            fe.stopping.set()
            await task

    asyncio.run(scenario())


def test_serves_verdict_reaches_the_frontends_stats_and_only_with_the_runs_secret() -> None:
    """`pddemu serve` posts its lag verdict to /admin/verdict; /stats shows it. Without the
    run's secret the post is refused and the verdict stays as it was."""

    async def scenario() -> None:
        fe, task, url, key = await running_frontend()
        verdict = {"as_of_s": 5.0, "valid": False, "invalid_reason": "step lag", "lag": {}}
        try:
            async with aiohttp.ClientSession() as stranger:
                async with stranger.post(url + "/admin/verdict", json=verdict) as reply:
                    assert reply.status == 401
            async with aiohttp.ClientSession(headers=key) as session:
                async with session.get(url + "/stats") as reply:
                    assert (await reply.json())["verdict"] is None
                async with session.post(url + "/admin/verdict", json=verdict) as reply:
                    assert reply.status == 200
                async with session.post(url + "/admin/verdict", json=[1]) as reply:
                    assert reply.status == 400  # not an object: refused, the last one kept
                async with session.get(url + "/stats") as reply:
                    assert (await reply.json())["verdict"] == verdict
        finally:
            fe.stopping.set()
            await task

    asyncio.run(scenario())
