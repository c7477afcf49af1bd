"""What an instance did and when, for timelines (`pddemu export --format perfetto`).

An instance records a few spans per request (prefill chunks, KV transfers as received, its
decode of the request) in modelled seconds; `/stats` hands them to the run's files
(`instances-<system>.json`). Times are passed in by the caller, never read here.

A `pddemu serve` runs without end, so the log keeps the most recent `capacity` events (every
event of an emulate run of up to about ten thousand requests per instance) and counts those it
dropped, oldest first (`dropped`; `/stats`' `events_dropped`); spans opened and never ended
(their request failed) are kept for the most recent `capacity` only.
"""

from __future__ import annotations

from collections import deque
from typing import Any

EVENT_CAPACITY = 65_536  # events kept per instance: a few tens of MB at most


class EventLog:
    """Spans and instants of one instance, as plain JSON-able dicts."""

    def __init__(self, capacity: int = EVENT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.events: deque[dict[str, Any]] = deque(maxlen=capacity)
        self.dropped = 0  # events forgotten, oldest first, to stay within the capacity
        self._open: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}

    def record(self, kind: str, rid: str, start_s: float, end_s: float, **detail: Any) -> None:
        """A span [start_s, end_s] (an instant when they are equal) of `kind` for request `rid`."""
        if len(self.events) == self.capacity:
            self.dropped += 1
        self.events.append({"kind": kind, "rid": rid, "start_s": start_s, "end_s": end_s, **detail})

    def begin(self, kind: str, rid: str, at_s: float, **detail: Any) -> None:
        """Open a span ended by `end` (a second begin of an open span keeps the first)."""
        self._open.setdefault((kind, rid), (at_s, detail))
        if len(self._open) > self.capacity:
            del self._open[next(iter(self._open))]  # the longest open: its request is long gone

    def end(self, kind: str, rid: str, at_s: float, **detail: Any) -> None:
        """Close the span `begin` opened (nothing when none is open)."""
        opened = self._open.pop((kind, rid), None)
        if opened is not None:
            start, first = opened
            self.record(kind, rid, start, at_s, **first, **detail)
