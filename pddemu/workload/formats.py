"""Trace formats by name, detection from a file's content, and the one entry point to read any.

docs/traces.md lists every format with its source.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

from pddemu.workload.bailian import read_bailian
from pddemu.workload.burstgpt import REQUEST_TOKENS, RESPONSE_TOKENS, read_burstgpt
from pddemu.workload.length_csv import CONTEXT_TOKENS, GENERATED_TOKENS, read_length_csv
from pddemu.workload.lines import first_content_line
from pddemu.workload.mooncake import UNREAD_PROMPTS, read_mooncake
from pddemu.workload.records import TraceError, TraceRequest
from pddemu.workload.sharegpt import read_sharegpt
from pddemu.workload.weka import read_weka

Reader = Callable[[Path], Iterator[TraceRequest]]

FORMATS: dict[str, Reader] = {
    "mooncake": read_mooncake,
    "weka": read_weka,
    "csv": read_length_csv,
    "burstgpt": read_burstgpt,
    "bailian": read_bailian,
    "sharegpt": read_sharegpt,
}
# AIPerf's four prompt kinds; the last two are refused by the reader, which says why.
MOONCAKE_PROMPTS = ("input_length", "text_input", *UNREAD_PROMPTS)


def _json_format(record: object) -> str | None:
    if not isinstance(record, dict):
        return None
    if "requests" in record:
        return "weka"
    if "chat_id" in record and "parent_chat_id" in record:
        return "bailian"
    if any(key in record for key in MOONCAKE_PROMPTS):
        return "mooncake"
    return None


def detect_format(path: Path | str) -> str:
    """Name of the format of `path`, judged from its first non-blank line.

    JSON lines: an object with `requests` is a WEKA conversation, one with `chat_id` and
    `parent_chat_id` a Bailian request, one with `input_length`, `text_input`, `messages` or
    `payload` (AIPerf's prompt kinds) a Mooncake request; a file opening a JSON array is ShareGPT; a CSV header with `Request tokens` and
    `Response tokens` is BurstGPT, one with the token columns of a length CSV a length CSV.
    """
    path = Path(path)
    first = first_content_line(path)
    if first is None:
        raise TraceError(f"{path}: empty file")
    line_no, raw = first
    where = f"{path}:{line_no}"
    text = raw.strip()
    if text.startswith(b"["):
        return "sharegpt"
    if text.startswith(b"{"):
        try:
            record = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TraceError(f"{where}: unknown format (line is not valid JSON: {exc})") from exc
        found = _json_format(record)
        if found is None:
            raise TraceError(
                f"{where}: unknown format (a JSON object with none of 'requests' (WEKA), "
                "'chat_id' and 'parent_chat_id' (Bailian), 'input_length', 'text_input', "
                "'messages' or 'payload' (Mooncake, AIPerf))"
            )
        return found
    header = text.decode("utf-8", errors="replace")
    if REQUEST_TOKENS in header and RESPONSE_TOKENS in header:
        return "burstgpt"
    if CONTEXT_TOKENS in header and GENERATED_TOKENS in header:
        return "csv"
    raise TraceError(
        f"{where}: unknown format (not JSON lines, a JSON array or a CSV header with "
        f"{REQUEST_TOKENS!r}/{RESPONSE_TOKENS!r} (BurstGPT) or {CONTEXT_TOKENS}/"
        f"{GENERATED_TOKENS}): {header[:60]!r}"
    )


def read_trace(
    path: Path | str, format: str | None = None, block_size: int | None = None
) -> Iterator[TraceRequest]:
    """Stream the requests of `path` in file order; `format` overrides detection;
    `block_size` is the tokens per hash id of a Mooncake file whose lines do not say."""
    path = Path(path)
    if format is None:
        format = detect_format(path)
    reader = FORMATS.get(format)
    if reader is None:
        raise TraceError(f"unknown trace format {format!r}; known: {', '.join(FORMATS)}")
    if block_size is not None:
        if format != "mooncake":
            raise TraceError(f"{path}: a block size applies to Mooncake traces, not {format}")
        return read_mooncake(path, block_size)
    return reader(path)
