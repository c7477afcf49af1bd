"""The synthetic workload: every request of the configured shape, sharing exactly the asked
share of its prompt (in whole pages) with the others, the rest its own."""

from __future__ import annotations

import pytest

from pddemu.config import load_config
from pddemu.emulate import workload_of
from pddemu.workload.synthetic import SYNTHETIC_BLOCK_TOKENS, SyntheticShape, synthetic_records


def test_requests_share_the_asked_prefix_and_nothing_else() -> None:
    records = synthetic_records(4, SyntheticShape(65536, 1024, 0.9))
    pages = 65536 // SYNTHETIC_BLOCK_TOKENS
    shared = round(0.9 * pages)
    for record in records:
        assert (record.input_tokens, record.output_tokens) == (65536, 1024)
        assert record.block_ids.size == pages and list(record.block_ids[:shared]) == list(
            range(shared)
        )
    own = [set(r.block_ids[shared:].tolist()) for r in records]
    assert all(not (a & b) for i, a in enumerate(own) for b in own[i + 1 :])


@pytest.mark.parametrize(("hit", "expected"), [(0.0, 0), (1.0, 65536 - SYNTHETIC_BLOCK_TOKENS)])
def test_the_ends_of_the_hit_rate(hit: float, expected: int) -> None:
    config = load_config(
        None,
        ['workload.trace="synthetic"', "workload.requests=3", f"workload.synthetic_hit_rate={hit}"],
    )
    requests = workload_of(config)
    assert requests[0].expected_hit_tokens == 0  # a cold cache
    assert [r.expected_hit_tokens for r in requests[1:]] == [expected, expected]
    assert requests[0].arrival_s == 0 and requests[1].arrival_s < requests[2].arrival_s


def test_the_same_seed_gives_the_same_workload() -> None:
    overrides = ['workload.trace="synthetic"', "workload.requests=3"]
    a, b = workload_of(load_config(None, overrides)), workload_of(load_config(None, overrides))
    assert [r.arrival_s for r in a] == [r.arrival_s for r in b]
    assert all((x.prompt_ids == y.prompt_ids).all() for x, y in zip(a, b, strict=True))
