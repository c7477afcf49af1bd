"""fifo: one drop-tail queue, first in first out (a plain router buffer; netem's own queue)."""

from __future__ import annotations

from collections import deque

from netem.qdisc.base import Qdisc, Queued


class Fifo(Qdisc):
    name = "fifo"

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(limit_bytes)
        self.queue: deque[Queued] = deque()

    def __len__(self) -> int:
        return len(self.queue)

    def enqueue(self, packet: bytes, at: float) -> None:
        size = len(packet)
        if self.queued_bytes + size > self.limit_bytes:
            self.dropped += 1
            return
        self.queue.append((packet, at))
        self.queued_bytes += size

    def dequeue(self, now: float) -> Queued | None:
        if not self.queue:
            return None
        item = self.queue.popleft()
        self.queued_bytes -= len(item[0])
        return item

    def drain(self) -> list[Queued]:
        items = list(self.queue)
        self.queue.clear()
        self.queued_bytes = 0
        return items
