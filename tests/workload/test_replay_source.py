"""`load_workload`: the generator and trace files of every format as timed requests with genuine
token sequences; determinism, sampling, arrival processes, expected hits, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from trace_samples import (
    DATA,
    WEKA_FULL,
    mooncake_line,
    weka_conversation,
    weka_request,
    write_jsonl,
)

from pddemu.workload import (
    PddJanFebConfig,
    WorkloadError,
    WorkloadRequest,
    load_workload,
    read_trace,
)
from pddemu.workload.janfeb import generate_pdd_janfeb
from pddemu.workload.mooncake_writer import write_mooncake
from pddemu.workload.records import TraceError
from pddemu.workload.stats import PrefixHitCounter
from pddemu.workload.weka import read_weka

MOONCAKE = DATA / "mooncake_excerpt.jsonl"
WEKA = DATA / "weka_excerpt.jsonl"


def _signature(workload: list[WorkloadRequest]) -> list[tuple[object, ...]]:
    return [
        (
            r.arrival_s,
            r.input_tokens,
            r.output_tokens,
            r.prompt_ids.tobytes(),
            r.genuine_output_tokens,
            r.session,
            r.day,
            r.expected_hit_tokens,
            r.long_input_short_output,
        )
        for r in workload
    ]


def _check_shape(workload: list[WorkloadRequest], token_scale: int) -> None:
    arrivals = np.array([r.arrival_s for r in workload])
    assert arrivals[0] == 0 and np.all(np.diff(arrivals) >= 0)
    for r in workload:
        assert r.prompt_ids.dtype == np.int32
        assert r.prompt_ids.size == -(-r.input_tokens // token_scale) == r.genuine_input_tokens
        assert r.prompt_ids.min() >= 0 and r.prompt_ids.max() <= 255
        assert r.genuine_output_tokens == 1 + -(-(r.output_tokens - 1) // token_scale)
        assert r.token_scale == token_scale
    assert len({r.request_id for r in workload}) == len(workload)


def test_pdd_janfeb_is_deterministic_and_seeded() -> None:
    first = load_workload("pdd-janfeb", requests=500, seed=1, token_scale=16)
    again = load_workload("pdd-janfeb", requests=500, seed=1, token_scale=16)
    other = load_workload("pdd-janfeb", requests=500, seed=2, token_scale=16)
    assert len(first) == 500
    _check_shape(first, 16)
    assert _signature(first) == _signature(again)
    assert [r.request_id for r in first] == [r.request_id for r in again]
    assert first[0].request_id == "pdd-janfeb:0"
    assert _signature(first) != _signature(other)
    assert {r.day for r in first} >= {"2026-01-01", "2026-02-28"}


def test_pdd_janfeb_matches_its_written_file(tmp_path: Path) -> None:
    direct = load_workload("pdd-janfeb", requests=300, seed=4, token_scale=8)
    path = tmp_path / "janfeb.jsonl.gz"
    write_mooncake(generate_pdd_janfeb(PddJanFebConfig(requests=300), seed=4).records, path)
    replayed = load_workload(path, requests=None, seed=99, token_scale=8)
    assert _signature(direct) == _signature(replayed)
    assert replayed[5].request_id == "janfeb.jsonl.gz:5"


def test_pdd_janfeb_expected_hits_are_the_generator_s(tmp_path: Path) -> None:
    config = PddJanFebConfig(requests=400, arrival_rate=2.0)
    trace = generate_pdd_janfeb(config, seed=0)
    workload = load_workload("pdd-janfeb", requests=400, seed=0, token_scale=16, arrival_rate=2.0)
    assert [r.expected_hit_tokens for r in workload] == trace.intended_hit_tokens.tolist()
    assert [r.long_input_short_output for r in workload] == list(trace.long_input_short_output)


def test_shared_prefix_in_blocks_is_shared_in_genuine_tokens() -> None:
    workload = load_workload("pdd-janfeb", requests=300, seed=3, token_scale=16)
    previous: dict[str, WorkloadRequest] = {}
    checked = 0
    for r in workload:
        before = previous.get(r.session or "")
        if before is not None and r.expected_hit_tokens:
            shared = r.expected_hit_tokens // 16
            np.testing.assert_array_equal(r.prompt_ids[:shared], before.prompt_ids[:shared])
            # Past the shared blocks the content is new (the previous prompt's partial block
            # is not kept: its id was its own).
            past = min(32, r.prompt_ids.size - shared, before.prompt_ids.size - shared)
            if past > 0:
                window = slice(shared, shared + past)
                assert (r.prompt_ids[window] != before.prompt_ids[window]).any()
            checked += 1
        previous[r.session or ""] = r
    assert checked > 200


def test_pdd_janfeb_arrival_rate_and_parameters() -> None:
    workload = load_workload(
        "pdd-janfeb",
        requests=3000,
        seed=0,
        token_scale=64,
        arrival_rate=5.0,
        janfeb=PddJanFebConfig(liso_share=0.0),
    )
    arrivals = np.array([r.arrival_s for r in workload])
    assert len(arrivals) / arrivals[-1] == pytest.approx(5.0, rel=0.06)
    assert not any(r.long_input_short_output for r in workload)


def test_mooncake_excerpt() -> None:
    workload = load_workload(MOONCAKE, requests=None, seed=0, token_scale=16)
    assert len(workload) == 30
    _check_shape(workload, 16)
    assert workload[0].request_id == "mooncake_excerpt.jsonl:0"
    assert workload[0].input_tokens == 40160 and workload[0].output_tokens == 6
    assert (workload[0].session, workload[0].day) == (None, None)
    # Trace timestamps (ms) as modelled seconds.
    assert [r.arrival_s for r in workload[:3]] == [0.0, 0.0, 0.04]
    # Expected hits follow the file's own prefix structure.
    counter = PrefixHitCounter(512, None)
    expected = [counter.observe(r.block_ids, r.input_tokens) for r in read_trace(MOONCAKE)]
    assert [r.expected_hit_tokens for r in workload] == expected
    # The seed does not touch a trace with timestamps.
    assert _signature(load_workload(MOONCAKE, requests=None, seed=5, token_scale=16)) == (
        _signature(workload)
    )


def test_mooncake_hits_and_unsorted_timestamps(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [
            mooncake_line(3000, 1024, 4, [0, 1]),
            mooncake_line(1000, 1500, 0, [0, 1, 2]),
            mooncake_line(2000, 600, 7, [5, 6]),
        ],
    )
    workload = load_workload(path, requests=None, seed=0, token_scale=16)
    # Replayed in timestamp order, the first at 0; hits counted in that order.
    assert [r.request_id for r in workload] == ["m.jsonl:1", "m.jsonl:2", "m.jsonl:0"]
    assert [r.arrival_s for r in workload] == [0.0, 1.0, 2.0]
    assert [r.expected_hit_tokens for r in workload] == [0, 0, 1024]
    assert [r.output_tokens for r in workload] == [1, 7, 4]
    np.testing.assert_array_equal(workload[2].prompt_ids, workload[0].prompt_ids[:64])


def test_requests_keeps_the_first_in_arrival_order() -> None:
    full = load_workload(MOONCAKE, requests=None, seed=0, token_scale=16)
    first_ten = load_workload(MOONCAKE, requests=10, seed=0, token_scale=16)
    assert _signature(first_ten) == _signature(full[:10])
    assert _signature(load_workload(MOONCAKE, requests=10, seed=0, token_scale=16)) == (
        _signature(first_ten)
    )


def test_poisson_retiming_keeps_the_order() -> None:
    timed = load_workload(MOONCAKE, requests=None, seed=0, token_scale=16)
    poisson = load_workload(MOONCAKE, requests=None, seed=0, token_scale=16, arrival_rate=2.0)
    assert [r.request_id for r in poisson] == [r.request_id for r in timed]
    assert [r.arrival_s for r in poisson] != [r.arrival_s for r in timed]
    again = load_workload(MOONCAKE, requests=None, seed=0, token_scale=16, arrival_rate=2.0)
    assert [r.arrival_s for r in poisson] == [r.arrival_s for r in again]
    other = load_workload(MOONCAKE, requests=None, seed=1, token_scale=16, arrival_rate=2.0)
    assert [r.arrival_s for r in poisson] != [r.arrival_s for r in other]


def test_weka_excerpt_conversations_keep_their_offsets() -> None:
    workload = load_workload(WEKA, requests=None, seed=3, token_scale=16)
    assert len(workload) == 9
    _check_shape(workload, 16)
    recorded = {(r.session, r.index): r.t_in_session_s for r in read_weka(WEKA)}
    by_session: dict[str, list[WorkloadRequest]] = {}
    for r in workload:
        by_session.setdefault(r.session or "", []).append(r)
    assert set(by_session) == {"trace_0103", "trace_0187", "trace_0504"}
    for session, requests in by_session.items():
        start = requests[0].arrival_s
        offsets = sorted(t for (s, _), t in recorded.items() if s == session)
        assert [r.arrival_s - start for r in requests] == pytest.approx(offsets)
    # Hits are the conversation's own: the first request of each misses, later ones hit.
    assert [requests[0].expected_hit_tokens for requests in by_session.values()] == [0, 0, 0]
    assert all(r.expected_hit_tokens for rs in by_session.values() for r in rs[1:])
    assert _signature(load_workload(WEKA, requests=None, seed=3, token_scale=16)) == (
        _signature(workload)
    )
    assert _signature(load_workload(WEKA, requests=None, seed=4, token_scale=16)) != (
        _signature(workload)
    )


def test_weka_stops_reading_once_later_conversations_cannot_arrive_in_time(
    tmp_path: Path,
) -> None:
    conversations = [
        weka_conversation(
            f"c{i}", [weka_request(t, "m", 640, 3, list(range(1, 11))) for t in (0, 5)]
        )
        for i in range(3)
    ]
    path = write_jsonl(tmp_path / "w.jsonl", conversations)
    with path.open("a") as broken:  # never read: conversation c1 starts after the 2nd arrival
        broken.write("{not json\n")
    workload = load_workload(path, requests=2, seed=0, token_scale=16, session_rate=1e-6)
    assert [r.session for r in workload] == ["c0", "c0"]
    assert [r.arrival_s for r in workload] == [0.0, 5.0]
    with pytest.raises(TraceError, match=":4: not valid JSON"):
        load_workload(path, requests=None, seed=0, token_scale=16)


@pytest.mark.skipif(not WEKA_FULL.exists(), reason="full WEKA trace not present")
def test_weka_full_file_sample() -> None:
    workload = load_workload(WEKA_FULL, requests=200, seed=0, token_scale=16)
    assert len(workload) == 200
    arrivals = [r.arrival_s for r in workload]
    assert arrivals == sorted(arrivals)
    sessions = {r.session for r in workload}
    assert len(sessions) > 1
    assert sum(r.long_input_short_output for r in workload) > 100  # short agentic outputs


def test_length_only_csv_gets_the_synthetic_shared_prefix(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n5,3000,0\n6.5,2000,40\n7,300,9\n")
    workload = load_workload(path, requests=None, seed=0, token_scale=16)
    assert [r.arrival_s for r in workload] == [0.0, 1.5, 2.0]
    assert [r.expected_hit_tokens for r in workload] == [None, None, None]
    assert workload[0].output_tokens == 1  # a recorded 0 still gets the prefill's token
    a, b, c = (r.prompt_ids for r in workload)
    np.testing.assert_array_equal(a[:64], b[:64])  # 1,024 shared tokens: 64 genuine ones
    assert (a[64:80] != b[64:80]).any()
    np.testing.assert_array_equal(c, a[: c.size])  # 300 tokens: all inside the shared prefix
    longer = load_workload(
        path, requests=None, seed=0, token_scale=16, length_only_prefix_tokens=2048
    )
    np.testing.assert_array_equal(longer[1].prompt_ids, longer[0].prompt_ids[:125])
    none = load_workload(path, requests=None, seed=0, token_scale=16, length_only_prefix_tokens=0)
    assert (none[0].prompt_ids[:64] != none[1].prompt_ids[:64]).any()


@pytest.mark.parametrize(
    ("arguments", "error", "problem"),
    [
        ({"requests": 0}, WorkloadError, "requests must be None or an integer >= 1, got 0"),
        ({"seed": -1}, WorkloadError, "seed must be a non-negative integer, got -1"),
        ({"token_scale": 0}, WorkloadError, "token_scale must be an integer >= 1, got 0"),
        ({"arrival_rate": -2.0}, WorkloadError, "arrival_rate must be finite and positive"),
        ({"session_rate": 0.0}, WorkloadError, "session_rate must be finite and positive"),
        ({"length_only_prefix_tokens": -1}, WorkloadError, "length_only_prefix_tokens must be"),
        ({"janfeb": PddJanFebConfig()}, WorkloadError, "janfeb parameters apply to 'pdd-janfeb'"),
        ({"format": "weka"}, TraceError, ":1: missing field 'id'"),
    ],
)
def test_bad_arguments(arguments: dict[str, object], error: type, problem: str) -> None:
    base: dict[str, object] = {"requests": None, "seed": 0, "token_scale": 16}
    with pytest.raises(error) as raised:
        load_workload(MOONCAKE, **{**base, **arguments})  # type: ignore[arg-type]
    assert problem in str(raised.value)


def test_format_is_for_files_only() -> None:
    with pytest.raises(WorkloadError, match="format applies to trace files, not to 'pdd-janfeb'"):
        load_workload("pdd-janfeb", requests=5, seed=0, token_scale=16, format="mooncake")


def test_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="nowhere.jsonl: cannot open"):
        load_workload(tmp_path / "nowhere.jsonl", requests=None, seed=0, token_scale=16)
    garbage = tmp_path / "notes.txt"
    garbage.write_text("hello\n")
    with pytest.raises(TraceError, match=r"notes.txt:1: unknown format"):
        load_workload(garbage, requests=None, seed=0, token_scale=16)
