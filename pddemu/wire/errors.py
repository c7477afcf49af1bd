"""Every way a frame or a message can be wrong, as one exception hierarchy.

A peer that sends a bad frame is a fact of life on a network: callers catch `WireError` once and
drop the connection, while the subclass and its message say exactly which field was wrong and why.
"""

from __future__ import annotations


class WireError(ValueError):
    """A frame or message that does not follow the wire format."""


class BadMagic(WireError):
    """The frame does not start with the format's magic bytes (not a pddemu peer, or desync)."""


class BadVersion(WireError):
    """The frame's format version is not one this code speaks."""


class BadKind(WireError):
    """The frame announces a message kind that does not exist."""


class BadFlags(WireError):
    """Unknown flag bits, or a flag set on a kind that does not support it."""


class TooLarge(WireError):
    """A length or size exceeds a cap of `Limits` (checked before anything is allocated)."""


class Truncated(WireError):
    """The frame or the stream ends before the announced number of bytes."""


class TrailingBytes(WireError):
    """A buffer holds more bytes than the one frame it should contain."""


class BadChecksum(WireError):
    """A CRC-32 over the header or the payload does not match its content."""


class BadField(WireError):
    """A header or metadata field has a value outside its domain (request id, range, dtype...)."""


class BadShape(WireError):
    """A tensor's shape or dtype disagrees with its ranges or with the payload length."""


class BadCompression(WireError):
    """A compressed payload is corrupt or does not inflate to exactly the declared size."""


class BadTokenIds(WireError):
    """A token-ID batch holds a negative id."""


class BadControl(WireError):
    """A control message's kind or JSON body is malformed."""


class EndOfStream(EOFError):
    """The stream closed cleanly between two frames: not a wire error, the peer is done."""
