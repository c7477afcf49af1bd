"""The KV of a run of tokens of one request: what roles keep, cache and ship over the wire.

Layout: a tensor [layers, 2 (K, V), kv_heads, tokens, head_dim] in the model dtype. Tokens are the
second-to-last axis so that one head's keys are a contiguous [tokens, head_dim] matrix, which is
what attention reads without copying. A `KV` may own spare capacity along the token axis so that
appending one decoded token per step costs O(1) amortised instead of O(tokens).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

from pddemu.model.config import DTYPES, ModelConfig
from pddemu.model.errors import KVError

_TOKEN_AXIS = 3
_MIN_CAPACITY = 16


class KV:
    """Keys and values of consecutive tokens (all or some layers), with amortised appends.

    Views returned by `token_slice`, `layer_slice` and `tensor` share memory with this object;
    they never see spare capacity, so appending to any `KV` never changes another one.
    """

    __slots__ = ("_storage", "_tokens")

    def __init__(self, data: torch.Tensor) -> None:
        """Wrap `data` [layers, 2, kv_heads, tokens, head_dim] without copying it."""
        if not isinstance(data, torch.Tensor):
            raise KVError(f"KV data must be a torch.Tensor, got {type(data).__name__}")
        if data.dim() != 5 or data.shape[1] != 2:
            raise KVError(
                f"KV data must have shape [layers, 2, kv_heads, tokens, head_dim], got "
                f"{list(data.shape)}"
            )
        if data.dtype not in DTYPES.values():
            raise KVError(f"KV dtype must be float32 or float64, got {data.dtype}")
        self._storage = data
        self._tokens = data.shape[_TOKEN_AXIS]

    @classmethod
    def empty(cls, config: ModelConfig, capacity: int = 0) -> KV:
        """A zero-token KV for every layer of `config`, with room for `capacity` tokens."""
        if capacity < 0:
            raise KVError(f"capacity must be non-negative, got {capacity}")
        data = torch.empty(
            (config.n_layers, 2, config.n_kv_heads, capacity, config.head_dim),
            dtype=config.torch_dtype,
        )
        kv = cls(data)
        kv._tokens = 0
        return kv

    @classmethod
    def from_numpy(cls, array: np.ndarray) -> KV:
        """Wrap a numpy array (e.g. one read off the wire) without copying it.

        A read-only array is accepted: a `KV` never writes over its tokens, only into spare
        capacity, which a wrapped array does not have.
        """
        if not isinstance(array, np.ndarray):
            raise KVError(f"from_numpy needs a numpy array, got {type(array).__name__}")
        if array.dtype not in (np.float32, np.float64):
            raise KVError(f"KV array dtype must be float32 or float64, got {array.dtype}")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return cls(torch.from_numpy(array))

    @classmethod
    def concat(cls, parts: Sequence[KV]) -> KV:
        """A new KV holding the tokens of `parts` one after the other."""
        return cls._concat(parts, _TOKEN_AXIS, "tokens")

    @classmethod
    def _concat(cls, parts: Sequence[KV], axis: int, what: str) -> KV:
        if not parts:
            raise KVError(f"concat of {what} needs at least one KV")
        tensors = [p.tensor for p in parts]
        first = tensors[0]
        for i, t in enumerate(tensors[1:], start=1):
            other_dims = [d for d in range(5) if d != axis]
            if t.dtype != first.dtype or any(t.shape[d] != first.shape[d] for d in other_dims):
                raise KVError(
                    f"cannot concat {what}: part {i} is {list(t.shape)} {t.dtype}, "
                    f"part 0 is {list(first.shape)} {first.dtype}"
                )
        return cls(torch.cat(tensors, dim=axis))

    @property
    def tensor(self) -> torch.Tensor:
        """[layers, 2, kv_heads, tokens, head_dim], a view (no spare capacity)."""
        return self._storage.narrow(_TOKEN_AXIS, 0, self._tokens)

    @property
    def tokens(self) -> int:
        return self._tokens

    def __len__(self) -> int:
        return self._tokens

    @property
    def n_layers(self) -> int:
        return self._storage.shape[0]

    @property
    def n_kv_heads(self) -> int:
        return self._storage.shape[2]

    @property
    def head_dim(self) -> int:
        return self._storage.shape[4]

    @property
    def dtype(self) -> torch.dtype:
        return self._storage.dtype

    @property
    def capacity(self) -> int:
        return self._storage.shape[_TOKEN_AXIS]

    @property
    def nbytes(self) -> int:
        """Bytes of the genuine tokens (spare capacity excluded)."""
        return self.tensor.numel() * self._storage.element_size()

    def token_slice(self, start: int, stop: int) -> KV:
        """Tokens [start, stop), a view."""
        if not 0 <= start <= stop <= self._tokens:
            raise KVError(f"token range [{start}, {stop}) is outside [0, {self._tokens}]")
        return KV(self._storage.narrow(_TOKEN_AXIS, start, stop - start))

    def layer_slice(self, start: int, stop: int) -> KV:
        """Layers [start, stop) of all tokens, a view."""
        if not 0 <= start <= stop <= self.n_layers:
            raise KVError(f"layer range [{start}, {stop}) is outside [0, {self.n_layers}]")
        return KV(self.tensor.narrow(0, start, stop - start))

    def append(self, other: KV) -> None:
        """Add `other`'s tokens at the end, in place; grows capacity geometrically."""
        if not isinstance(other, KV):
            raise KVError(f"append needs a KV, got {type(other).__name__}")
        src = other.tensor
        mine = self._storage
        if src.dtype != mine.dtype or any(src.shape[d] != mine.shape[d] for d in (0, 1, 2, 4)):
            raise KVError(
                f"cannot append KV {list(src.shape)} {src.dtype} to KV {list(self.tensor.shape)} "
                f"{mine.dtype}: layers, kv_heads, head_dim and dtype must match"
            )
        needed = self._tokens + src.shape[_TOKEN_AXIS]
        if needed > self.capacity:
            self._grow(max(needed, 2 * self.capacity, _MIN_CAPACITY))
        self._storage.narrow(_TOKEN_AXIS, self._tokens, src.shape[_TOKEN_AXIS]).copy_(src)
        self._tokens = needed

    def _grow(self, capacity: int) -> None:
        shape = list(self._storage.shape)
        shape[_TOKEN_AXIS] = capacity
        grown = torch.empty(shape, dtype=self._storage.dtype)
        grown.narrow(_TOKEN_AXIS, 0, self._tokens).copy_(self.tensor)
        self._storage = grown

    def numpy(self) -> np.ndarray:
        """The tokens as a numpy view (strided when this KV has spare capacity)."""
        return self.tensor.numpy()

    def clone(self) -> KV:
        """A contiguous copy that shares no memory with this KV."""
        return KV(self.tensor.clone(memory_format=torch.contiguous_format))

    def check_fits(self, config: ModelConfig) -> None:
        """Raise KVError unless this is a whole-model KV for `config` (all layers, dims, dtype)."""
        expected = (config.n_layers, 2, config.n_kv_heads, config.head_dim)
        got = (self.n_layers, 2, self.n_kv_heads, self.head_dim)
        if got != expected or self.dtype != config.torch_dtype:
            raise KVError(
                f"KV [layers, 2, kv_heads, head_dim] = {list(got)} {self.dtype} does not fit "
                f"the model's {list(expected)} {config.torch_dtype}"
            )

    def __repr__(self) -> str:
        return (
            f"KV(layers={self.n_layers}, kv_heads={self.n_kv_heads}, tokens={self._tokens}, "
            f"head_dim={self.head_dim}, dtype={self.dtype}, capacity={self.capacity})"
        )
