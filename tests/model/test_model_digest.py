"""The committed digests of the model's streams: the same tokens, logits and KV on any machine.

float32 here; the kernel matrix (tests/exactness) checks float64 against the same digests in
every cell, and test_model_exact.py checks that float64 computes float32's values."""

from __future__ import annotations

from pddemu.model import ModelConfig
from tests.model.paths_digest import EXPECTED, paths_digest


def test_every_path_gives_the_committed_digest() -> None:
    assert paths_digest(ModelConfig()) == EXPECTED
