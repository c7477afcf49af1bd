"""Chained page hashes: a prompt's prefix of whole pages named by 8 bytes, as vLLM's and
SGLang's prefix caches key their blocks, so that the router can name a prefix to the decode
side without its token ids (the `match`), and the decode side can tell which prefix it is.

The hash of page k covers the hash of page k - 1 and page k's ids, so it names the whole prefix
up to page k. 64-bit BLAKE2b: two different prefixes share a hash with a probability of about
n² / 2⁶⁵ for n prefixes known (10⁻⁹ for the 203,116 distinct prefixes of pdd-janfeb's 2,000
requests at the default page).
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Iterable, Sequence
from hashlib import blake2b
from typing import Any

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
    """Chained page hash -> the ids of the prefix it names, for the prefixes the router may
    name that the decode side may hold, and the changes to its DRC the router must hear of.

    A prefix is held while the DRC holds its last page (`stored`, until `evicted`) or while a
    prompt whose KV is coming holds it (`hold`, from its `kv_begin` until `let_go`: a transfer
    cut mid-way keeps a part of it, the prompt's longer prefixes the router may still name).
    One let go of by all is forgotten only once the router has heard the report that says so
    (`heard`): until then the router may still name it, and the hit must still count it.

    The router's record (`RoutedPrompts`) mirrors the DRC's pages from the reports: `kept`, the
    part of a prompt its DRC took in; `evicted`, the pages its DRC dropped, in the order they
    happened. So the entries are the DRC's pages (its capacity in pages), the prompts on their
    way, and the pages dropped since the router's last report heard (a round trip's worth)."""

    def __init__(self, page_tokens: int) -> None:
        self.page_tokens = page_tokens
        # hash -> [ids, whole pages, holds, the report after which it may be forgotten]
        self.prefixes: dict[int, list] = {}
        # this process's reports: a restarted one's differ (one the same as the process's
        # before would have the router skip its reports as applied: a 2^-64 chance)
        self.since = secrets.token_hex(8)
        self.reports = 0  # numbered from 1, in the order sent
        self.changes: list[list] = []  # for the next report
        self.doomed: deque[tuple[int, int]] = deque()  # (report, hash) let go of by all
        self.unheard: deque[dict[str, Any]] = deque()  # reports made, not yet acknowledged

    def hold(self, ids: Sequence[int]) -> list[int]:
        """Hold every whole page's prefix of `ids` (a prompt whose KV is coming); returns their
        hashes, for `let_go` and the DRC's insert."""
        array = np.asarray(ids, dtype=_ID_DTYPE)
        hashes = chained_page_hashes(array, self.page_tokens)
        for pages, value in enumerate(hashes, 1):
            entry = self.prefixes.get(value)
            if entry is None:
                self.prefixes[value] = [array, pages, 1, 0]
            else:
                entry[2] += 1
        return hashes

    def let_go(self, hashes: Iterable[int]) -> None:
        for value in hashes:
            entry = self.prefixes[value]
            entry[2] -= 1
            if entry[2] == 0:  # the router hears of it with the next report
                entry[3] = self.reports + 1
                self.doomed.append((entry[3], value))

    def stored(self, hashes: Sequence[int]) -> None:
        """The DRC took in pages (new ones: those it held already are held once): each is
        held while there."""
        for value in hashes:
            self.prefixes[value][2] += 1

    def evicted(self, hashes: Sequence[int]) -> None:
        """The DRC dropped these pages (a leaf's last ones, in their order): reported as the
        last one's hash and their count (the router follows its record of them up the path)."""
        self.let_go(hashes)
        self.changes.append(["evicted", hash_text(hashes[-1]), len(hashes)])

    def kept(self, rid: str, tokens: int) -> None:
        """The first `tokens` of the request's prompt are about to enter the DRC (0: none will,
        its KV came or was cut short of a page, or it was let go before it came)."""
        self.changes.append(["kept", rid, tokens])

    def report(self) -> dict[str, Any] | None:
        """The changes since the last report, numbered for the router's `heard`; None if none."""
        if not self.changes:
            return None
        self.reports += 1
        changes, self.changes = self.changes, []
        body = {"since": self.since, "report": self.reports, "changes": changes}
        self.unheard.append(body)
        return body

    def heard(self, since: str, report: int) -> None:
        """The router has applied this process's reports up to `report` (a match says so):
        what they let go of, it names no more, and they need not be sent again (`unheard`:
        those after it, sent again when one may not have reached it)."""
        if since != self.since:
            return  # another process's (the one before a restart)
        while self.unheard and self.unheard[0]["report"] <= report:
            self.unheard.popleft()
        while self.doomed and self.doomed[0][0] <= report:
            _, value = self.doomed.popleft()
            entry = self.prefixes.get(value)
            if entry is not None and entry[2] == 0 and entry[3] <= report:
                del self.prefixes[value]

    def longest(self, named: Iterable[tuple[int, int]]) -> list[int]:
        """The ids of the longest prefix known among `named`, (tokens, hash) pairs; [] if it
        knows none."""
        best: list | None = None
        for tokens, value in named:
            entry = self.prefixes.get(value)
            if entry is None or entry[1] * self.page_tokens != tokens:
                continue  # not known here (or a hash of a prefix of another length)
            if best is None or entry[1] > best[1]:
                best = entry
        if best is None:
            return []
        return best[0][: best[1] * self.page_tokens].tolist()

    def __len__(self) -> int:
        return len(self.prefixes)
