"""One test per way a frame can be wrong: each yields its own WireError naming the field."""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest
import zstandard
from wire_samples import (
    TOKEN_META,
    control,
    kv_chunk,
    kv_meta,
    name_field,
    raw_frame,
    token_ids,
)

from pddemu.wire import (
    PREFIX_BYTES,
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
    Control,
    KVChunk,
    KVDtype,
    Limits,
    TokenIds,
    TooLarge,
    TrailingBytes,
    Truncated,
    WireError,
    decode,
    encode,
)
from pddemu.wire.frame import FLAG_ZSTD, FrameKind, parse_prefix
from pddemu.wire.tensors import kv_chunk_from_tensor

PAYLOAD_LEN_AT = 12
PAYLOAD_CRC_AT = 20


def frame_of(message, **options) -> bytearray:
    return bytearray(b"".join(bytes(b) for b in encode(message, **options)))


def test_every_error_is_a_wire_error_and_a_value_error() -> None:
    for error in (
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
        TooLarge,
        TrailingBytes,
        Truncated,
    ):
        assert issubclass(error, WireError) and issubclass(error, ValueError)


def test_bad_magic() -> None:
    frame = frame_of(control())
    frame[:4] = b"HTTP"
    with pytest.raises(BadMagic, match=r"magic = b'HTTP', expected b'PDDW'"):
        decode(frame)


def test_bad_version() -> None:
    frame = frame_of(control())
    frame[4] = 2
    with pytest.raises(BadVersion, match="version = 2"):
        decode(frame)


def test_bad_kind() -> None:
    frame = frame_of(control())
    frame[5] = 9
    with pytest.raises(BadKind, match="kind = 9 is unknown"):
        decode(frame)


def test_unknown_flag_bits() -> None:
    frame = frame_of(kv_chunk())
    frame[6:8] = struct.pack("<H", 0x8000)
    with pytest.raises(BadFlags, match="0x8000 has unknown bits"):
        decode(frame)


def test_zstd_flag_on_a_kind_without_compression() -> None:
    frame = raw_frame(FrameKind.TOKEN_IDS, name_field(b"r") + TOKEN_META.pack(0), b"", FLAG_ZSTD)
    with pytest.raises(BadFlags, match="only allowed on KV_CHUNK, not TOKEN_IDS"):
        decode(frame)


def test_header_announcing_4_gb_is_rejected_from_the_prefix_alone() -> None:
    prefix = frame_of(kv_chunk())[:PREFIX_BYTES]
    prefix[PAYLOAD_LEN_AT : PAYLOAD_LEN_AT + 8] = struct.pack("<Q", 4 << 30)
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge, match="payload_len = 4294967296"):
            decode(bytes(prefix))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


def test_compressed_kv_announcing_a_tensor_over_the_cap() -> None:
    limits = Limits(max_tensor_bytes=1 << 20)
    shape = (1, 2, 1, 1 << 16, 8)  # 4 MiB of float32 behind a tiny compressed payload
    packed = zstandard.ZstdCompressor().compress(bytes(4 << 20))
    meta = kv_meta(ranges=(0, 1, 0, 1 << 16), shape=shape)
    with pytest.raises(TooLarge, match="max_tensor_bytes = 1048576"):
        decode(raw_frame(FrameKind.KV_CHUNK, meta, packed, FLAG_ZSTD), limits)


@pytest.mark.parametrize(
    ("message", "limits", "match"),
    [
        (token_ids(), Limits(max_token_ids=99), "max_token_ids = 99"),
        (
            Control("big", {"blob": "x" * 200}),
            Limits(max_control_body_bytes=100),
            "max_control_body_bytes = 100",
        ),
        (kv_chunk(), Limits(max_frame_bytes=200), "max_frame_bytes = 200"),
    ],
)
def test_per_kind_caps_on_decode_and_on_encode(message, limits: Limits, match: str) -> None:
    frame = frame_of(message)
    with pytest.raises(TooLarge, match=match):
        decode(frame, limits)
    with pytest.raises(TooLarge, match=match):
        encode(message, limits=limits)


