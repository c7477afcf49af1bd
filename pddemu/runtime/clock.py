"""Modelled time: the emulator runs `time_scale` times faster than the system it models.

Every process of a run shares one epoch on CLOCK_MONOTONIC (system-wide on Linux), so modelled
timestamps taken in different processes compare directly. Steps are scheduled on the modelled
time line (start + modelled duration), never on "now + duration", so a late wake-up does not
push every later step back: it shows as lag and is reported.
"""

from __future__ import annotations

import asyncio
import time


class ModelledClock:
    def __init__(self, epoch: float, time_scale: float) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self.epoch = epoch
        self.time_scale = time_scale

    def now(self) -> float:
        """Modelled seconds since the run's epoch."""
        return (time.monotonic() - self.epoch) * self.time_scale

    def wall_at(self, modelled: float) -> float:
        return self.epoch + modelled / self.time_scale

    async def sleep_until(self, modelled: float) -> float:
        """Sleep until the modelled instant; returns how late (modelled seconds) it woke."""
        delay = self.wall_at(modelled) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        return max(0.0, self.now() - modelled)
