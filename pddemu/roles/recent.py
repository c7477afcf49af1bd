"""Request ids an instance remembers after the request is over here, for the messages that may
still come for it (a KV transfer that was on its way, a late release or `md_ready`): a record of
the most recent ones, the oldest forgotten beyond a bound, so that a run without end (serve)
keeps a bounded memory. Such a message trails its request's end by a network delay and a
reading, while an entry is forgotten only after `KEPT` later ones: thousands of requests
ending here in between."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

V = TypeVar("V")
KEPT = 4096


class Recent(OrderedDict[str, V]):
    """The `kept` most recently added entries, by request id, in the order they came."""

    def __init__(self, kept: int = KEPT) -> None:
        super().__init__()
        self.kept = kept

    def __setitem__(self, rid: str, value: V) -> None:
        super().__setitem__(rid, value)
        if len(self) > self.kept:
            self.popitem(last=False)

    def add(self, rid: str) -> None:
        """Remember `rid` (as a set would)."""
        self[rid] = None  # type: ignore[assignment]

    def discard(self, rid: str) -> None:
        self.pop(rid, None)

    def copy(self) -> Recent[V]:
        """The same entries, with the same bound (OrderedDict's would pass them as the bound)."""
        made: Recent[V] = Recent(self.kept)
        made.update(self)
        return made
