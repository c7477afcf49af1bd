"""Resource caps a receiver enforces before it allocates anything for a frame.

A header is tiny and arrives first; every cap here is checked against the sizes it announces, so a
frame claiming gigabytes is refused from its first 28 bytes instead of after a failed allocation.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Caps on one frame; the defaults suit the emulator's chunks (a few MiB) with ample margin."""

    max_frame_bytes: int = 256 * MIB
    """Whole frame on the wire: prefix, metadata and (possibly compressed) payload."""
    max_tensor_bytes: int = 256 * MIB
    """A KV chunk's tensor after decompression; also bounds what zstd may inflate to."""
    max_control_body_bytes: int = 64 * 1024
    """A control message's UTF-8 JSON body."""
    max_token_ids: int = 1 << 20
    """Ids in one token-ID batch."""

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"Limits.{field.name} must be a positive int, got {value!r}")


DEFAULT_LIMITS = Limits()
