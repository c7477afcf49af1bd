"""The router's view of the WAN: how long a new KV increment would take to reach MD now.

predicted = correction x (one-way delay + (bytes already in flight + increment) / capacity)

The in-flight bytes stand for the queueing the increment meets (TCP flows share the link, so
what is in flight delays everyone); `capacity` is the configured modelled rate, and the
correction factor is an exponentially weighted mean of measured / uncorrected predicted time
over completed transfers (measured at MD, from the first to the last KV byte, so P's queueing
and MD's admission do not count), so jitter, loss and TCP's own inefficiency feed back into
the next decision: "the link's current measured goodput".
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
    _open: dict[str, tuple[float, float]] = field(default_factory=dict)  # rid -> (bytes, raw)

    def raw(self, increment_bytes: float) -> float:
        """The uncorrected prediction: delay plus everything in flight and the increment at
        the configured rate."""
        return (
            self.one_way_delay_s
            + 8.0 * (self.in_flight_bytes + increment_bytes) / self.capacity_bps
        )

    def predict(self, increment_bytes: float) -> float:
        """Modelled seconds for `increment_bytes` (modelled) to arrive, if sent now."""
        return self.correction * self.raw(increment_bytes)

    def started(self, rid: str, increment_bytes: float) -> None:
        self._open[rid] = (increment_bytes, self.raw(increment_bytes))
        self.in_flight_bytes += increment_bytes

    def arrived(self, rid: str, transfer_s: float) -> None:
        """The transfer took `transfer_s` on the WAN (MD's first to last KV byte, so P's
        queueing and MD's admission are not counted)."""
        opened = self._open.pop(rid, None)
        if opened is None:
            return
        size, raw = opened
        self.in_flight_bytes = max(0.0, self.in_flight_bytes - size)
        if raw > 0 and transfer_s > 0:
            ratio = min(MAX_CORRECTION, max(MIN_CORRECTION, transfer_s / raw))
            self.correction += self.smoothing * (ratio - self.correction)

    def forget(self, rid: str) -> None:
        """A transfer that will not arrive (cancelled or failed)."""
        opened = self._open.pop(rid, None)
        if opened is not None:
            self.in_flight_bytes = max(0.0, self.in_flight_bytes - opened[0])
