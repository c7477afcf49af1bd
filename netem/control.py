"""Client of a running shaper's control socket (JSON lines over a Unix socket)."""

from __future__ import annotations

import json
import socket
from typing import Any


class ControlError(RuntimeError):
    """The shaper refused a request or could not be reached."""


def request(path: str, message: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            sock.sendall(json.dumps(message).encode() + b"\n")
            reply = bytearray()  # appended in place: a long reply is not copied once per chunk
            while not reply.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
        except OSError as exc:
            raise ControlError(f"shaper control socket {path}: {exc}") from None
    try:
        answer = json.loads(reply)
    except ValueError:
        raise ControlError(
            f"shaper control socket {path}: unreadable reply {bytes(reply[:80])!r}"
        ) from None
    if not answer.get("ok"):
        raise ControlError(answer.get("error", "request refused"))
    return answer
