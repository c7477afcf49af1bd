"""Whether the emulated WAN left each TCP flow enough packets to behave as the modelled one's
(summary.json's `wan_flows`, and a judgement of the run's validity).

The emulated WAN is the modelled one scaled in bytes: its queue keeps its modelled seconds, not
its packets (21 on the default deployment, where the modelled one holds ~33,000), while the
flows that share it are not scaled. A path of P packets (queue limit + bandwidth-delay product,
in MTU-sized packets) shared fairly by N flows leaves each P / N packets of window. TCP
recovers a loss by fast retransmit only when three duplicate ACKs come back (RFC 5681, section
3.2), i.e. with at least 4 packets in flight (the lost one and three behind it; RFC 3042's
limited transmit does not help a window that cannot hold them). Under that, losses are
recovered by retransmission timeouts, of 200 ms (Linux's floor) or more, five round trips of
the default WAN, which the modelled flows, with hundreds of packets each, would not suffer:
then the emulator's TCP, not the modelled system's, sets the run's times.

The shaper counts, per direction and window of about one loaded round trip (`netem.
flow_count`), the TCP flows that sent data in it, and the packets its queue dropped. A window
is *starved* when its flows' fair share is under FAST_RETRANSMIT_PACKETS and its queue dropped
packets: only a loss needs recovery, so crowded windows without drops do not distort (a
crowded queue with no drop is a fair share of a path TCP keeps full). A run whose starved
windows are more than STARVED_SHARE_MAX of its replay's time (either direction) is not valid.
docs/validation.md ("Points flagged not valid") gives the measurements behind the share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# packets in flight for three duplicate ACKs to follow a lost one (RFC 5681 section 3.2)
FAST_RETRANSMIT_PACKETS = 4
# the largest share of the replay's windows that may be starved in a valid run
STARVED_SHARE_MAX = 0.01
FLOWS_CAUSE = (
    "the emulated WAN left TCP too few packets per flow: losses were recovered by timeouts the "
    "modelled system's flows would not suffer"
)


def fair_share(path_packets: float, flows: int) -> float:
    """Each of `flows` flows' fair share of a path of `path_packets` packets (the whole path
    for no flow)."""
    return path_packets / flows if flows else path_packets


def starved(path_packets: float, flows: int, drops: int) -> bool:
    """Whether a window's flows had under FAST_RETRANSMIT_PACKETS each and lost packets."""
    return drops > 0 and fair_share(path_packets, flows) < FAST_RETRANSMIT_PACKETS


def direction_summary(
    record: Mapping[str, Any], start: float, end: float, path_packets: float
) -> dict[str, Any]:
    """One direction's windows that begin within [start, end) (the replay, in the shaper's
    time): their peak flows, drops, and the windows crowded (fair share under the bound) and
    starved (crowded, with drops)."""
    width, origin, first = record["window_s"], record["origin"], record["first"]
    lo = math.ceil((start - origin) / width) - first
    hi = math.ceil((end - origin) / width) - first
    flows = record["flows"][max(lo, 0) : max(hi, 0)]
    drops = record.get("drops", [])[max(lo, 0) : max(hi, 0)]
    peak = max(flows, default=0)
    return {
        "flows_peak": peak,
        "drops": sum(drops),
        "windows_crowded": sum(
            1 for n in flows if fair_share(path_packets, n) < FAST_RETRANSMIT_PACKETS
        ),
        "windows_starved": sum(
            1 for n, d in zip(flows, drops, strict=True) if starved(path_packets, n, d)
        ),
    }


def wan_flows_summary(
    records: Mapping[str, Mapping[str, Any]], start: float, end: float, path_packets: float
) -> dict[str, Any]:
    """summary.json's `wan_flows` from the shaper's WAN records by direction (`a2b`, `b2a`)
    over the replay [start, end) (modelled s on the shaper's clock)."""
    width = next(iter(records.values()))["window_s"] if records else None
    windows = max(1, math.ceil((end - start) / width)) if width else 0
    directions = {
        name: direction_summary(record, start, end, path_packets)
        for name, record in sorted(records.items())
    }
    peak = max((d["flows_peak"] for d in directions.values()), default=0)
    starved_windows = max((d["windows_starved"] for d in directions.values()), default=0)
    return {
        "window_s": width,
        "windows": windows,
        "path_packets": path_packets,
        "bound_packets": FAST_RETRANSMIT_PACKETS,
        "flows_peak": peak,
        "packets_per_flow_min": fair_share(path_packets, peak),
        "starved_share": starved_windows / windows if windows else 0.0,
        "starved_share_max": STARVED_SHARE_MAX,
        "directions": directions,
    }


def judge_wan_flows(summary: dict[str, Any]) -> None:
    """A run whose WAN windows were starved (`wan_flows.starved_share`) more than
    STARVED_SHARE_MAX of its replay is not valid, whatever its lag. Not a run with scheduled
    link events: the path they change is not the one the share is taken of. `summary`: a
    system's, with its timing keys (`valid`, `invalid_reason`) and `faults` in."""
    flows = summary.get("wan_flows")
    links = (summary.get("faults") or {}).get("link_events")
    if not flows or links or flows["starved_share"] <= STARVED_SHARE_MAX:
        return
    reason = flows_reason(flows)
    lag = summary.get("invalid_reason")
    summary["valid"] = False
    summary["invalid_reason"] = f"{lag}; {reason}" if lag else reason


def flows_reason(flows: Mapping[str, Any]) -> str:
    """The judgement in a user's words, with its figures."""
    return (
        f"{FLOWS_CAUSE} (up to {flows['flows_peak']} flows shared a path of "
        f"{flows['path_packets']:.0f} packets, {flows['packets_per_flow_min']:.1f} each; under "
        f"{flows['bound_packets']} with losses in {flows['starved_share']:.0%} of the replay: "
        f"wan_flows)"
    )
