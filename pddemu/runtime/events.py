"""What an instance did and when, for timelines (`pddemu export --format perfetto`).

An instance records a few spans per request (prefill chunks, KV transfers as received, its
decode of the request) in modelled seconds; `/stats` hands them to the run's files
(`instances-<system>.json`). Times are passed in by the caller, never read here.
"""

from __future__ import annotations

from typing import Any


class EventLog:
    """Spans and instants of one instance, as plain JSON-able dicts."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._open: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}

    def record(self, kind: str, rid: str, start_s: float, end_s: float, **detail: Any) -> None:
        """A span [start_s, end_s] (an instant when they are equal) of `kind` for request `rid`."""
        self.events.append({"kind": kind, "rid": rid, "start_s": start_s, "end_s": end_s, **detail})

    def begin(self, kind: str, rid: str, at_s: float, **detail: Any) -> None:
        """Open a span ended by `end` (a second begin of an open span keeps the first)."""
        self._open.setdefault((kind, rid), (at_s, detail))

    def end(self, kind: str, rid: str, at_s: float, **detail: Any) -> None:
        """Close the span `begin` opened (nothing when none is open)."""
        opened = self._open.pop((kind, rid), None)
        if opened is not None:
            start, first = opened
            self.record(kind, rid, start, at_s, **first, **detail)