def test_oversized_metadata_length() -> None:
    frame = frame_of(control())
    frame[8:12] = struct.pack("<I", 1000)
    with pytest.raises(TooLarge, match="meta_len = 1000"):
        decode(frame)


@pytest.mark.parametrize("cut", [0, 1, PREFIX_BYTES - 1, PREFIX_BYTES, PREFIX_BYTES + 5, -1])
def test_truncated(cut: int) -> None:
    frame = frame_of(kv_chunk())
    with pytest.raises(Truncated, match=r"frame is \d+ bytes"):
        decode(frame[:cut])


def test_trailing_bytes() -> None:
    frame = frame_of(token_ids())
    with pytest.raises(TrailingBytes, match="1 more than the"):
        decode(frame + b"\0")


def test_payload_checksum_mismatch() -> None:
    frame = frame_of(kv_chunk())
    frame[-1] ^= 0x01
    with pytest.raises(BadChecksum, match="payload_crc = 0x[0-9a-f]{8}, but the 1920-byte payload"):
        decode(frame)


@pytest.mark.parametrize("offset", [PAYLOAD_CRC_AT, PREFIX_BYTES + 2])
def test_header_checksum_mismatch(offset: int) -> None:
    """The payload CRC field and the metadata are both covered by the header CRC."""
    frame = frame_of(kv_chunk())
    frame[offset] ^= 0x10
    with pytest.raises(BadChecksum, match="header_crc"):
        decode(frame)


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        (kv_meta(request_id=b"caf\xe9"), "request_id .* is not ASCII"),
        (kv_meta(request_id=b"has space"), "request_id 'has space' is not 1..64 printable"),
        (kv_meta(request_id=b""), "request_id '' is not"),
        (kv_meta(ranges=(3, 3, 0, 2)), r"layer range \[3, 3\) is empty"),
        (kv_meta(ranges=(0, 1, 5, 4)), r"token range \[5, 4\) is empty or reversed"),
        (kv_meta(dtype_code=7), "dtype code = 7 is unknown"),
        (kv_meta()[:-1], "KV_CHUNK metadata after the name is 36 bytes, expected 37"),
        (b"", "metadata is empty"),
        (b"\x09abc", "too short for a 9-byte request id"),
    ],
)
def test_bad_metadata_field(meta: bytes, match: str) -> None:
    with pytest.raises(BadField, match=match):
        decode(raw_frame(FrameKind.KV_CHUNK, meta, bytes(64)))


@pytest.mark.parametrize(
    ("meta", "payload_len", "match"),
    [
        (kv_meta(), 60, "payload_len = 60, but KV shape .* needs 64 bytes"),
        (kv_meta(shape=(2, 2, 1, 2, 4)), 128, r"dim 0 = 2 but layer range \[0, 1\) spans 1"),
        (kv_meta(shape=(1, 3, 1, 2, 4)), 96, "dim 1 must be 2"),
        (kv_meta(shape=(1, 2, 1, 3, 4)), 96, r"dim 3 = 3 but token range \[0, 2\) spans 2"),
        (kv_meta(shape=(1, 2, 0, 2, 4)), 0, "dimension outside"),
    ],
)
def test_shape_inconsistent_with_ranges_or_length(
    meta: bytes, payload_len: int, match: str
) -> None:
    with pytest.raises(BadShape, match=match):
        decode(raw_frame(FrameKind.KV_CHUNK, meta, bytes(payload_len)))


def test_token_payload_not_a_multiple_of_four() -> None:
    meta = name_field(b"r") + TOKEN_META.pack(0)
    with pytest.raises(BadShape, match="payload_len = 7 is not a multiple of 4"):
        decode(raw_frame(FrameKind.TOKEN_IDS, meta, bytes(7)))


