"""Trace formats by name, detection from a file's content, and the one entry point to read any."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

from pddemu.workload.length_csv import CONTEXT_TOKENS, GENERATED_TOKENS, read_length_csv
from pddemu.workload.lines import first_content_line
from pddemu.workload.mooncake import read_mooncake
from pddemu.workload.records import TraceError, TraceRequest
from pddemu.workload.weka import read_weka

Reader = Callable[[Path], Iterator[TraceRequest]]

FORMATS: dict[str, Reader] = {
    "mooncake": read_mooncake,
    "weka": read_weka,
    "csv": read_length_csv,
}


def detect_format(path: Path | str) -> str:
    """Name of the format of `path`, judged from its first non-blank line.

    A JSON object with `requests` is a WEKA conversation, one with `hash_ids` and
    `input_length` a Mooncake request; a header naming the token columns is a length CSV.
    """
    path = Path(path)
    first = first_content_line(path)
    if first is None:
        raise TraceError(f"{path}: empty file")
    line_no, raw = first
    where = f"{path}:{line_no}"
    text = raw.strip()
    if text.startswith(b"{"):
        try:
            record = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TraceError(f"{where}: unknown format (line is not valid JSON: {exc})") from exc
        if isinstance(record, dict):
            if "requests" in record:
                return "weka"
            if "hash_ids" in record and "input_length" in record:
                return "mooncake"
        raise TraceError(
            f"{where}: unknown format (a JSON object with neither 'requests' (WEKA) nor "
            "'input_length' and 'hash_ids' (Mooncake))"
        )
    header = text.decode("utf-8", errors="replace")
    if CONTEXT_TOKENS in header and GENERATED_TOKENS in header:
        return "csv"
    raise TraceError(
        f"{where}: unknown format (neither JSON lines nor a CSV header with "
        f"{CONTEXT_TOKENS} and {GENERATED_TOKENS}): {header[:60]!r}"
    )


def read_trace(path: Path | str, format: str | None = None) -> Iterator[TraceRequest]:
    """Stream the requests of `path` in file order; `format` overrides detection."""
    path = Path(path)
    if format is None:
        format = detect_format(path)
    reader = FORMATS.get(format)
    if reader is None:
        raise TraceError(f"unknown trace format {format!r}; known: {', '.join(FORMATS)}")
    return reader(path)
