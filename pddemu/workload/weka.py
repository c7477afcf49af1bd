"""Reader of the WEKA agentic trace format (kv-cache-tester v8): one conversation a line.

A conversation has `id`, `block_size` (64), `hash_id_scope` ("local": ids are numbered per
conversation) and `requests`. A request has `t` (s since the conversation started), `type`
("n" or "s"), `model`, `in`, `out` and `hash_ids` (chained hashes of the full blocks,
`len == floor(in / block_size)`). An entry of type "subagent" nests its own `requests`, whose `t`
is relative to the entry's `t`.

Cache keys are (conversation, model, hash id). Each (conversation, model) pair gets a scope
number in order of first appearance and a key is `scope << 32 | hash id`: globally unique,
computed with one vectorised operation per request, and still increasing within a request.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pddemu.workload.fields import (
    parse_json_object,
    require_block_ids,
    require_count,
    require_list,
    require_object,
    require_str,
    require_time,
)
from pddemu.workload.lines import iter_lines
from pddemu.workload.records import TraceError, TraceRequest

_SCOPE_SHIFT = 32
_REQUEST_TYPES = frozenset({"n", "s"})
_SUBAGENT = "subagent"


@dataclass
class _FileCounters:
    """Numbering that runs through the whole file: request index and cache-key scopes."""

    next_index: int = 0
    next_scope: int = 0


@dataclass
class _Conversation:
    """What the requests of one conversation line share while it is being walked."""

    counters: _FileCounters
    line_no: int
    session: str
    block_tokens: int
    scopes: dict[str, int] = field(default_factory=dict)

    def scope(self, model: str) -> int:
        scope = self.scopes.get(model)
        if scope is None:
            scope = self.scopes[model] = self.counters.next_scope
            self.counters.next_scope += 1
        return scope


def read_weka(path: Path) -> Iterator[TraceRequest]:
    counters = _FileCounters()
    for line_no, raw in iter_lines(path):
        if not raw.strip():
            continue
        where = f"{path}:{line_no}"
        record = parse_json_object(raw, where)
        session = require_str(record, "id", where)
        where = f"{where}: conversation {session!r}"
        block_tokens = require_count(record, "block_size", where, minimum=1)
        scope_kind = require_str(record, "hash_id_scope", where)
        if scope_kind != "local":
            raise TraceError(f"{where}: unsupported hash_id_scope {scope_kind!r} (only 'local')")
        entries = require_list(record, "requests", where)
        conversation = _Conversation(counters, line_no, session, block_tokens)
        yield from _walk(conversation, entries, 0.0, None, where)
    if counters.next_index == 0:
        raise TraceError(f"{path}: empty file (no requests)")


def _walk(
    conversation: _Conversation,
    entries: list[Any],
    start_s: float,
    agent: str | None,
    where: str,
) -> Iterator[TraceRequest]:
    """Requests in file order, a subagent's requests at the position of its entry."""
    for position, entry in enumerate(entries):
        here = f"{where} requests[{position}]" if agent is None else f"{where}.requests[{position}]"
        entry = require_object(entry, here)
        kind = require_str(entry, "type", here)
        t_s = start_s + require_time(entry, "t", here)
        if kind == _SUBAGENT:
            nested = require_list(entry, "requests", here)
            name = entry.get("agent_id")
            name = name if isinstance(name, str) else f"requests[{position}]"
            sub_agent = name if agent is None else f"{agent}/{name}"
            yield from _walk(conversation, nested, t_s, sub_agent, here)
            continue
        if kind not in _REQUEST_TYPES:
            raise TraceError(
                f"{here}: unknown entry type {kind!r} (expected 'n', 's' or 'subagent')"
            )
        yield _request(conversation, entry, t_s, agent, here)


def _request(
    conversation: _Conversation,
    entry: dict[str, Any],
    t_s: float,
    agent: str | None,
    where: str,
) -> TraceRequest:
    model = require_str(entry, "model", where)
    input_tokens = require_count(entry, "in", where, minimum=1)
    output_tokens = require_count(entry, "out", where)
    local_ids = require_block_ids(entry, "hash_ids", where)
    expected = input_tokens // conversation.block_tokens
    if local_ids.shape[0] != expected:
        raise TraceError(
            f"{where}: 'hash_ids' has {local_ids.shape[0]} ids but in={input_tokens} needs "
            f"floor({input_tokens}/{conversation.block_tokens}) = {expected}"
        )
    if local_ids.size and (local_ids[0] < 0 or local_ids[-1] >= 1 << _SCOPE_SHIFT):
        raise TraceError(f"{where}: 'hash_ids' outside [0, 2^{_SCOPE_SHIFT})")
    block_ids = local_ids | (conversation.scope(model) << _SCOPE_SHIFT)
    block_ids.flags.writeable = False
    index = conversation.counters.next_index
    conversation.counters.next_index += 1
    return TraceRequest(
        index=index,
        arrival_s=None,
        session=conversation.session,
        t_in_session_s=t_s,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        block_ids=block_ids,
        block_tokens=conversation.block_tokens,
        source_line=conversation.line_no,
        model=model,
        agent=agent,
    )