def test_kv_chunk_construction_checks_shape_and_dtype() -> None:
    with pytest.raises(BadShape, match="has 4 dims"):
        KVChunk("r", 0, 1, 0, 1, KVDtype.FLOAT32, np.zeros((1, 2, 1, 1), "<f4"))
    with pytest.raises(BadShape, match="data dtype <f8 does not store float32"):
        KVChunk("r", 0, 1, 0, 1, KVDtype.FLOAT32, np.zeros((1, 2, 1, 1, 1), "<f8"))
    with pytest.raises(BadShape, match=r"dim 3 = 2 but token range \[0, 1\)"):
        KVChunk("r", 0, 1, 0, 1, KVDtype.FLOAT32, np.zeros((1, 2, 1, 2, 1), "<f4"))
    with pytest.raises(BadField, match="layer_start = -1 is outside"):
        KVChunk("r", -1, 0, 0, 1, KVDtype.FLOAT32, np.zeros((1, 2, 1, 1, 1), "<f4"))
    with pytest.raises(BadField, match="request_id 'xxx.* is not 1..64"):
        KVChunk("x" * 65, 0, 1, 0, 1, KVDtype.FLOAT32, np.zeros((1, 2, 1, 1, 1), "<f4"))
    with pytest.raises(BadField, match="token_end must be an integer, got 1.0"):
        KVChunk("r", 0, 1, 0, 1.0, KVDtype.FLOAT32, np.zeros((1, 2, 1, 1, 1), "<f4"))


def test_torch_dtype_without_a_wire_code() -> None:
    import torch

    with pytest.raises(BadShape, match="KV dtype torch.int64 cannot go on the wire"):
        kv_chunk_from_tensor("r", 0, 0, torch.zeros(1, 2, 1, 1, 1, dtype=torch.int64))


def kv_zstd_frame(packed: bytes, tokens: int = 2) -> bytes:
    meta = kv_meta(ranges=(0, 1, 0, tokens), shape=(1, 2, 1, tokens, 4))
    return raw_frame(FrameKind.KV_CHUNK, meta, packed, FLAG_ZSTD)


def test_corrupt_zstd_payload_with_a_valid_checksum() -> None:
    packed = zstandard.ZstdCompressor().compress(np.arange(16, dtype="<f4").tobytes())
    with pytest.raises(BadCompression, match="zstd payload is corrupt"):
        decode(kv_zstd_frame(packed[:-4]))


def test_zstd_declaring_another_size_is_refused_before_inflating() -> None:
    bomb = zstandard.ZstdCompressor().compress(bytes(64 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(BadCompression, match="declares 67108864 content bytes"):
            decode(kv_zstd_frame(bomb))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_zstd_without_content_size_is_refused() -> None:
    packed = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(64))
    with pytest.raises(BadCompression, match=r"declares -1 content bytes \(-1 = unknown\)"):
        decode(kv_zstd_frame(packed))


def test_zstd_with_data_after_the_frame_is_refused() -> None:
    packed = zstandard.ZstdCompressor().compress(bytes(64))
    with pytest.raises(BadCompression, match="corrupt"):
        decode(kv_zstd_frame(packed + packed))


def test_payload_that_is_not_zstd() -> None:
    with pytest.raises(BadCompression, match="not a zstd frame"):
        decode(kv_zstd_frame(b"definitely not zstd"))


def test_negative_token_id() -> None:
    ids = np.array([5, -2, 7, -1], dtype="<i4").tobytes()
    frame = raw_frame(FrameKind.TOKEN_IDS, name_field(b"r") + TOKEN_META.pack(0), ids)
    with pytest.raises(BadTokenIds, match=r"ids\[1\] = -2 is negative \(2 negative ids"):
        decode(frame)


def test_token_ids_construction_checks() -> None:
    with pytest.raises(BadTokenIds, match="must fit in int32"):
        TokenIds.from_ints("r", 0, [2**31])
    with pytest.raises(BadShape, match="ids must be 1-D <i4, got 1-D <i8"):
        TokenIds("r", 0, np.arange(3))
    with pytest.raises(BadField, match="first_position = 4294967296 is outside"):
        TokenIds.from_ints("r", 1 << 32, [1])
    for not_integers in ([1.7, 2.2], ["5"], [None]):
        with pytest.raises(BadTokenIds, match="ids must be integers"):
            TokenIds.from_ints("r", 0, not_integers)
    assert TokenIds.from_ints("r", 0, np.array([3, 4])).ids.tolist() == [3, 4]


@pytest.mark.parametrize("cap", [True, 0, -1, 1.5])
def test_limits_must_be_positive_ints(cap: object) -> None:
    with pytest.raises(ValueError, match="Limits.max_frame_bytes must be a positive int"):
        Limits(max_frame_bytes=cap)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"\xff\xfe{}", "not UTF-8"),
        (b"{'a': 1}", "not valid JSON"),
        (b"[1, 2]", "is a JSON list, expected an object"),
        (b'{"a": NaN}', "contains NaN"),
        (b'{"a": 1, "a": 2}', "repeats the key 'a'"),
        (b"[" * 5000 + b"]" * 5000, "not valid JSON|nests deeper"),
        (b'{"a":' * 40 + b"1" + b"}" * 40, "nests deeper than 32"),
        (b'{"a":' + b"[" * 32 + b"1" + b"]" * 32 + b"}", "nests deeper than 32"),
        (b'{"a": "\\ud800"}', "not encodable as UTF-8"),
        (b'{"times": [0.5, 1e999]}', r"body\['times'\]\[1\] = inf is not a finite number"),
    ],
)
def test_bad_control_body(body: bytes, match: str) -> None:
    with pytest.raises(BadControl, match=match):
        decode(raw_frame(FrameKind.CONTROL, name_field(b"probe"), body))


