"""prio: strict priority bands chosen by the packet's DSCP class.

Three bands, like Linux's prio with its default three: the link always sends from the highest
non-empty band. The band is read from the DSCP precedence (the class selector, DSCP >> 3):

    band 0  precedence 4-7  CS4-CS7, AF4x, EF       real time, network control
    band 1  precedence 2-3  CS2, CS3, AF2x, AF3x     low-latency data, signalling (pddemu's
                                                     control and token-id connections: AF21)
    band 2  precedence 0-1  best effort, CS1, AF1x   everything else (pddemu's bulk KV: AF11)

Bands 0 and 1 are FIFOs; band 2, where bulk traffic and unmarked cross-traffic share the link,
is a fifo, fq or fq_codel (`prio`, `prio:fq`, `prio:fq_codel`). Each band has the whole byte
limit, as each of Linux prio's children has its own.
"""

from __future__ import annotations

from typing import Any

from netem.packet import dscp
from netem.qdisc.base import Qdisc, Queued

BANDS = 3


def band_of(packet: bytes) -> int:
    precedence = dscp(packet) >> 3
    if precedence >= 4:
        return 0
    if precedence >= 2:
        return 1
    return 2


class Prio(Qdisc):
    name = "prio"

    def __init__(self, bands: list[Qdisc]) -> None:
        super().__init__(sum(band.limit_bytes for band in bands))
        if len(bands) != BANDS:
            raise ValueError(f"prio has {BANDS} bands, got {len(bands)}")
        self.bands = bands
        self.name = f"prio:{bands[-1].name}"
        self.enqueued = [0] * BANDS

    def __len__(self) -> int:
        return sum(len(band) for band in self.bands)

    def resize(self, limit_bytes: int) -> None:
        for band in self.bands:
            band.resize(limit_bytes)
        self.limit_bytes = limit_bytes * BANDS

    def enqueue(self, packet: bytes, at: float) -> None:
        index = band_of(packet)
        band = self.bands[index]
        held, dropped = band.queued_bytes, band.dropped
        band.enqueue(packet, at)
        self.enqueued[index] += 1
        self.queued_bytes += band.queued_bytes - held
        self.dropped += band.dropped - dropped

    def dequeue(self, now: float) -> Queued | None:
        for band in self.bands:
            if len(band):
                held, dropped = band.queued_bytes, band.dropped
                item = band.dequeue(now)
                self.queued_bytes += band.queued_bytes - held
                self.dropped += band.dropped - dropped
                if item is not None:
                    return item
        return None

    def drain(self) -> list[Queued]:
        items = sorted((item for band in self.bands for item in band.drain()), key=lambda i: i[1])
        self.queued_bytes = 0
        return items

    def counters(self) -> dict[str, Any]:
        return {
            **super().counters(),
            "band_packets": list(self.enqueued),
            "bands": [band.counters() for band in self.bands],
        }
