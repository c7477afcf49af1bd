"""The Mooncake reader's optional fields (`block_size`, `session`, `day`) and their errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trace_samples import mooncake_line, write_jsonl

from pddemu.workload import TraceError, read_trace


def test_extras_are_read(tmp_path: Path) -> None:
    line = dict(mooncake_line(0, 130, 2, [4, 5, 6]), block_size=64, session="s1", day="2026-01-09")
    (record,) = read_trace(write_jsonl(tmp_path / "m.jsonl", [line]))
    assert (record.block_tokens, record.session, record.day) == (64, "s1", "2026-01-09")


def test_without_extras_nothing_changes(tmp_path: Path) -> None:
    (record,) = read_trace(write_jsonl(tmp_path / "m.jsonl", [mooncake_line(0, 600, 2, [1, 2])]))
    assert (record.block_tokens, record.session, record.day) == (512, None, None)


@pytest.mark.parametrize(
    ("extras", "problem"),
    [
        ({"block_size": 0}, "field 'block_size' must be at least 1, got 0"),
        ({"block_size": "64"}, "field 'block_size' must be an integer"),
        ({"block_size": 64}, "'hash_ids' has 2 ids but input_length 600 needs ceil(600/64) = 10"),
        ({"session": 7}, "field 'session' must be a string"),
        ({"day": None}, "field 'day' must be a string"),
    ],
)
def test_bad_extras_name_the_line(tmp_path: Path, extras: dict[str, Any], problem: str) -> None:
    good = mooncake_line(0, 600, 2, [1, 2])
    path = write_jsonl(tmp_path / "m.jsonl", [good, dict(good, **extras)])
    with pytest.raises(TraceError) as raised:
        list(read_trace(path))
    assert str(raised.value).startswith(f"{path}:2: ")
    assert problem in str(raised.value)
