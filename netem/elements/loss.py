"""Random loss: independent (Bernoulli) or Gilbert-Elliott bursts, as netem's gemodel."""

from __future__ import annotations

import random

from netem.elements.base import Element
from netem.spec import LossModel


class LossProcess(Element):
    def __init__(self, model: LossModel, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng
        self.bad_state = False
        self.model = model

    @property
    def model(self) -> LossModel:
        return self._model

    @model.setter
    def model(self, model: LossModel) -> None:
        self._model = model
        self._kind = model.kind

    def _lost(self) -> bool:
        model = self._model
        if self._kind == "bernoulli":
            return self.rng.random() < model.p
        # Gilbert-Elliott: the loss draw uses the current state, then the state moves.
        rng = self.rng
        if self.bad_state:
            lost = rng.random() < model.loss_bad
            if rng.random() < model.r:
                self.bad_state = False
        else:
            lost = model.loss_good > 0 and rng.random() < model.loss_good
            if rng.random() < model.p:
                self.bad_state = True
        return lost

    def push(self, packet: bytes, at: float) -> None:
        if self._kind != "none" and self._lost():
            self.dropped += 1
            return
        self.passed += 1
        self.downstream.push(packet, at)  # type: ignore[union-attr]

    def push_many(self, packets: list[bytes], at: float) -> None:
        if self._kind != "none":
            # One at a time: the delay line's jitter draws from the same generator, and the
            # draws must interleave as they would with one push per packet.
            super().push_many(packets, at)
            return
        self.passed += len(packets)
        self.downstream.push_many(packets, at)  # type: ignore[union-attr]
