"""An instance answers only its own run: control requests without the run's secret and
data-plane connections whose hello does not prove it are refused; policy changes are checked."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import aiohttp
import pytest

from pddemu.config import config_to_json, load_config
from pddemu.roles import base
from pddemu.roles.prefill import PrefillInstance
from pddemu.roles.spec import Address, InstanceSpec
from pddemu.runtime.auth import KEY_HEADER, RunSecret
from pddemu.runtime.channel import HELLO, Channel
from pddemu.wire import Control, encode


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def started(secret: RunSecret) -> tuple[PrefillInstance, asyncio.Task, str]:
    me = Address("P0", "P", "127.0.0.1", free_port(), free_port())
    spec = InstanceSpec(me, "pdd", "", {"P0": me}, config_to_json(load_config()), time.monotonic())
    instance = PrefillInstance(spec)
    instance.use_secret(secret)
    task = asyncio.create_task(instance.run())
    url = f"http://127.0.0.1:{me.http_port}"
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            try:
                async with session.get(url + "/health") as reply:
                    if reply.status == 200:
                        return instance, task, url
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise AssertionError("the instance did not start")


async def hello_bytes(body: dict[str, Any]) -> bytes:
    return b"".join(bytes(b) for b in encode(Control(HELLO, body)))


async def closed_by_peer(port: int, first_frame: bytes) -> bool:
    """Whether the instance hangs up after `first_frame` (within a generous bound)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(first_frame)
    await writer.drain()
    try:
        data = await asyncio.wait_for(reader.read(1), 5.0)
        return data == b""
    except TimeoutError:
        return False
    finally:
        writer.close()


def test_control_requests_need_the_secret_and_policy_values_are_checked() -> None:
    async def scenario() -> None:
        secret = RunSecret.new()
        instance, task, url = await started(secret)
        key = secret.headers()
        try:
            async with aiohttp.ClientSession() as session:
                for method, path in (
                    ("GET", "/stats"),
                    ("POST", "/shutdown"),
                    ("POST", "/admin/policy"),
                ):
                    for headers in ({}, {KEY_HEADER: "0" * 64}, RunSecret.new().headers()):
                        async with session.request(
                            method, url + path, json={}, headers=headers
                        ) as reply:
                            assert reply.status == 401, (path, headers)
                assert not instance.stopping.is_set()
                assert instance.refused["control"] == 9
                async with session.get(url + "/stats", headers=key) as reply:
                    assert reply.status == 200
                before = instance.config.policy
                for bad, needle in (
                    ({"routing": "teleport"}, "routing"),
                    ({"wan_time_threshold_s": -1}, "wan_time_threshold_s"),
                    ({"handoff_mode": "one-shot", "nope": 1}, "nope"),
                    ([1, 2], "JSON object"),
                ):
                    async with session.post(url + "/admin/policy", json=bad, headers=key) as reply:
                        assert reply.status == 400, bad
                        assert needle in (await reply.json())["error"]
                assert instance.config.policy == before  # nothing changed by a refused body
                async with session.post(
                    url + "/admin/policy", json={"routing": "always-relay"}, headers=key
                ) as reply:
                    assert reply.status == 200
                assert instance.config.policy.routing == "always-relay"
        finally:
            instance.stopping.set()
            await task

    asyncio.run(scenario())


def test_data_plane_hellos_must_prove_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "HELLO_TIMEOUT_S", base.HELLO_TIMEOUT_S)

    async def scenario() -> None:
        secret = RunSecret.new()
        instance, task, _url = await started(secret)
        port = instance.spec.me.data_port
        try:
            bare = await hello_bytes({"from": "P9", "purpose": "control"})
            other_run = await hello_bytes(RunSecret.new().hello("P9", "P0", "control"))
            elsewhere = await hello_bytes(secret.hello("P9", "P1", "control"))
            stale = secret.hello("P9", "P0", "control")
            stale_bytes = await hello_bytes(
                {**stale, "sent": stale["sent"] - 3600}  # the MAC no longer matches either
            )
            not_hello = b"".join(bytes(b) for b in encode(Control("prefill", {"rid": "x"})))
            for frame in (
                bare,
                other_run,
                elsewhere,
                stale_bytes,
                not_hello,
                b"GET / HTTP/1.0\r\nHost: pddemu\r\n\r\n",
            ):
                assert await closed_by_peer(port, frame), frame[:40]
            assert instance.refused["data"] == 6
            good = await hello_bytes(secret.hello("P9", "P0", "control"))
            assert not await closed_by_peer(port, good)
            assert await closed_by_peer(port, good)  # the same hello again: a replay
            assert instance.refused["data"] == 7
            base.HELLO_TIMEOUT_S = 0.5
            assert await closed_by_peer(port, b"PDDW")  # says nothing more: dropped
            assert instance.refused["data"] == 8
            channel = await Channel.connect("127.0.0.1", port, "P9", "P0", "control", secret)
            await asyncio.sleep(0.1)
            assert not channel.closed
            channel.close()
        finally:
            instance.stopping.set()
            await task

    asyncio.run(scenario())


@pytest.mark.parametrize("text", ["", "zz\n", "00" * 8 + "\n"])
def test_an_instance_without_a_run_secret_refuses_to_start(text: str) -> None:
    import io

    from pddemu.runtime.auth import AuthError

    with pytest.raises(AuthError, match="no run secret"):
        RunSecret.read(io.StringIO(text))
