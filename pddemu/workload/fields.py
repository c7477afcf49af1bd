"""Checked access to the fields of one parsed trace record, with messages that say where.

`where` is the location prefix of every message, e.g. "trace.jsonl:12" or
"trace.jsonl.gz:3: conversation 'trace_0003' requests[7]".
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from pddemu.workload.records import TraceError


def parse_json_object(raw: bytes, where: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"{where}: not valid JSON ({exc})") from exc
    return require_object(value, where)


def require_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def require_field(record: dict[str, Any], name: str, where: str) -> Any:
    if name not in record:
        raise TraceError(f"{where}: missing field {name!r}")
    return record[name]


def require_str(record: dict[str, Any], name: str, where: str) -> str:
    value = require_field(record, name, where)
    if not isinstance(value, str):
        raise TraceError(f"{where}: field {name!r} must be a string, got {value!r:.60}")
    return value


def optional_str(record: dict[str, Any], name: str, where: str) -> str | None:
    """A string field that may be absent (then `None`)."""
    if name not in record:
        return None
    return require_str(record, name, where)


def require_list(record: dict[str, Any], name: str, where: str) -> list[Any]:
    value = require_field(record, name, where)
    if not isinstance(value, list):
        raise TraceError(f"{where}: field {name!r} must be a list, got {type(value).__name__}")
    return value


def require_count(record: dict[str, Any], name: str, where: str, minimum: int = 0) -> int:
    """A token count or size: an integer (not a bool) of at least `minimum`."""
    value = require_field(record, name, where)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TraceError(f"{where}: field {name!r} must be an integer, got {value!r:.60}")
    if value < 0:
        raise TraceError(f"{where}: field {name!r} is negative ({value})")
    if value < minimum:
        raise TraceError(f"{where}: field {name!r} must be at least {minimum}, got {value}")
    return value


def require_time(record: dict[str, Any], name: str, where: str) -> float:
    """A non-negative, finite time in the file's unit."""
    value = require_field(record, name, where)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TraceError(f"{where}: field {name!r} must be a number, got {value!r:.60}")
    if not np.isfinite(value):
        raise TraceError(f"{where}: field {name!r} is not finite ({value})")
    if value < 0:
        raise TraceError(f"{where}: field {name!r} is negative ({value})")
    return float(value)


def require_block_ids(record: dict[str, Any], name: str, where: str) -> np.ndarray:
    """The chained block ids as a read-only int64 array, checked to be strictly increasing.

    Ids numbered by first appearance grow along every chain (a block's id is created after its
    predecessor's), so a decrease means the file is not the chained format it claims to be.
    """
    value = require_list(record, name, where)
    if not value:
        return np.empty(0, dtype=np.int64)
    try:
        ids = np.array(value)
    except (ValueError, OverflowError) as exc:
        raise TraceError(f"{where}: field {name!r} must be a list of integers ({exc})") from exc
    if ids.ndim != 1 or ids.dtype.kind != "i":
        raise TraceError(f"{where}: field {name!r} must be a list of integers")
    ids = ids.astype(np.int64, copy=False)
    steps = np.diff(ids)
    if steps.size and steps.min() <= 0:
        at = int(np.flatnonzero(steps <= 0)[0])
        raise TraceError(
            f"{where}: field {name!r} is not strictly increasing "
            f"(position {at + 1}: {ids[at + 1]} after {ids[at]})"
        )
    ids.flags.writeable = False
    return ids


def require_id_list(record: dict[str, Any], name: str, where: str) -> np.ndarray:
    """Non-negative integer block ids in any order (per-block hashes, which may repeat), as a
    read-only int64 array."""
    value = require_list(record, name, where)
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise TraceError(f"{where}: field {name!r} must be a list of non-negative integers")
    try:
        ids = np.array(value, dtype=np.int64)
    except OverflowError:
        raise TraceError(f"{where}: field {name!r} holds an id beyond 64 bits") from None
    ids.flags.writeable = False
    return ids
