"""The pdd-janfeb generator: determinism, the hit-rate distribution read back by `trace stats`
from the written file, long-input short-output requests, drift, and parameter checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pddemu.workload import read_trace
from pddemu.workload.janfeb import GeneratedTrace, generate_pdd_janfeb
from pddemu.workload.janfeb_config import GeneratorError, PddJanFebConfig
from pddemu.workload.liso import LISO_RULE
from pddemu.workload.mooncake_writer import write_mooncake
from pddemu.workload.stats import PrefixHitCounter, hit_buckets, trace_stats


@pytest.fixture(scope="module")
def trace_4000() -> GeneratedTrace:
    return generate_pdd_janfeb(PddJanFebConfig(requests=4000), seed=7)


@pytest.fixture(scope="module")
def written_4000(trace_4000: GeneratedTrace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("janfeb") / "pdd-janfeb.jsonl"
    write_mooncake(trace_4000.records, path)
    return path


def _fields(trace: GeneratedTrace) -> list[tuple[Any, ...]]:
    return [
        (r.arrival_s, r.session, r.day, r.input_tokens, r.output_tokens, r.block_ids.tobytes())
        for r in trace.records
    ]


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    config = PddJanFebConfig(requests=300)
    first = generate_pdd_janfeb(config, seed=3)
    again = generate_pdd_janfeb(config, seed=3)
    other = generate_pdd_janfeb(config, seed=4)
    assert _fields(first) == _fields(again)
    np.testing.assert_array_equal(first.intended_hit_tokens, again.intended_hit_tokens)
    assert [r.input_tokens for r in first.records] != [r.input_tokens for r in other.records]
    assert [r.arrival_s for r in first.records] != [r.arrival_s for r in other.records]


def test_written_file_is_byte_identical_for_a_seed(tmp_path: Path) -> None:
    config = PddJanFebConfig(requests=200)
    for name in ("a.jsonl.gz", "b.jsonl.gz"):
        write_mooncake(generate_pdd_janfeb(config, seed=1).records, tmp_path / name)
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()


def test_stats_of_the_written_file_give_the_intended_hits(
    trace_4000: GeneratedTrace, written_4000: Path
) -> None:
    # The hit of every request is exactly the prefix the generator meant it to share.
    counter = PrefixHitCounter(512, None)
    records = list(read_trace(written_4000))
    hits = np.array([counter.observe(r.block_ids, r.input_tokens) for r in records])
    np.testing.assert_array_equal(hits, trace_4000.intended_hit_tokens)
    stats = trace_stats(written_4000)
    assert stats.format == "mooncake"
    assert stats.requests == 4000
    assert stats.hit_rate is not None
    assert stats.hit_rate.bucket_counts == tuple(
        np.bincount(trace_4000.buckets(), minlength=7).tolist()
    )


def test_bucket_distribution_is_the_intended_one(
    trace_4000: GeneratedTrace, written_4000: Path
) -> None:
    hit = trace_stats(written_4000).hit_rate
    assert hit is not None
    intended = trace_4000.intended_bucket_shares()
    # Stratified bucket draws: over 20 seeds of 2,000 requests the 0-90 % share scattered by
    # 0.25 points (independent draws: 0.75).
    np.testing.assert_allclose(hit.bucket_shares, intended, atol=0.015)
    assert 0.70 <= hit.share_above_95 <= 0.80
    assert hit.mean_token_hit_rate == pytest.approx(0.90, abs=0.015)
    # PDD: the few low-hit requests carry almost all the uncached tokens.
    assert hit.bucket_miss_shares[0] > 0.7


def test_every_request_of_a_continued_session_shares_a_prefix_with_it(
    trace_4000: GeneratedTrace,
) -> None:
    last_prompt: dict[str, np.ndarray] = {}
    system_blocks = 14_948 // 512
    for record, hit in zip(trace_4000.records, trace_4000.intended_hit_tokens, strict=True):
        assert np.all(np.diff(record.block_ids) > 0)
        kept = int(hit) // 512
        previous = last_prompt.get(record.session)
        if previous is None:  # a new session: only the shared system prompt
            assert kept in (0, system_blocks)
            np.testing.assert_array_equal(record.block_ids[:system_blocks], range(system_blocks))
        else:
            np.testing.assert_array_equal(record.block_ids[:kept], previous[:kept])
        last_prompt[record.session] = record.block_ids


def test_long_input_short_output_requests() -> None:
    trace = generate_pdd_janfeb(PddJanFebConfig(requests=20_000), seed=5)
    flagged = trace.long_input_short_output
    # Stratified draws put the share within a few requests of liso_share = 3.5 %.
    assert flagged.mean() == pytest.approx(0.035, abs=0.002)
    by_rule = np.array([LISO_RULE.applies(r.input_tokens, r.output_tokens) for r in trace.records])
    np.testing.assert_array_equal(by_rule, flagged)
    low_hit = trace.buckets()[flagged] == 0
    assert low_hit.mean() == pytest.approx(0.8, abs=0.02)
    outputs = np.array([r.output_tokens for r in trace.records])
    assert outputs[flagged].max() < 500 and outputs[~flagged].min() >= 500
    assert np.median(outputs[~flagged]) == pytest.approx(1024, rel=0.05)
    inputs = np.array([r.input_tokens for r in trace.records])
    assert inputs.min() >= 32_768
    assert np.median(inputs) == pytest.approx(65_536, rel=0.05)


def test_drift_between_early_january_and_late_february() -> None:
    trace = generate_pdd_janfeb(PddJanFebConfig(requests=6000), seed=2)
    above_95 = trace.buckets() >= 2
    early = trace.day_index < 15
    late = trace.day_index >= len(trace.config.days) - 15
    assert trace.records[int(np.flatnonzero(early)[-1])].day == "2026-01-15"
    assert trace.records[-1].day == "2026-02-28"
    # About 1,500 requests each: standard error 1.2 points; the intended shares are 70.6 and
    # 79.4 %.
    intended_early = trace.intended_bucket_shares(early)[2:].sum()
    intended_late = trace.intended_bucket_shares(late)[2:].sum()
    assert intended_late - intended_early > 0.08
    assert above_95[early].mean() == pytest.approx(intended_early, abs=0.04)
    assert above_95[late].mean() == pytest.approx(intended_late, abs=0.04)
    assert above_95[late].mean() - above_95[early].mean() > 0.04


def test_daily_mixture_ramps_from_the_first_to_the_last_day() -> None:
    config = PddJanFebConfig()
    assert len(config.days) == 59
    np.testing.assert_allclose(config.mixture_on(0), config.hit_mix_first_day)
    np.testing.assert_allclose(config.mixture_on(58), config.hit_mix_last_day)
    middle = (np.asarray(config.hit_mix_first_day) + np.asarray(config.hit_mix_last_day)) / 2
    np.testing.assert_allclose(config.mixture_on(29), middle)
    shares_0_90 = [config.mixture_on(d)[0] for d in range(59)]
    assert all(a >= b for a, b in zip(shares_0_90, shares_0_90[1:], strict=False))


def test_days_arrivals_and_sessions() -> None:
    trace = generate_pdd_janfeb(PddJanFebConfig(requests=5900, arrival_rate=4.0), seed=0)
    days = [r.day for r in trace.records]
    assert days == sorted(days)
    assert {days.count(d) for d in set(days)} == {100}
    arrivals = np.array([r.arrival_s for r in trace.records])
    assert arrivals[0] == 0 and np.all(np.diff(arrivals) >= 0)
    assert np.all(np.rint(arrivals * 1000) / 1000 == arrivals)  # whole ms, as written
    assert len(arrivals) / arrivals[-1] == pytest.approx(4.0, rel=0.05)
    sessions = {r.session for r in trace.records}
    assert 200 < len(sessions) < 800


def test_block_size_64_round_trips(tmp_path: Path) -> None:
    trace = generate_pdd_janfeb(PddJanFebConfig(requests=300, block_tokens=64), seed=0)
    path = tmp_path / "b64.jsonl"
    write_mooncake(trace.records, path)
    assert '"block_size":64' in path.read_text().splitlines()[0]
    stats = trace_stats(path)
    assert stats.hit_rate is not None and stats.hit_rate.block_tokens == 64
    inputs = np.array([r.input_tokens for r in trace.records])
    assert stats.hit_rate.bucket_counts == tuple(
        np.bincount(hit_buckets(trace.intended_hit_tokens, inputs), minlength=7).tolist()
    )


def test_by_day_and_by_week_statistics(written_4000: Path) -> None:
    by_day = trace_stats(written_4000, group="day")
    assert by_day.groups is not None
    assert [name for name, _ in by_day.groups][:2] == ["2026-01-01", "2026-01-02"]
    assert len(by_day.groups) == 59
    assert sum(hit.requests for _, hit in by_day.groups) == 4000
    by_week = trace_stats(written_4000, group="week")
    assert by_week.groups is not None
    names = [name for name, _ in by_week.groups]
    assert names[0] == "2026-W01" and names[-1] == "2026-W09"
    first, last = by_week.groups[0][1], by_week.groups[-1][1]
    assert last.share_above_95 > first.share_above_95
    assert by_week.to_dict()["by_week"][0]["week"] == "2026-W01"


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"requests": 0}, "'requests' = 0: must be at least 1"),
        ({"requests": 2.5}, "'requests' = 2.5: must be an integer"),
        ({"first_day": "2026-13-01"}, "'first_day' = '2026-13-01': not an ISO date"),
        ({"last_day": "2025-12-31"}, "'last_day' = '2025-12-31': is before first_day"),
        ({"arrival_rate": 0}, "'arrival_rate' = 0: must be positive"),
        ({"arrival_rate": float("inf")}, "'arrival_rate' = inf: must lie in"),
        ({"context_sigma": -1.0}, "'context_sigma' = -1.0: must lie in [0, 5]"),
        ({"max_input_tokens": 1000}, "'max_input_tokens' = 1000: must be at least 32768"),
        ({"context_median_tokens": 10**9}, "less than 1 % of the lengths fall in"),
        ({"hit_mix_first_day": (0.5, 0.5)}, "must have 7 bucket shares, got 2"),
        ({"hit_mix_last_day": (0.2,) * 7}, "shares must sum to 1, sum to 1.4000"),
        ({"hit_mix_last_day": (-0.1, 0.3, 0.2, 0.2, 0.2, 0.1, 0.1)}, "non-negative"),
        (
            {"hit_mix_first_day": (0.01, 0.29, 0.1, 0.1, 0.2, 0.2, 0.1)},
            "its 0-90 % share 0.010 is below the long-input short-output requests",
        ),
        ({"liso_share": 1.5}, "'liso_share' = 1.5: must lie in [0, 1]"),
        ({"min_input_tokens": 8192}, "must be at least 32768 (the long-input bound)"),
        ({"system_prompt_tokens": 40_000}, "must stay under 90 % of min_input_tokens"),
        ({"concurrent_sessions": 0}, "'concurrent_sessions' = 0: must be at least 1"),
        ({"liso_min_output_tokens": 600}, "must be at most 499"),
        ({"block_tokens": 8192}, "'min_input_tokens' = 32768: must be at least 65536"),
    ],
)
def test_bad_parameters_are_named(changes: dict[str, Any], problem: str) -> None:
    with pytest.raises(GeneratorError) as raised:
        dataclasses.replace(PddJanFebConfig(), **changes)
    message = str(raised.value)
    assert message.startswith("pdd-janfeb parameter ")
    assert problem in message


def test_short_contexts_need_no_long_input_requests() -> None:
    config = PddJanFebConfig(
        requests=200,
        liso_share=0.0,
        min_input_tokens=4096,
        context_median_tokens=8192,
        max_input_tokens=16_384,
        system_prompt_tokens=2048,
    )
    trace = generate_pdd_janfeb(config, seed=0)
    assert not trace.long_input_short_output.any()
    assert max(r.input_tokens for r in trace.records) < 17_000


def test_bad_seed() -> None:
    with pytest.raises(GeneratorError, match="seed must be a non-negative integer, got -1"):
        generate_pdd_janfeb(PddJanFebConfig(requests=10), seed=-1)


def test_committed_sample_is_what_its_readme_command_writes(tmp_path: Path) -> None:
    committed = Path(__file__).parents[2] / "traces" / "pdd-janfeb-2000.jsonl.gz"
    regenerated = tmp_path / "pdd-janfeb-2000.jsonl.gz"
    write_mooncake(generate_pdd_janfeb(PddJanFebConfig(requests=2000), seed=0).records, regenerated)
    assert committed.read_bytes() == regenerated.read_bytes()
