"""fq and fq_codel: per-flow fair queueing by 5-tuple, served by deficit round robin.

Each flow (protocol, addresses, ports) has its own queue. The scheduler keeps Linux
fq_codel's two lists: a flow that becomes active joins `new` and is served first, for one
quantum, before it joins the round robin of `old` flows; so a sparse flow (a ping, a small
control message) goes ahead of the bulk flows' standing queues instead of waiting behind them.
When the byte limit is exceeded, the packet at the head of the flow holding the most bytes is
dropped, so one greedy flow cannot push the others out.

`fq` is this with plain per-flow FIFOs; `fq_codel` manages each flow's queue with CoDel.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from netem.packet import FlowKey, flow_key
from netem.qdisc.base import Qdisc, Queued
from netem.qdisc.codel import CodelParams, CodelQueue, FlowQueue


class FairQueue(Qdisc):
    name = "fq"

    def __init__(
        self,
        limit_bytes: int,
        quantum: int,
        new_flow_queue: Callable[[FlowKey], FlowQueue] = FlowQueue,
    ) -> None:
        super().__init__(limit_bytes)
        self.quantum = quantum
        self._new_flow_queue = new_flow_queue
        self.flows: dict[FlowKey, FlowQueue] = {}
        self.new_flows: deque[FlowQueue] = deque()
        self.old_flows: deque[FlowQueue] = deque()
        self.packets = 0
        self.overlimit_dropped = 0

    def __len__(self) -> int:
        return self.packets

    def enqueue(self, packet: bytes, at: float) -> None:
        key = flow_key(packet)
        flow = self.flows.get(key)
        if flow is None:
            flow = self.flows[key] = self._new_flow_queue(key)
        flow.push(packet, at)
        self.packets += 1
        self.queued_bytes += len(packet)
        if not flow.listed:
            flow.listed = True
            flow.deficit = self.quantum
            self.new_flows.append(flow)
        while self.queued_bytes > self.limit_bytes:
            self._drop_from_fattest()

    def _drop_from_fattest(self) -> None:
        fattest = max(self.flows.values(), key=lambda f: f.bytes)
        before = fattest.bytes
        fattest.drop_head()
        self.queued_bytes -= before - fattest.bytes
        self.packets -= 1
        self.dropped += 1
        self.overlimit_dropped += 1

    def dequeue(self, now: float) -> Queued | None:
        while True:
            if self.new_flows:
                flows, is_new = self.new_flows, True
            elif self.old_flows:
                flows, is_new = self.old_flows, False
            else:
                return None
            flow = flows[0]
            if flow.deficit <= 0:
                flow.deficit += self.quantum
                flows.popleft()
                self.old_flows.append(flow)
                continue
            held_packets, held_bytes = len(flow.packets), flow.bytes
            item = flow.pop(now)
            self.packets -= held_packets - len(flow.packets)
            self.queued_bytes -= held_bytes - flow.bytes
            if item is None:  # the flow is empty (perhaps after CoDel's drops)
                self.dropped += held_packets
                flows.popleft()
                if is_new and self.old_flows:
                    self.old_flows.append(flow)  # one more pass, so it cannot jump ahead again
                else:
                    self._forget(flow)
                continue
            self.dropped += held_packets - len(flow.packets) - 1
            flow.deficit -= len(item[0])
            return item

    def _forget(self, flow: FlowQueue) -> None:
        flow.listed = False
        del self.flows[flow.key]

    def drain(self) -> list[Queued]:
        items = sorted(
            (item for flow in self.flows.values() for item in flow.packets), key=lambda i: i[1]
        )
        self.flows.clear()
        self.new_flows.clear()
        self.old_flows.clear()
        self.packets = 0
        self.queued_bytes = 0
        return items

    def counters(self) -> dict[str, Any]:
        return {
            **super().counters(),
            "flows": len(self.flows),
            "overlimit_dropped": self.overlimit_dropped,
        }


class FqCodel(FairQueue):
    name = "fq_codel"

    def __init__(self, limit_bytes: int, quantum: int, params: CodelParams) -> None:
        self.params = params
        super().__init__(limit_bytes, quantum, lambda key: CodelQueue(key, params))

    def counters(self) -> dict[str, Any]:
        return {
            **super().counters(),
            "codel_dropped": self.params.dropped,
            "ecn_marked": self.params.marked,
        }
