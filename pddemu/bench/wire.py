"""Wire format speed and compression on genuine KV from the tiny transformer.

Measures, in one run: the integrity checks available to the frame (why CRC-32); encode+decode
throughput of uncompressed KV chunks of several sizes (target: at least 1 GB/s of tensor bytes);
zstd at a few levels on float32 and bfloat16 KV (ratio, throughput), also per layer and K/V since
the parts compress very differently; the frame size of a 100-id token batch; and, for scale, the
same chunks through `write_message`/`read_message` over a socketpair on both event loops.

The KV is a prefill of the source text of Python's asyncio package (code, as agentic contexts
are) through `TinyTransformer(ModelConfig())`. Encode time is `encode()` (header, CRC, zstd);
decode time is `decode()` of the frame as one contiguous buffer, as a socket read delivers it.
Each figure is the median of several repetitions.
"""

from __future__ import annotations

import asyncio
import hashlib
import pathlib
import socket
import statistics
import time
import zlib
from collections.abc import Callable

import torch
import uvloop

from pddemu.model import ByteTokenizer, ModelConfig, TinyTransformer
from pddemu.wire import (
    KVChunk,
    TokenIds,
    compression,
    decode,
    encode,
    frame_size,
    read_message,
    write_message,
)
from pddemu.wire.tensors import kv_chunk_from_tensor

TARGET_GBPS = 1.0
GB = 1e9
ZSTD_LEVELS = (1, 3, 9)


def _median_seconds(action: Callable[[], object], repeats: int) -> float:
    action()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _genuine_kv(tokens: int) -> torch.Tensor:
    """Prefill KV [layers, 2, kv_heads, tokens, head_dim] of `tokens` bytes of real source text."""
    source = pathlib.Path(asyncio.__file__).parent
    text = "".join(path.read_text() for path in sorted(source.glob("*.py")))
    ids = ByteTokenizer().encode(text)[:tokens]
    kv, _ = TinyTransformer(ModelConfig()).prefill(ids)
    return kv.tensor


def _checksums(buffer: memoryview, repeats: int) -> dict[str, float]:
    """GB/s of each integrity check the stdlib offers (zstandard exposes no xxhash of its own)."""
    checks: dict[str, Callable[[memoryview], object]] = {
        "zlib.crc32": zlib.crc32,
        "zlib.adler32": zlib.adler32,
        "hashlib.sha1": lambda data: hashlib.sha1(data).digest(),
        "hashlib.blake2b": lambda data: hashlib.blake2b(data).digest(),
        "hashlib.md5": lambda data: hashlib.md5(data).digest(),
    }
    return {
        name: round(buffer.nbytes / _median_seconds(lambda c=check: c(buffer), repeats) / GB, 3)
        for name, check in checks.items()
    }


def _frame_bytes(chunk: KVChunk, zstd_level: int | None) -> bytes:
    return b"".join(bytes(buffer) for buffer in encode(chunk, zstd_level=zstd_level))


def _codec(chunk: KVChunk, zstd_level: int | None, repeats: int) -> dict[str, float]:
    """Encode and decode times of one chunk, checked to round-trip bit for bit."""
    frame = _frame_bytes(chunk, zstd_level)
    decoded = decode(frame)
    if decoded.data.tobytes() != chunk.data.tobytes():
        raise AssertionError("wire round trip changed the KV")
    encode_s = _median_seconds(lambda: encode(chunk, zstd_level=zstd_level), repeats)
    decode_s = _median_seconds(lambda: decode(frame), repeats)
    return {
        "tensor_bytes": chunk.nbytes,
        "frame_bytes": len(frame),
        "ratio": round(chunk.nbytes / len(frame), 3),
        "encode_gbps": round(chunk.nbytes / encode_s / GB, 3),
        "decode_gbps": round(chunk.nbytes / decode_s / GB, 3),
        "encode_decode_gbps": round(chunk.nbytes / (encode_s + decode_s) / GB, 3),
    }


def _uncompressed(kv: torch.Tensor, token_counts: list[int], repeats: int) -> list[dict]:
    rows = []
    for tokens in token_counts:
        chunk = kv_chunk_from_tensor("req-bench", 0, 0, kv[:, :, :, :tokens])
        rows.append({"chunk_tokens": tokens, **_codec(chunk, None, repeats)})
    return rows


