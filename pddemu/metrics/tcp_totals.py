"""TCP_INFO counters of a sender's KV transfers, summed per path as they are made.

A `pddemu serve` makes KV transfers without end, so a sender cannot keep a row per transfer
for the summary: `TcpTotals` keeps, per path (`wan`: to MD, across the WAN; `intra`: within
DC A), the exact count, bytes, retransmissions and RTO events, and the minimum RTTs and
delivery rates as bounded samples (`Reservoir`: exact mean, max and count, estimated
percentiles beyond its capacity). It travels in `/stats` as JSON (`as_dict`, `from_dict`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pddemu.metrics.reservoir import Reservoir

PATHS = {"wan": True, "intra": False}  # path -> a transfer's `wan` flag
COUNTERS = ("transfers", "bytes", "retransmits", "rto_events", "transfers_with_retransmits")


class TcpTotals:
    """Per path: counters summed, min RTT (modelled s) and delivery rate (bits per modelled s)
    sampled."""

    def __init__(self, sender: str = "") -> None:
        """`sender`: its name, in the samples' seeds (senders' samples are pooled)."""
        self.counters = {path: dict.fromkeys(COUNTERS, 0) for path in PATHS}
        self.min_rtt_s = {path: Reservoir(seed=f"tcp:{sender}:{path}:min_rtt") for path in PATHS}
        self.delivery_rate_bps = {
            path: Reservoir(seed=f"tcp:{sender}:{path}:rate") for path in PATHS
        }

    def add(self, transfer: Mapping[str, Any]) -> None:
        """One transfer's row (`TcpLedger`'s: wan, bytes, retransmits, rto_events, min_rtt_s,
        delivery_rate_Bps)."""
        path = "wan" if transfer["wan"] else "intra"
        counters = self.counters[path]
        counters["transfers"] += 1
        counters["bytes"] += transfer.get("bytes") or 0
        counters["retransmits"] += transfer["retransmits"]
        counters["rto_events"] += transfer["rto_events"]
        counters["transfers_with_retransmits"] += 1 if transfer["retransmits"] else 0
        if transfer["min_rtt_s"]:
            self.min_rtt_s[path].append(transfer["min_rtt_s"])
        if transfer["delivery_rate_Bps"]:
            self.delivery_rate_bps[path].append(8 * transfer["delivery_rate_Bps"])

    def add_tail(self, transfer: dict[str, Any], retransmits: int, rto_events: int) -> None:
        """Counters a transfer already added gained after its end (its tail's
        retransmissions): onto its row and the sums."""
        if not retransmits and not rto_events:
            return
        counters = self.counters["wan" if transfer["wan"] else "intra"]
        if retransmits and not transfer["retransmits"]:
            counters["transfers_with_retransmits"] += 1
        transfer["retransmits"] += retransmits
        transfer["rto_events"] += rto_events
        counters["retransmits"] += retransmits
        counters["rto_events"] += rto_events

    @classmethod
    def of(cls, transfers: Iterable[Mapping[str, Any]]) -> TcpTotals:
        totals = cls()
        for transfer in transfers:
            totals.add(transfer)
        return totals

    def as_dict(self) -> dict[str, Any]:
        return {
            path: {
                **self.counters[path],
                "min_rtt_s": list(self.min_rtt_s[path]),
                "min_rtt_s_totals": self.min_rtt_s[path].totals(),
                "delivery_rate_bps": list(self.delivery_rate_bps[path]),
                "delivery_rate_bps_totals": self.delivery_rate_bps[path].totals(),
            }
            for path in PATHS
        }

    @classmethod
    def from_dict(cls, sent: Mapping[str, Any]) -> TcpTotals:
        totals = cls()
        for path in PATHS:
            part = sent.get(path, {})
            totals.counters[path] = {name: part.get(name, 0) for name in COUNTERS}
            for name, samples in (
                ("min_rtt_s", totals.min_rtt_s),
                ("delivery_rate_bps", totals.delivery_rate_bps),
            ):
                samples[path] = Reservoir.restored(part.get(name, []), part.get(f"{name}_totals"))
        return totals
