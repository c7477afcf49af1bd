"""`pddemu serve`'s door on the host: a listener that forwards the frontend's OpenAI routes
and `/health`, and nothing else (the instances' control routes such as `/shutdown` and
`/admin/policy` stay inside the emulated datacenter).

Each route is forwarded to its own fixed path upstream, never to the path the client wrote: a
path such as `/v1/../shutdown` or `/v1/%2e%2e/admin/policy` matches no route here, and could
not reach another route upstream even if it did (an HTTP client resolves dot segments).

The proxy adds the run's secret to what it forwards (the instances answer nothing else without
it), so the host door is the only way in that does not need it. A client that goes away cancels
its forwarded request, and with it the request in the emulated system.

Bodies are passed through as they arrive, chunk by chunk, so a streamed token reaches the
client when the frontend sends it (the client's TTFT is the emulator's plus a loopback hop). A
stream the frontend cuts (a request failing midway) is cut here too, so the client sees the
same incomplete response.

The listening socket is made by `listen` before anything else, in the host's network namespace:
a run without root then enters its private namespace and the socket stays reachable from the
host (a socket belongs to the namespace it was made in).
"""

from __future__ import annotations

import argparse
import functools
import socket
from typing import Any

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
FORWARDED_HEADERS = ("Content-Type", "Cache-Control", "x-should-retry", "Retry-After")
# (method, path) of the frontend's routes a host client may reach: `OpenAIFrontDoor`'s routes
# (a test keeps the two in step) and the health check. Written out here so that importing this
# module, before a rootless run enters its namespace, loads neither aiohttp's server nor torch.
FORWARDED_ROUTES = (
    ("GET", "/health"),
    ("GET", "/v1/models"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
)


class ListenError(OSError):
    """The host address or port cannot be listened on."""


def port_number(text: str) -> int:
    """A TCP port from the command line: 0 (any free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is not in 0..65535")
    return port


def listen_arguments(argv: list[str]) -> tuple[str, int]:
    """`--host` and `--port` of a `pddemu serve` command line (the full parse comes later)."""
    parser = argparse.ArgumentParser(prog="pddemu serve", add_help=False)
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT)
    known, _ = parser.parse_known_args(argv)
    return known.host, known.port


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free one)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise ListenError(f"cannot listen on {host}: {error.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(1024)
    except OSError as error:
        sock.close()
        raise ListenError(
            f"cannot listen on {host}:{port}: {error.strerror} (choose another with --port, "
            "or --port 0 for any free one)"
        ) from None
    sock.setblocking(False)
    return sock


def server_url(sock: socket.socket) -> str:
    """http://host:port of a listening socket (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class HostProxy:
    """Forwards `FORWARDED_ROUTES` to `upstream` (the frontend's URL), with `credentials`
    (the run's secret header)."""

    def __init__(self, upstream: str, credentials: dict[str, str]) -> None:
        self.upstream = upstream
        self.credentials = credentials
        self.session: Any = None
        self.runner: Any = None

    async def start(self, sock: socket.socket) -> None:
        import aiohttp
        from aiohttp import web

        # No pool limit and no timeout: the benchmark client sets the concurrency and the
        # request timeout; a long generation is not the proxy's to cut.
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application(client_max_size=64 * 1024**2)
        for method, path in FORWARDED_ROUTES:
            app.router.add_route(method, path, functools.partial(self.forward, path=path))
        self.runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self.runner.setup()
        await web.SockSite(self.runner, sock).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.session is not None:
            await self.session.close()

    async def forward(self, request: Any, path: str) -> Any:
        """`request` sent on to the upstream's `path` (its route's own), with its query."""
        import aiohttp
        from aiohttp import web

        headers = {k: v for k, v in request.headers.items() if k.lower() in _REQUEST_HEADERS}
        headers.update(self.credentials)
        try:
            upstream = await self.session.request(
                request.method,
                self.upstream + path,
                params=request.rel_url.query,
                data=await request.read(),
                headers=headers,
            )
        except aiohttp.ClientError as error:
            return web.json_response(
                {
                    "error": {
                        "message": f"the emulated frontend is unreachable: {error}",
                        "type": "server_error",
                        "param": None,
                        "code": None,
                    }
                },
                status=502,
            )
        async with upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={
                    k: upstream.headers[k] for k in FORWARDED_HEADERS if k in upstream.headers
                },
            )
            try:
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (aiohttp.ClientError, ConnectionResetError):
                # The frontend cut the stream (a request failing midway): cut ours too. Or the
                # client left (a write failed before aiohttp cancelled this handler): leaving
                # this block closes the frontend's stream, which abandons the request there.
                if request.transport is not None:
                    request.transport.close()
            return response


_REQUEST_HEADERS = {"content-type", "accept", "authorization", "x-request-id"}
