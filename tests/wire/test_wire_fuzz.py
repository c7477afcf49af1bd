"""Property-based fuzzing: any byte string decodes to a valid message or raises a WireError.

Never another exception, never a hang (each example has a deadline, each test a timeout) and
never an allocation beyond the caps (traced with tracemalloc under small Limits).
"""

from __future__ import annotations

import asyncio
import struct
import tracemalloc
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from wire_samples import assert_same, kv_array

from pddemu.wire import (
    PREFIX_BYTES,
    Control,
    EndOfStream,
    KVChunk,
    KVDtype,
    Limits,
    Message,
    TokenIds,
    Truncated,
    WireError,
    decode,
    encode,
    read_message,
)
from pddemu.wire.frame import MAGIC, VERSION, seal

pytestmark = pytest.mark.timeout(120)
FUZZ = settings(
    max_examples=300,
    deadline=timedelta(milliseconds=500),
    suppress_health_check=[HealthCheck.too_slow],
)
SMALL = Limits(
    max_frame_bytes=64 * 1024,
    max_tensor_bytes=64 * 1024,
    max_control_body_bytes=4096,
    max_token_ids=1024,
)
U32 = (1 << 32) - 1

request_ids = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=64
)


@st.composite
def kv_chunks(draw: st.DrawFn) -> KVChunk:
    dtype = draw(st.sampled_from(list(KVDtype)))
    layers, heads, tokens, head_dim = (draw(st.integers(1, n)) for n in (3, 2, 6, 8))
    layer_start = draw(st.integers(0, U32 - layers))
    token_start = draw(st.integers(0, U32 - tokens))
    data = kv_array((layers, 2, heads, tokens, head_dim), dtype, seed=draw(st.integers(0, 99)))
    if draw(st.booleans()):
        data[..., ::2] = 0  # give zstd something to compress
    return KVChunk(
        draw(request_ids),
        layer_start,
        layer_start + layers,
        token_start,
        token_start + tokens,
        dtype,
        data,
    )


