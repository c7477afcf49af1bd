"""Between torch tensors (what the model computes) and wire messages (numpy views over buffers).

Kept apart from the rest of the package so that the frame layer imports without torch. Both
directions share memory instead of copying where the dtype allows; bfloat16, which numpy lacks,
crosses as its raw 16-bit patterns.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from pddemu.wire.errors import BadShape
from pddemu.wire.messages import KVChunk, KVDtype

_TORCH_DTYPES: dict[KVDtype, torch.dtype] = {
    KVDtype.FLOAT32: torch.float32,
    KVDtype.FLOAT16: torch.float16,
    KVDtype.BFLOAT16: torch.bfloat16,
    KVDtype.FLOAT64: torch.float64,
}
_KV_DTYPES = {torch_dtype: kv_dtype for kv_dtype, torch_dtype in _TORCH_DTYPES.items()}


def kv_dtype_of(dtype: torch.dtype) -> KVDtype:
    """The wire dtype of a torch dtype; BadShape for dtypes KV never has."""
    try:
        return _KV_DTYPES[dtype]
    except KeyError:
        known = ", ".join(str(d) for d in _KV_DTYPES)
        raise BadShape(f"KV dtype {dtype} cannot go on the wire (known: {known})") from None


def tensor_from_array(array: np.ndarray, dtype: KVDtype) -> torch.Tensor:
    """A torch tensor sharing `array`'s memory, reinterpreting uint16 storage as bfloat16.

    A decoded array is a read-only view over the received buffer; torch has no read-only
    tensors and warns about it. The warning is silenced here because the sharing is deliberate:
    the tensor must be treated as read-only (call `.clone()` for a writable copy).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if dtype is KVDtype.BFLOAT16 else tensor


def kv_tensor(chunk: KVChunk) -> torch.Tensor:
    """The chunk's KV as a torch tensor sharing its memory (read-only when decoded)."""
    return tensor_from_array(chunk.data, chunk.dtype)


def kv_chunk_from_tensor(
    request_id: str, layer_start: int, token_start: int, kv: torch.Tensor
) -> KVChunk:
    """A chunk holding `kv` ([layers, 2, kv_heads, tokens, head_dim], on CPU).

    The ranges follow from the start positions and the tensor's shape. The chunk shares the
    tensor's memory when it is contiguous; otherwise (a slice of a larger cache) it is copied once.
    """
    dtype = kv_dtype_of(kv.dtype)
    if kv.device.type != "cpu":
        raise BadShape(f"KV tensor is on {kv.device}; move it to the CPU before sending")
    if kv.dim() != 5:
        raise BadShape(
            f"KV tensor shape {tuple(kv.shape)} has {kv.dim()} dims; expected 5 "
            "[layers, 2, kv_heads, tokens, head_dim]"
        )
    contiguous = kv.detach().contiguous()
    if dtype is KVDtype.BFLOAT16:
        contiguous = contiguous.view(torch.uint16)
    return KVChunk(
        request_id,
        layer_start,
        layer_start + kv.shape[0],
        token_start,
        token_start + kv.shape[3],
        dtype,
        contiguous.numpy(),
    )
