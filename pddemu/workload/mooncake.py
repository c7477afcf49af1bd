"""Reader of the Mooncake JSONL trace format (also read by SGLang, Dynamo and AIPerf), with the
variants AIPerf's `mooncake_trace` dataset reads.

One JSON object a line: `timestamp` (ms since the trace start), `input_length`,
`output_length` (tokens) and `hash_ids`, the ids of the prompt's 512-token blocks, chained like
a prefix hash and numbered globally, so they are used as cache keys unchanged.
`len(hash_ids) == ceil(input_length / block size)`: the last block may be partial.

AIPerf's variants (aiperf/dataset/loader/models.py, `MooncakeTrace`):
- `session_id` names a multi-turn session; `delay` (ms) is a turn's wait after the session's
  previous turn, in place of `timestamp`. AIPerf counts it from the previous turn's response
  (its fixed-schedule replay sends a turn `delay` after the previous one returned); an
  open-loop replay cannot wait for a response, so here it counts from the previous turn's
  arrival, and a turn comes earlier than under AIPerf by its predecessor's latency. A turn
  with a delay and no timestamp arrives that long after its session's previous turn when that
  one has a time; in a file with no timestamps at
  all, turns keep their time within their session (sessions start at replay, as WEKA's do),
  and a line with no timestamp, no delay and no session has no time at all (a file of only
  such lines, AIPerf's plainest, is replayed at an arrival rate, as ShareGPT is);
- `text_input`, a literal prompt, in place of `input_length`: its length is the model's byte
  tokens, and its block ids, when `hash_ids` is absent, are a chained hash of its 64-token
  blocks (`content_blocks`);
- `hash_ids` may be absent (a length-only request); `messages` and `payload` prompts are not
  read (they carry no length to replay).
`output_length` is required: a replay needs to know how many tokens each request generates.

Optional extras, written by `pddemu trace gen` and ignored by tools that do not know them:
`block_size` (tokens per block when not 512; `--block-size` sets it for a whole file),
`session` (the older name of `session_id`) and `day` (an ISO date).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pddemu.workload.content_blocks import ContentBlocks, byte_token_count
from pddemu.workload.fields import (
    optional_str,
    parse_json_object,
    require_block_ids,
    require_count,
    require_str,
    require_time,
)
from pddemu.workload.lines import iter_lines
from pddemu.workload.records import TraceError, TraceRequest

MOONCAKE_BLOCK_TOKENS = 512
UNREAD_PROMPTS = ("messages", "payload")


def _block_tokens(record: dict[str, Any], where: str, default: int) -> int:
    if "block_size" not in record:
        return default
    return require_count(record, "block_size", where, minimum=1)


class _Sessions:
    """Arrival times of turns given by `delay`: after their session's previous turn."""

    def __init__(self) -> None:
        self.last_arrival: dict[str, float] = {}
        self.elapsed: dict[str, float] = {}
        self.timed: bool | None = None  # whether the file gives times (it must not mix)

    def place(
        self, session: str | None, timestamp_ms: float | None, delay_ms: float | None, where: str
    ) -> tuple[float | None, float | None]:
        """(arrival s or None, time within the session s or None) of one turn; (None, None)
        for a line that gives neither a time nor a session: it has no time of any kind."""
        key = session if session is not None else where
        if timestamp_ms is None and delay_ms is None and session is None:
            arrival = None
        elif timestamp_ms is not None:
            arrival = timestamp_ms / 1000.0
        elif key in self.last_arrival:
            arrival = self.last_arrival[key] + (delay_ms or 0.0) / 1000.0
        else:
            arrival = None
        timed = arrival is not None
        if self.timed is None:
            self.timed = timed
        elif self.timed != timed:
            raise TraceError(
                f"{where}: no 'timestamp', and no earlier timed turn of its session to count "
                "its 'delay' from (a file gives every request a time, or none)"
            )
        if arrival is not None:
            self.last_arrival[key] = arrival
            return arrival, None
        if session is None and delay_ms is None:
            return None, None
        self.elapsed[key] = self.elapsed.get(key, 0.0) + (delay_ms or 0.0) / 1000.0
        return None, self.elapsed[key]


def read_mooncake(path: Path, block_size: int | None = None) -> Iterator[TraceRequest]:
    """The requests of a Mooncake file; `block_size` is the tokens per hash id of lines that do
    not say (default 512)."""
    default_block = block_size if block_size is not None else MOONCAKE_BLOCK_TOKENS
    sessions = _Sessions()
    content = ContentBlocks()
    index = 0
    for line_no, raw in iter_lines(path):
        if not raw.strip():
            continue
        where = f"{path}:{line_no}"
        record = parse_json_object(raw, where)
        unread = [name for name in UNREAD_PROMPTS if name in record]
        if unread:
            raise TraceError(
                f"{where}: a '{unread[0]}' prompt is not read (give input_length or text_input)"
            )
        session = optional_str(record, "session_id", where) or optional_str(
            record, "session", where
        )
        timestamp = require_time(record, "timestamp", where) if "timestamp" in record else None
        delay = require_time(record, "delay", where) if "delay" in record else None
        arrival, t_in_session = sessions.place(session, timestamp, delay, where)
        if "output_length" not in record:
            raise TraceError(f"{where}: missing field 'output_length' (a replay needs it)")
        output_tokens = require_count(record, "output_length", where)
        if "text_input" in record:
            text = require_str(record, "text_input", where)
            input_tokens = byte_token_count(text)
            block_tokens = content.block_tokens
            block_ids = content.ids(text)
        else:
            input_tokens = require_count(record, "input_length", where, minimum=1)
            block_tokens = _block_tokens(record, where, default_block)
            block_ids = None
        if "hash_ids" in record:
            block_tokens = _block_tokens(record, where, default_block)
            block_ids = require_block_ids(record, "hash_ids", where)
            expected = -(-input_tokens // block_tokens)
            if block_ids.shape[0] != expected:
                raise TraceError(
                    f"{where}: 'hash_ids' has {block_ids.shape[0]} ids but input_length "
                    f"{input_tokens} needs ceil({input_tokens}/{block_tokens}) = {expected}"
                    " (another block size? --block-size)"
                )
        yield TraceRequest(
            index=index,
            arrival_s=arrival,
            session=session,
            t_in_session_s=t_in_session,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            block_ids=block_ids,
            block_tokens=block_tokens if block_ids is not None else None,
            source_line=line_no,
            day=optional_str(record, "day", where),
        )
        index += 1
    if index == 0:
        raise TraceError(f"{path}: empty file (no requests)")
