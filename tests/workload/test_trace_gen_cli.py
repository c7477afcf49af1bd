"""`pddemu trace gen` and `pddemu trace stats --by-day/--by-week` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pddemu.cli import main
from pddemu.workload import read_trace


def test_gen_writes_a_readable_mooncake_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "janfeb.jsonl"
    assert main(["trace", "gen", "pdd-janfeb", "--out", str(out), "--requests", "300"]) == 0
    report = capsys.readouterr().out
    assert report.startswith("wrote 300 requests, ")
    assert "59 days (2026-01-01 .. 2026-02-28)" in report
    assert "intended  realised" in report
    line = json.loads(out.read_text().splitlines()[0])
    assert list(line)[:4] == ["timestamp", "input_length", "output_length", "hash_ids"]
    assert line["day"] == "2026-01-01" and line["session_id"] == "s00000"
    assert "block_size" not in line  # Mooncake's own 512
    records = list(read_trace(out))
    assert len(records) == 300 and records[-1].day == "2026-02-28"


def test_gen_parameters_and_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def generate(name: str, *options: str) -> bytes:
        path = tmp_path / name
        assert main(["trace", "gen", "pdd-janfeb", "--out", str(path), *options]) == 0
        return path.read_bytes()

    base = ("--requests", "100", "--first-day", "2026-02-01", "--last-day", "2026-02-07")
    one = generate("a.jsonl", *base, "--seed", "1")
    assert one == generate("b.jsonl", *base, "--seed", "1")
    assert one != generate("c.jsonl", *base, "--seed", "2")
    mixture = "0.5,0.1,0.1,0.1,0.1,0.05,0.05"
    generate("d.jsonl", *base, "--hit-mix-first-day", mixture, "--hit-mix-last-day", mixture)
    days = {r.day for r in read_trace(tmp_path / "d.jsonl")}
    assert days == {f"2026-02-0{d}" for d in range(1, 8)}
    capsys.readouterr()


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["--liso-share", "0.9"], "pdd-janfeb parameter 'hit_mix_first_day'"),
        (["--last-day", "2025-01-01"], "'last_day' = '2025-01-01': is before first_day"),
        (["--hit-mix-first-day", "1,0"], "must have 7 bucket shares, got 2"),
    ],
)
def test_gen_reports_bad_parameters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], problem: str
) -> None:
    out = tmp_path / "x.jsonl"
    assert main(["trace", "gen", "pdd-janfeb", "--out", str(out), *options]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pddemu trace gen: error: ")
    assert problem in err
    assert not out.exists()


def test_gen_usage_errors(tmp_path: Path) -> None:
    for argv in (
        ["trace", "gen", "other", "--out", str(tmp_path / "x")],
        ["trace", "gen", "pdd-janfeb"],
        ["trace", "gen", "pdd-janfeb", "--out", "x", "--requests", "many"],
        ["trace", "gen", "pdd-janfeb", "--out", "x", "--hit-mix-last-day", "a,b"],
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2


def test_stats_by_day_and_week(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "janfeb.jsonl.gz"
    assert main(["trace", "gen", "pdd-janfeb", "--out", str(out), "--requests", "590"]) == 0
    capsys.readouterr()
    assert main(["trace", "stats", str(out), "--by-day"]) == 0
    table = capsys.readouterr().out
    assert "miss share" in table
    assert "hit rate by day (share of the day's requests in each bucket, %)" in table
    assert "\n2026-01-01       10 " in table and "\n2026-02-28       10 " in table
    assert main(["trace", "stats", str(out), "--by-week", "--json"]) == 0
    weeks = json.loads(capsys.readouterr().out)["by_week"]
    assert [w["week"] for w in weeks][0] == "2026-W01"
    assert sum(w["requests"] for w in weeks) == 590
    with pytest.raises(SystemExit):
        main(["trace", "stats", str(out), "--by-day", "--by-week"])


def test_stats_by_day_without_days(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n')
    assert main(["trace", "stats", str(path), "--by-day"]) == 1
    assert "no request carries a day" in capsys.readouterr().err
