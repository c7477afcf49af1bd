"""`pddemu serve`'s host-side door in front of a stand-in frontend that records every request it
gets: the OpenAI routes and /health pass, to their own paths; no path a client writes (dot
segments, percent-encoding, another method) reaches any other route."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from pddemu.host_proxy import FORWARDED_ROUTES, HostProxy, listen
from pddemu.roles.openai_api import OpenAIFrontDoor


async def through_the_door(requests: list[bytes]) -> tuple[list[bytes], list[tuple[str, str]]]:
    """Each raw HTTP request sent to the door (bytes exactly as given, which no HTTP client
    would leave alone); the status lines it answered and what the frontend received."""
    reached: list[tuple[str, str]] = []

    async def frontend(request: web.Request) -> web.Response:
        reached.append((request.method, request.raw_path))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", frontend)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    proxy = HostProxy(f"http://127.0.0.1:{port}", {"X-Pddemu-Key": "k"})
    door = listen("127.0.0.1", 0)
    statuses = []
    try:
        await proxy.start(door)
        host, door_port = door.getsockname()[:2]
        for raw in requests:
            reader, writer = await asyncio.open_connection(host, door_port)
            writer.write(raw)
            await writer.drain()
            statuses.append((await reader.read()).split(b"\r\n", 1)[0])
            writer.close()
            await writer.wait_closed()
    finally:
        await proxy.stop()
        await runner.cleanup()
    return statuses, reached


def http(method: str, path: str) -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: door\r\nContent-Type: application/json\r\n"
        "Content-Length: 2\r\nConnection: close\r\n\r\n{}"
    ).encode()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/shutdown"),
        ("POST", "/admin/policy"),
        ("GET", "/stats"),
        ("POST", "/generate"),
        ("POST", "/v1/../shutdown"),
        ("POST", "/v1/./../admin/policy"),
        ("POST", "/v1/%2e%2e/shutdown"),
        ("POST", "/v1/%2E%2E/admin/policy"),
        ("POST", "/v1/..%2fshutdown"),
        ("POST", "/v1/%2e%2e%2fshutdown"),
        ("POST", "/v1/models/../../shutdown"),
        ("POST", "/v1/completions/../../shutdown"),
        ("GET", "/v1/../stats"),
        ("POST", "/health/../shutdown"),
        ("POST", "//shutdown"),
        ("DELETE", "/v1/completions"),
        ("POST", "/v1/models"),
        ("GET", "/v1/anything"),
    ],
)
def test_no_client_path_reaches_another_route(method: str, path: str) -> None:
    statuses, reached = asyncio.run(through_the_door([http(method, path)]))
    assert reached == [], f"{method} {path} reached the frontend as {reached}"
    assert statuses[0].split()[1] in (b"404", b"405"), statuses


def test_the_api_and_health_reach_their_own_paths() -> None:
    sent = [http(method, path) for method, path in FORWARDED_ROUTES]
    sent.append(http("POST", "/v1/%63ompletions?x=1"))  # an encoded letter: still completions
    statuses, reached = asyncio.run(through_the_door(sent))
    assert all(status.split()[1] == b"200" for status in statuses), statuses
    assert reached == [*FORWARDED_ROUTES, ("POST", "/v1/completions?x=1")]


def test_the_door_forwards_exactly_the_front_doors_routes() -> None:
    app = web.Application()
    OpenAIFrontDoor.__new__(OpenAIFrontDoor).add_routes(app)  # routes need no frontend
    served = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD"
    }
    assert served == set(FORWARDED_ROUTES) - {("GET", "/health")}


async def streamed_through_the_door(frontend_stream: Any, client: Any) -> Any:
    """`client(door_url, proxy)` against a door in front of one streaming route."""
    app = web.Application()
    app.router.add_post("/v1/completions", frontend_stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    proxy = HostProxy(f"http://127.0.0.1:{port}", {"X-Pddemu-Key": "k"})
    door = listen("127.0.0.1", 0)
    try:
        await proxy.start(door)
        host, door_port = door.getsockname()[:2]
        return await client(f"http://{host}:{door_port}", proxy)
    finally:
        await proxy.stop()
        await runner.cleanup()


def test_a_stream_the_frontend_cuts_is_cut_for_the_client() -> None:
    async def frontend_stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: {}\n\n")
        request.transport.close()  # a request failing midway: no end of the chunked body
        return response

    async def client(url: str, _proxy: HostProxy) -> tuple[bytes, bool]:
        received = b""
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1/completions", data=b"{}") as reply:
                try:
                    async for chunk in reply.content.iter_any():
                        received += chunk
                except aiohttp.ClientPayloadError:
                    return received, True
        return received, False

    received, cut = asyncio.run(streamed_through_the_door(frontend_stream, client))
    assert received == b"data: {}\n\n" and cut, "the client saw a clean end: a success"


def test_a_client_leaving_midway_closes_the_frontends_stream_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No traceback on serve's terminal when a benchmark client gives up on a stream."""
    seen: dict[str, Any] = {}

    async def frontend_stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: 0\n\n")
        try:  # the client has left: the door's writes to it fail, then it closes this stream
            for _ in range(10_000):
                await response.write(b"data: more\n\n")
                await asyncio.sleep(0.001)
        except ConnectionResetError:
            seen["frontend"] = "closed"
            return response
        seen["frontend"] = "never closed"
        return response

    async def client(url: str, _proxy: HostProxy) -> None:
        reader, writer = await asyncio.open_connection(*url.removeprefix("http://").split(":"))
        writer.write(http("POST", "/v1/completions"))
        await writer.drain()
        await reader.readuntil(b"data: 0\n\n")
        writer.close()
        await writer.wait_closed()
        while "frontend" not in seen:
            await asyncio.sleep(0.01)

    with caplog.at_level(logging.ERROR, logger="aiohttp.server"):
        asyncio.run(streamed_through_the_door(frontend_stream, client))
    assert seen["frontend"] == "closed"
    errors = [r.getMessage() for r in caplog.records if r.name == "aiohttp.server"]
    assert not errors
