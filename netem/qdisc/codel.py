"""CoDel (RFC 8289): drop at the head of a queue when its packets have waited longer than
`target` for at least `interval`, more often the longer that lasts.

Unlike a drop-tail limit, CoDel looks at sojourn time (how long the packet being sent waited),
so a standing queue is drained while a burst that passes quickly is left alone. Drops happen
at dequeue, at spacings of interval/sqrt(count); an ECN-capable packet is marked
Congestion Experienced instead of dropped, as Linux's fq_codel does by default.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from netem.packet import FlowKey, ecn_capable, mark_congestion
from netem.qdisc.base import Queued

DEFAULT_TARGET_S = 0.005  # Linux's and the RFC's defaults
DEFAULT_INTERVAL_S = 0.100


@dataclass
class CodelParams:
    target_s: float = DEFAULT_TARGET_S
    interval_s: float = DEFAULT_INTERVAL_S
    mtu: int = 1500  # a queue holding at most one packet is never "above target"
    ecn: bool = True
    dropped: int = 0  # counters shared by every queue using these parameters
    marked: int = 0


class FlowQueue:
    """One flow's packets, first in first out, and its deficit for round robin."""

    def __init__(self, key: FlowKey) -> None:
        self.key = key
        self.packets: deque[Queued] = deque()
        self.bytes = 0
        self.deficit = 0
        self.listed = False  # in the scheduler's new or old list

    def push(self, packet: bytes, at: float) -> None:
        self.packets.append((packet, at))
        self.bytes += len(packet)

    def _take(self) -> Queued:
        item = self.packets.popleft()
        self.bytes -= len(item[0])
        return item

    def pop(self, now: float) -> Queued | None:
        return self._take() if self.packets else None

    def drop_head(self) -> None:
        self._take()


class CodelQueue(FlowQueue):
    """A flow queue managed by CoDel's control law (the RFC's state machine)."""

    def __init__(self, key: FlowKey, params: CodelParams) -> None:
        super().__init__(key)
        self.params = params
        self.first_above: float | None = None  # when sojourn time has been above target long enough
        self.drop_next = 0.0
        self.count = 0
        self.last_count = 0
        self.dropping = False

    def _control_law(self, t: float) -> float:
        return t + self.params.interval_s / math.sqrt(self.count)

    def _dequeue(self, now: float) -> tuple[Queued | None, bool]:
        """The head packet and whether CoDel may drop it (sojourn above target for an interval)."""
        if not self.packets:
            self.first_above = None
            return None, False
        item = self.packets.popleft()  # _take(), inlined: once a packet
        self.bytes -= len(item[0])
        params = self.params
        if now - item[1] < params.target_s or self.bytes <= params.mtu:
            self.first_above = None
            return item, False
        if self.first_above is None:
            self.first_above = now + params.interval_s
            return item, False
        return item, now >= self.first_above

    def _signal(self, item: Queued) -> Queued | None:
        """Congestion signal for `item`: marked and kept when ECN-capable, dropped otherwise."""
        if self.params.ecn and ecn_capable(item[0]):
            self.params.marked += 1
            return mark_congestion(item[0]), item[1]
        self.params.dropped += 1
        return None

    def pop(self, now: float) -> Queued | None:
        item, ok_to_drop = self._dequeue(now)
        if item is None:
            self.dropping = False
            return None
        if self.dropping:
            if not ok_to_drop:
                self.dropping = False
            while self.dropping and now >= self.drop_next:
                self.count += 1
                kept = self._signal(item)
                if kept is not None:
                    self.drop_next = self._control_law(self.drop_next)
                    return kept
                item, ok_to_drop = self._dequeue(now)
                if item is None or not ok_to_drop:
                    self.dropping = False
                else:
                    self.drop_next = self._control_law(self.drop_next)
            return item
        if ok_to_drop:
            # Enter the dropping state; resume near the previous drop rate if that was recent.
            delta = self.count - self.last_count
            recent = delta > 1 and now - self.drop_next < 16 * self.params.interval_s
            self.count = delta if recent else 1
            self.last_count = self.count
            self.dropping = True
            self.drop_next = self._control_law(now)
            kept = self._signal(item)
            if kept is not None:
                return kept
            item, _ = self._dequeue(now)
        return item
