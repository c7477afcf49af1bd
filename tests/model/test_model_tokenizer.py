from __future__ import annotations

import numpy as np
import pytest

from pddemu.model import BOS_ID, EOS_ID, ByteTokenizer, TokenizerError


@pytest.mark.parametrize(
    "text",
    ["", "hello world", "naïve café", "日本語のテキスト", "emoji 🙂🚀 mix", "tab\tnew\nline\x00"],
)
def test_round_trip(text: str) -> None:
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(text)
    assert ids[0] == BOS_ID
    assert ids[1:] == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_specials_are_skipped_and_invalid_utf8_replaced() -> None:
    tokenizer = ByteTokenizer()
    assert tokenizer.decode([BOS_ID, ord("a"), EOS_ID, ord("b")]) == "ab"
    assert tokenizer.decode([0xFF, ord("x")]) == "\ufffdx"
    assert tokenizer.decode([0xE6, 0x97]) == "\ufffd"  # truncated 3-byte character


def test_ids_beyond_specials_decode_to_nothing_when_vocab_is_larger() -> None:
    tokenizer = ByteTokenizer(vocab_size=300)
    assert tokenizer.decode([299, ord("z")]) == "z"


def test_numpy_integers_are_accepted() -> None:
    assert ByteTokenizer().decode(np.array([104, 105], dtype=np.int64)) == "hi"


@pytest.mark.parametrize("bad", [[-1], [258], [1.5], ["a"]])
def test_bad_ids_raise(bad: list) -> None:
    with pytest.raises(TokenizerError):
        ByteTokenizer().decode(bad)


def test_bad_construction_and_input_raise() -> None:
    with pytest.raises(TokenizerError, match="vocab_size"):
        ByteTokenizer(vocab_size=10)
    with pytest.raises(TokenizerError, match="str"):
        ByteTokenizer().encode(b"bytes")  # type: ignore[arg-type]


def test_stream_decoder_never_splits_a_character() -> None:
    tokenizer = ByteTokenizer()
    text = "a€b🙂"
    ids = tokenizer.encode(text) + [EOS_ID]
    stream = tokenizer.stream_decoder()
    pieces = [stream.push([i]) for i in ids]
    pieces.append(stream.finish())
    assert "".join(pieces) == text
    assert pieces[3] == "" and pieces[4] == "€"  # the euro sign's three bytes arrive one by one
    assert all("\ufffd" not in p for p in pieces)


def test_stream_decoder_flushes_incomplete_tail() -> None:
    stream = ByteTokenizer().stream_decoder()
    assert stream.push([ord("x"), 0xE2, 0x82]) == "x"
    assert stream.finish() == "\ufffd"
