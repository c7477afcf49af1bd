"""Link up/down: while down, every packet is dropped (a pulled cable, a link flap)."""

from __future__ import annotations

from netem.elements.base import Element


class Gate(Element):
    def __init__(self, up: bool = True) -> None:
        super().__init__()
        self.up = up

    def push(self, packet: bytes, at: float) -> None:
        if self.up:
            self.passed += 1
            self.downstream.push(packet, at)  # type: ignore[union-attr]
        else:
            self.dropped += 1

    def push_many(self, packets: list[bytes], at: float) -> None:
        if self.up:
            self.passed += len(packets)
            self.downstream.push_many(packets, at)  # type: ignore[union-attr]
        else:
            self.dropped += len(packets)
