"""Reader of ShareGPT conversation dumps (e.g. `ShareGPT_V3_unfiltered_cleaned_split.json`, the
file vLLM's and SGLang's benchmarks sample from).

One JSON array of conversations `{"id": ..., "conversations": [{"from": "human" | "gpt" |
..., "value": text}, ...]}`. As vLLM's benchmark does (vllm/benchmarks/datasets/sharegpt.py),
each conversation with at least two turns is one request: its first turn is the prompt, its
second the response, counted in the model's byte tokens (BOS and one token per UTF-8 byte for
the prompt, one per byte for the response); conversations with fewer turns are skipped. The
file has no times (replay it with an arrival rate) and no ids: block ids are a chained hash of
the prompt's 64-token blocks (`content_blocks`), so identical prompt openings share a prefix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from pddemu.workload.content_blocks import ContentBlocks, byte_token_count
from pddemu.workload.fields import require_list, require_object, require_str
from pddemu.workload.lines import read_all
from pddemu.workload.records import TraceError, TraceRequest


def read_sharegpt(path: Path) -> Iterator[TraceRequest]:
    try:
        document = json.loads(read_all(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not a JSON document ({exc})") from None
    if not isinstance(document, list):
        raise TraceError(f"{path}: expected a JSON array of conversations")
    blocks = ContentBlocks()
    index = 0
    for position, entry in enumerate(document):
        where = f"{path}: conversation [{position}]"
        entry = require_object(entry, where)
        turns = require_list(entry, "conversations", where)
        if len(turns) < 2:
            continue
        prompt = require_str(require_object(turns[0], f"{where} turn 0"), "value", where)
        response = require_str(require_object(turns[1], f"{where} turn 1"), "value", where)
        session = entry.get("id")
        yield TraceRequest(
            index=index,
            arrival_s=None,
            session=session if isinstance(session, str) else None,
            t_in_session_s=None,
            input_tokens=byte_token_count(prompt),
            output_tokens=len(response.encode("utf-8")),
            block_ids=blocks.ids(prompt),
            block_tokens=blocks.block_tokens,
            source_line=position + 1,
        )
        index += 1
    if index == 0:
        raise TraceError(f"{path}: no conversation with two turns")
