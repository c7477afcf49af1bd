"""Reader of BurstGPT traces (HPMLL/BurstGPT: GPT-3.5 and GPT-4 requests served on Azure).

CSV with the header `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`:
`Timestamp` is the submission time in seconds from 0:00:00 of the trace's first day,
`Request tokens` / `Response tokens` the request's and response's lengths (a failed request has
0 response tokens, kept as recorded), `Model` `ChatGPT` or `GPT-4`, `Log Type`
`Conversation log` or `API log`. No block ids: lengths and arrivals, no prefix structure.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from pddemu.workload.length_csv import decoded_lines, token_count
from pddemu.workload.records import TraceError, TraceRequest

TIMESTAMP = "Timestamp"
MODEL = "Model"
REQUEST_TOKENS = "Request tokens"
RESPONSE_TOKENS = "Response tokens"
COLUMNS = (TIMESTAMP, MODEL, REQUEST_TOKENS, RESPONSE_TOKENS)


def _seconds(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(
            f"{where}: {TIMESTAMP} must be a number of seconds, got {text!r:.60}"
        ) from None
    if not 0 <= value < float("inf"):
        raise TraceError(f"{where}: {TIMESTAMP} must be finite and non-negative ({text})")
    return value


def read_burstgpt(path: Path) -> Iterator[TraceRequest]:
    rows = csv.reader(decoded_lines(path))
    header: dict[str, int] | None = None
    index = 0
    for row in rows:
        where = f"{path}:{rows.line_num}"
        if not row or not "".join(row).strip():
            continue
        if header is None:
            header = {name.strip(): i for i, name in enumerate(row)}
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise TraceError(f"{where}: header lacks column(s) {', '.join(missing)}")
            continue
        if len(row) != len(header):
            raise TraceError(f"{where}: expected {len(header)} fields, got {len(row)}")
        yield TraceRequest(
            index=index,
            arrival_s=_seconds(row[header[TIMESTAMP]].strip(), where),
            session=None,
            t_in_session_s=None,
            input_tokens=token_count(row[header[REQUEST_TOKENS]], REQUEST_TOKENS, where, 1),
            output_tokens=token_count(row[header[RESPONSE_TOKENS]], RESPONSE_TOKENS, where, 0),
            block_ids=None,
            block_tokens=None,
            source_line=rows.line_num,
            model=row[header[MODEL]].strip() or None,
        )
        index += 1
    if index == 0:
        raise TraceError(f"{path}: empty file (no requests)")
