"""The committed digests of the model's streams: the same tokens, logits and KV on any machine."""

from __future__ import annotations

import pytest

from pddemu.model import ModelConfig
from tests.model.paths_digest import EXPECTED, paths_digest


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_path_gives_the_committed_digest(dtype: str) -> None:
    assert paths_digest(ModelConfig(dtype=dtype)) == EXPECTED
