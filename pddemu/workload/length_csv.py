"""Reader of length-only CSV traces (Azure LLM inference trace style).

Header `TIMESTAMP,ContextTokens,GeneratedTokens` (column order free, extra columns ignored);
timestamps either numbers (seconds, kept as given) or ISO datetimes (arrival = seconds since the
first row). No block ids: such a trace has lengths and arrivals but no prefix structure.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from pddemu.workload.lines import iter_lines
from pddemu.workload.records import TraceError, TraceRequest

TIMESTAMP = "TIMESTAMP"
CONTEXT_TOKENS = "ContextTokens"
GENERATED_TOKENS = "GeneratedTokens"


def decoded_lines(path: Path) -> Iterator[str]:
    for line_no, raw in iter_lines(path):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(f"{path}:{line_no}: not UTF-8 text ({exc})") from exc


def token_count(text: str, column: str, where: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TraceError(f"{where}: {column} must be an integer, got {text!r:.60}") from None
    if value < 0:
        raise TraceError(f"{where}: {column} is negative ({value})")
    if value < minimum:
        raise TraceError(f"{where}: {column} must be at least {minimum}, got {value}")
    return value


class _Clock:
    """Turns the TIMESTAMP column into seconds; the first row decides numbers or datetimes."""

    def __init__(self) -> None:
        self.origin: datetime | None = None
        self.numeric: bool | None = None

    def seconds(self, text: str, where: str) -> float:
        if self.numeric is None:
            self.numeric = _is_number(text)
        if self.numeric:
            try:
                value = float(text)
            except ValueError:
                raise TraceError(
                    f"{where}: {TIMESTAMP} {text!r:.60} is not a number like the first row's"
                ) from None
            if not value >= 0 or value == float("inf"):
                raise TraceError(f"{where}: {TIMESTAMP} must be finite and non-negative ({text})")
            return value
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise TraceError(
                f"{where}: {TIMESTAMP} {text!r:.60} is not an ISO datetime like the first row's"
            ) from None
        if self.origin is None:
            self.origin = moment
        try:
            return (moment - self.origin).total_seconds()
        except TypeError:
            raise TraceError(f"{where}: {TIMESTAMP} mixes zoned and naive datetimes") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_length_csv(path: Path) -> Iterator[TraceRequest]:
    rows = csv.reader(decoded_lines(path))
    header: dict[str, int] | None = None
    clock = _Clock()
    index = 0
    for row in rows:
        line_no = rows.line_num
        where = f"{path}:{line_no}"
        if not row or not "".join(row).strip():
            continue
        if header is None:
            header = {name.strip(): i for i, name in enumerate(row)}
            missing = [c for c in (TIMESTAMP, CONTEXT_TOKENS, GENERATED_TOKENS) if c not in header]
            if missing:
                raise TraceError(f"{where}: header lacks column(s) {', '.join(missing)}")
            continue
        if len(row) != len(header):
            raise TraceError(f"{where}: expected {len(header)} fields, got {len(row)}")
        yield TraceRequest(
            index=index,
            arrival_s=clock.seconds(row[header[TIMESTAMP]].strip(), where),
            session=None,
            t_in_session_s=None,
            input_tokens=token_count(row[header[CONTEXT_TOKENS]], CONTEXT_TOKENS, where, minimum=1),
            output_tokens=token_count(row[header[GENERATED_TOKENS]], GENERATED_TOKENS, where, 0),
            block_ids=None,
            block_tokens=None,
            source_line=line_no,
        )
        index += 1
    if index == 0:
        raise TraceError(f"{path}: empty file (no requests)")
