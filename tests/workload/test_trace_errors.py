"""Every kind of bad input gets a TraceError naming the file, the line and the problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trace_samples import mooncake_line, weka_conversation, weka_request, weka_subagent, write_jsonl

from pddemu.workload import TraceError, read_trace
from pddemu.workload.stats import trace_stats

GOOD_MOONCAKE = mooncake_line(0, 1000, 5, [0, 1])


def _error(path: Path, format: str | None = None) -> str:
    with pytest.raises(TraceError) as caught:
        list(read_trace(path, format))
    return str(caught.value)


def _mooncake_error(tmp_path: Path, **changes: Any) -> str:
    bad = dict(GOOD_MOONCAKE, **changes)
    for name in [k for k, v in changes.items() if v is ...]:
        del bad[name]
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD_MOONCAKE, bad])
    message = _error(path)
    assert message.startswith(f"{path}:2: ")
    return message


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"input_length": ...}, "missing field 'input_length'"),
        ({"output_length": ...}, "missing field 'output_length' (a replay needs it)"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "a 'messages' prompt is not read"),
        ({"input_length": "1000"}, "field 'input_length' must be an integer"),
        ({"output_length": 2.5}, "field 'output_length' must be an integer"),
        ({"output_length": True}, "field 'output_length' must be an integer"),
        ({"timestamp": "soon"}, "field 'timestamp' must be a number"),
        ({"hash_ids": "0,1"}, "field 'hash_ids' must be a list"),
        ({"hash_ids": [0, "1"]}, "field 'hash_ids' must be a list of integers"),
        ({"hash_ids": [0, 1.0]}, "field 'hash_ids' must be a list of integers"),
        ({"input_length": -1000}, "field 'input_length' is negative (-1000)"),
        ({"output_length": -1}, "field 'output_length' is negative (-1)"),
        ({"timestamp": -5}, "field 'timestamp' is negative"),
        ({"input_length": 0, "hash_ids": []}, "field 'input_length' must be at least 1"),
        ({"input_length": 1025}, "has 2 ids but input_length 1025 needs ceil(1025/512) = 3"),
        ({"hash_ids": [0]}, "has 1 ids but input_length 1000 needs ceil(1000/512) = 2"),
        ({"hash_ids": [1, 0]}, "not strictly increasing (position 1: 0 after 1)"),
        ({"hash_ids": [4, 4]}, "not strictly increasing (position 1: 4 after 4)"),
    ],
)
def test_bad_mooncake_request(tmp_path: Path, changes: dict[str, Any], problem: str) -> None:
    assert problem in _mooncake_error(tmp_path, **changes)


def test_mooncake_line_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n{oops\n'
    )
    message = _error(path)
    assert message.startswith(f"{path}:2: not valid JSON")


def _weka(tmp_path: Path, inner: dict[str, Any], **conversation_changes: Any) -> Path:
    conversation = weka_conversation(
        "conv-9",
        [
            weka_request(0.0, "m", 128, 1, [1, 2]),
            weka_subagent(3.0, "agent_001", [weka_request(0.0, "m", 128, 1, [1, 2]), inner]),
        ],
    )
    conversation.update(conversation_changes)
    good = weka_conversation("conv-1", [weka_request(0.0, "m", 64, 1, [1])])
    return write_jsonl(tmp_path / "bad.jsonl", [good, conversation])


def _inner(**changes: Any) -> dict[str, Any]:
    request = dict(weka_request(1.0, "m", 192, 1, [1, 2, 3]), **changes)
    for name in [k for k, v in changes.items() if v is ...]:
        del request[name]
    return request


@pytest.mark.parametrize(
    ("inner", "problem"),
    [
        (_inner(**{"in": ...}), "missing field 'in'"),
        (_inner(model=...), "missing field 'model'"),
        (_inner(t=...), "missing field 't'"),
        (_inner(model=7), "field 'model' must be a string"),
        (_inner(out="1"), "field 'out' must be an integer"),
        (_inner(hash_ids={"a": 1}), "field 'hash_ids' must be a list"),
        (_inner(out=-3), "field 'out' is negative (-3)"),
        (_inner(**{"in": -192}), "field 'in' is negative (-192)"),
        (_inner(**{"in": 260}), "has 3 ids but in=260 needs floor(260/64) = 4"),
        (_inner(hash_ids=[1, 3, 2]), "not strictly increasing (position 2: 2 after 3)"),
        (_inner(hash_ids=[-2, -1, 0]), "'hash_ids' outside [0, 2^32)"),
        (_inner(type="x"), "unknown entry type 'x'"),
        ("not an object", "expected a JSON object, got str"),
    ],
)
def test_bad_weka_request_in_a_subagent(tmp_path: Path, inner: Any, problem: str) -> None:
    path = _weka(tmp_path, inner)
    message = _error(path)
    assert message.startswith(f"{path}:2: conversation 'conv-9' requests[1].requests[1]: ")
    assert problem in message


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"requests": None}, "field 'requests' must be a list"),
        ({"block_size": "64"}, "field 'block_size' must be an integer"),
        ({"block_size": -64}, "field 'block_size' is negative"),
        ({"hash_id_scope": "global"}, "unsupported hash_id_scope 'global'"),
    ],
)
def test_bad_weka_conversation(tmp_path: Path, changes: dict[str, Any], problem: str) -> None:
    path = _weka(tmp_path, _inner(), **changes)
    message = _error(path)
    assert message.startswith(f"{path}:2: conversation 'conv-9': ")
    assert problem in message


def test_weka_conversation_without_id(tmp_path: Path) -> None:
    conversation = weka_conversation("x", [])
    del conversation["id"]
    path = write_jsonl(tmp_path / "bad.jsonl", [conversation])
    assert _error(path, "weka") == f"{path}:1: missing field 'id'"


@pytest.mark.parametrize(
    ("body", "line", "problem"),
    [
        ("TIMESTAMP,ContextTokens\n0,5\n", 1, "header lacks column(s) GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,1\n1,x,1\n", 3, "must be an integer"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,-5,1\n", 2, "ContextTokens is negative (-5)"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,-1\n", 2, "GeneratedTokens is negative"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5\n", 2, "expected 3 fields, got 2"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n-1,5,1\n", 2, "finite and non-negative"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-01 10:00:00,5,1\n12.5,5,1\n",
            3,
            "not an ISO datetime like the first row's",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-01 10:00:00,5,1\n"
            "2024-05-01T10:00:01+00:00,5,1\n",
            3,
            "mixes zoned and naive datetimes",
        ),
    ],
)
def test_bad_csv(tmp_path: Path, body: str, line: int, problem: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(body)
    message = _error(path, "csv")
    assert message.startswith(f"{path}:{line}: ")
    assert problem in message


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("hello world\n", "unknown format (not JSON lines, a JSON array or a CSV header"),
        ('{"prompt": "hi"}\n', "unknown format (a JSON object with none of 'requests'"),
        ('{"prompt": \n', "unknown format (line is not valid JSON"),
    ],
)
def test_unknown_format(tmp_path: Path, body: str, problem: str) -> None:
    path = tmp_path / "trace.txt"
    path.write_text("\n" + body)
    message = _error(path)
    assert message.startswith(f"{path}:2: ")
    assert problem in message


@pytest.mark.parametrize(
    ("body", "format"),
    [
        ("", None),
        ("\n  \n", None),
        ("", "mooncake"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", None),
        ('{"id": "c", "block_size": 64, "hash_id_scope": "local", "requests": []}\n', None),
    ],
)
def test_empty_file(tmp_path: Path, body: str, format: str | None) -> None:
    path = tmp_path / "empty"
    path.write_text(body)
    assert _error(path, format).startswith(f"{path}: empty file")


def test_truncated_gzip(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [GOOD_MOONCAKE] * 2000, compress=True)
    path.write_bytes(path.read_bytes()[:-100])
    message = _error(path, "mooncake")
    assert message.startswith(f"{path}:")
    assert "unreadable gzip data" in message


def test_corrupt_gzip(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl.gz", [GOOD_MOONCAKE] * 50, compress=True)
    data = bytearray(path.read_bytes())
    data[20:40] = b"\xff" * 20
    path.write_bytes(bytes(data))
    message = _error(path)
    assert message.startswith(f"{path}:1: unreadable gzip data")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.jsonl"
    assert _error(path, "mooncake").startswith(f"{path}: cannot open")


def test_stats_reject_mixed_block_sizes(tmp_path: Path) -> None:
    small = weka_conversation("a", [weka_request(0.0, "m", 64, 1, [1])])
    large = dict(weka_conversation("b", [weka_request(0.0, "m", 128, 1, [1])]), block_size=128)
    path = write_jsonl(tmp_path / "mixed.jsonl", [small, large])
    with pytest.raises(TraceError, match=r":2: block size 128 differs from the first request's 64"):
        trace_stats(path)
