"""KV from the wire is this model's KV, or a protocol error naming what differs."""

from __future__ import annotations

import pytest
import torch

from pddemu.roles.main_decode import MainDecodeInstance
from pddemu.wire.tensors import kv_chunk_from_tensor
from tests.roles.in_process import instance


def test_a_chunk_of_every_layer_is_taken_and_others_are_named() -> None:
    md = instance(MainDecodeInstance, "MD")
    config = md.model_config
    kv, _ = md.model.prefill(list(range(10)), None, 64)
    whole = kv_chunk_from_tensor("r1", 0, 0, kv.tensor)
    assert torch.equal(md.received_kv(whole).tensor, kv.tensor)
    one_layer = kv_chunk_from_tensor("r1", 1, 0, kv.tensor[1:].contiguous())
    with pytest.raises(ValueError, match=rf"r1: layers \[1, {config.n_layers}\)"):
        md.received_kv(one_layer)
    half = kv_chunk_from_tensor("r1", 0, 0, kv.tensor.to(torch.float16))
    with pytest.raises(ValueError, match="torch.float16; this model's KV is"):
        md.received_kv(half)
