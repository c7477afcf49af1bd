"""The router's view of the WAN: how long a new KV increment would take to reach MD now.

predicted = correction x (one-way delay + (bytes already in flight + increment) / capacity)

The in-flight bytes stand for the queueing the increment meets (TCP flows share the link, so
what is in flight delays everyone); `capacity` starts at the configured modelled rate and the
correction factor is an exponentially weighted mean of measured / predicted over completed
transfers, so jitter, loss and TCP's own inefficiency feed back into the next decision: "the
link's current measured goodput".
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_CORRECTION = 0.5
MAX_CORRECTION = 20.0


@dataclass
class WanEstimator:
    capacity_bps: float  # modelled bytes are counted in bits here
    one_way_delay_s: float
    smoothing: float = 0.2
    correction: float = 1.0
    in_flight_bytes: float = 0.0
    _open: dict[str, tuple[float, float, float]] = field(
        default_factory=dict
    )  # rid -> (bytes, start, predicted)

    def predict(self, increment_bytes: float) -> float:
        """Modelled seconds for `increment_bytes` (modelled) to arrive, if sent now."""
        raw = (
            self.one_way_delay_s
            + 8.0 * (self.in_flight_bytes + increment_bytes) / self.capacity_bps
        )
        return self.correction * raw

    def started(self, rid: str, increment_bytes: float, now: float) -> None:
        self._open[rid] = (increment_bytes, now, self.predict(increment_bytes))
        self.in_flight_bytes += increment_bytes

    def arrived(self, rid: str, now: float) -> None:
        opened = self._open.pop(rid, None)
        if opened is None:
            return
        size, start, predicted = opened
        self.in_flight_bytes = max(0.0, self.in_flight_bytes - size)
        if predicted > 0 and now > start:
            ratio = (now - start) / (predicted / self.correction)
            ratio = min(MAX_CORRECTION, max(MIN_CORRECTION, ratio))
            self.correction += self.smoothing * (ratio - self.correction)

    def forget(self, rid: str) -> None:
        """A transfer that will not arrive (cancelled or failed)."""
        opened = self._open.pop(rid, None)
        if opened is not None:
            self.in_flight_bytes = max(0.0, self.in_flight_bytes - opened[0])
