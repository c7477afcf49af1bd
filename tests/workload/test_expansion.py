"""Block ids to genuine token sequences: lengths, vocabulary, prefix sharing, distinctness."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pddemu.workload.expansion import (
    GENUINE_VOCAB,
    ExpansionError,
    expand_prompt,
    genuine_input_length,
    genuine_output_length,
)


@pytest.mark.parametrize(
    ("modelled", "scale", "genuine"),
    [(1, 16, 1), (16, 16, 1), (17, 16, 2), (65_536, 16, 4096), (65_537, 16, 4097), (5, 1, 5)],
)
def test_input_length_is_the_ceiling(modelled: int, scale: int, genuine: int) -> None:
    assert genuine_input_length(modelled, scale) == genuine


@pytest.mark.parametrize(
    ("modelled", "scale", "genuine"),
    [(1, 16, 1), (2, 16, 2), (17, 16, 2), (18, 16, 3), (1024, 16, 65), (7, 1, 7)],
)
def test_output_length_counts_the_first_token_as_one(
    modelled: int, scale: int, genuine: int
) -> None:
    assert genuine_output_length(modelled, scale) == genuine


@pytest.mark.parametrize("scale", [0, -16, 1.5, True])
def test_bad_token_scale(scale: object) -> None:
    with pytest.raises(ExpansionError, match="token_scale must be an integer >= 1"):
        genuine_input_length(100, scale)  # type: ignore[arg-type]


def test_zero_lengths_are_refused() -> None:
    with pytest.raises(ExpansionError, match="input must be at least 1 token, got 0"):
        genuine_input_length(0, 16)
    with pytest.raises(ExpansionError, match="output must be at least 1 token, got 0"):
        genuine_output_length(0, 16)


@settings(max_examples=150, deadline=None)
@given(
    shared=st.integers(0, 40),
    tail_a=st.integers(1, 20),
    tail_b=st.integers(1, 20),
    block=st.sampled_from([64, 512, 100]),
    scale=st.sampled_from([1, 4, 16, 48]),
    partial_a=st.integers(0, 99),
    partial_b=st.integers(0, 99),
)
def test_equal_block_prefixes_give_equal_token_prefixes(
    shared: int,
    tail_a: int,
    tail_b: int,
    block: int,
    scale: int,
    partial_a: int,
    partial_b: int,
) -> None:
    ids_a = np.arange(shared + tail_a, dtype=np.int64)
    ids_b = np.concatenate([ids_a[:shared], np.arange(10_000, 10_000 + tail_b)])
    len_a = (shared + tail_a - 1) * block + 1 + partial_a % block
    len_b = (shared + tail_b - 1) * block + 1 + partial_b % block
    a = expand_prompt(ids_a, block, len_a, scale, request_key=1)
    b = expand_prompt(ids_b, block, len_b, scale, request_key=2)
    assert a.dtype == np.int32 and b.dtype == np.int32
    assert a.size == -(-len_a // scale) and b.size == -(-len_b // scale)
    assert a.min() >= 0 and a.max() < GENUINE_VOCAB
    common = -(-shared * block // scale)
    np.testing.assert_array_equal(a[:common], b[:common])


def test_different_blocks_give_different_tokens() -> None:
    # 2,000 distinct blocks of 64 modelled tokens at scale 16: 4 genuine tokens each. Two
    # different blocks agree on all 4 with probability 256^-4, so all 2,000 must differ.
    ids = np.arange(2000, dtype=np.int64) * 7919 + 3
    tokens = expand_prompt(ids, 64, 2000 * 64, 16, request_key=0).reshape(2000, 4)
    assert len({row.tobytes() for row in tokens}) == 2000
    # And the tokens are spread over the whole byte vocabulary, about evenly.
    counts = np.bincount(tokens.ravel(), minlength=GENUINE_VOCAB)
    assert counts.min() > 0
    assert counts.max() < 3 * counts.mean()


def test_same_block_at_another_offset_gives_other_tokens() -> None:
    tokens = expand_prompt(np.array([5]), 512, 512, 16, request_key=0)
    assert len(set(tokens.tolist())) > 20  # 32 positions of one block, not one repeated token


def test_tokens_past_the_block_ids_belong_to_the_request() -> None:
    # WEKA hashes full blocks only: 130 tokens with 64-token blocks have 2 ids and a 2-token tail.
    ids = np.array([1, 2])
    a = expand_prompt(ids, 64, 130 * 8, 8, request_key=11)
    same = expand_prompt(ids, 64, 130 * 8, 8, request_key=11)
    other = expand_prompt(ids, 64, 130 * 8, 8, request_key=12)
    np.testing.assert_array_equal(a, same)
    np.testing.assert_array_equal(a[:16], other[:16])  # the 2 blocks: 16 genuine tokens
    assert (a[16:] != other[16:]).any()


def test_no_block_ids_at_all() -> None:
    a = expand_prompt(None, None, 1000, 16, request_key=1)
    b = expand_prompt(None, None, 1000, 16, request_key=2)
    assert a.size == 63
    assert (a != b).sum() > 50


def test_block_ids_without_a_block_size() -> None:
    with pytest.raises(ExpansionError, match="block size of at least 1"):
        expand_prompt(np.array([1]), None, 10, 1, request_key=0)
