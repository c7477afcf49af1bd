"""BurstGPT, Alibaba Bailian, ShareGPT and AIPerf's Mooncake variants: detected, read as their
sources document them, summarised by `trace stats` and replayable."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pddemu.cli import main
from pddemu.model.tokenizer import ByteTokenizer
from pddemu.workload import load_workload
from pddemu.workload.formats import detect_format, read_trace
from pddemu.workload.replay_source import WorkloadError

DATA = Path(__file__).parent / "data"
SAMPLES = {
    "burstgpt": DATA / "burstgpt_sample.csv",
    "bailian": DATA / "bailian_sample.jsonl",
    "sharegpt": DATA / "sharegpt_sample.json",
    "mooncake": DATA / "aiperf_mooncake_sample.jsonl",
}


@pytest.mark.parametrize("format", SAMPLES)
def test_each_sample_is_detected(format: str) -> None:
    assert detect_format(SAMPLES[format]) == format


def test_burstgpt_rows() -> None:
    rows = list(read_trace(SAMPLES["burstgpt"]))
    assert [r.arrival_s for r in rows] == [5.0, 45.0, 118.5, 120.0]
    assert [(r.input_tokens, r.output_tokens) for r in rows][:2] == [(472, 18), (1087, 0)]
    assert rows[2].model == "GPT-4" and rows[0].block_ids is None


def test_bailian_sessions_follow_parent_links_and_ids_may_repeat() -> None:
    rows = list(read_trace(SAMPLES["bailian"]))
    assert [r.session for r in rows] == ["0", "1", "0", "0"]
    assert rows[2].arrival_s == 3.5 and rows[3].block_tokens == 16
    assert rows[3].block_ids.tolist() == [0, 1, 5, 6, 7, 5]


def test_sharegpt_first_two_turns_in_byte_tokens() -> None:
    rows = list(read_trace(SAMPLES["sharegpt"]))
    tokenizer = ByteTokenizer()
    assert [r.session for r in rows] == ["c1", "c3", "c4"]  # c2 has one turn: skipped
    prompt = "Grüße — ünïcode"
    assert rows[2].input_tokens == len(tokenizer.encode(prompt))
    assert rows[2].output_tokens == len("✓".encode())
    assert rows[0].arrival_s is None and rows[0].block_ids.size == 0  # shorter than a block
    c3 = json.loads(SAMPLES["sharegpt"].read_text())[2]["conversations"][0]["value"]
    assert rows[1].block_ids.size == len(tokenizer.encode(c3)) // 64  # full blocks only


def test_aiperf_mooncake_sessions_delays_and_text() -> None:
    rows = list(read_trace(SAMPLES["mooncake"]))
    assert all(r.arrival_s is None for r in rows)
    assert [(r.session, r.t_in_session_s) for r in rows] == [
        ("a", 0.0),
        ("b", 0.0),
        ("a", 2.5),
        ("b", 1.0),
    ]
    assert rows[0].block_ids is None  # no hash_ids: length only
    first, second = rows[1].block_ids, rows[3].block_ids
    assert first.size == 1 and second[:1].tolist() == first.tolist()  # a shared opening block
    assert np.all(np.diff(second) > 0)


def test_timestamped_turns_count_their_delay_from_the_previous_turn(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [
        {"session_id": "s", "timestamp": 1000, "input_length": 10, "output_length": 2},
        {"session_id": "s", "delay": 500, "input_length": 20, "output_length": 2},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [r.arrival_s for r in read_trace(path)] == [1.0, 1.5]


def test_block_size_for_a_whole_mooncake_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    line = {"timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [0, 1, 2, 3]}
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match="another block size"):
        list(read_trace(path))
    (row,) = read_trace(path, block_size=32)
    assert row.block_tokens == 32


@pytest.mark.parametrize("format", SAMPLES)
def test_trace_stats_works_on_each(format: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "stats", str(SAMPLES[format]), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["requests"] == len(list(read_trace(SAMPLES[format])))


def test_replay_needs_a_rate_only_where_the_trace_has_no_times() -> None:
    with pytest.raises(WorkloadError, match="records no arrival times"):
        load_workload(SAMPLES["sharegpt"], requests=None, seed=0, token_scale=1)
    replayed = load_workload(
        SAMPLES["sharegpt"], requests=None, seed=0, token_scale=1, arrival_rate=2.0
    )
    assert [r.session for r in replayed] == ["c1", "c3", "c4"]
    sessions = load_workload(SAMPLES["mooncake"], requests=None, seed=0, token_scale=1)
    by_session = {}
    for request in sessions:
        by_session.setdefault(request.session, []).append(request.arrival_s)
    assert by_session["a"][1] - by_session["a"][0] == pytest.approx(2.5)
    bailian = load_workload(SAMPLES["bailian"], requests=None, seed=0, token_scale=1)
    assert [r.arrival_s for r in bailian] == [0.0, 0.75, 3.5, 9.25]


def test_a_mooncake_file_without_any_time_needs_a_rate(tmp_path: Path) -> None:
    """AIPerf's plainest lines (`{"input_length": 10, "output_length": 4}`) carry no time: not one
    session a line started at the WEKA conversation rate (a request a minute)."""
    path = tmp_path / "plain.jsonl"
    lines = [{"input_length": 100 * (i + 1), "output_length": 4} for i in range(3)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = list(read_trace(path))
    assert [(r.arrival_s, r.t_in_session_s) for r in rows] == [(None, None)] * 3
    with pytest.raises(WorkloadError, match="records no arrival times"):
        load_workload(path, requests=None, seed=0, token_scale=1)
    replayed = load_workload(path, requests=None, seed=0, token_scale=1, arrival_rate=1.0)
    assert [r.input_tokens for r in replayed] == [100, 200, 300]  # file order, at the rate
    mixed = tmp_path / "mixed.jsonl"
    lines.insert(1, {"session_id": "s", "delay": 500, "input_length": 10, "output_length": 2})
    mixed.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert len(load_workload(mixed, requests=None, seed=0, token_scale=1)) == 4


def test_an_aiperf_messages_prompt_is_refused_for_what_it_is(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    line = {"messages": [{"role": "user", "content": "hi"}], "output_length": 4}
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match="a 'messages' prompt is not read"):
        list(read_trace(path))


def test_emulate_block_size_flag_reads_a_mooncake_file_of_another_block_size(
    tmp_path: Path,
) -> None:
    from pddemu.cli import build_parser
    from pddemu.config import ConfigError
    from pddemu.emulate import config_of, workload_of
    from pddemu.workload.records import TraceError

    path = tmp_path / "t.jsonl"
    line = {"timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [0, 1, 2, 3]}
    path.write_text(json.dumps(line) + "\n")
    command = ["emulate", "--out", str(tmp_path / "run"), "--trace", str(path)]
    parser = build_parser()
    with pytest.raises(TraceError, match="another block size"):
        workload_of(config_of(parser.parse_args(command)))
    config = config_of(parser.parse_args([*command, "--block-size", "32"]))
    assert config.workload.block_size == 32
    assert len(workload_of(config)) == 1  # the same file, read with 32-token blocks
    with pytest.raises(ConfigError, match="--block-size must be at least 1"):
        config_of(parser.parse_args([*command, "--block-size", "0"]))
