"""How a run kept modelled time: the lag left in it, by kind and participant, its dilation, and
whether its results can be trusted (summary.json's `lag`, `dilation`, `holds`, `valid`).

Lag is how late, in modelled seconds, the emulator did something whose modelled time it knew
(`pddemu.runtime.clock.LAG_KINDS`): a step whose end passed before its genuine work was done,
a message handled after it arrived (on a path without modelled time), a request sent after
its arrival time, a packet the shaper let go after its exit time. Kinds ending in `_wan` are
bounds (a message across the WAN, whose modelled queueing its receiver cannot know) and are
reported, not judged; so are `report` (the frontend reading a report that carries its own
times) and `delivery` (the frontend reading tokens and heartbeats), which its lateness cannot
move.
docs/validation.md, "Which lag counts", says which lag can move a result and which is held.

A run is valid when the mean lag of each exact kind is at most `max_lag` x its TPOT p50. The
mean is the lag's systematic part: what shifts a reported time by adding up along a request's
path (a handful of messages and steps each), so a mean within 5 % of a TPOT keeps TTFT p50
within a few per cent of the model's. Percentiles are reported beside it: a run with rare long
stalls shows them there (and in its tails). A run whose requests have no TPOT (one-token
outputs, or outputs whose tokens all reached the user at once: a TPOT of 0, as naive's 2-token
outputs in experiments/kv-transfer.toml at 887400f) is judged against the modelled decode step
instead, the scale the rate's controller aims at before any TPOT is known.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from pddemu.metrics.distribution import describe, percentile
from pddemu.metrics.reservoir import Reservoir
from pddemu.metrics.tcp_totals import PATHS, TcpTotals
from pddemu.runtime.clock import LAG_KINDS


def timing_summary(
    instance_stats: Mapping[str, Mapping[str, Any]],
    replayer_lags: Mapping[str, list[float]],
    release_lag: Mapping[str, Any] | None,
    dilation: Mapping[str, Any],
    tpot_p50: float | None,
    max_lag: float,
    replayer_holds: Mapping[str, float] | None = None,
    cpu: Mapping[str, Any] | None = None,
    decode_step_s: float | None = None,
    routing_holds: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """`decode_step_s`: the modelled decode step that bounds the lag when no request has a
    TPOT (None: such a run cannot be judged). `routing_holds`: the shaper's, each from a
    routing message's release until its reader had it (each connection's
    `netem.clock.routing_slot`, those given back in ROUTING_ENDED_SLOT), and their senders',
    each until the shaper had read it (INGRESS_SLOT)."""
    # each participant's lag samples with their exact totals (`Reservoir`: bounded samples)
    participants = {
        name: {
            kind: Reservoir.restored(samples, stats.get("lag_totals_s", {}).get(kind))
            for kind, samples in stats.get("lags_s", {}).items()
        }
        for name, stats in instance_stats.items()
    }
    participants["replayer"] = {
        kind: Reservoir.pooled([samples]) for kind, samples in replayer_lags.items()
    }
    by_kind = {
        kind: Reservoir.pooled(lags[kind] for lags in participants.values() if kind in lags)
        for kind in sorted({kind for lags in participants.values() for kind in lags})
    }
    exact_kinds = Reservoir.pooled(by_kind[kind] for kind in LAG_KINDS if kind in by_kind)
    exact = np.asarray(exact_kinds, dtype=np.float64)
    bound_from = "tpot_p50" if tpot_p50 else "decode_step" if decode_step_s else None
    scale = tpot_p50 if tpot_p50 else decode_step_s
    bound = max_lag * scale if scale else None
    means = {kind: by_kind[kind].mean() for kind in LAG_KINDS if kind in by_kind}
    means = {kind: mean for kind, mean in means.items() if mean is not None}
    release_count = sum(release_lag["counts"]) if release_lag else 0
    if release_count:
        means["release"] = release_lag["total_s"] / release_count
    reason = invalid_reason(means, bound, max_lag, bound_from or "tpot_p50")
    holds = [stats.get("holds", {}) for stats in instance_stats.values()]
    by_participant = {
        name: {kind: _brief(samples) for kind, samples in sorted(lags.items()) if samples.seen}
        for name, lags in sorted(participants.items())
    }
    if reason is not None and bound is not None:
        reason += whose_lag(means, by_participant, release_count)
    return {
        "emulator_lag_s": {
            "p99": percentile(exact, 99),
            "max": exact_kinds.largest,
            "mean": exact_kinds.mean(),
            "samples": exact_kinds.seen,
        },
        "lag": {
            "bound_s": bound,
            "bound_from": bound_from,
            "max_lag": max_lag,
            "mean_by_kind": means,
            "by_kind": {kind: described(samples) for kind, samples in sorted(by_kind.items())},
            "release": {
                "mean": means.get("release"),
                "p99": histogram_percentile(release_lag, 99) if release_count else None,
                "max": release_lag["max_s"] if release_lag else None,
                "packets": release_count,
            },
            "by_participant": by_participant,
            # kernel dates a later segment may have pushed back (the frontend's), and dates
            # older than the clock's anchor history, read as the reading time instead
            **{
                count: sum(int(stats.get(count, 0)) for stats in instance_stats.values())
                for count in ("inexact_dates", "dates_past_history")
            },
        },
        "holds": {
            **_hold_totals(holds),
            # instant holds (routing exchanges, and the replayer's at each arrival) stand the
            # clock still without slowing it: their frozen wall time shows a slow participant
            "instant": _hold_totals(
                [h.get("instant", {}) for h in holds] + [replayer_holds or {}, routing_holds or {}]
            ),
            # of them, the shaper's at the decode side's routing answers
            "routing": _hold_totals([routing_holds or {}]),
        },
        "dilation": dict(dilation),
        "cpu": dict(cpu or {}),
        "tcp": tcp_summary(
            [
                TcpTotals.from_dict(stats["kv_transfers_tcp_totals"])
                if "kv_transfers_tcp_totals" in stats
                else TcpTotals.of(stats.get("kv_transfers_tcp", []))
                for stats in instance_stats.values()
            ]
        ),
        "valid": reason is None,
        "invalid_reason": reason,
    }


def cpu_summary(
    used_s: Mapping[str, float],
    roles: Mapping[str, str],
    modelled_s: float,
    wall_s: float,
    cores: int | None = None,
    host_steal_s: list[float] | None = None,
) -> dict[str, Any]:
    """The CPU the run's processes used over the replay (`used_s`, by name; `roles`: each
    instance's role) and the speed-up the host's cores allow at that CPU: modelled seconds x
    cores / CPU seconds of every process (roles, frontend, replayer, shaper), the fastest the
    run could go were its work the only bound. It is a ceiling, not a forecast: the speed-up
    reached is bounded by the lag of each message too (docs/validation.md). `host_steal_s`:
    the seconds the hypervisor took from each CPU over the replay (None: not read)."""
    cores = cores or len(os.sched_getaffinity(0))
    by_role = {"frontend": 0.0, "roles": 0.0}
    for name, seconds in used_s.items():
        role = roles.get(name)
        if role == "FE":
            by_role["frontend"] += seconds
        elif role:
            by_role["roles"] += seconds
    total = sum(used_s.values())
    return {
        "by_process_s": {name: round(seconds, 3) for name, seconds in sorted(used_s.items())},
        "roles_s": by_role["roles"],
        "frontend_s": by_role["frontend"],
        "total_s": total,
        "cores": cores,
        "busy_share": total / (cores * wall_s) if wall_s > 0 else None,
        "ceiling_speedup": modelled_s * cores / total if total > 0 else None,
        "host_steal_s": host_steal_s,
    }


def _hold_totals(holds: list[Mapping[str, Any]]) -> dict[str, Any]:
    return {
        "posted": sum(h.get("posted", 0) for h in holds),
        "binding": sum(h.get("binding", 0) for h in holds),
        "frozen_wall_s": sum(h.get("frozen_wall_s", 0.0) for h in holds),
    }


def tcp_summary(senders: list[TcpTotals]) -> dict[str, Any]:
    """TCP_INFO of the KV transfers, summed per path over the senders: across the WAN (to MD)
    and within DC A (to RLD, or the in-DC baseline's D). Minimum RTTs in modelled seconds;
    delivery rates in genuine bits per modelled second, the unit of
    `scale.wan_rate_emulated_bps` (means, maxima and counts exact; percentiles from samples)."""
    out = {}
    for path in PATHS:
        counters = [sender.counters[path] for sender in senders]
        out[path] = {
            name: sum(c[name] for c in counters)
            for name in ("transfers", "retransmits", "rto_events", "transfers_with_retransmits")
        }
        out[path]["min_rtt_s"] = described(Reservoir.pooled(s.min_rtt_s[path] for s in senders))
        out[path]["delivery_rate_bps"] = described(
            Reservoir.pooled(s.delivery_rate_bps[path] for s in senders)
        )
    return out


BOUND_SCALES = {"tpot_p50": "TPOT p50", "decode_step": "the modelled decode step"}


def invalid_reason(
    means: Mapping[str, float], bound: float | None, max_lag: float, bound_from: str = "tpot_p50"
) -> str | None:
    """Why a run's results cannot be trusted (the worst kind of lag), or None. `bound_from`:
    what the bound is a share of (`BOUND_SCALES`)."""
    if bound is None:
        return "no TPOT to bound the lag by" if any(means.values()) else None
    kind, worst = max(means.items(), key=lambda item: item[1], default=("", 0.0))
    if worst <= bound:
        return None
    return (
        f"mean {kind} lag {worst * 1e3:.2f} ms is over its bound {bound * 1e3:.2f} ms "
        f"({max_lag:.0%} of {BOUND_SCALES[bound_from]} {bound / max_lag * 1e3:.2f} ms"
        f"{'' if bound_from == 'tpot_p50' else ': no request had a TPOT'})"
    )


def whose_lag(
    means: Mapping[str, float],
    by_participant: Mapping[str, Mapping[str, Mapping[str, Any]]],
    packets: int = 0,
    most: int = 3,
) -> str:
    """Whose lag the worst kind's is (what `invalid_reason` judges): the participants with
    its largest means, largest first, `most` of them; the shaper's release lag (`packets`
    released) is the shaper's alone. What a not-valid reason goes on with, so that it says
    where to look."""
    kind = max(means, key=means.__getitem__)
    if kind == "release":
        named = f"the shaper {means[kind] * 1e3:.2f} ms mean over {packets} packets"
    else:
        late = sorted(
            (
                (name, kinds[kind])
                for name, kinds in by_participant.items()
                if kinds.get(kind, {}).get("mean")
            ),
            key=lambda item: -item[1]["mean"],
        )
        named = ", ".join(
            f"{name} {brief['mean'] * 1e3:.2f} ms mean over {brief['count']}"
            for name, brief in late[:most]
        )
    return f"; {kind} lag of {named or 'no participant'}"


def histogram_percentile(histogram: Mapping[str, Any], q: float) -> float | None:
    """The upper edge of the bucket holding the q-th percentile (the last bucket, open: the
    largest value seen)."""
    counts = histogram["counts"]
    total = sum(counts)
    if not total:
        return None
    edges = [*histogram["bucket_edges_s"], histogram["max_s"]]
    running = 0
    for count, edge in zip(counts, edges, strict=True):
        running += count
        if running >= q / 100 * total:
            return float(edge)
    return float(edges[-1])


def described(samples: Reservoir) -> dict[str, Any]:
    """`describe`, with the mean, max and count exact (percentiles from the kept sample)."""
    full = describe(samples)
    if samples.seen:
        full.update(mean=samples.mean(), max=samples.largest, count=samples.seen)
    return full


def _brief(samples: Reservoir) -> dict[str, Any]:
    full = described(samples)
    return {"mean": full["mean"], "p99": full["p99"], "max": full["max"], "count": full["count"]}
