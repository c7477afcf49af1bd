"""Sample messages and a raw-frame builder shared by the wire tests.

The metadata layouts are written out again here, from docs/wire.md, rather than imported, so the
tests check the documented layout and not merely the code against itself.
"""

from __future__ import annotations

import struct

import numpy as np

from pddemu.wire import Control, KVChunk, KVDtype, Message, TokenIds
from pddemu.wire.frame import FrameKind, seal

KV_META = struct.Struct("<IIIIB5I")
TOKEN_META = struct.Struct("<I")


def kv_array(shape: tuple[int, ...], dtype: KVDtype, seed: int = 0) -> np.ndarray:
    """Normally distributed values stored as `dtype` (bfloat16: the top half of float32)."""
    values = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    if dtype is KVDtype.BFLOAT16:
        return (values.view(np.uint32) >> 16).astype("<u2")
    return values.astype(dtype.storage)


def kv_chunk(dtype: KVDtype = KVDtype.FLOAT32, seed: int = 0) -> KVChunk:
    data = kv_array((3, 2, 2, 5, 8), dtype, seed)
    return KVChunk("req-kv", 4, 7, 100, 105, dtype, data)


def token_ids() -> TokenIds:
    return TokenIds.from_ints("req-tok", 4096, range(1000, 1100))


def control() -> Control:
    return Control("handoff.begin", {"mode": "catch_up", "pending": 80, "ratio": 0.5})


def name_field(name: bytes) -> bytes:
    return bytes((len(name),)) + name


def kv_meta(
    request_id: bytes = b"req-kv",
    ranges: tuple[int, int, int, int] = (0, 1, 0, 2),
    dtype_code: int = KVDtype.FLOAT32.value,
    shape: tuple[int, ...] = (1, 2, 1, 2, 4),
) -> bytes:
    return name_field(request_id) + KV_META.pack(*ranges, dtype_code, *shape)


def raw_frame(kind: FrameKind, meta: bytes, payload: bytes, flags: int = 0) -> bytes:
    """A frame with correct CRCs around whatever metadata and payload are given."""
    return b"".join(bytes(buffer) for buffer in seal(kind, flags, meta, payload))


def assert_same(got: Message, want: Message) -> None:
    """Equal message, with arrays compared bit for bit (NaN-safe, bfloat16-safe)."""
    assert type(got) is type(want)
    if isinstance(want, KVChunk):
        assert (got.request_id, got.layer_start, got.layer_end, got.token_start, got.token_end) == (
            want.request_id,
            want.layer_start,
            want.layer_end,
            want.token_start,
            want.token_end,
        )
        assert got.dtype is want.dtype
        assert got.data.shape == want.data.shape and got.data.dtype == want.data.dtype
        assert got.data.tobytes() == want.data.tobytes()
    elif isinstance(want, TokenIds):
        assert (got.request_id, got.first_position) == (want.request_id, want.first_position)
        assert got.ids.dtype == want.ids.dtype and got.ids.tolist() == want.ids.tolist()
    else:
        assert got == want
