"""Every message kind and dtype survives encode -> decode, with and without zstd."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from wire_samples import assert_same, control, kv_array, kv_chunk, token_ids

from pddemu.wire import (
    PREFIX_BYTES,
    Control,
    KVChunk,
    KVDtype,
    TokenIds,
    decode,
    encode,
    frame_size,
)
from pddemu.wire.frame import FLAG_ZSTD, parse_prefix
from pddemu.wire.tensors import kv_chunk_from_tensor, kv_tensor


def roundtrip(message, **options):
    return decode(b"".join(bytes(b) for b in encode(message, **options)))


@pytest.mark.parametrize("dtype", list(KVDtype))
@pytest.mark.parametrize("zstd_level", [None, 1, 3])
def test_kv_chunk_roundtrip(dtype: KVDtype, zstd_level: int | None) -> None:
    chunk = kv_chunk(dtype)
    assert_same(roundtrip(chunk, zstd_level=zstd_level), chunk)


@pytest.mark.parametrize("dtype", list(KVDtype))
def test_compressible_kv_goes_compressed_and_smaller(dtype: KVDtype) -> None:
    data = np.zeros((2, 2, 4, 64, 16), dtype=dtype.storage)
    data[:, :, :, ::7] = kv_array((2, 2, 4, 10, 16), dtype)
    chunk = KVChunk("req-z", 0, 2, 0, 64, dtype, data)
    buffers = encode(chunk, zstd_level=3)
    assert parse_prefix(buffers[0][:PREFIX_BYTES]).flags & FLAG_ZSTD
    assert frame_size(buffers) < data.nbytes / 3
    assert_same(decode(b"".join(bytes(b) for b in buffers)), chunk)


def test_incompressible_kv_falls_back_to_raw() -> None:
    noise = np.random.default_rng(1).integers(0, 256, (1, 2, 1, 64, 32), dtype=np.uint8)
    chunk = KVChunk("req-n", 0, 1, 0, 64, KVDtype.FLOAT32, noise.view("<f4"))
    buffers = encode(chunk, zstd_level=3)
    assert parse_prefix(buffers[0][:PREFIX_BYTES]).flags == 0
    assert_same(decode(b"".join(bytes(b) for b in buffers)), chunk)


def test_kv_special_values_survive_bit_for_bit() -> None:
    data = np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45, 3.4e38, 0.0, 1.0], dtype="<f4")
    chunk = KVChunk("req-s", 0, 1, 0, 1, KVDtype.FLOAT32, data.reshape(1, 2, 1, 1, 4))
    for level in (None, 3):
        assert_same(roundtrip(chunk, zstd_level=level), chunk)


def test_encode_shares_the_array_and_decode_views_the_frame() -> None:
    chunk = kv_chunk()
    header, payload = encode(chunk)
    assert np.shares_memory(np.frombuffer(payload, dtype="<f4"), chunk.data)
    frame = bytearray(bytes(header) + bytes(payload))
    decoded = decode(frame)
    assert np.shares_memory(decoded.data, np.frombuffer(frame, dtype=np.uint8))


def test_slice_of_a_larger_cache_is_sent_as_its_own_chunk() -> None:
    cache = kv_array((6, 2, 2, 40, 8), KVDtype.FLOAT32)
    part = cache[2:5, :, :, 10:30]
    chunk = KVChunk("req-slice", 2, 5, 10, 30, KVDtype.FLOAT32, part)
    decoded = roundtrip(chunk)
    assert np.array_equal(decoded.data, part)


def test_kv_chunk_at_u32_range_limits() -> None:
    top = (1 << 32) - 1
    chunk = KVChunk(
        "r", top - 1, top, top - 2, top, KVDtype.FLOAT16, np.ones((1, 2, 1, 2, 1), "<f2")
    )
    assert_same(roundtrip(chunk), chunk)


@pytest.mark.parametrize("ids", [[], [0], list(range(100)), [2**31 - 1] * 3])
def test_token_ids_roundtrip(ids: list[int]) -> None:
    batch = TokenIds.from_ints("req-tok", 17, ids)
    assert_same(roundtrip(batch), batch)


def test_hundred_token_ids_frame_size() -> None:
    """28-byte prefix + 1 + len(request id) + 4 metadata + 4 bytes per id."""
    batch = token_ids()
    assert frame_size(encode(batch)) == PREFIX_BYTES + 1 + len("req-tok") + 4 + 100 * 4 == 440


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"a": 1, "b": [1, 2.5, None, True, False, "x"], "c": {"d": {"e": []}}},
        {"unicode": "déjà vu ✓ 𝔘", "big": 2**62, "neg": -3, "tiny": 5e-324},
    ],
)
def test_control_roundtrip(body: dict) -> None:
    message = Control("probe", body)
    assert roundtrip(message) == message


def test_zstd_level_leaves_small_kinds_raw() -> None:
    for message in (token_ids(), control()):
        header, _ = encode(message, zstd_level=3)
        assert parse_prefix(header[:PREFIX_BYTES]).flags == 0
        assert_same(roundtrip(message, zstd_level=3), message)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("zstd_level", [None, 3])
def test_torch_roundtrip(dtype: torch.dtype, zstd_level: int | None) -> None:
    kv = torch.randn(2, 2, 3, 7, 4, generator=torch.Generator().manual_seed(0)).to(dtype)
    chunk = kv_chunk_from_tensor("req-t", 5, 64, kv)
    assert (chunk.layer_start, chunk.layer_end, chunk.token_start, chunk.token_end) == (
        5,
        7,
        64,
        71,
    )
    back = kv_tensor(roundtrip(chunk, zstd_level=zstd_level))
    assert back.dtype == dtype and torch.equal(back, kv)


def test_torch_chunk_shares_memory_both_ways() -> None:
    kv = torch.randn(1, 2, 1, 3, 4, dtype=torch.bfloat16)
    chunk = kv_chunk_from_tensor("req-t", 0, 0, kv)
    assert chunk.data.dtype == np.dtype("<u2")
    assert kv_tensor(chunk).data_ptr() == kv.data_ptr()


def test_torch_slice_is_copied_once_and_exact() -> None:
    cache = torch.randn(4, 2, 2, 16, 8)
    part = cache[1:3, :, :, 4:9]
    chunk = kv_chunk_from_tensor("req-t", 1, 4, part)
    assert torch.equal(kv_tensor(roundtrip(chunk)), part)
