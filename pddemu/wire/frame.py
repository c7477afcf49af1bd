"""The frame layout: a fixed 28-byte prefix, kind-specific metadata, then the payload.

    offset  size  field
    0       4     magic b"PDDW"
    4       1     version (1)
    5       1     kind: 1 KV chunk, 2 token-ID batch, 3 control
    6       2     flags: bit 0 = payload is zstd-compressed (KV chunks only)
    8       4     meta_len
    12      8     payload_len (as sent, i.e. compressed when bit 0 is set)
    20      4     payload_crc: CRC-32 of the payload as sent
    24      4     header_crc: CRC-32 of bytes 0..24 and of the metadata
    28      meta_len     metadata (below)
    ...     payload_len  payload

Integers are little-endian. Metadata starts with a 1-byte length and an ASCII name (the request
id, or a control message's kind), then: KV chunk `<IIIIB5I` layer_start, layer_end, token_start,
token_end, dtype code, shape; token-ID batch `<I` first_position; control nothing. Payloads: KV
chunk the C-order tensor; token-ID batch int32 ids; control a UTF-8 JSON object.

Decoding runs in three steps so a stream reader can stop a bad frame as early as possible:
`parse_prefix` checks magic, version, kind, flags and every size cap from 28 bytes; `parse_meta`
checks the header CRC and that the metadata agrees with the announced payload length, before a
byte of payload is read; `finish_frame` checks the payload CRC and builds the message. The header
CRC is separate so that a corrupted length field is caught before anything waits on or allocates
for the payload it announces.
"""

from __future__ import annotations

import abc
import enum
import json
import math
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from pddemu.wire import compression
from pddemu.wire.errors import (
    BadChecksum,
    BadControl,
    BadField,
    BadFlags,
    BadKind,
    BadMagic,
    BadShape,
    BadVersion,
    TooLarge,
    TrailingBytes,
    Truncated,
)
from pddemu.wire.limits import DEFAULT_LIMITS, Limits
from pddemu.wire.messages import (
    MAX_KIND_BYTES,
    MAX_REQUEST_ID_BYTES,
    Control,
    KVChunk,
    KVDtype,
    Message,
    TokenIds,
    check_kv_layout,
    shown,
)

MAGIC = b"PDDW"
VERSION = 1
FLAG_ZSTD = 0x0001
_PREFIX_FIELDS = struct.Struct("<4sBBHIQI")
"""The prefix up to header_crc: what the header CRC covers, with the metadata."""
_PREFIX = struct.Struct(_PREFIX_FIELDS.format + "I")
PREFIX_BYTES = _PREFIX.size
_HEADER_CRC = struct.Struct("<I")
_KV_META = struct.Struct("<IIIIB5I")
_TOKEN_META = struct.Struct("<I")
_TOKEN_ITEMSIZE = 4

Buffer = bytes | bytearray | memoryview


class FrameKind(enum.IntEnum):
    KV_CHUNK = 1
    TOKEN_IDS = 2
    CONTROL = 3


_MAX_META_BYTES = {
    FrameKind.KV_CHUNK: 1 + MAX_REQUEST_ID_BYTES + _KV_META.size,
    FrameKind.TOKEN_IDS: 1 + MAX_REQUEST_ID_BYTES + _TOKEN_META.size,
    FrameKind.CONTROL: 1 + MAX_KIND_BYTES,
}


@dataclass(frozen=True)
class FrameHeader:
    """The fixed prefix of a frame, already checked against the format and the caps."""

    kind: FrameKind
    flags: int
    meta_len: int
    payload_len: int
    payload_crc: int
    header_crc: int

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_ZSTD)

    @property
    def frame_bytes(self) -> int:
        return PREFIX_BYTES + self.meta_len + self.payload_len


