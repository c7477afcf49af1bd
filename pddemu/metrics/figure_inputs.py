"""What a run's figures are drawn from, the same whether `pddemu emulate` draws them at the end
of its run or `pddemu plot` draws them again from the run's directory: the measured requests
(the warm-up left out) and the KV transfers that crossed the WAN, as MD recorded them."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pddemu.metrics.plots import WanTransfer, WanUse
from pddemu.metrics.records import RequestRecord


def split_warmup(
    records: list[RequestRecord], warmup_ids: Collection[str]
) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """(the warm-up, the measured requests): those of `warmup_ids` (the workload's first
    requests, in its own order: equal arrival times and ids such as r10 and r2 leave no
    doubt), and the rest, each in the records' order."""
    warm = [r for r in records if r.request_id in warmup_ids]
    return warm, [r for r in records if r.request_id not in warmup_ids]


def wan_transfers(stats: Mapping[str, Any]) -> list[WanTransfer]:
    """The KV transfers that crossed the WAN (those an MD received), from the instances'
    reports (`/stats`, kept as instances-<system>.json)."""
    from pddemu.roles.frontend import LEG_SEPARATOR  # the router names a request's legs

    return [
        WanTransfer(
            event["start_s"],
            event["end_s"],
            int(event.get("genuine_bytes") or 0),
            [tuple(chunk) for chunk in event.get("chunks", [])],
            str(event["rid"]).split(LEG_SEPARATOR, 1)[0],  # a later leg's is its request's
        )
        for report in stats.values()
        if report.get("role") == "MD"
        for event in report.get("events", [])
        if event["kind"] == "kv_transfer"
    ]


def crosses_the_wan(system: str) -> bool:
    """Whether a system's KV crosses the WAN (the in-DC baseline's stays in DC A)."""
    return system != "indc"


def measured_wan_use(
    transfers: Mapping[str, Sequence[WanTransfer]],
    measured: Mapping[str, Sequence[RequestRecord]],
    rate_bps: float | None,
    byte_scale: float,
) -> WanUse:
    """The WAN figure's input for the systems of `measured` that cross the WAN: the transfers
    of the measured requests alone, timed from the first measured arrival (a warm-up is in no
    figure)."""
    crossing = [system for system in measured if crosses_the_wan(system)]
    ids = {system: {r.request_id for r in measured[system]} for system in crossing}
    return WanUse(
        {
            system: [t for t in transfers.get(system, ()) if t.request_id in ids[system]]
            for system in crossing
        },
        {system: min((r.arrival_s for r in measured[system]), default=0.0) for system in crossing},
        rate_bps,
        byte_scale,
    )
