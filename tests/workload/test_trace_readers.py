"""Readers of the three trace formats: fields, cache-key scoping, timing, gzip, detection."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from trace_samples import (
    DATA,
    mooncake_line,
    weka_conversation,
    weka_request,
    weka_subagent,
    write_jsonl,
)

from pddemu.workload import TraceError, detect_format, read_trace

OPUS = "claude-opus"
HAIKU = "claude-haiku"


def test_mooncake_records(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [mooncake_line(0, 1000, 7, [0, 1]), mooncake_line(1500, 512, 3, [0])],
    )
    first, second = read_trace(path)
    assert (first.index, first.arrival_s, first.input_tokens, first.output_tokens) == (
        0,
        0.0,
        1000,
        7,
    )
    assert first.block_ids.tolist() == [0, 1]
    assert first.block_ids.dtype == np.int64
    assert first.block_tokens == 512
    assert (first.session, first.t_in_session_s) == (None, None)
    assert (second.index, second.arrival_s, second.source_line) == (1, 1.5, 2)


def test_mooncake_excerpt_matches_a_plain_parse() -> None:
    path = DATA / "mooncake_excerpt.jsonl"
    plain = [json.loads(line) for line in path.read_text().splitlines()]
    records = list(read_trace(path))
    assert detect_format(path) == "mooncake"
    assert len(records) == len(plain) == 30
    for record, row in zip(records, plain, strict=True):
        assert record.arrival_s == row["timestamp"] / 1000
        assert record.input_tokens == row["input_length"]
        assert record.output_tokens == row["output_length"]
        assert record.block_ids.tolist() == row["hash_ids"]
        assert len(row["hash_ids"]) == math.ceil(row["input_length"] / 512)


def test_weka_subagent_timing_and_order(tmp_path: Path) -> None:
    conversation = weka_conversation(
        "c1",
        [
            weka_request(0.0, OPUS, 200, 10, [1, 2, 3]),
            weka_subagent(
                30.0,
                "agent_007",
                [
                    weka_request(0.0, HAIKU, 128, 5, [10, 11]),
                    weka_request(4.5, HAIKU, 192, 6, [10, 11, 12]),
                ],
            ),
            weka_request(40.0, OPUS, 260, 11, [1, 2, 3, 4]),
        ],
    )
    path = write_jsonl(tmp_path / "w.jsonl", [conversation])
    records = list(read_trace(path))
    assert [r.index for r in records] == [0, 1, 2, 3]
    assert [r.t_in_session_s for r in records] == [0.0, 30.0, 34.5, 40.0]
    assert [r.agent for r in records] == [None, "agent_007", "agent_007", None]
    assert [r.model for r in records] == [OPUS, HAIKU, HAIKU, OPUS]
    assert all(r.session == "c1" and r.arrival_s is None for r in records)
    assert all(r.block_tokens == 64 and r.source_line == 1 for r in records)


def test_weka_cache_keys_are_scoped_by_conversation_and_model(tmp_path: Path) -> None:
    first = weka_conversation(
        "a",
        [
            weka_request(0.0, OPUS, 128, 1, [1, 2]),
            weka_subagent(1.0, "agent_001", [weka_request(0.0, HAIKU, 128, 1, [1, 2])]),
            weka_subagent(2.0, "agent_002", [weka_request(0.0, OPUS, 192, 1, [1, 2, 3])]),
        ],
    )
    second = weka_conversation("b", [weka_request(0.0, OPUS, 128, 1, [1, 2])])
    path = write_jsonl(tmp_path / "w.jsonl", [first, second])
    a_opus, a_haiku, a_opus_subagent, b_opus = (r.block_ids for r in read_trace(path))
    # Same conversation and model: same content, same keys, even from a subagent.
    assert a_opus_subagent[:2].tolist() == a_opus.tolist()
    # Another model or another conversation: the same local ids are different content.
    assert not set(a_haiku.tolist()) & set(a_opus.tolist())
    assert not set(b_opus.tolist()) & set(a_opus.tolist())
    assert not set(b_opus.tolist()) & set(a_haiku.tolist())


def test_weka_gzip_and_excerpt_match_a_plain_parse(tmp_path: Path) -> None:
    source = DATA / "weka_excerpt.jsonl"
    conversations = [json.loads(line) for line in source.read_text().splitlines()]
    compressed = write_jsonl(tmp_path / "w.jsonl.gz", conversations, compress=True)
    plain = [(c["id"], r) for c in conversations for r in c["requests"]]
    for path in (source, compressed):
        assert detect_format(path) == "weka"
        records = list(read_trace(path))
        assert len(records) == len(plain) == 9
        for record, (conversation_id, row) in zip(records, plain, strict=True):
            assert record.session == conversation_id
            assert record.t_in_session_s == row["t"]
            assert (record.input_tokens, record.output_tokens) == (row["in"], row["out"])
            assert (record.block_ids & 0xFFFFFFFF).tolist() == row["hash_ids"]
            assert len(row["hash_ids"]) == row["in"] // 64


def test_csv_with_iso_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,4808,10\n"
        "\n"
        "2023-11-16 18:15:50.9951690,3180,8\n"
    )
    first, second = read_trace(path)
    assert detect_format(path) == "csv"
    assert (first.arrival_s, first.input_tokens, first.output_tokens) == (0.0, 4808, 10)
    assert second.arrival_s == pytest.approx(4.314579)
    assert second.source_line == 4
    assert first.block_ids is None and first.block_tokens is None


def test_csv_with_seconds_and_reordered_columns(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("GeneratedTokens,TIMESTAMP,ContextTokens\r\n5,0.5,100\r\n0,2.25,40\r\n")
    records = list(read_trace(path))
    assert [(r.arrival_s, r.input_tokens, r.output_tokens) for r in records] == [
        (0.5, 100, 5),
        (2.25, 40, 0),
    ]


def test_format_override_beats_detection(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [mooncake_line(0, 100, 1, [0])])
    with pytest.raises(TraceError, match="missing field 'id'"):
        list(read_trace(path, format="weka"))
    with pytest.raises(TraceError, match="unknown trace format 'parquet'"):
        read_trace(path, format="parquet")


def test_block_ids_are_read_only(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [mooncake_line(0, 100, 1, [0])])
    (record,) = read_trace(path)
    with pytest.raises(ValueError):
        record.block_ids[0] = 5