def _check_sizes(
    kind: FrameKind, flags: int, meta_len: int, payload_len: int, limits: Limits
) -> None:
    """Every cap that the prefix alone can decide: shared by encoder and decoder."""
    if meta_len > _MAX_META_BYTES[kind]:
        raise TooLarge(
            f"meta_len = {meta_len} bytes, over the {_MAX_META_BYTES[kind]} a {kind.name} "
            "frame can need"
        )
    frame_bytes = PREFIX_BYTES + meta_len + payload_len
    if frame_bytes > limits.max_frame_bytes:
        raise TooLarge(
            f"frame of {frame_bytes} bytes (payload_len = {payload_len}) is over "
            f"Limits.max_frame_bytes = {limits.max_frame_bytes}"
        )
    if kind is FrameKind.KV_CHUNK and not flags & FLAG_ZSTD:
        if payload_len > limits.max_tensor_bytes:
            raise TooLarge(
                f"KV payload_len = {payload_len} is over Limits.max_tensor_bytes = "
                f"{limits.max_tensor_bytes}"
            )
    elif kind is FrameKind.TOKEN_IDS:
        if payload_len > limits.max_token_ids * _TOKEN_ITEMSIZE:
            raise TooLarge(
                f"token-ID payload_len = {payload_len} holds more than "
                f"Limits.max_token_ids = {limits.max_token_ids} ids"
            )
    elif kind is FrameKind.CONTROL and payload_len > limits.max_control_body_bytes:
        raise TooLarge(
            f"control body payload_len = {payload_len} is over "
            f"Limits.max_control_body_bytes = {limits.max_control_body_bytes}"
        )


