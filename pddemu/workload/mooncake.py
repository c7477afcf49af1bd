"""Reader of the Mooncake JSONL trace format (also read by SGLang, Dynamo and AIPerf).

One JSON object a line: `timestamp` (ms since the trace start), `input_length`,
`output_length` (tokens) and `hash_ids`, the ids of the prompt's 512-token blocks, chained like
a prefix hash and numbered globally, so they are used as cache keys unchanged.
`len(hash_ids) == ceil(input_length / block size)`: the last block may be partial.

Optional extra fields, written by `pddemu trace gen` and ignored by tools that do not know them:
`block_size` (tokens per block when not 512), `session` and `day` (an ISO date).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pddemu.workload.fields import (
    optional_str,
    parse_json_object,
    require_block_ids,
    require_count,
    require_time,
)
from pddemu.workload.lines import iter_lines
from pddemu.workload.records import TraceError, TraceRequest

MOONCAKE_BLOCK_TOKENS = 512


def _block_tokens(record: dict[str, Any], where: str) -> int:
    if "block_size" not in record:
        return MOONCAKE_BLOCK_TOKENS
    return require_count(record, "block_size", where, minimum=1)


def read_mooncake(path: Path) -> Iterator[TraceRequest]:
    index = 0
    for line_no, raw in iter_lines(path):
        if not raw.strip():
            continue
        where = f"{path}:{line_no}"
        record = parse_json_object(raw, where)
        arrival_ms = require_time(record, "timestamp", where)
        input_tokens = require_count(record, "input_length", where, minimum=1)
        output_tokens = require_count(record, "output_length", where)
        block_ids = require_block_ids(record, "hash_ids", where)
        block_tokens = _block_tokens(record, where)
        expected = -(-input_tokens // block_tokens)
        if block_ids.shape[0] != expected:
            raise TraceError(
                f"{where}: 'hash_ids' has {block_ids.shape[0]} ids but input_length "
                f"{input_tokens} needs ceil({input_tokens}/{block_tokens}) = {expected}"
            )
        yield TraceRequest(
            index=index,
            arrival_s=arrival_ms / 1000.0,
            session=optional_str(record, "session", where),
            t_in_session_s=None,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            block_ids=block_ids,
            block_tokens=block_tokens,
            source_line=line_no,
            day=optional_str(record, "day", where),
        )
        index += 1
    if index == 0:
        raise TraceError(f"{path}: empty file (no requests)")
