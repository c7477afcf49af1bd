"""The run's secret: what closes an emulated deployment to everyone but the run that made it.

The host has routes into every namespace of a run, so any local user could otherwise reach the
instances' control routes (`/shutdown`, `/admin/policy`, `/stats`, the frontend's request API)
and their data planes. Each run makes a random secret and hands it to its instances on their
standard input (never on disk, in argv or in the environment). Then:

- every HTTP route but `/health` asks for it in the `X-Pddemu-Key` header;
- a data-plane connection's first frame, the hello, proves it without sending it: an HMAC-SHA256
  over who is calling whom for what, a fresh nonce and the sending time. The receiver refuses a
  wrong MAC, a hello meant for another instance, one sent more than `HELLO_FRESH_S` ago, and a
  nonce it has already seen (a replayed hello).

What this does not do: encrypt, or authenticate each frame after the hello. Reading or injecting
into a connection takes the privileges of the namespaces' owner, which already own the run.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, TextIO

KEY_HEADER = "X-Pddemu-Key"
SECRET_BYTES = 32
HELLO_FRESH_S = 120.0  # wall seconds a hello stays acceptable (the nonce memory covers them)
MAX_REMEMBERED_NONCES = 1 << 16


class AuthError(ValueError):
    """A control request or a hello that does not prove the run's secret."""


@dataclass(frozen=True)
class RunSecret:
    key: bytes

    @classmethod
    def new(cls) -> RunSecret:
        return cls(secrets.token_bytes(SECRET_BYTES))

    @classmethod
    def read(cls, stream: TextIO) -> RunSecret:
        """The secret as the deployment wrote it on the instance's standard input."""
        text = stream.readline().strip()
        try:
            key = bytes.fromhex(text)
        except ValueError:
            key = b""
        if len(key) != SECRET_BYTES:
            raise AuthError("no run secret on standard input (instances are started by a run)")
        return cls(key)

    def line(self) -> bytes:
        return self.key.hex().encode() + b"\n"

    def headers(self) -> dict[str, str]:
        return {KEY_HEADER: self.key.hex()}

    def allows(self, headers: Any) -> bool:
        """Whether a control request's headers carry this secret (compared in constant time)."""
        given = headers.get(KEY_HEADER, "")
        return hmac.compare_digest(given.encode(), self.key.hex().encode())

    def _mac(self, sender: str, receiver: str, purpose: str, nonce: str, sent: float) -> str:
        message = "\0".join(("pddemu-hello-1", sender, receiver, purpose, nonce, repr(sent)))
        return hmac.new(self.key, message.encode(), hashlib.sha256).hexdigest()

    def hello(self, sender: str, receiver: str, purpose: str) -> dict[str, Any]:
        """The body of a hello that proves the secret."""
        nonce, sent = secrets.token_hex(16), time.monotonic()
        return {
            "from": sender,
            "to": receiver,
            "purpose": purpose,
            "nonce": nonce,
            "sent": sent,
            "mac": self._mac(sender, receiver, purpose, nonce, sent),
        }


class HelloCheck:
    """A receiver's check of hellos: the MAC, the addressee, freshness, and nonces seen."""

    def __init__(self, secret: RunSecret, me: str) -> None:
        self.secret = secret
        self.me = me
        self._seen: OrderedDict[str, float] = OrderedDict()

    def verify(self, body: dict[str, Any]) -> None:
        fields = [body.get(k) for k in ("from", "to", "purpose", "nonce")]
        sent = body.get("sent")
        mac = body.get("mac")
        if not all(isinstance(f, str) and f for f in fields) or not isinstance(mac, str):
            raise AuthError("hello without credentials")
        if isinstance(sent, bool) or not isinstance(sent, int | float):
            raise AuthError("hello without its sending time")
        sender, receiver, purpose, nonce = fields
        expected = self.secret._mac(sender, receiver, purpose, nonce, float(sent))
        if not hmac.compare_digest(mac.encode(), expected.encode()):
            raise AuthError(f"hello from {sender!r} does not prove the run's secret")
        if receiver != self.me:
            raise AuthError(f"hello from {sender!r} is meant for {receiver!r}")
        now = time.monotonic()
        if not -HELLO_FRESH_S < now - float(sent) < HELLO_FRESH_S:
            raise AuthError(f"hello from {sender!r} is stale")
        self._forget_before(now - HELLO_FRESH_S)
        if nonce in self._seen:
            raise AuthError(f"hello from {sender!r} replays an earlier one")
        if len(self._seen) >= MAX_REMEMBERED_NONCES:
            raise AuthError("too many connections opened recently")
        self._seen[nonce] = float(sent)

    def _forget_before(self, horizon: float) -> None:
        while self._seen and next(iter(self._seen.values())) < horizon:
            self._seen.popitem(last=False)
