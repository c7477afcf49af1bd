"""`pddemu serve`'s host door, served as the frontend serves it (`public_application` on a
socket from `listen`) with stand-in handlers that record every request they get: the OpenAI
routes and /health answer, at their own paths; no path a client writes (dot segments,
percent-encoding, another method) reaches anything else, and nothing else is there."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from pddemu.host_door import PUBLIC_ROUTES, listen, public_application
from pddemu.roles.openai_api import OpenAIFrontDoor


async def through_the_door(requests: list[bytes]) -> tuple[list[bytes], list[tuple[str, str]]]:
    """Each raw HTTP request sent to the door (bytes exactly as given, which no HTTP client
    would leave alone); the status lines it answered and what the handlers received."""
    reached: list[tuple[str, str]] = []

    async def handler(request: web.Request) -> web.Response:
        reached.append((request.method, request.raw_path))
        return web.json_response({"ok": True})

    def api_routes(app: web.Application) -> None:
        for method, path in PUBLIC_ROUTES:
            if path != "/health":
                app.router.add_route(method, path, handler)

    door = listen("127.0.0.1", 0)
    runner = web.AppRunner(public_application(api_routes, handler, 1 << 20))
    await runner.setup()
    await web.SockSite(runner, door).start()
    statuses = []
    try:
        host, port = door.getsockname()[:2]
        for raw in requests:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(raw)
            await writer.drain()
            statuses.append((await reader.read()).split(b"\r\n", 1)[0])
            writer.close()
            await writer.wait_closed()
    finally:
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
    assert reached == [], f"{method} {path} reached {reached}"
    assert statuses[0].split()[1] in (b"404", b"405"), statuses


def test_the_api_and_health_answer_at_their_own_paths() -> None:
    sent = [http(method, path) for method, path in PUBLIC_ROUTES]
    sent.append(http("POST", "/v1/%63ompletions?x=1"))  # an encoded letter: still completions
    statuses, reached = asyncio.run(through_the_door(sent))
    assert all(status.split()[1] == b"200" for status in statuses), statuses
    assert reached == [*PUBLIC_ROUTES, ("POST", "/v1/%63ompletions?x=1")]  # its route matched


def test_the_door_serves_exactly_the_front_doors_routes() -> None:
    door = OpenAIFrontDoor.__new__(OpenAIFrontDoor)  # routes need no frontend

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({})

    public_application(door.add_routes, health, 1 << 20)  # in step with PUBLIC_ROUTES

    def more(app: web.Application) -> None:
        door.add_routes(app)
        app.router.add_post("/shutdown", health)

    with pytest.raises(ValueError, match="would serve"):
        public_application(more, health, 1 << 20)
