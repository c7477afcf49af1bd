"""Exceptions of the model package: one base class so callers can catch any bad model input."""

from __future__ import annotations


class ModelError(ValueError):
    """Bad input to the tiny transformer (token ids, past KV, chunk size, ...)."""


class ConfigError(ModelError):
    """A `ModelConfig` field has an invalid value; the message names the field."""


class KVError(ModelError):
    """A KV tensor or KV operation does not fit (shape, dtype, range)."""


class TokenizerError(ModelError):
    """Token ids or text the byte tokenizer cannot handle."""
