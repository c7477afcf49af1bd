"""Builders of small trace files for the workload tests (hand-made, so every expected value
follows from the construction), and the paths of the real trace files and excerpts."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from pddemu.workload.public_traces import MOONCAKE_FILE, WEKA_FILE, public_traces_dir

DATA = Path(__file__).parent / "data"
SHARED_TRACES = public_traces_dir()
WEKA_FULL = SHARED_TRACES / WEKA_FILE
MOONCAKE_FULL = SHARED_TRACES / MOONCAKE_FILE


def mooncake_line(timestamp: int, input_length: int, output_length: int, ids: list[int]) -> dict:
    return {
        "timestamp": timestamp,
        "input_length": input_length,
        "output_length": output_length,
        "hash_ids": ids,
    }


def weka_request(t: float, model: str, n_in: int, out: int, ids: list[int]) -> dict[str, Any]:
    return {"t": t, "type": "n", "model": model, "in": n_in, "out": out, "hash_ids": ids}


def weka_subagent(t: float, agent_id: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    return {"t": t, "type": "subagent", "agent_id": agent_id, "requests": requests}


def weka_conversation(conversation_id: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": conversation_id,
        "models": sorted({r["model"] for r in requests if "model" in r}),
        "block_size": 64,
        "hash_id_scope": "local",
        "tool_tokens": 100,
        "system_tokens": 50,
        "requests": requests,
    }


def write_jsonl(path: Path, records: list[Any], compress: bool = False) -> Path:
    text = "".join(json.dumps(record) + "\n" for record in records).encode()
    path.write_bytes(gzip.compress(text) if compress else text)
    return path
