"""zstd for KV payloads, with inflation bounded by the size the frame declares.

A compressed payload is untrusted: its zstd header may claim any content size and its window any
size. The receiver already knows the exact size the tensor must have (shape x itemsize, checked
against `Limits` first), so it refuses a zstd frame whose declared content size differs, caps the
window, and checks the output length, so memory never exceeds what the frame was allowed.
"""

from __future__ import annotations

import zstandard

from pddemu.wire.errors import BadCompression

_MIN_WINDOW_BYTES = 1 << 10
_MAX_WINDOW_BYTES = 1 << 31


def compress(payload: memoryview, level: int) -> bytes:
    """One zstd frame with its content size recorded (the receiver requires it)."""
    compressor = zstandard.ZstdCompressor(
        level=level, write_content_size=True, write_checksum=False
    )
    return compressor.compress(payload)


def decompress(payload: memoryview, expected_bytes: int) -> bytes:
    """Inflate one zstd frame that must produce exactly `expected_bytes` bytes, no more."""
    try:
        declared = zstandard.frame_content_size(payload)
    except zstandard.ZstdError as error:
        raise BadCompression(f"payload is not a zstd frame: {error}") from None
    if declared != expected_bytes:
        raise BadCompression(
            f"zstd frame declares {declared} content bytes (-1 = unknown); "
            f"the tensor needs exactly {expected_bytes}"
        )
    window = min(_MAX_WINDOW_BYTES, max(_MIN_WINDOW_BYTES, 1 << (expected_bytes - 1).bit_length()))
    decompressor = zstandard.ZstdDecompressor(max_window_size=window)
    try:
        inflated = decompressor.decompress(
            payload, max_output_size=expected_bytes, allow_extra_data=False
        )
    except zstandard.ZstdError as error:
        raise BadCompression(f"zstd payload is corrupt: {error}") from None
    if len(inflated) != expected_bytes:
        raise BadCompression(
            f"zstd payload inflated to {len(inflated)} bytes; the tensor needs {expected_bytes}"
        )
    return inflated
