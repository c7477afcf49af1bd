"""The tiny CPU transformer whose genuine KV tensors and tokens the emulator moves around.

Public API: `ModelConfig`, `TinyTransformer` (prefill / decode_batch / extend / generate),
`KV`, `greedy` (over `TEXT_IDS`), `ByteTokenizer`, and the `ModelError` family of exceptions.
"""

from __future__ import annotations

from pddemu.model.config import ModelConfig
from pddemu.model.errors import ConfigError, KVError, ModelError, TokenizerError
from pddemu.model.kv import KV
from pddemu.model.tokenizer import (
    BOS_ID,
    EOS_ID,
    TEXT_IDS,
    VOCAB_SIZE,
    ByteTokenizer,
    StreamDecoder,
)
from pddemu.model.transformer import TinyTransformer, greedy

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "KV",
    "VOCAB_SIZE",
    "ByteTokenizer",
    "ConfigError",
    "KVError",
    "ModelConfig",
    "ModelError",
    "StreamDecoder",
    "TEXT_IDS",
    "TinyTransformer",
    "TokenizerError",
    "greedy",
]