def _zstd(kv: torch.Tensor, repeats: int) -> list[dict]:
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        chunk = kv_chunk_from_tensor("req-bench", 0, 0, kv.to(dtype))
        for level in ZSTD_LEVELS:
            rows.append(
                {
                    "dtype": str(dtype).removeprefix("torch."),
                    "zstd_level": level,
                    **_codec(chunk, level, repeats),
                }
            )
    return rows


def _zstd_by_part(kv: torch.Tensor, level: int) -> list[dict]:
    """Ratio per layer and K/V: positions enter K through RoPE, but layer 0's V is a function
    of the token id alone, so it repeats wherever a token repeats."""
    rows = []
    for layer in range(kv.shape[0]):
        for index, part in enumerate(("K", "V")):
            raw = memoryview(kv[layer, index].contiguous().numpy()).cast("B")
            ratio = raw.nbytes / len(compression.compress(raw, level))
            rows.append({"layer": layer, "part": part, "ratio": round(ratio, 3)})
    return rows


async def _stream_gbps(chunk: KVChunk, count: int) -> float:
    left, right = socket.socketpair()
    reader, reader_side_writer = await asyncio.open_connection(sock=left)
    _, writer = await asyncio.open_connection(sock=right)

    async def send() -> None:
        for _ in range(count):
            await write_message(writer, chunk)

    started = time.perf_counter()
    sender = asyncio.create_task(send())
    for _ in range(count):
        await read_message(reader)
    await sender
    elapsed = time.perf_counter() - started
    for stream_writer in (writer, reader_side_writer):
        stream_writer.close()
        await stream_writer.wait_closed()
    return round(count * chunk.nbytes / elapsed / GB, 3)


def _streams(chunk: KVChunk, count: int) -> dict[str, float]:
    loops = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    result = {}
    for name, factory in loops.items():
        with asyncio.Runner(loop_factory=factory) as runner:
            result[name] = runner.run(_stream_gbps(chunk, count))
    return result


def _token_frame_bytes() -> dict[str, int]:
    batch = TokenIds.from_ints("req-000001", 65536, range(1000, 1100))
    longest = TokenIds.from_ints("r" * 64, 65536, range(1000, 1100))
    return {
        "ids": 100,
        "request_id_10_chars": frame_size(encode(batch)),
        "request_id_64_chars": frame_size(encode(longest)),
    }


def run(quick: bool) -> dict:
    genuine_tokens = 2048 if quick else 8192
    repeats = 5 if quick else 15
    kv = _genuine_kv(genuine_tokens)
    config = ModelConfig()
    token_counts = [t for t in (64, 512, 2048, 8192) if t <= genuine_tokens]
    uncompressed = _uncompressed(kv, token_counts, repeats)
    whole = kv_chunk_from_tensor("req-bench", 0, 0, kv)
    stream_chunk = kv_chunk_from_tensor("req-bench", 0, 0, kv[:, :, :, :2048])
    # Chunks from 512 tokens up: what the prefill role ships (its default chunk is 512 tokens).
    shipped = [row for row in uncompressed if row["chunk_tokens"] >= 512]
    return {
        "kv_source": {
            "model": "TinyTransformer(ModelConfig())",
            "n_layers": config.n_layers,
            "n_kv_heads": config.n_kv_heads,
            "head_dim": config.head_dim,
            "kv_bytes_per_token": config.kv_bytes_per_token,
            "prompt": f"first {genuine_tokens} byte tokens of Python's asyncio/*.py source",
            "tensor_bytes": whole.nbytes,
        },
        "checksum_gbps": _checksums(memoryview(whole.data).cast("B"), repeats),
        "uncompressed": uncompressed,
        "zstd": _zstd(kv, max(3, repeats // 3)),
        "zstd_level3_by_part": _zstd_by_part(kv, 3),
        "token_ids_frame_bytes": _token_frame_bytes(),
        "stream_socketpair_gbps": _streams(stream_chunk, 16 if quick else 64),
        "targets": {
            "uncompressed_encode_decode_at_least_1_GBps": all(
                row["encode_decode_gbps"] >= TARGET_GBPS for row in shipped
            ),
        },
    }
