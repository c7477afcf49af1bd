"""What a run's figures are drawn from, the same whether `pddemu emulate` draws them at the end
of its run or `pddemu plot` draws them again from the run's directory: the measured requests
(the warm-up left out) and the KV transfers that crossed the WAN, as MD recorded them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
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
    reports (`/stats`, kept as instances-<system>.json), each with its sender's prefill steps
    for its leg (the P named as its source)."""
    from pddemu.roles.frontend import LEG_SEPARATOR  # the router names a request's legs

    steps: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for name, report in stats.items():
        if report.get("role") == "P":
            for event in report.get("events", []):
                if event["kind"] == "prefill_chunk":
                    steps[name, str(event["rid"])].append((event["end_s"], int(event["tokens"])))
    return [
        WanTransfer(
            event["start_s"],
            event["end_s"],
            int(event.get("genuine_bytes") or 0),
            [tuple(chunk) for chunk in event.get("chunks", [])],
            str(event["rid"]).split(LEG_SEPARATOR, 1)[0],  # a later leg's is its request's
            sorted(steps.get((str(event.get("source")), str(event["rid"])), [])),
        )
        for report in stats.values()
        if report.get("role") == "MD"
        for event in report.get("events", [])
        if event["kind"] == "kv_transfer"
    ]


def kv_offered(transfer: WanTransfer, record: RequestRecord) -> list[tuple[float, int]]:
    """When P offered each part of a transfer's KV to the WAN (modelled s, genuine bytes).

    P streams a request's KV from MD's hit on (`md_hit_tokens`) as it is computed: a part is
    offered as the prefill step that computed it ends (P hands it to the connection then, or
    as soon as the connection takes more), from the routing on (`routed_s`; P's own prefix
    hit is there at once). The bytes are taken as even over the transfer's tokens. Empty when
    the records do not account for the whole KV (no routing date, prefill steps missing):
    its offering is unknown."""
    total = record.input_tokens
    offset = record.md_hit_tokens or 0
    if record.routed_s is None or total <= offset or not transfer.genuine_bytes:
        return []
    computed = record.p_hit_tokens
    moments = [(record.routed_s, computed)]  # (date, tokens computed by then)
    for end_s, tokens in transfer.prefill_steps:
        computed += tokens
        moments.append((max(end_s, record.routed_s), computed))
    if computed < total:
        return []
    offered: list[tuple[float, int]] = []
    sent = 0
    for at, tokens in moments:
        share = min(max(tokens - offset, 0), total - offset) / (total - offset)
        bytes_by_then = round(transfer.genuine_bytes * share)
        if bytes_by_then > sent:
            if offered and offered[-1][0] == at:  # one date, one part
                offered[-1] = (at, offered[-1][1] + bytes_by_then - sent)
            else:
                offered.append((at, bytes_by_then - sent))
            sent = bytes_by_then
    return offered


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
    of the measured requests alone, each with when its KV was offered (`kv_offered`), timed
    from the first measured arrival (a warm-up is in no figure)."""
    crossing = [system for system in measured if crosses_the_wan(system)]
    records = {system: {r.request_id: r for r in measured[system]} for system in crossing}
    return WanUse(
        {
            system: [
                replace(t, offered=kv_offered(t, records[system][t.request_id]))
                for t in transfers.get(system, ())
                if t.request_id in records[system]
            ]
            for system in crossing
        },
        {system: min((r.arrival_s for r in measured[system]), default=0.0) for system in crossing},
        rate_bps,
        byte_scale,
    )
