"""Reader of the Alibaba Bailian traces (alibaba-edu/qwen-bailian-usagetraces-anon, from
"KVCache Cache in the Wild", USENIX ATC '25): two hours of requests to one Qwen serving instance.

JSON lines: `chat_id`, `parent_chat_id` (-1 for a conversation's first request),
`timestamp` (seconds since the trace start), `input_length`, `output_length`, `type` (text,
search, image or file), `turn` and `hash_ids`: one id per 16-token block, a salted SipHash of
the block remapped to sequential integers. The ids are per-block hashes, not a prefix chain, so
they are taken in any order; they may cover fewer tokens than `input_length`, never more blocks
than it has. A request's session is the first request of its conversation, found by following
`parent_chat_id` through the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pddemu.workload.fields import (
    parse_json_object,
    require_count,
    require_field,
    require_id_list,
    require_time,
)
from pddemu.workload.lines import iter_lines
from pddemu.workload.records import TraceError, TraceRequest

BAILIAN_BLOCK_TOKENS = 16


def _chat_id(record: dict, name: str, where: str) -> int:
    value = require_field(record, name, where)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TraceError(f"{where}: field {name!r} must be an integer, got {value!r:.60}")
    return value


def read_bailian(path: Path) -> Iterator[TraceRequest]:
    roots: dict[int, int] = {}  # chat id -> the chat id its conversation started with
    index = 0
    for line_no, raw in iter_lines(path):
        if not raw.strip():
            continue
        where = f"{path}:{line_no}"
        record = parse_json_object(raw, where)
        chat = _chat_id(record, "chat_id", where)
        parent = _chat_id(record, "parent_chat_id", where)
        root = chat if parent == -1 else roots.get(parent, parent)
        roots[chat] = root
        input_tokens = require_count(record, "input_length", where, minimum=1)
        block_ids = require_id_list(record, "hash_ids", where)
        most = -(-input_tokens // BAILIAN_BLOCK_TOKENS)
        if block_ids.shape[0] > most:
            raise TraceError(
                f"{where}: 'hash_ids' has {block_ids.shape[0]} ids but input_length "
                f"{input_tokens} has only ceil({input_tokens}/{BAILIAN_BLOCK_TOKENS}) = {most} "
                "blocks"
            )
        yield TraceRequest(
            index=index,
            arrival_s=require_time(record, "timestamp", where),
            session=str(root),
            t_in_session_s=None,
            input_tokens=input_tokens,
            output_tokens=require_count(record, "output_length", where),
            block_ids=block_ids,
            block_tokens=BAILIAN_BLOCK_TOKENS,
            source_line=line_no,
        )
        index += 1
    if index == 0:
        raise TraceError(f"{path}: empty file (no requests)")
