from __future__ import annotations

import numpy as np
import pytest
import torch

from pddemu.model import KV, KVError, ModelConfig

CONFIG = ModelConfig()


def random_kv(tokens: int, config: ModelConfig = CONFIG, seed: int = 0) -> KV:
    gen = torch.Generator().manual_seed(seed)
    shape = (config.n_layers, 2, config.n_kv_heads, tokens, config.head_dim)
    return KV(torch.randn(shape, generator=gen, dtype=config.torch_dtype))


def test_shape_accessors_and_nbytes() -> None:
    kv = random_kv(10)
    assert (len(kv), kv.tokens, kv.n_layers, kv.n_kv_heads, kv.head_dim) == (10, 10, 2, 2, 32)
    assert kv.nbytes == 10 * CONFIG.kv_bytes_per_token
    assert kv.layer_slice(0, 1).nbytes == 10 * CONFIG.kv_bytes_per_token // 2


@pytest.mark.parametrize(
    "data",
    [
        torch.zeros(2, 2, 2, 3),
        torch.zeros(2, 3, 2, 4, 32),
        torch.zeros(1, 2, 1, 1, 4, dtype=torch.int32),
    ],
)
def test_bad_tensor_raises(data: torch.Tensor) -> None:
    with pytest.raises(KVError):
        KV(data)


def test_append_grows_geometrically_and_keeps_values() -> None:
    kv = KV.empty(CONFIG)
    parts = [random_kv(1, seed=i) for i in range(1000)]
    reallocations = 0
    for part in parts:
        before = kv.capacity
        kv.append(part)
        reallocations += kv.capacity != before
    assert len(kv) == 1000
    assert reallocations == 7  # 16 -> 32, ..., -> 1024: O(log n), so O(1) amortised per token
    assert torch.equal(kv.tensor, KV.concat(parts).tensor)


def test_views_never_see_later_appends() -> None:
    kv = KV.empty(CONFIG, capacity=64)
    kv.append(random_kv(5, seed=1))
    view = kv.token_slice(0, 5)
    snapshot = view.tensor.clone()
    view.append(random_kv(3, seed=2))  # a view has no spare capacity: it reallocates
    kv.append(random_kv(3, seed=3))
    assert torch.equal(kv.token_slice(0, 5).tensor, snapshot)
    assert not torch.equal(view.tensor[:, :, :, 5:], kv.tensor[:, :, :, 5:])


def test_slices_are_views_sharing_memory() -> None:
    kv = random_kv(20)
    tokens = kv.token_slice(4, 9)
    layers = kv.layer_slice(1, 2)
    assert torch.equal(tokens.tensor, kv.tensor[:, :, :, 4:9])
    assert torch.equal(layers.tensor, kv.tensor[1:2])
    assert tokens.tensor.untyped_storage().data_ptr() == kv.tensor.untyped_storage().data_ptr()
    assert np.shares_memory(layers.numpy(), kv.numpy())


@pytest.mark.parametrize("bad", [(-1, 3), (3, 2), (0, 21)])
def test_bad_token_range_raises(bad: tuple[int, int]) -> None:
    with pytest.raises(KVError, match="token range"):
        random_kv(20).token_slice(*bad)


def test_bad_layer_range_raises() -> None:
    with pytest.raises(KVError, match="layer range"):
        random_kv(2).layer_slice(1, 3)


def test_concat_reassembles_token_chunks() -> None:
    kv = random_kv(30)
    token_chunks = [kv.token_slice(0, 7), kv.token_slice(7, 30)]
    assert torch.equal(KV.concat(token_chunks).tensor, kv.tensor)


def test_concat_mismatch_raises() -> None:
    with pytest.raises(KVError, match="part 1"):
        KV.concat([random_kv(2), random_kv(2).layer_slice(0, 1)])
    with pytest.raises(KVError, match="at least one"):
        KV.concat([])


def test_append_mismatch_raises() -> None:
    with pytest.raises(KVError, match="layers, kv_heads, head_dim and dtype"):
        random_kv(2).append(random_kv(2, ModelConfig(dtype="float64")))


def test_numpy_round_trip_is_zero_copy_and_accepts_read_only_buffers() -> None:
    kv = random_kv(12)
    array = kv.numpy()
    assert np.shares_memory(array, kv.tensor.numpy())
    received = np.frombuffer(array.tobytes(), dtype=array.dtype).reshape(array.shape)
    assert not received.flags.writeable
    back = KV.from_numpy(received)
    assert np.shares_memory(back.numpy(), received)
    assert torch.equal(back.tensor, kv.tensor)


def test_from_numpy_rejects_other_dtypes() -> None:
    with pytest.raises(KVError, match="dtype"):
        KV.from_numpy(np.zeros((2, 2, 2, 1, 32), dtype=np.float16))


def test_clone_shares_nothing() -> None:
    kv = random_kv(3)
    copy = kv.clone()
    kv.tensor.zero_()
    assert copy.tensor.abs().sum() > 0


def test_check_fits_names_the_mismatch() -> None:
    random_kv(3).check_fits(CONFIG)
    with pytest.raises(KVError, match="does not fit"):
        random_kv(3).layer_slice(0, 1).check_fits(CONFIG)
    with pytest.raises(KVError, match="float64"):
        random_kv(3).check_fits(ModelConfig(dtype="float64"))
