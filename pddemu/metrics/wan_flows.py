"""Whether the emulated WAN left each TCP flow enough packets to behave as the modelled one's
(summary.json's `wan_flows`, and a judgement of the run's validity).

The emulated WAN is the modelled one scaled in bytes: its queue keeps its modelled seconds, not
its packets (21 on the default deployment, where the modelled one holds ~33,000), while the
flows that share it are not scaled. A path of P packets (queue limit + bandwidth-delay product,
in MTU-sized packets) shared fairly by N flows leaves each P / N packets of window. TCP
recovers a loss by fast retransmit only when three duplicate ACKs come back (RFC 5681, section
3.2), i.e. with at least 4 packets in flight (the lost one and three behind it); RFC 3042
(section 1) names a window under four segments as a case where fast retransmit cannot be
invoked (its limited transmit, and Linux's loss probes, save some such losses, not a path whose
share stays under it). Under that, losses are recovered by retransmission timeouts, of 200 ms
(Linux's floor) or more, five round trips of the default WAN, which the modelled flows, with
hundreds of packets each, would not suffer: then the emulator's TCP, not the modelled
system's, sets the run's times.

The shaper counts, per direction and window of one loaded round trip (the base round trip plus
the queue's time, so what the link carries in a window is the path's P packets), the TCP flows
that sent data in it, their max-min fair share of those P packets (`netem.flow_count.
fair_share`: a flow offering less than the share, a control message or another tenant's short
transfer, keeps its own, and the flows that want more divide the rest; with N equal bulk flows
it is P / N) and the packets its queue dropped. A window is *starved* when that share is under
FAST_RETRANSMIT_PACKETS and the queue dropped packets in it: only a loss needs recovering, so a
crowded window without drops does not distort. A run whose starved windows in one direction
are more than STARVED_SHARE_MAX of that direction's windows that carried data (idle time
dilutes nothing) and last STARVED_MIN_S at least in all is not valid: a window or two of
crowding in a short run is a moment, not TCP living on timeouts.
docs/validation.md ("TCP flows on the scaled WAN") gives the measurements behind both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

# packets in flight for three duplicate ACKs to follow a lost one (RFC 5681 section 3.2)
FAST_RETRANSMIT_PACKETS = 4
# the largest share of the replay's windows that may be starved in a valid run
STARVED_SHARE_MAX = 0.01
# and the least time they must last in all (modelled s): five retransmission timeouts at
# Linux's 200 ms floor (one starved window of a quick handoff point, 80 ms, cost no timeout)
STARVED_MIN_S = 1.0
FLOWS_CAUSE = (
    "the emulated WAN left TCP too few packets per flow: losses were recovered by timeouts the "
    "modelled system's flows would not suffer"
)


def starved(share_packets: float | None, drops: int) -> bool:
    """Whether a window's flows had a fair share under FAST_RETRANSMIT_PACKETS and lost packets
    (a window without data, or on an unlimited link, has no share: None)."""
    return drops > 0 and share_packets is not None and share_packets < FAST_RETRANSMIT_PACKETS


@dataclass
class DirectionTotals:
    """One direction's figures over windows taken in one after another (`add`): its peak
    flows, the windows that carried data, least fair share, drops, and the windows crowded
    (share under the bound) and starved (crowded, with drops). Peaks, counts and sums: the
    totals of a run taken in part by part are those of the run taken whole."""

    flows_peak: int = 0
    windows_active: int = 0
    share_min_packets: float | None = None
    drops: int = 0
    windows_crowded: int = 0
    windows_starved: int = 0

    def add(self, flows: list[int], shares: list[float | None], drops: list[int]) -> None:
        """Windows side by side: their flows, fair shares (None without data) and drops."""
        known = [share for share in shares if share is not None]
        self.flows_peak = max(self.flows_peak, max(flows, default=0))
        self.windows_active += sum(1 for count in flows if count)
        least = min(known, default=None)
        if least is not None and (self.share_min_packets is None or least < self.share_min_packets):
            self.share_min_packets = least
        self.drops += sum(drops)
        self.windows_crowded += sum(1 for share in known if share < FAST_RETRANSMIT_PACKETS)
        self.windows_starved += sum(
            1 for share, d in zip(shares, drops, strict=True) if starved(share, d)
        )

    def with_windows(
        self, flows: list[int], shares: list[float | None], drops: list[int]
    ) -> DirectionTotals:
        """These totals with windows that may still change (the one under way) added, these
        left as they are."""
        totals = replace(self)
        totals.add(flows, shares, drops)
        return totals


def windows_between(
    record: Mapping[str, Any], lo: int, hi: int
) -> tuple[list[int], list[float | None], list[int]]:
    """A direction's record's windows from index `lo` to `hi` (excluded; windows since the
    shaper's origin), those it holds: flows, fair shares and drops."""
    first = record["first"]
    lo, hi = max(lo - first, 0), max(hi - first, 0)
    return record["flows"][lo:hi], record["share_packets"][lo:hi], record["drops"][lo:hi]


def replay_windows(record: Mapping[str, Any], start: float, end: float) -> tuple[int, int]:
    """The indices of the first window that begins at `start` or after and of the first that
    begins at `end` or after: the windows of [start, end) (in the shaper's time; the count's
    first is window 0, at its origin)."""
    width, origin = record["window_s"], record["origin"]
    lo = max(0, math.ceil((start - origin) / width))
    return lo, max(lo, math.ceil((end - origin) / width))


def direction_summary(record: Mapping[str, Any], start: float, end: float) -> dict[str, Any]:
    """One direction's windows that begin within [start, end) (the replay, in the shaper's
    time), totalled (`DirectionTotals`)."""
    totals = DirectionTotals()
    totals.add(*windows_between(record, *replay_windows(record, start, end)))
    return asdict(totals)


def wan_flows_summary(
    records: Mapping[str, Mapping[str, Any]], start: float, end: float, path_packets: float
) -> dict[str, Any]:
    """summary.json's `wan_flows` from the shaper's WAN records by direction (`a2b`, `b2a`)
    over the replay [start, end) (modelled s on the shaper's clock); `path_packets`, the
    path's packets as configured (queue limit + bandwidth-delay product), is reported beside."""
    directions = {
        name: direction_summary(record, start, end) for name, record in sorted(records.items())
    }
    return summary_of(directions, window_width(records), end - start, path_packets)


def window_width(records: Mapping[str, Mapping[str, Any]]) -> float | None:
    """The records' window (every direction's is the shaper's one), None without a record."""
    return next(iter(records.values()))["window_s"] if records else None


def summary_of(
    directions: Mapping[str, Mapping[str, Any]],
    width: float | None,
    duration_s: float,
    path_packets: float,
) -> dict[str, Any]:
    """`wan_flows` from each direction's totals (`DirectionTotals`) over `duration_s`."""
    windows = max(1, math.ceil(duration_s / width)) if width else 0
    shares = [d["share_min_packets"] for d in directions.values()]
    judged = judged_direction(directions, width)
    return {
        "window_s": width,
        "windows": windows,
        "path_packets": path_packets,
        "bound_packets": FAST_RETRANSMIT_PACKETS,
        "flows_peak": max((d["flows_peak"] for d in directions.values()), default=0),
        "share_min_packets": min((s for s in shares if s is not None), default=None),
        "starved_direction": judged[0] if judged[1] else None,
        "starved_share": judged[1],
        "starved_share_max": STARVED_SHARE_MAX,
        "starved_s": judged[2],
        "starved_min_s": STARVED_MIN_S,
        "directions": dict(directions),
    }


class RunningFlows:
    """A long run's `wan_flows`, judged round after round from the windows the shaper counted
    since the last (`netem.flow_count.FlowCount.since`): each direction keeps its closed
    windows' totals and the first window it has not taken in (`cursors`, what the next round
    asks the shaper from, which then forgets those before), and each round adds the windows
    that may still change (the one under way) as they stand, to its answer only. Each
    round's summary is the one the whole record would give (`wan_flows_summary` over
    [start, end)) at a cost of the windows since the last round, however long the run."""

    def __init__(self, start: float, path_packets: float) -> None:
        self.start = start
        self.path_packets = path_packets
        self.totals: dict[str, DirectionTotals] = {}
        self.cursors: dict[str, int] = {}  # direction -> the first window not taken in
        self.width: float | None = None

    def summary(self, records: Mapping[str, Mapping[str, Any]], end: float) -> dict[str, Any]:
        """`wan_flows` over [start, end) from the shaper's records since `cursors` (each with
        `final`: the windows before it are closed), whose closed windows are taken in."""
        directions = {}
        for name, record in sorted(records.items()):
            lo, hi = replay_windows(record, self.start, end)
            cursor = max(self.cursors.get(name, lo), lo)
            closed = min(max(record["final"], cursor), hi)
            totals = self.totals.setdefault(name, DirectionTotals())
            totals.add(*windows_between(record, cursor, closed))
            self.cursors[name] = closed
            directions[name] = asdict(totals.with_windows(*windows_between(record, closed, hi)))
        self.width = window_width(records) or self.width
        return summary_of(directions, self.width, end - self.start, self.path_packets)

    def taken(self, end: float, unread: str) -> dict[str, Any]:
        """`wan_flows` from the closed windows taken in so far, when a round's count could not
        be read (`unread`, why): still judged on them, and saying it is short of the run."""
        directions = {name: asdict(totals) for name, totals in sorted(self.totals.items())}
        summary = summary_of(directions, self.width, end - self.start, self.path_packets)
        return {**summary, "unread": unread}


def judged_direction(
    directions: Mapping[str, Mapping[str, Any]], width: float | None
) -> tuple[str | None, float, float]:
    """The direction a run is judged by, with the share of its windows with data that were
    starved and their modelled seconds: each direction is judged on its own (a share over the
    bound in one and a second of starved windows in the other are neither direction starved
    over enough of its time), so the one starved by both bounds if any, else the one with the
    larger share (then the longer). Of the windows with data: a served run's idle hours (or a
    sparse trace's gaps) would otherwise thin out its starved ones until the run read valid
    again. The seconds to the microsecond: ten windows of a width not exact in binary
    (0.09999999999999999 s) are the second they stand for."""
    figures = [
        (
            name,
            d["windows_starved"] / d["windows_active"] if d["windows_active"] else 0.0,
            round(d["windows_starved"] * width, 6) if width else 0.0,
        )
        for name, d in directions.items()
    ]
    return max(
        figures,
        key=lambda f: (starved_by_both(f[1], f[2]), f[1], f[2]),
        default=(None, 0.0, 0.0),
    )


def judge_wan_flows(summary: dict[str, Any]) -> None:
    """A run whose WAN was starved (`starved_run`) is not valid, whatever its lag. Not a run
    with scheduled link events: the path they change is not the one the share is taken of.
    `summary`: a system's, with its timing keys (`valid`, `invalid_reason`) and `faults` in."""
    flows = summary.get("wan_flows")
    links = (summary.get("faults") or {}).get("link_events")
    if not flows or links or not starved_run(flows):
        return
    reason = flows_reason(flows)
    lag = summary.get("invalid_reason")
    summary["valid"] = False
    summary["invalid_reason"] = f"{lag}; {reason}" if lag else reason


def starved_run(flows: Mapping[str, Any]) -> bool:
    """Whether a run's `wan_flows` were starved over more than STARVED_SHARE_MAX of its replay
    and for STARVED_MIN_S at least."""
    return starved_by_both(flows["starved_share"], flows.get("starved_s", 0.0))


def starved_by_both(share: float, seconds: float) -> bool:
    """Whether a direction's starved windows were over STARVED_SHARE_MAX of its windows with
    data and lasted STARVED_MIN_S at least."""
    return share > STARVED_SHARE_MAX and seconds >= STARVED_MIN_S


def flows_reason(flows: Mapping[str, Any]) -> str:
    """The judgement in a user's words, with the starved direction's own figures (the run's
    peak and least share may be the other direction's, crowded without losses)."""
    direction = flows.get("starved_direction")
    own = flows.get("directions", {}).get(direction, flows) if direction else flows
    where = ""
    if direction:
        source, _, destination = direction.partition("2")
        where = f" from {source.upper()} to {destination.upper()}"
    return (
        f"{FLOWS_CAUSE} (a path of {flows['path_packets']:.0f} packets, up to "
        f"{own['flows_peak']} flows at once{where}; their fair share under "
        f"{flows['bound_packets']} packets each, down to {own['share_min_packets']:.1f}, with "
        f"losses in {flows['starved_share']:.0%} of the replay, {flows['starved_s']:.1f} s: "
        "wan_flows)"
    )
