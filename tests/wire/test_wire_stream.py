"""Frames over real sockets and asyncio streams, on the default loop and on uvloop."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
import uvloop
from wire_samples import assert_same, control, kv_array, kv_chunk, token_ids

from pddemu.wire import (
    PREFIX_BYTES,
    EndOfStream,
    KVChunk,
    KVDtype,
    Limits,
    TooLarge,
    Truncated,
    WireError,
    encode,
    iter_messages,
    read_message,
    write_message,
)

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def run(loop_name: str, main: Callable[[], Awaitable[None]]) -> None:
    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        runner.run(asyncio.wait_for(main(), timeout=20))


class Pipe:
    """Both ends of a socketpair; all four stream objects are kept alive (a dropped writer
    closes its socket)."""

    def __init__(self, left: Streams, right: Streams) -> None:
        self.ends = (left, right)
        self.reader = left[0]
        self.writer = right[1]


async def socket_pair() -> Pipe:
    left, right = socket.socketpair()
    return Pipe(await asyncio.open_connection(sock=left), await asyncio.open_connection(sock=right))


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


def big_chunk() -> KVChunk:
    """4 MiB of KV, bigger than any socket buffer, so reads and writes interleave."""
    data = kv_array((4, 2, 4, 256, 64), KVDtype.FLOAT32, seed=3)
    data[:, :, :, ::2] = 0  # half zeros so zstd has something to find
    return KVChunk("req-big", 0, 4, 0, 256, KVDtype.FLOAT32, data)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_messages_cross_a_socketpair_in_order(loop_name: str) -> None:
    sent = [kv_chunk(), token_ids(), control(), big_chunk(), big_chunk(), kv_chunk(KVDtype.FLOAT16)]
    levels = [None, None, None, None, 3, 1]

    async def main() -> None:
        pipe = await socket_pair()
        reader, writer = pipe.reader, pipe.writer

        async def send() -> None:
            for message, level in zip(sent, levels, strict=True):
                await write_message(writer, message, zstd_level=level)
            await close(writer)

        sender = asyncio.create_task(send())
        received = [message async for message in iter_messages(reader)]
        await sender
        assert len(received) == len(sent)
        for got, want in zip(received, sent, strict=True):
            assert_same(got, want)

    run(loop_name, main)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_messages_cross_tcp_loopback(loop_name: str) -> None:
    async def main() -> None:
        received: asyncio.Queue = asyncio.Queue()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            async for message in iter_messages(reader):
                await received.put(message)
            await close(writer)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        sent = big_chunk()
        size = await write_message(writer, sent, zstd_level=1)
        assert size < sent.nbytes
        assert_same(await received.get(), sent)
        await close(writer)
        server.close()
        await server.wait_closed()

    run(loop_name, main)


@pytest.mark.parametrize("loop_name", LOOPS)
@pytest.mark.parametrize("part", ["prefix", "metadata", "payload"])
def test_truncation_mid_frame_names_the_part(loop_name: str, part: str) -> None:
    header, payload = encode(big_chunk())
    frame = bytes(header) + bytes(payload)
    cut = {"prefix": PREFIX_BYTES - 3, "metadata": PREFIX_BYTES + 4, "payload": len(frame) // 2}

    async def main() -> None:
        pipe = await socket_pair()
        reader, writer = pipe.reader, pipe.writer
        writer.write(frame[: cut[part]])
        closing = asyncio.create_task(close(writer))
        with pytest.raises(Truncated, match=f"stream ended after .* of the frame {part}"):
            await read_message(reader)
        await closing

    run(loop_name, main)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_clean_close_between_frames_is_end_of_stream(loop_name: str) -> None:
    async def main() -> None:
        pipe = await socket_pair()
        reader, writer = pipe.reader, pipe.writer
        await write_message(writer, token_ids())
        await close(writer)
        assert_same(await read_message(reader), token_ids())
        with pytest.raises(EndOfStream):
            await read_message(reader)

    run(loop_name, main)
    assert not issubclass(EndOfStream, WireError)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_oversized_header_fails_without_waiting_for_its_payload(loop_name: str) -> None:
    """The peer keeps the connection open: only the prefix can have been used to refuse it."""
    header, _ = encode(kv_chunk())
    prefix = bytearray(bytes(header)[:PREFIX_BYTES])
    prefix[12:20] = struct.pack("<Q", 4 << 30)

    async def main() -> None:
        pipe = await socket_pair()
        reader, writer = pipe.reader, pipe.writer
        writer.write(bytes(prefix))
        await writer.drain()
        with pytest.raises(TooLarge, match="payload_len = 4294967296"):
            await asyncio.wait_for(read_message(reader), timeout=2)
        await close(writer)

    run(loop_name, main)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_reader_limits_apply_to_stream_frames(loop_name: str) -> None:
    async def main() -> None:
        pipe = await socket_pair()
        reader, writer = pipe.reader, pipe.writer
        writer.write(bytes(encode(big_chunk())[0]))
        with pytest.raises(TooLarge, match="max_frame_bytes = 1048576"):
            await read_message(reader, Limits(max_frame_bytes=1 << 20))
        await close(writer)

    run(loop_name, main)


def test_write_message_reports_the_frame_size() -> None:
    async def main() -> None:
        pipe = await socket_pair()
        reader, writer = pipe.reader, pipe.writer
        size = await write_message(writer, kv_chunk())
        await close(writer)
        data = await reader.read()
        assert size == len(data) == PREFIX_BYTES + 1 + len("req-kv") + 37 + kv_chunk().nbytes
        assert np.frombuffer(data[-kv_chunk().nbytes :], "<f4").tolist() == (
            kv_chunk().data.ravel().tolist()
        )

    run("asyncio", main)
