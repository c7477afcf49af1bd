"""The messages the roles exchange: KV chunks, token-ID batches and control messages.

Each message validates itself when built, so the same checks guard a sender (a bug is caught
before it reaches the network) and the decoder (a hostile or corrupt frame never becomes a
message). The frame layout lives in `frame`; this module knows nothing about bytes on the wire.
"""

from __future__ import annotations

import enum
import math
import operator
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pddemu.wire.errors import BadControl, BadField, BadShape, BadTokenIds

MAX_REQUEST_ID_BYTES = 64
MAX_KIND_BYTES = 32
MAX_JSON_DEPTH = 32
_INTEGERS = (bool, int)
_NUMBER_TYPES = frozenset({bool, int, float})  # exactly these: a list of them is checked in C
MAX_U32 = (1 << 32) - 1
KV_NDIM = 5
"""A KV tensor is [layers, 2 (K, V), kv_heads, tokens, head_dim]."""

_REQUEST_ID = re.compile(rf"[!-~]{{1,{MAX_REQUEST_ID_BYTES}}}\Z")
_KIND = re.compile(rf"[A-Za-z0-9_.:-]{{1,{MAX_KIND_BYTES}}}\Z")
_TOKEN_DTYPE = np.dtype("<i4")


def shown(value: object, width: int = 80) -> str:
    """repr() cut to `width` characters: error messages must stay readable on hostile input."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


class KVDtype(enum.IntEnum):
    """Element type of a KV tensor; the value is its code on the wire."""

    FLOAT32 = 1
    FLOAT16 = 2
    BFLOAT16 = 3
    FLOAT64 = 4

    @property
    def storage(self) -> np.dtype:
        """The numpy dtype holding the elements; bfloat16, unknown to numpy, is kept as uint16."""
        return _STORAGE[self]

    @property
    def itemsize(self) -> int:
        return _STORAGE[self].itemsize


_STORAGE: dict[KVDtype, np.dtype] = {
    KVDtype.FLOAT32: np.dtype("<f4"),
    KVDtype.FLOAT16: np.dtype("<f2"),
    KVDtype.BFLOAT16: np.dtype("<u2"),
    KVDtype.FLOAT64: np.dtype("<f8"),
}


def check_request_id(request_id: object) -> None:
    """Request ids are 1..64 printable ASCII characters without spaces."""
    if not isinstance(request_id, str) or not _REQUEST_ID.match(request_id):
        raise BadField(
            f"request_id {shown(request_id)} is not 1..{MAX_REQUEST_ID_BYTES} printable ASCII "
            "characters without spaces"
        )


def _as_u32(name: str, value: object) -> int:
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise BadField(f"{name} must be an integer, got {shown(value)}") from None
    if not 0 <= number <= MAX_U32:
        raise BadField(f"{name} = {number} is outside 0..{MAX_U32}")
    return number


def check_kv_layout(
    layer_start: int, layer_end: int, token_start: int, token_end: int, shape: Sequence[int]
) -> None:
    """A chunk's ranges must be non-empty and agree with its 5-D shape."""
    if layer_end <= layer_start:
        raise BadField(f"layer range [{layer_start}, {layer_end}) is empty or reversed")
    if token_end <= token_start:
        raise BadField(f"token range [{token_start}, {token_end}) is empty or reversed")
    if len(shape) != KV_NDIM:
        raise BadShape(
            f"KV shape {tuple(shape)} has {len(shape)} dims; expected {KV_NDIM} "
            "[layers, 2, kv_heads, tokens, head_dim]"
        )
    if any(not 1 <= dim <= MAX_U32 for dim in shape):
        raise BadShape(f"KV shape {tuple(shape)} has a dimension outside 1..{MAX_U32}")
    if shape[1] != 2:
        raise BadShape(f"KV shape {tuple(shape)}: dim 1 must be 2 (K and V), got {shape[1]}")
    if shape[0] != layer_end - layer_start:
        raise BadShape(
            f"KV shape {tuple(shape)}: dim 0 = {shape[0]} but layer range "
            f"[{layer_start}, {layer_end}) spans {layer_end - layer_start}"
        )
    if shape[3] != token_end - token_start:
        raise BadShape(
            f"KV shape {tuple(shape)}: dim 3 = {shape[3]} but token range "
            f"[{token_start}, {token_end}) spans {token_end - token_start}"
        )


@dataclass(frozen=True, eq=False)
class KVChunk:
    """The KV of layers [layer_start, layer_end) x tokens [token_start, token_end) of a request.

    `data` has shape [layer span, 2, kv_heads, token span, head_dim] and dtype `dtype.storage`.
    A decoded chunk's `data` is a view over the received (or inflated) buffer, read-only when
    that buffer is bytes, as it always is from `read_message`.
    """

    request_id: str
    layer_start: int
    layer_end: int
    token_start: int
    token_end: int
    dtype: KVDtype
    data: np.ndarray

    def __post_init__(self) -> None:
        check_request_id(self.request_id)
        for name in ("layer_start", "layer_end", "token_start", "token_end"):
            object.__setattr__(self, name, _as_u32(name, getattr(self, name)))
        if not isinstance(self.dtype, KVDtype):
            raise BadField(f"dtype must be a KVDtype, got {shown(self.dtype)}")
        if not isinstance(self.data, np.ndarray):
            raise BadShape(f"data must be a numpy array, got {type(self.data).__name__}")
        check_kv_layout(
            self.layer_start, self.layer_end, self.token_start, self.token_end, self.data.shape
        )
        if self.data.dtype != self.dtype.storage:
            raise BadShape(
                f"data dtype {self.data.dtype.str} does not store {self.dtype.name.lower()} "
                f"(expected {self.dtype.storage.str})"
            )

    @property
    def nbytes(self) -> int:
        """Tensor bytes, before any compression."""
        return self.data.nbytes


