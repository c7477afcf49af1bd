"""`pddemu serve`'s door on the host: a listening socket made in the host's network namespace
and handed to the frontend process, which serves on it the OpenAI routes and `/health`, and
nothing else (the instances' control routes such as `/shutdown` and `/admin/policy` stay inside
the emulated datacenter, behind the run's secret).

A socket belongs to the namespace it was made in, so the frontend, inside DC A's namespace,
answers host clients on it directly: no forwarding hop between a benchmark client and the
emulated system, whose delay would count in the client's TTFT and not in the emulator's. The
door's application has only `PUBLIC_ROUTES`: a path such as `/v1/../shutdown` or
`/v1/%2e%2e/admin/policy` matches none of them (404), and no other route exists there to reach.

The socket is made by `listen` before anything else: a run without root then enters its private
namespace and the socket stays reachable from the host.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Callable
from typing import Any

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# (method, path) of the frontend's routes a host client may reach: `OpenAIFrontDoor`'s routes
# (a test keeps the two in step) and the health check. Written out here so that importing this
# module, before a rootless run enters its namespace, loads neither aiohttp's server nor torch.
PUBLIC_ROUTES = (
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


def public_application(
    add_api_routes: Callable[[Any], None], health: Any, max_body_bytes: int
) -> Any:
    """The door's aiohttp application: `/health` and the routes `add_api_routes` adds (the
    OpenAI front door's), nothing else, and no secret asked (the host's only way in)."""
    from aiohttp import web

    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_get("/health", health)
    add_api_routes(app)
    served = {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    if served != set(PUBLIC_ROUTES):
        raise ValueError(f"the host door would serve {sorted(served)}, not {PUBLIC_ROUTES}")
    return app
