"""`pddemu trace stats`: JSON and table output, format override, errors and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trace_samples import DATA, mooncake_line, write_jsonl

from pddemu.cli import main


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "m.jsonl",
        [
            mooncake_line(0, 1024, 4, [0, 1]),
            mooncake_line(10, 1024, 6, [5, 6]),
            mooncake_line(20, 1536, 8, [0, 1, 2]),
        ],
    )


def test_json_output(small_trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "stats", str(small_trace), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["format"] == "mooncake"
    assert result["requests"] == 3
    assert result["sessions"] is None
    assert result["percentile_method"] == "linear"
    assert result["input_tokens"] == {
        "mean": pytest.approx(3584 / 3),
        "p50": 1024.0,
        "p90": pytest.approx(1433.6),
        "p99": pytest.approx(1525.76),
        "max": 1536,
    }
    assert result["output_tokens"]["p50"] == 6.0
    hit = result["hit_rate"]
    assert hit["cache_tokens"] is None
    assert hit["block_tokens"] == 512
    assert [b["requests"] for b in hit["buckets"]] == [3, 0, 0, 0, 0, 0, 0]
    assert [(b["lo_pct"], b["hi_pct"]) for b in hit["buckets"]][-2:] == [(99, 99.5), (99.5, 100)]
    assert hit["mean_token_hit_rate"] == pytest.approx((1024 / 1536) / 3)
    assert hit["token_weighted_hit_rate"] == pytest.approx(1024 / 3584)


def test_cache_tokens_reaches_the_cache(
    small_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Room for two blocks only: request 1's blocks push out request 0's before request 2 looks.
    assert main(["trace", "stats", str(small_trace), "--json", "--cache-tokens", "1024"]) == 0
    hit = json.loads(capsys.readouterr().out)["hit_rate"]
    assert hit["cache_tokens"] == 1024
    assert hit["mean_token_hit_rate"] == 0


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "stats", str(DATA / "weka_excerpt.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "format   weka, 9 requests, 3 sessions" in out
    assert "prefix hit rate (64-token blocks, infinite cache)" in out
    assert "99.5-100%" in out
    assert "mean token hit rate" in out


def test_length_only_table_says_why_there_is_no_hit_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,5\n")
    assert main(["trace", "stats", str(path)]) == 0
    assert "prefix hit rate: not available (a csv trace has no block ids" in capsys.readouterr().out
    assert main(["trace", "stats", str(path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["hit_rate"] is None
    assert "no block ids" in result["hit_rate_unavailable"]


def test_bad_trace_exits_1_with_the_reason(
    small_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "stats", str(small_trace), "--format", "weka"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pddemu trace stats: error: ")
    assert f"{small_trace}:1: missing field 'id'" in err


def test_negative_cache_size_is_a_usage_error(small_trace: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["trace", "stats", str(small_trace), "--cache-tokens", "-1"])
    assert exited.value.code == 2


def test_module_entry_point(small_trace: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pddemu.cli", "trace", "stats", str(small_trace), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout)["requests"] == 3