@pytest.mark.parametrize("kind", [b"", b"has space", b"k" * 33, b"\xc3\xa9"])
def test_bad_control_kind(kind: bytes) -> None:
    if len(kind) > 32:
        with pytest.raises(TooLarge, match="meta_len = 34"):
            decode(raw_frame(FrameKind.CONTROL, name_field(kind), b"{}"))
        return
    with pytest.raises(BadControl, match="kind"):
        decode(raw_frame(FrameKind.CONTROL, name_field(kind), b"{}"))


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({1: "x"}, "non-string key 1"),
        ({"t": (1, 2)}, r"body\['t'\] is a tuple"),
        ({"s": {1, 2}}, r"body\['s'\] is a set"),
        ({"f": float("inf")}, "inf is not a finite number"),
        ({"times": [0.1, 0.2, float("nan")]}, r"body\['times'\]\[2\] = nan is not a finite"),
        ({"times": [1, True, -float("inf")]}, r"body\['times'\]\[2\] = -inf is not a finite"),
        ({"times": [float("inf"), -float("inf")]}, r"body\['times'\]\[0\] = inf is not"),
        ({"n": [[{"x": np.float32(1)}]]}, r"body\['n'\]\[0\]\[0\]\['x'\] is a float32"),
    ],
)
def test_control_construction_accepts_json_types_only(body: dict, match: str) -> None:
    with pytest.raises(BadControl, match=match):
        Control("probe", body)


def test_control_bodies_at_the_json_limits_pass() -> None:
    """Numbers whose sum overflows are each finite; scalars nested exactly as deep as allowed
    pass, on construction and on decoding."""
    deepest: object = [1.5]
    for _ in range(30):
        deepest = [deepest]
    for body in (
        {"big": [1e308, 1e308, -1e308], "huge": [10**400, 2.5], "mixed": [1, 2.5, "x", None]},
        {"a": deepest},
    ):
        assert decode(frame_of(Control("probe", body))).body == body


def test_control_body_must_be_a_dict() -> None:
    with pytest.raises(BadControl, match="body must be a dict, got list"):
        Control("probe", [])


def test_prefix_parser_needs_the_whole_prefix() -> None:
    with pytest.raises(Truncated, match="prefix is 10 bytes, needs 28"):
        parse_prefix(bytes(10))


@pytest.mark.parametrize("make", [kv_chunk, token_ids, control], ids=["kv", "tokens", "control"])
def test_every_single_bit_flip_is_rejected(make) -> None:
    frame = frame_of(make())
    for bit in range(len(frame) * 8):
        flipped = bytearray(frame)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(WireError):
            decode(flipped)
