"""The files a run writes besides the report: requests.csv and summary.json.

requests.csv has one row per request (all systems in one file, told apart by `system`): every
field of `RequestRecord` in declaration order, then the derived `ttft_s`, `tpot_s`, `e2el_s`.
Floats are written with `repr`, so they read back bit for bit; `token_times_s` is one field of
`;`-joined times; an absent value (None) is an empty field; booleans are `True` / `False`.
A file written before a field existed (`ADDED_COLUMNS`) lacks its column, which reads as the
field's default: `pddemu export` and `pddemu plot` still read older run directories. A run's
files may be kept gzipped (`requests.csv.gz`, as the reference runs are committed): they are
read unpacked on the fly (`open_run_file`).
"""

from __future__ import annotations

import csv
import gzip
import json
import types
import typing
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, TextIO

from pddemu.metrics.errors import MetricsError
from pddemu.metrics.records import RequestRecord

SUMMARY_FILE = "summary.json"
REQUESTS_FILE = "requests.csv"
RECORD_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
DERIVED_COLUMNS: tuple[str, ...] = ("ttft_s", "tpot_s", "e2el_s")
REQUESTS_COLUMNS: tuple[str, ...] = RECORD_COLUMNS + DERIVED_COLUMNS
TOKEN_TIME_SEPARATOR = ";"
# Record fields added after requests.csv was first written, with the commit that added each:
# an older file lacks them, and they read as the field's default (not recorded: None; a count
# or reason the code of then did not keep: 0, "").
ADDED_COLUMNS: dict[str, str] = {
    "handoff_switch": "7f5c01f",
    "handoff_gap_s": "7f5c01f",
    "handoff_started_s": "7f5c01f",
    "handoff_resumed_s": "7f5c01f",
    "predicted_output_tokens": "141895b",
    "retries": "6582fbf",
    "failovers": "6582fbf",
    "failover_path": "6582fbf",
    "routed_s": "585e1b5",
    "kv_arrived_s": "585e1b5",
    "dropped_stale_tokens": "a90286c",
    "kv_first_chunk_s": "6561da1",
    "unmatched": "93d6258",
}


def write_requests_csv(path: Path | str, records: Iterable[RequestRecord]) -> Path:
    path = Path(path)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(REQUESTS_COLUMNS)
        for record in records:
            row = [getattr(record, name) for name in REQUESTS_COLUMNS]
            writer.writerow([_cell(value) for value in row])
    return path


GZIP_SUFFIX = ".gz"
# What reading a damaged gzip file raises: a bad header or CRC, a stream cut short (EOFError),
# or deflate data that does not decode (zlib.error)
GZIP_DAMAGE = (gzip.BadGzipFile, EOFError, zlib.error)


def open_run_file(path: Path) -> TextIO:
    """One of a run's text files for reading; one whose name ends in .gz is unpacked as it is
    read (a run's large files are committed gzipped)."""
    if path.name.endswith(GZIP_SUFFIX):
        return typing.cast(TextIO, gzip.open(path, "rt", newline=""))
    return path.open(newline="")


def read_requests_csv(path: Path | str) -> list[RequestRecord]:
    """The records of a requests.csv (or requests.csv.gz), as written (derived columns are
    recomputed, not read); a column of `ADDED_COLUMNS` the file lacks takes the field's
    default."""
    path = Path(path)
    try:
        return _read_records(path)
    except GZIP_DAMAGE as error:
        raise MetricsError(f"{path}: not a whole gzip file ({error})") from None
    except UnicodeDecodeError as error:
        raise MetricsError(f"{path}: not UTF-8 text ({error})") from None


def _read_records(path: Path) -> list[RequestRecord]:
    hints = typing.get_type_hints(RequestRecord)
    with open_run_file(path) as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or ()
        missing = [c for c in RECORD_COLUMNS if c not in header and c not in ADDED_COLUMNS]
        if missing:
            raise MetricsError(f"{path}: header lacks column(s) {', '.join(missing)}")
        present = [c for c in RECORD_COLUMNS if c in header]
        records = []
        for line, row in enumerate(reader, start=2):
            values = {}
            for name in present:
                try:
                    values[name] = _parse(row[name], hints[name])
                except ValueError as error:
                    raise MetricsError(f"{path}:{line}: column {name}: {error}") from None
            records.append(RequestRecord(**values))
    return records


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return TOKEN_TIME_SEPARATOR.join(repr(float(t)) for t in value)
    return str(value)


def _parse(text: str, hint: Any) -> Any:
    """The value of one cell, by the field's type: X | None, str, int, float, bool, list[float]."""
    if isinstance(hint, types.UnionType):
        if not text:
            return None
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if hint is str:
        return text
    if hint is bool:
        if text not in ("True", "False"):
            raise ValueError(f"expected True or False, got {text!r}")
        return text == "True"
    if hint is int:
        return int(text)
    if hint is float:
        return float(text)
    if typing.get_origin(hint) is list:
        return [float(t) for t in text.split(TOKEN_TIME_SEPARATOR)] if text else []
    raise ValueError(f"no reader for type {hint!r}")


def write_summary_json(
    path: Path | str, summaries: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any]
) -> Path:
    """{"systems": {name: summary, ...}, **meta}; strict JSON (a NaN or infinity is an error)."""
    path = Path(path)
    if "systems" in meta:
        raise MetricsError("meta must not have a 'systems' key: it would hide the summaries")
    for name, summary in summaries.items():
        if summary.get("system") != name:
            raise MetricsError(f"summary under {name!r} is for system {summary.get('system')!r}")
    document = {"systems": dict(summaries), **meta}
    try:
        text = json.dumps(document, indent=2, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise MetricsError(f"summary is not strict JSON: {error}") from None
    path.write_text(text + "\n")
    return path