@dataclass(frozen=True, eq=False)
class TokenIds:
    """Token ids of a request starting at position `first_position` (Extend-Decode handoff)."""

    request_id: str
    first_position: int
    ids: np.ndarray
    """1-D little-endian int32, every id >= 0; a decoded batch's array views the frame."""

    def __post_init__(self) -> None:
        check_request_id(self.request_id)
        object.__setattr__(self, "first_position", _as_u32("first_position", self.first_position))
        if not isinstance(self.ids, np.ndarray):
            raise BadShape(f"ids must be a numpy array, got {type(self.ids).__name__}")
        if self.ids.ndim != 1 or self.ids.dtype != _TOKEN_DTYPE:
            raise BadShape(
                f"ids must be 1-D {_TOKEN_DTYPE.str}, got {self.ids.ndim}-D {self.ids.dtype.str}"
            )
        negative = np.flatnonzero(self.ids < 0)
        if negative.size:
            index = int(negative[0])
            raise BadTokenIds(
                f"ids[{index}] = {int(self.ids[index])} is negative "
                f"({negative.size} negative ids in the batch)"
            )

    @classmethod
    def from_ints(cls, request_id: str, first_position: int, ids: Iterable[int]) -> TokenIds:
        """Build a batch from integers (ids must fit in int32); a float or a string is refused,
        never truncated or parsed."""
        try:
            array = np.asarray([operator.index(i) for i in ids], dtype=_TOKEN_DTYPE)
        except TypeError as error:
            raise BadTokenIds(f"ids must be integers: {error}") from None
        except OverflowError as error:
            raise BadTokenIds(f"ids must fit in int32: {error}") from None
        return cls(request_id, first_position, array)


def _json_ok(value: Any, depth: int) -> bool:
    """Whether `value` surely passes `_check_json`: its checks without the bookkeeping of
    where a fault is, for the common case (a body that passes). False means: look closer."""
    if depth > MAX_JSON_DEPTH:
        return False
    if value is None or isinstance(value, _INTEGERS):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return value.isascii() or _encodes(value)
    if isinstance(value, list | dict) and depth >= MAX_JSON_DEPTH:
        return not value  # its items would nest too deep
    if isinstance(value, list):
        if _finite_numbers(value):
            return True
        return all(_json_ok(item, depth + 1) for item in value)
    if isinstance(value, dict):
        for key, item in value.items():
            if not (isinstance(key, str) and (key.isascii() or _encodes(key))):
                return False
            kind = type(item)  # the common scalars inline, the rest (and subclasses) recursed
            if kind is float:
                if not math.isfinite(item):
                    return False
            elif kind is str:
                if not (item.isascii() or _encodes(item)):
                    return False
            elif not (kind is int or kind is bool or item is None or _json_ok(item, depth + 1)):
                return False
        return True
    return False


def _finite_numbers(items: list[Any]) -> bool:
    """Whether `items` are all ints, bools and finite floats, told in C rather than item by
    item (a token group's times are such a list): their exact sum is finite only if each is,
    since an infinity or a NaN stays in it. False means: not told (an overflowing sum, or
    other types: look item by item)."""
    if not set(map(type, items)) <= _NUMBER_TYPES:
        return False
    try:
        return math.isfinite(math.fsum(items))
    except (OverflowError, ValueError):  # finite but huge, or inf - inf: look closer
        return False


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_json(value: Any, path: str, depth: int) -> None:
    if depth > MAX_JSON_DEPTH:
        raise BadControl(f"body{path} nests deeper than {MAX_JSON_DEPTH} levels")
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise BadControl(f"body{path} = {value} is not a finite number")
        return
    if isinstance(value, str):
        _check_utf8(value, f"body{path}")
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, f"{path}[{index}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise BadControl(f"body{path} has a non-string key {shown(key)}")
            _check_utf8(key, f"key in body{path}")
            _check_json(item, f"{path}[{shown(key, 40)}]", depth + 1)
        return
    raise BadControl(
        f"body{path} is a {type(value).__name__}; only dict, list, str, int, float, bool and "
        "None are allowed"
    )


def _check_utf8(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise BadControl(f"{where} is not encodable as UTF-8: {error.reason}") from None


@dataclass(frozen=True)
class Control:
    """A role-defined command: a short ASCII `kind` and a JSON object `body`.

    The wire checks form only (names, JSON types, sizes); what a kind means is the roles' business.
    """

    kind: str
    body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not _KIND.match(self.kind):
            raise BadControl(
                f"kind {shown(self.kind)} is not 1..{MAX_KIND_BYTES} characters of [A-Za-z0-9_.:-]"
            )
        if not isinstance(self.body, dict):
            raise BadControl(f"body must be a dict, got {type(self.body).__name__}")
        if not _json_ok(self.body, 0):
            _check_json(self.body, "", 0)  # finds and names what is wrong


Message = KVChunk | TokenIds | Control