def parse_prefix(prefix: Buffer, limits: Limits = DEFAULT_LIMITS) -> FrameHeader:
    """Check the first PREFIX_BYTES of a frame; nothing else needs to have arrived."""
    if len(prefix) != PREFIX_BYTES:
        raise Truncated(f"frame prefix is {len(prefix)} bytes, needs {PREFIX_BYTES}")
    magic, version, kind_code, flags, meta_len, payload_len, payload_crc, header_crc = (
        _PREFIX.unpack(prefix)
    )
    if magic != MAGIC:
        raise BadMagic(f"magic = {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise BadVersion(f"version = {version}, this code speaks version {VERSION}")
    try:
        kind = FrameKind(kind_code)
    except ValueError:
        known = ", ".join(f"{k.value} {k.name}" for k in FrameKind)
        raise BadKind(f"kind = {kind_code} is unknown (known: {known})") from None
    if flags & ~FLAG_ZSTD:
        raise BadFlags(f"flags = {flags:#06x} has unknown bits (known: {FLAG_ZSTD:#06x} zstd)")
    if flags & FLAG_ZSTD and kind is not FrameKind.KV_CHUNK:
        raise BadFlags(f"flags = {flags:#06x}: zstd is only allowed on KV_CHUNK, not {kind.name}")
    _check_sizes(kind, flags, meta_len, payload_len, limits)
    return FrameHeader(kind, flags, meta_len, payload_len, payload_crc, header_crc)


class FrameMeta(abc.ABC):
    """Checked metadata of one frame, waiting for its payload."""

    @abc.abstractmethod
    def build(self, payload: memoryview) -> Message:
        """The message this metadata and `payload` (CRC already checked) make."""


@dataclass(frozen=True)
class _KVMeta(FrameMeta):
    request_id: str
    layer_start: int
    layer_end: int
    token_start: int
    token_end: int
    dtype: KVDtype
    shape: tuple[int, ...]
    compressed: bool

    @property
    def tensor_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def build(self, payload: memoryview) -> KVChunk:
        if self.compressed:
            payload = memoryview(compression.decompress(payload, self.tensor_bytes))
        data = np.frombuffer(payload, dtype=self.dtype.storage).reshape(self.shape)
        return KVChunk(
            self.request_id,
            self.layer_start,
            self.layer_end,
            self.token_start,
            self.token_end,
            self.dtype,
            data,
        )


@dataclass(frozen=True)
class _TokenIdsMeta(FrameMeta):
    request_id: str
    first_position: int

    def build(self, payload: memoryview) -> TokenIds:
        ids = np.frombuffer(payload, dtype="<i4")
        return TokenIds(self.request_id, self.first_position, ids)


@dataclass(frozen=True)
class _ControlMeta(FrameMeta):
    kind: str

    def build(self, payload: memoryview) -> Control:
        return Control(self.kind, _parse_json_object(payload))


def _split_name(meta: memoryview, what: str) -> tuple[bytes, memoryview]:
    """Metadata starts with a 1-byte length and that many ASCII bytes."""
    if len(meta) < 1:
        raise BadField(f"metadata is empty; it must start with the {what}'s length")
    length = meta[0]
    if len(meta) < 1 + length:
        raise BadField(f"metadata is {len(meta)} bytes, too short for a {length}-byte {what}")
    return bytes(meta[1 : 1 + length]), meta[1 + length :]


def _ascii(raw: bytes, what: str, error: type[Exception]) -> str:
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise error(f"{what} {shown(raw)} is not ASCII") from None


def _check_rest(rest: memoryview, layout: struct.Struct, kind: FrameKind) -> None:
    if len(rest) != layout.size:
        raise BadField(
            f"{kind.name} metadata after the name is {len(rest)} bytes, expected {layout.size}"
        )


def parse_meta(
    header: FrameHeader, prefix: Buffer, meta: Buffer, limits: Limits = DEFAULT_LIMITS
) -> FrameMeta:
    """Check the header CRC and the metadata, including its agreement with payload_len."""
    meta = memoryview(meta)
    crc = zlib.crc32(meta, zlib.crc32(memoryview(prefix)[: _PREFIX_FIELDS.size]))
    if crc != header.header_crc:
        raise BadChecksum(
            f"header_crc = {header.header_crc:#010x}, but prefix and metadata hash to {crc:#010x}"
        )
    if header.kind is FrameKind.CONTROL:
        raw_kind, rest = _split_name(meta, "control kind")
        if len(rest):
            raise BadField(f"CONTROL metadata has {len(rest)} bytes after the kind")
        return _ControlMeta(_ascii(raw_kind, "control kind", BadControl))
    raw_id, rest = _split_name(meta, "request id")
    request_id = _ascii(raw_id, "request_id", BadField)
    if header.kind is FrameKind.TOKEN_IDS:
        _check_rest(rest, _TOKEN_META, header.kind)
        if header.payload_len % _TOKEN_ITEMSIZE:
            raise BadShape(
                f"token-ID payload_len = {header.payload_len} is not a multiple of "
                f"{_TOKEN_ITEMSIZE} (int32 ids)"
            )
        (first_position,) = _TOKEN_META.unpack(rest)
        return _TokenIdsMeta(request_id, first_position)
    _check_rest(rest, _KV_META, header.kind)
    layer_start, layer_end, token_start, token_end, dtype_code, *shape = _KV_META.unpack(rest)
    try:
        dtype = KVDtype(dtype_code)
    except ValueError:
        known = ", ".join(f"{d.value} {d.name.lower()}" for d in KVDtype)
        raise BadField(f"dtype code = {dtype_code} is unknown (known: {known})") from None
    check_kv_layout(layer_start, layer_end, token_start, token_end, shape)
    kv = _KVMeta(
        request_id,
        layer_start,
        layer_end,
        token_start,
        token_end,
        dtype,
        tuple(shape),
        header.compressed,
    )
    if kv.tensor_bytes > limits.max_tensor_bytes:
        raise TooLarge(
            f"KV shape {kv.shape} of {dtype.name.lower()} is {kv.tensor_bytes} bytes, over "
            f"Limits.max_tensor_bytes = {limits.max_tensor_bytes}"
        )
    if not header.compressed and header.payload_len != kv.tensor_bytes:
        raise BadShape(
            f"payload_len = {header.payload_len}, but KV shape {kv.shape} of "
            f"{dtype.name.lower()} needs {kv.tensor_bytes} bytes"
        )
    return kv


def finish_frame(header: FrameHeader, meta: FrameMeta, payload: Buffer) -> Message:
    """Check the payload CRC and build the message (a view over `payload` where possible)."""
    payload = memoryview(payload)
    crc = zlib.crc32(payload)
    if crc != header.payload_crc:
        raise BadChecksum(
            f"payload_crc = {header.payload_crc:#010x}, but the {len(payload)}-byte payload "
            f"hashes to {crc:#010x}"
        )
    return meta.build(payload)


def decode(frame: Buffer, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decode a buffer holding exactly one frame; arrays in the result are views into it."""
    view = memoryview(frame)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if len(view) < PREFIX_BYTES:
        raise Truncated(f"frame is {len(view)} bytes, shorter than the {PREFIX_BYTES}-byte prefix")
    prefix = view[:PREFIX_BYTES]
    header = parse_prefix(prefix, limits)
    if len(view) < header.frame_bytes:
        raise Truncated(
            f"frame is {len(view)} bytes; its header announces {header.frame_bytes} "
            f"(meta_len = {header.meta_len}, payload_len = {header.payload_len})"
        )
    if len(view) > header.frame_bytes:
        raise TrailingBytes(
            f"buffer is {len(view)} bytes, {len(view) - header.frame_bytes} more than the "
            f"{header.frame_bytes}-byte frame it holds"
        )
    meta_end = PREFIX_BYTES + header.meta_len
    meta = parse_meta(header, prefix, view[PREFIX_BYTES:meta_end], limits)
    return finish_frame(header, meta, view[meta_end:])


def _name_field(name: str) -> bytes:
    raw = name.encode("ascii")
    return bytes((len(raw),)) + raw


def _encode_json_object(body: dict[str, Any]) -> bytes:
    try:
        text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError as error:
        raise BadControl(f"body cannot be written as JSON: {error}") from None
    return text.encode("utf-8")


def _parse_json_object(payload: memoryview) -> dict[str, Any]:
    try:
        text = bytes(payload).decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadControl(f"control body is not UTF-8: {error}") from None
    try:
        body = _DECODER.decode(text)
    except BadControl:
        raise
    except (ValueError, RecursionError) as error:
        raise BadControl(f"control body is not valid JSON: {shown(str(error))}") from None
    if not isinstance(body, dict):
        raise BadControl(f"control body is a JSON {type(body).__name__}, expected an object")
    return body


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key, value in pairs:
        if key in body:
            raise BadControl(f"control body repeats the key {shown(key)}")
        body[key] = value
    return body


def _no_constants(name: str) -> None:
    raise BadControl(f"control body contains {name}, which is not JSON")


# One decoder for every control body (json.loads with hooks would make one per call).
_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_constant=_no_constants)


def _payload_of(
    message: Message, zstd_level: int | None, limits: Limits
) -> tuple[FrameKind, bytes, Buffer, int]:
    """Kind, metadata, payload and flags of a message; the payload is not copied when raw."""
    if isinstance(message, KVChunk):
        meta = _name_field(message.request_id) + _KV_META.pack(
            message.layer_start,
            message.layer_end,
            message.token_start,
            message.token_end,
            message.dtype.value,
            *message.data.shape,
        )
        if message.nbytes > limits.max_tensor_bytes:
            raise TooLarge(
                f"KV tensor of {message.nbytes} bytes is over Limits.max_tensor_bytes = "
                f"{limits.max_tensor_bytes}"
            )
        raw = memoryview(np.ascontiguousarray(message.data)).cast("B")
        if zstd_level is not None:
            packed = compression.compress(raw, zstd_level)
            if len(packed) < len(raw):
                return FrameKind.KV_CHUNK, meta, packed, FLAG_ZSTD
        return FrameKind.KV_CHUNK, meta, raw, 0
    if isinstance(message, TokenIds):
        meta = _name_field(message.request_id) + _TOKEN_META.pack(message.first_position)
        ids = memoryview(np.ascontiguousarray(message.ids)).cast("B")
        return FrameKind.TOKEN_IDS, meta, ids, 0
    if isinstance(message, Control):
        return FrameKind.CONTROL, _name_field(message.kind), _encode_json_object(message.body), 0
    raise TypeError(
        f"cannot encode a {type(message).__name__}; expected KVChunk, TokenIds or Control"
    )


def encode(
    message: Message, *, zstd_level: int | None = None, limits: Limits = DEFAULT_LIMITS
) -> list[Buffer]:
    """Frame `message` as [header, payload] buffers, ready for `writelines`.

    The payload of an uncompressed message is a memoryview of its array, not a copy. With
    `zstd_level`, a KV chunk's payload is compressed, unless that would not make it smaller
    (then it goes raw); the other kinds are small and always go raw. The frame is checked
    against `limits` so a sender fails with TooLarge instead of its peer.
    """
    kind, meta, payload, flags = _payload_of(message, zstd_level, limits)
    _check_sizes(kind, flags, len(meta), len(payload), limits)
    return seal(kind, flags, meta, payload)


def seal(kind: FrameKind, flags: int, meta: bytes, payload: Buffer) -> list[Buffer]:
    """Frame raw metadata and payload with both CRCs, checking nothing else.

    `encode` calls it for well-formed messages; tests call it to craft frames whose CRCs are
    right but whose content is not, to reach the checks that come after the CRCs.
    """
    payload_len = memoryview(payload).nbytes
    prefix_fields = _PREFIX_FIELDS.pack(
        MAGIC, VERSION, kind, flags, len(meta), payload_len, zlib.crc32(payload)
    )
    header_crc = zlib.crc32(meta, zlib.crc32(prefix_fields))
    return [prefix_fields + _HEADER_CRC.pack(header_crc) + meta, payload]


def frame_size(buffers: list[Buffer]) -> int:
    """Bytes on the wire of an encoded frame."""
    return sum(memoryview(buffer).nbytes for buffer in buffers)
