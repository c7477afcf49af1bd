"""Byte-level tokenizer: every UTF-8 byte is a token, plus BOS and EOS.

Needs no vocabulary file and round-trips any text, which is all the HTTP front end needs from a
model whose weights are random. Generation (`pddemu.model.greedy`) chooses only `TEXT_IDS`, so
generated text is valid UTF-8 and re-encoding it gives back exactly the generated ids.
"""

from __future__ import annotations

import codecs
import operator
from collections.abc import Sequence

from pddemu.model.errors import TokenizerError

BYTE_IDS = 256
BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258
# The ids generation may choose: tab, newline and printable ASCII. Each is valid UTF-8 text on
# its own, so generated text always decodes, and re-tokenizing it gives back the same ids.
TEXT_IDS = (0x09, 0x0A, *range(0x20, 0x7F))


class ByteTokenizer:
    """text <-> token ids; ids 0..255 are bytes, every id above is a special (BOS, EOS, unused).

    `vocab_size` is the model's (at least 258); ids beyond the specials decode to nothing.
    `text_ids` are the ids generation may produce.
    """

    bos_id = BOS_ID
    eos_id = EOS_ID
    text_ids = TEXT_IDS

    def __init__(self, vocab_size: int = VOCAB_SIZE) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
            raise TokenizerError(f"vocab_size must be an int, got {vocab_size!r}")
        if vocab_size < VOCAB_SIZE:
            raise TokenizerError(f"vocab_size must be at least {VOCAB_SIZE}, got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        """BOS followed by the UTF-8 bytes of `text`."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode needs a str, got {type(text).__name__}")
        return [BOS_ID, *text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of the byte ids; specials are skipped, invalid UTF-8 becomes U+FFFD."""
        return bytes(_byte_ids(ids, self.vocab_size)).decode("utf-8", errors="replace")

    def stream_decoder(self) -> StreamDecoder:
        """A decoder for tokens arriving a few at a time (a streamed response)."""
        return StreamDecoder(self.vocab_size)


class StreamDecoder:
    """Turns a token stream into text pieces, holding back a multi-byte character until complete.

    The pieces of `push` calls followed by `finish()` concatenate to `ByteTokenizer.decode` of
    the whole stream, so a streamed response never shows a split character.
    """

    def __init__(self, vocab_size: int) -> None:
        self._vocab_size = vocab_size
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: Sequence[int]) -> str:
        """Text completed by these ids (possibly empty)."""
        return self._utf8.decode(bytes(_byte_ids(ids, self._vocab_size)))

    def finish(self) -> str:
        """Flush a trailing incomplete character (as U+FFFD)."""
        return self._utf8.decode(b"", final=True)


def _byte_ids(ids: Sequence[int], vocab_size: int) -> list[int]:
    """The byte ids among `ids`, after checking every id is an integer in the vocabulary."""
    out = []
    for raw in ids:
        try:
            i = operator.index(raw)
        except TypeError:
            raise TokenizerError(f"token id must be an integer, got {raw!r}") from None
        if not 0 <= i < vocab_size:
            raise TokenizerError(f"token id {i} is outside [0, {vocab_size})")
        if i < BYTE_IDS:
            out.append(i)
    return out