token_batches = st.builds(
    TokenIds.from_ints,
    request_ids,
    st.integers(0, U32),
    st.lists(st.integers(0, 2**31 - 1), max_size=40),
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
controls = st.builds(
    Control,
    st.text(st.sampled_from("abcXYZ019_.:-"), min_size=1, max_size=32),
    st.dictionaries(st.text(max_size=8), json_values, max_size=5),
)
messages = kv_chunks() | token_batches | controls
zstd_levels = st.none() | st.sampled_from([1, 3])


def frame_of(message: Message, zstd_level: int | None) -> bytes:
    return b"".join(bytes(b) for b in encode(message, zstd_level=zstd_level))


def decode_or_wire_error(data: bytes, limits: Limits = SMALL) -> Message | WireError:
    """The property under test: decoding returns a message or raises a WireError, nothing else."""
    try:
        message = decode(data, limits)
    except WireError as error:
        event(f"error {type(error).__name__}")
        return error
    assert isinstance(message, KVChunk | TokenIds | Control)
    event(f"decoded {type(message).__name__}")
    return message


@FUZZ
@given(messages, zstd_levels)
def test_generated_messages_roundtrip(message: Message, zstd_level: int | None) -> None:
    assert_same(decode(frame_of(message, zstd_level)), message)


@FUZZ
@given(st.binary(max_size=600))
def test_arbitrary_bytes(data: bytes) -> None:
    decode_or_wire_error(data)


@FUZZ
@given(st.integers(1, 3), st.binary(max_size=600))
def test_arbitrary_bytes_after_a_valid_magic_and_version(kind: int, rest: bytes) -> None:
    decode_or_wire_error(MAGIC + bytes((VERSION, kind)) + rest)


@FUZZ
@given(messages, zstd_levels, st.data())
def test_any_single_bit_flip_is_rejected(
    message: Message, zstd_level: int | None, data: st.DataObject
) -> None:
    frame = bytearray(frame_of(message, zstd_level))
    bit = data.draw(st.integers(0, len(frame) * 8 - 1))
    frame[bit // 8] ^= 1 << (bit % 8)
    assert isinstance(decode_or_wire_error(bytes(frame), Limits()), WireError)


@FUZZ
@given(messages, zstd_levels, st.data())
def test_any_truncation_is_reported_as_truncated(
    message: Message, zstd_level: int | None, data: st.DataObject
) -> None:
    frame = frame_of(message, zstd_level)
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(Truncated):
        decode(frame[:cut])


@FUZZ
@given(messages, st.sampled_from([("<I", 8), ("<Q", 12)]), st.integers(0, 2**64 - 1))
def test_length_field_changes_are_rejected(
    message: Message, field: tuple[str, int], value: int
) -> None:
    layout, offset = field
    value %= 1 << (8 * struct.calcsize(layout))
    frame = bytearray(frame_of(message, None))
    assume(struct.unpack_from(layout, frame, offset)[0] != value)
    struct.pack_into(layout, frame, offset, value)
    assert isinstance(decode_or_wire_error(bytes(frame), Limits()), WireError)


def mutate(data: st.DataObject, blob: bytes) -> bytes:
    """Overwrite, insert or delete a few bytes somewhere in `blob`."""
    start = data.draw(st.integers(0, len(blob)))
    end = data.draw(st.integers(start, min(len(blob), start + 8)))
    return blob[:start] + data.draw(st.binary(max_size=8)) + blob[end:]


@FUZZ
@given(messages, zstd_levels, st.data())
def test_resealed_mutations_reach_the_deep_checks(
    message: Message, zstd_level: int | None, data: st.DataObject
) -> None:
    """Mutate metadata, payload, kind or flags and recompute the CRCs, so the mutation gets past
    them; whatever decodes must be a message that encodes back to itself."""
    header, payload = (bytes(b) for b in encode(message, zstd_level=zstd_level))
    kind, flags = header[5], struct.unpack_from("<H", header, 6)[0]
    meta = header[PREFIX_BYTES:]
    target = data.draw(st.sampled_from(["meta", "payload", "kind", "flags"]))
    if target == "meta":
        meta = mutate(data, meta)
    elif target == "payload":
        payload = mutate(data, payload)
    elif target == "kind":
        kind = data.draw(st.integers(0, 255))
    else:
        flags = data.draw(st.integers(0, 0xFFFF))
    frame = b"".join(bytes(b) for b in seal(kind, flags, meta, payload))
    tracemalloc.start()
    try:
        result = decode_or_wire_error(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= SMALL.max_tensor_bytes + 16 * 1024
    if not isinstance(result, WireError):
        assert_same(decode(frame_of(result, None)), result)


@FUZZ
@given(st.lists(messages, max_size=3), st.binary(max_size=64), st.data())
def test_stream_reader_on_arbitrary_streams_ends_cleanly(
    sent: list[Message], junk: bytes, data: st.DataObject
) -> None:
    """Valid frames, then a mutated stream tail: the reader yields the frames, then stops with a
    WireError or EndOfStream, and never waits past the end of the stream."""
    stream = b"".join(frame_of(message, None) for message in sent)
    stream = mutate(data, stream + junk) if data.draw(st.booleans()) else stream + junk

    async def read_all() -> list[Message]:
        reader = asyncio.StreamReader()
        reader.feed_data(stream)
        reader.feed_eof()
        received = []
        while True:
            try:
                received.append(await read_message(reader, SMALL))
            except (WireError, EndOfStream):
                return received

    received = asyncio.run(asyncio.wait_for(read_all(), timeout=2))
    assert all(isinstance(m, KVChunk | TokenIds | Control) for m in received)
    if not junk and len(received) == len(sent):
        for got, want in zip(received, sent, strict=True):
            assert_same(got, want)


def test_fuzz_limits_are_small_enough_to_matter() -> None:
    """The tracemalloc bound above is only meaningful if a frame can ask for more than it."""
    chunk = KVChunk("r", 0, 1, 0, 64, KVDtype.FLOAT64, np.zeros((1, 2, 8, 64, 16), "<f8"))
    assert chunk.nbytes > SMALL.max_tensor_bytes
