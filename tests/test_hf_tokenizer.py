"""The Hugging Face tokenizer directory shipped in the package is the model's byte tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

from pddemu.cli import main
from pddemu.hf_tokenizer import FILES, byte_characters, shipped_directory, tokenizer_files
from pddemu.model.tokenizer import BOS_ID, BYTE_IDS, EOS_ID


def test_the_shipped_directory_is_what_the_module_generates() -> None:
    """Regenerate with `python -m pddemu.hf_tokenizer` after changing the module."""
    for name, content in tokenizer_files().items():
        assert (shipped_directory() / name).read_text() == content, name


def test_every_byte_is_its_own_id_and_the_specials_are_the_models() -> None:
    tokenizer = json.loads(tokenizer_files()["tokenizer.json"])
    vocab = tokenizer["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(BYTE_IDS)) and tokenizer["model"]["merges"] == []
    assert len(set(byte_characters())) == BYTE_IDS
    assert all(len(char) == 1 and char.isprintable() for char in byte_characters())
    assert byte_characters()[ord("a")] == "a" and vocab["a"] == ord("a")
    specials = {t["id"]: t["content"] for t in tokenizer["added_tokens"]}
    assert set(specials) == {BOS_ID, EOS_ID}
    bos = tokenizer["post_processor"]["special_tokens"][specials[BOS_ID]]["ids"]
    assert bos == [BOS_ID]  # encode() with special tokens puts BOS first, as ByteTokenizer does


def test_export_writes_the_directory(tmp_path: Path) -> None:
    assert main(["tokenizer", "export", str(tmp_path / "tok")]) == 0
    for name in FILES:
        assert (tmp_path / "tok" / name).read_bytes() == (shipped_directory() / name).read_bytes()
