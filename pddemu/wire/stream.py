"""Frames over asyncio streams: what the roles' TCP data planes call.

The reader pulls a frame in three reads (prefix, metadata, payload) and checks each part before
asking for the next, so a bad header never makes it wait for or buffer the payload it announces.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from pddemu.wire.errors import EndOfStream, Truncated
from pddemu.wire.frame import (
    PREFIX_BYTES,
    encode,
    finish_frame,
    frame_size,
    parse_meta,
    parse_prefix,
)
from pddemu.wire.limits import DEFAULT_LIMITS, Limits
from pddemu.wire.messages import Message


async def _read_part(reader: asyncio.StreamReader, size: int, part: str) -> bytes:
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as error:
        if part == "prefix" and not error.partial:
            raise EndOfStream("stream closed between frames") from None
        raise Truncated(
            f"stream ended after {len(error.partial)} of the {size} bytes of the frame {part}"
        ) from None


async def read_message(reader: asyncio.StreamReader, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Read one frame. A clean close before its first byte raises EndOfStream (not a WireError);
    a close inside it raises Truncated."""
    prefix = await _read_part(reader, PREFIX_BYTES, "prefix")
    header = parse_prefix(prefix, limits)
    meta = parse_meta(header, prefix, await _read_part(reader, header.meta_len, "metadata"), limits)
    payload = await _read_part(reader, header.payload_len, "payload")
    return finish_frame(header, meta, payload)


async def iter_messages(
    reader: asyncio.StreamReader, limits: Limits = DEFAULT_LIMITS
) -> AsyncIterator[Message]:
    """Every message until the peer closes cleanly; wire errors propagate."""
    while True:
        try:
            message = await read_message(reader, limits)
        except EndOfStream:
            return
        yield message


async def write_message(
    writer: asyncio.StreamWriter,
    message: Message,
    *,
    zstd_level: int | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> int:
    """Encode and send one message, waiting for the transport to drain; returns bytes sent.

    The buffers are written one by one rather than joined, so a large payload is handed to the
    transport without first being copied into one frame-sized bytes object. Some transports
    (uvloop) keep a reference to the payload until it is sent, which can be after this returns:
    do not modify the message's array in place afterwards (a receiver would see a BadChecksum).
    """
    buffers = encode(message, zstd_level=zstd_level, limits=limits)
    for buffer in buffers:
        writer.write(buffer)
    await writer.drain()
    return frame_size(buffers)
