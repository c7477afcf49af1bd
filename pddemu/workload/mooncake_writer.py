"""Writer of Mooncake JSONL traces, so generated workloads replay in other tools too.

Lines hold the Mooncake fields (`timestamp` in whole ms, `input_length`, `output_length`,
`hash_ids`) and, when known, `session_id` (AIPerf's name for a request's session) and the
extras the reader understands: `block_size` (only when not Mooncake's 512), `day`. A name ending in `.gz` gets gzip, written reproducibly (no
time stamp or file name in the header), so the same trace gives the same bytes.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from pddemu.workload.mooncake import MOONCAKE_BLOCK_TOKENS
from pddemu.workload.records import TraceError, TraceRequest


def mooncake_record(request: TraceRequest) -> dict[str, Any]:
    if request.arrival_s is None or request.block_ids is None or request.block_tokens is None:
        raise TraceError(
            f"request {request.index}: a Mooncake line needs an arrival time and block ids"
        )
    record: dict[str, Any] = {
        "timestamp": round(request.arrival_s * 1000),
        "input_length": request.input_tokens,
        "output_length": request.output_tokens,
        "hash_ids": request.block_ids.tolist(),
    }
    if request.block_tokens != MOONCAKE_BLOCK_TOKENS:
        record["block_size"] = request.block_tokens
    if request.session is not None:
        record["session_id"] = request.session
    if request.day is not None:
        record["day"] = request.day
    return record


def _write_lines(requests: Iterable[TraceRequest], stream: IO[bytes]) -> int:
    count = 0
    for request in requests:
        line = json.dumps(mooncake_record(request), separators=(",", ":")) + "\n"
        stream.write(line.encode())
        count += 1
    return count


def write_mooncake(requests: Iterable[TraceRequest], path: Path | str) -> int:
    """Write `requests` to `path`; returns how many lines were written."""
    path = Path(path)
    try:
        with path.open("wb") as raw:
            if path.suffix != ".gz":
                return _write_lines(requests, raw)
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as compressed:
                return _write_lines(requests, compressed)
    except OSError as exc:
        raise TraceError(f"{path}: cannot write ({exc.strerror or exc})") from exc
