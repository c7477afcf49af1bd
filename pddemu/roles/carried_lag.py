"""Each request's share of an instance's step lag, kept for the most recent requests only.

A step that ends late makes every request in it carry that lateness (`Instance.finish_step`);
`pddemu serve` sums it per request over the instances and counts the requests whose recorded
times carry more of it than emulate's bound (`pddemu.serve.served_summary`). A serve runs as
long as its user wants, so the instance keeps the legs it saw last: at most `capacity`, the one
touched longest ago dropped first (a leg still in steps is touched at every late one, so what
is dropped is a request long finished), and it says how many it dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

# Legs kept per instance: hundreds of times the requests one instance holds at once (a leg
# dropped while its request is still in flight would need thousands of later legs in between),
# and a few hundred kB of stats.
CARRIED_LEGS = 4096


class CarriedLag(OrderedDict[str, float]):
    """Leg id -> modelled seconds of step lag carried, least recently carried first."""

    def __init__(self, capacity: int = CARRIED_LEGS) -> None:
        super().__init__()
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.dropped = 0  # legs forgotten to keep within the capacity

    def carry(self, legs: Iterable[str], lag: float) -> None:
        """Each of `legs` was in a step that ended `lag` late."""
        for leg in legs:
            self[leg] = self.pop(leg, 0.0) + lag  # re-inserted: now the most recent
            if len(self) > self.capacity:
                self.popitem(last=False)
                self.dropped += 1
