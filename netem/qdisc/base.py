"""The interface every queueing discipline of the shaper's bottleneck implements.

A discipline holds the packets waiting for the link and decides two things: which packet the
link sends next (`dequeue`) and which packets are dropped (on arrival when full, or at dequeue
for an active queue manager such as CoDel). The rate queue asks it for a packet whenever the
link falls idle, passing the time the transmission starts; disciplines never read a clock.
"""

from __future__ import annotations

from typing import Any

Queued = tuple[bytes, float]  # a packet and the time it arrived at the queue


class Qdisc:
    """A queueing discipline with a byte limit on what it holds."""

    name = "?"

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.queued_bytes = 0
        self.dropped = 0  # packets this discipline dropped, for whatever reason

    def __len__(self) -> int:
        raise NotImplementedError

    def resize(self, limit_bytes: int) -> None:
        """A new byte limit, for arrivals from now on (nothing held is dropped for it)."""
        self.limit_bytes = limit_bytes

    def enqueue(self, packet: bytes, at: float) -> None:
        """Take a packet that arrived at `at`; drop it (or another one) when over the limit."""
        raise NotImplementedError

    def dequeue(self, now: float) -> Queued | None:
        """The packet whose transmission starts at `now`, with its arrival time; None when
        nothing is left (an active queue manager may drop packets on the way)."""
        raise NotImplementedError

    def drain(self) -> list[Queued]:
        """Remove and return everything held, in arrival order (to hand it to another
        discipline on a live change)."""
        raise NotImplementedError

    def clear(self) -> int:
        """Drop everything held (the link went down); returns how many packets."""
        held = self.drain()
        self.dropped += len(held)
        return len(held)

    def counters(self) -> dict[str, Any]:
        return {"qdisc": self.name, "dropped": self.dropped, "queued_packets": len(self)}
