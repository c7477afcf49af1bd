"""Chained page hashes: a prompt's prefix of whole pages named by 8 bytes, as vLLM's and
SGLang's prefix caches key their blocks, so that the router can name a prefix to the decode
side without its token ids (the `match`), and the decode side can tell which prefix it is.

The hash of page k covers the hash of page k - 1 and page k's ids, so it names the whole prefix
up to page k. 64-bit BLAKE2b: two different prefixes share a hash with a probability of about
n² / 2⁶⁵ for n prefixes known (10⁻⁹ for the 203,116 distinct prefixes of pdd-janfeb's 2,000
requests at the default page).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from hashlib import blake2b

import numpy as np

HASH_BYTES = 8
_ID_DTYPE = np.dtype("<i4")


def chained_page_hashes(ids: Sequence[int] | np.ndarray, page_tokens: int) -> list[int]:
    """The hash of each whole page's prefix of `ids`, in order (a last partial page has none)."""
    data = np.asarray(ids, dtype=_ID_DTYPE).tobytes()
    step = page_tokens * _ID_DTYPE.itemsize
    hashes: list[int] = []
    digest = b""
    for start in range(0, len(data) - step + 1, step):
        digest = blake2b(digest + data[start : start + step], digest_size=HASH_BYTES).digest()
        hashes.append(int.from_bytes(digest, "big"))
    return hashes


def hash_text(value: int) -> str:
    """A hash as it crosses the wire (JSON): 16 hexadecimal digits."""
    return f"{value:0{2 * HASH_BYTES}x}"


def parse_hash(text: object) -> int:
    """A hash from the wire; ValueError naming what is wrong."""
    if not isinstance(text, str) or len(text) != 2 * HASH_BYTES:
        raise ValueError(f"a page hash is {2 * HASH_BYTES} hexadecimal digits, got {text!r:.40}")
    try:
        return int(text, 16)
    except ValueError:
        raise ValueError(f"a page hash is hexadecimal digits, got {text!r:.40}") from None


class PrefixIndex:
    """Chained page hash -> the ids of the prefix it names, for every prefix of every prompt
    added (the decode side adds each prompt whose KV began to come: whatever its DRC holds
    is a prefix of one of those). A prefix shared by several prompts is kept once; the
    entries share their prompt's id array. Kept for the instance's life: its DRC may hold a
    prompt's first pages long after the prompt (the pages are touched by later hits)."""

    def __init__(self, page_tokens: int) -> None:
        self.page_tokens = page_tokens
        self.prefixes: dict[int, tuple[np.ndarray, int]] = {}  # hash -> (ids, whole pages)

    def add(self, ids: Sequence[int]) -> None:
        array = np.asarray(ids, dtype=_ID_DTYPE)
        for pages, value in enumerate(chained_page_hashes(array, self.page_tokens), 1):
            self.prefixes.setdefault(value, (array, pages))

    def longest(self, named: Iterable[tuple[int, int]]) -> list[int]:
        """The ids of the longest prefix known among `named`, (tokens, hash) pairs; [] if it
        knows none."""
        best: tuple[np.ndarray, int] | None = None
        for tokens, value in named:
            entry = self.prefixes.get(value)
            if entry is None or entry[1] * self.page_tokens != tokens:
                continue  # not known here (or a hash of a prefix of another length)
            if best is None or entry[1] > best[1]:
                best = entry
        if best is None:
            return []
        array, pages = best
        return array[: pages * self.page_tokens].tolist()

    def __len__(self) -> int:
        return len(self.prefixes)
