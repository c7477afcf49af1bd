"""The KV wire format: framed, versioned, checksummed binary messages between the roles.

`encode`/`decode` work on buffers, `read_message`/`write_message` on asyncio streams; torch
conversions live in `pddemu.wire.tensors` so this package imports without torch. The frame layout
is documented in `pddemu.wire.frame` and docs/wire.md.
"""

from __future__ import annotations

from pddemu.wire.errors import (
    BadChecksum,
    BadCompression,
    BadControl,
    BadField,
    BadFlags,
    BadKind,
    BadMagic,
    BadShape,
    BadTokenIds,
    BadVersion,
    EndOfStream,
    TooLarge,
    TrailingBytes,
    Truncated,
    WireError,
)
from pddemu.wire.frame import PREFIX_BYTES, decode, encode, frame_size
from pddemu.wire.limits import DEFAULT_LIMITS, Limits
from pddemu.wire.messages import Control, KVChunk, KVDtype, Message, TokenIds
from pddemu.wire.stream import iter_messages, read_message, write_message

__all__ = [
    "DEFAULT_LIMITS",
    "PREFIX_BYTES",
    "BadChecksum",
    "BadCompression",
    "BadControl",
    "BadField",
    "BadFlags",
    "BadKind",
    "BadMagic",
    "BadShape",
    "BadTokenIds",
    "BadVersion",
    "Control",
    "EndOfStream",
    "KVChunk",
    "KVDtype",
    "Limits",
    "Message",
    "TokenIds",
    "TooLarge",
    "TrailingBytes",
    "Truncated",
    "WireError",
    "decode",
    "encode",
    "frame_size",
    "iter_messages",
    "read_message",
    "write_message",
]
