"""What one direction of a shaped link delivered, interval by interval of the shaper's time.

Two counts per interval, so a host's stalls are told apart from the link's own behaviour:

- `due_bytes`: the bytes whose scheduled exit time (what the element chain computed from the
  link's spec and schedule) falls in the interval. This is what the emulator controls: it
  depends only on the times packets reached the shaper, never on when the shaper ran, so a
  saturated link's due bytes match a replayed delivery trace to within one packet, by
  construction.
- `written_bytes`: the bytes the shaper wrote out during the interval, by the time it wrote
  them. When the process stalls, the packets due meanwhile leave together after it, so bytes
  move from one interval to a later one; `max_lateness_s` (by the interval a packet was due
  in) says how late the latest of them left.

Intervals are `interval_s` wide from `origin` (the schedule's time 0 when one runs), in the
shaper's time (the clock page's when it follows one). Opt-in (`record_interval_s` in the
shaper's config): a measurement run asks for it; it grows with the run's length.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any


class DeliveryRecord:
    def __init__(self, interval_s: float, origin: float) -> None:
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"the record's interval must be positive, got {interval_s}")
        self.interval_s = interval_s
        self.origin = origin
        self.due_bytes: defaultdict[int, int] = defaultdict(int)
        self.written_bytes: defaultdict[int, int] = defaultdict(int)
        self.max_lateness_s: defaultdict[int, float] = defaultdict(float)

    def index(self, at: float) -> int:
        """The interval holding time `at`."""
        return math.floor((at - self.origin) / self.interval_s)

    def count(self, size: int, due: float, written: float) -> None:
        """A packet of `size` bytes due to leave at `due`, written out at `written`."""
        due_index = self.index(due)
        self.due_bytes[due_index] += size
        self.written_bytes[self.index(written)] += size
        if written - due > self.max_lateness_s[due_index]:
            self.max_lateness_s[due_index] = written - due

    def count_released(self, released: list[tuple[bytes, float]], written: float) -> None:
        """Each (packet, due time) of `released`, all written out at `written` (as `count`
        for each)."""
        if not released:
            return
        origin, width = self.origin, self.interval_s
        written_index = math.floor((written - origin) / width)
        due_bytes, lateness = self.due_bytes, self.max_lateness_s
        total = 0
        for packet, due in released:
            size = len(packet)
            total += size
            due_index = math.floor((due - origin) / width)
            due_bytes[due_index] += size
            if written - due > lateness[due_index]:
                lateness[due_index] = written - due
        self.written_bytes[written_index] += total

    def to_dict(self) -> dict[str, Any]:
        """Dense lists from the first interval with traffic (`first`) to the last."""
        indices = [*self.due_bytes, *self.written_bytes]
        if not indices:
            return {"interval_s": self.interval_s, "origin": self.origin, "first": 0}
        first, last = min(indices), max(indices)
        span = range(first, last + 1)
        return {
            "interval_s": self.interval_s,
            "origin": self.origin,
            "first": first,
            "due_bytes": [self.due_bytes.get(i, 0) for i in span],
            "written_bytes": [self.written_bytes.get(i, 0) for i in span],
            "max_lateness_s": [self.max_lateness_s.get(i, 0.0) for i in span],
        }
