"""`pddemu serve`: bring up one emulated system and expose its OpenAI-compatible API on the host.

    pddemu serve [--host 127.0.0.1] [--port 8000] [--config configs/serve.toml]
                 [--system pdd|naive|indc] [--rootless]

Prints one JSON line when ready:
  {"ready": true, "url": "http://127.0.0.1:8000",
   "base_url": "http://127.0.0.1:8000/v1", "model": "pddemu",
   "tokenizer": ".../pddemu/tokenizer", ...}
`base_url` is for OpenAI clients (they append /completions); `url` is for benchmark tools that
append the whole path themselves (AIPerf's --url, vllm bench serve's --base-url); `tokenizer` is
the model's tokenizer as a Hugging Face directory (their --tokenizer); `time_zero_s` is the
CLOCK_MONOTONIC instant of the timeline's time 0, from which `[wan] schedule` counts (serve runs
in real time: a schedule's modelled second is a wall second). Only the OpenAI routes
(/v1/models, /v1/completions, /v1/chat/completions) and /health are served on the host. Runs
until SIGINT or SIGTERM, then prints one last JSON line (`"stopped": true`, with `door`: the
streamed chunks written and how many were late, later than their tokens' modelled times by more
than `late_after_s`; the records' TTFT p50 and p90, modelled (`ttft_p50_s`) and as served
(`served_ttft_p50_s`: the door's, streamed requests); `valid`, `invalid_reason` and `lag`: the
emulator's lag judged as `pddemu emulate` judges it, and `unmatched`, the requests routed with no
decode-side hit (their match answered too late), which make it not valid as there;
`wan_flows`, the WAN's TCP flows against its packets since ready, judged as there (null when
the kernel's netem carries the WAN, which counts no flows, the WAN is unshaped, the system is
in-DC PD, or the run schedules link events; when a round's count could not be read, the
windows taken in before are judged and `wan_flows.unread` says why);
`late_requests`: how many requests carry more of it than the bound)
and removes everything it made. While it runs, the frontend's `/stats` (inside the emulated
datacenter, behind the run's secret) has the same judgement so far under `verdict`, with
`as_of_s`, the seconds since ready it was judged at (every few seconds), and `missing_stats`
(as in the last line: instance -> why its stats could not be read; its lag is not judged).
A round of that watch that fails is logged as one line on stderr and the watch goes on. Nothing
holds time for the host in real time: what the host does late is in the records, and this line says how much. Without root it runs in a private
user namespace, as `pddemu emulate` does; the host port stays reachable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from netem.control import ControlError
from pddemu.cli import add_rootless_flag
from pddemu.config import SYSTEMS, Config, load_config
from pddemu.deployment import STATS_TIMEOUT_S, Deployment
from pddemu.emulated_network import (
    ReplayConditions,
    network_for,
    path_packets,
    replay_conditions,
    scale_model,
    timeline_of,
)
from pddemu.help_format import HelpFormatter
from pddemu.hf_tokenizer import shipped_directory
from pddemu.host_door import DEFAULT_HOST, DEFAULT_PORT, listen, port_number, server_url
from pddemu.metrics.summary import UNMATCHED_CAUSE
from pddemu.metrics.timing import timing_summary
from pddemu.metrics.wan_flows import RunningFlows, flows_reason, starved_run
from pddemu.roles.frontend import LEG_SEPARATOR
from pddemu.roles.openai_api import MODEL_NAME
from pddemu.runtime.timekeeping import expected_tpot

# The live verdict on the frontend's /stats: how often it is judged, and at most which share of
# the wall time gathering the instances' stats for it may take.
VERDICT_PERIOD_S = 5.0
VERDICT_SHARE = 0.02
SERVE_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "serve.toml"


async def serve(
    deployment: Deployment,
    stop: asyncio.Event,
    listener: socket.socket,
    conditions: ReplayConditions,
) -> None:
    try:
        await deployment.start()  # its frontend serves the host door on `listener`
        time_zero = time.monotonic()  # the timeline's time 0: ready to serve
        conditions.begin(time_zero)
        url = server_url(listener)
        print(
            json.dumps(
                {
                    "ready": True,
                    "url": url,
                    "base_url": url + "/v1",
                    "model": MODEL_NAME,
                    "tokenizer": str(shipped_directory()),
                    "system": deployment.system,
                    "netns": deployment.network.a.netns,
                    "time_zero_s": time_zero,
                }
            ),
            flush=True,
        )
        wan_flows = wan_flows_watch(deployment, time_zero)
        watch = asyncio.create_task(keep_verdict_live(deployment, time_zero, wan_flows))
        try:
            await stop.wait()
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        summary = served_summary(
            await deployment.stats(),
            deployment.config.scale.max_lag,
            decode_step(deployment),
            unmatched_judged(deployment.config),
            await served_wan_flows(deployment, wan_flows) if wan_flows else None,
        )
        summary["missing_stats"] = dict(deployment.missing_stats)
        print(json.dumps(summary), flush=True)
    finally:
        await deployment.stop()


def unmatched_judged(config: Config) -> bool:
    """Whether requests routed unmatched make the run not valid: as emulate's
    `judge_unmatched`, not when it schedules faults or link events (an outage or a slower link
    may hold MD's answer in the modelled system too)."""
    timeline = timeline_of(config)
    links = timeline.link_events
    return not timeline.instance_faults and not (links is not None and links.to_dict()["steps"])


def flows_judged(config: Config, system: str) -> bool:
    """Whether the WAN's flows are judged: as emulate's `judge_wan_flows`, not when the run
    schedules link events (they change the path the share is taken of), nor for in-DC PD (no
    KV of its own crosses the WAN: the flows there are other tenants')."""
    if system == "indc":
        return False
    links = timeline_of(config).link_events
    return not (links is not None and links.to_dict()["steps"])


def wan_flows_watch(deployment: Deployment, time_zero: float) -> RunningFlows | None:
    """The WAN's flows judged since `time_zero` (ready), round after round
    (`pddemu.metrics.wan_flows.RunningFlows`); None when they are not judged (`flows_judged`)
    or nothing counts them: no userspace shaper carries the WAN (the kernel's netem counts no
    flows) or it is unshaped."""
    network = deployment.network
    config = deployment.config
    packets = path_packets(config, scale_model(config))
    record = network.record
    if (
        not flows_judged(config, deployment.system)
        or packets is None
        or network.flow_window_s is None
        or record is None
        or not record.control
    ):
        return None
    return RunningFlows(time_zero, packets)


async def served_wan_flows(
    deployment: Deployment, wan_flows: RunningFlows
) -> dict[str, Any] | None:
    """The WAN's flows so far (`pddemu.metrics.wan_flows`; the shaper runs in wall time here),
    from the windows the shaper counted since the last round (`Network.flows_since`: it keeps
    only those, so a round costs the same after hours as after seconds). When the count cannot
    be read, the windows taken in by earlier rounds are judged, and `unread` says why the
    figures stop there (a starved run must not read valid for a lost answer)."""
    since = dict(wan_flows.cursors)  # as of now: a round cancelled meanwhile takes in nothing
    try:
        records = await asyncio.to_thread(deployment.network.flows_since, since)
    except (OSError, KeyError, ControlError) as error:  # the verdict goes on with what it had
        print(f"pddemu serve: the WAN's flow count could not be read: {error}", file=sys.stderr)
        return wan_flows.taken(time.monotonic(), f"the WAN's flow count could not be read: {error}")
    return wan_flows.summary(records, time.monotonic())


def decode_step(deployment: Deployment) -> float:
    """The modelled decode step that bounds the lag while no request has a TPOT, as emulate
    takes it (`expected_tpot`; serve has no workload: the typical context)."""
    return expected_tpot(deployment.config, deployment.system)


def served_summary(
    stats: dict[str, dict[str, Any]],
    max_lag: float,
    decode_step_s: float | None,
    judge_unmatched: bool = True,
    wan_flows: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """serve's last line: what its door wrote, how many chunks it wrote later than their
    tokens' modelled times (`pddemu.roles.openai_api.WriteTiming`: what a client measures
    and the records do not show), and whether the records are the modelled system's
    (`lag_verdict`)."""
    router = _router(stats)
    if router is None:
        return {"stopped": True, "door": None, "errors": ["the frontend's stats are unreadable"]}
    return {
        "stopped": True,
        "door": router.get("door"),
        **lag_verdict(stats, max_lag, decode_step_s, judge_unmatched, wan_flows),
        "errors": router.get("errors", []),
    }


def lag_verdict(
    stats: dict[str, dict[str, Any]],
    max_lag: float,
    decode_step_s: float | None,
    judge_unmatched: bool = True,
    wan_flows: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Whether the records so far are the modelled system's, from every instance's stats.

    In real time nothing holds the clock for the host, so what the host did late is in the
    records. It is judged by emulate's rule (`pddemu.metrics.timing`: each exact kind's mean lag
    within `max_lag` x the TPOT p50 of the requests served, or, while none has a TPOT, x the
    modelled decode step `decode_step_s`): `valid`, `invalid_reason`, `lag`; and, as emulate's
    `judge_unmatched`, not valid when the frontend routed requests with no decode-side hit, the
    WAN holding their match too long (`unmatched`, the frontend's count), if `judge_unmatched`
    (`unmatched_judged`); and, as emulate's `judge_wan_flows`, not valid when the WAN's flows
    (`wan_flows`, `served_wan_flows`: given only when judged, `flows_judged`) were left too
    few packets each over more than its share of the time.
    `late_requests` counts the requests whose steps ran later than that bound, summed over the
    steps each was in (`Instance.carried_lag_s`): requests whose recorded times carry it (any
    request that was in a step, failed ones too, so `count` may exceed the `of` completed; None
    without a bound, i.e. before a request completed). Each instance keeps the carried lag of
    its most recent legs only (`pddemu.roles.carried_lag`); `dropped_legs` says how many it
    forgot, whose requests are counted from what the other instances kept of them."""
    router = _router(stats) or {}
    door = router.get("door") or {}
    timing = timing_summary(
        stats, {}, None, {}, door.get("tpot_p50_s"), max_lag, decode_step_s=decode_step_s
    )
    bound = timing["lag"]["bound_s"]
    carried: dict[str, float] = {}
    for report in stats.values():
        for leg, lag in report.get("carried_lag_s", {}).items():
            rid = leg.split(LEG_SEPARATOR, 1)[0]
            carried[rid] = carried.get(rid, 0.0) + lag
    # the reason names whose lag it is (`whose_lag`); serve says why no hold can take it
    # out: the routing exchange's messages, held in `pddemu emulate`, take their handling
    # time here, so the records and the client both carry it
    lag_reason = timing["invalid_reason"] and timing["invalid_reason"] + REAL_TIME_CAUSE
    unmatched = int(router.get("unmatched", 0))
    judged = unmatched if judge_unmatched else 0
    starved = wan_flows is not None and starved_run(wan_flows)
    reasons = [
        *([lag_reason] if lag_reason else []),
        *([f"{unmatched} requests {UNMATCHED_CAUSE} (unmatched)"] if judged else []),
        *([flows_reason(wan_flows)] if starved and wan_flows is not None else []),
    ]
    return {
        "valid": timing["valid"] and not judged and not starved,
        "invalid_reason": "; ".join(reasons) or None,
        "unmatched": unmatched,
        "wan_flows": wan_flows,
        "lag": {
            key: timing["lag"][key]
            for key in ("bound_s", "bound_from", "max_lag", "mean_by_kind", "by_participant")
        },
        "late_requests": {
            "count": None if bound is None else sum(1 for lag in carried.values() if lag > bound),
            "of": door.get("completed"),
            "max_carried_s": max(carried.values(), default=0.0),
            "dropped_legs": sum(r.get("carried_lag_dropped", 0) for r in stats.values()),
        },
    }


REAL_TIME_CAUSE = (
    ": in real time nothing holds the clock while a message or step is handled, so what a "
    "client measures carries it too"
)


def _router(stats: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    return next((report for report in stats.values() if report.get("role") == "FE"), None)


async def keep_verdict_live(
    deployment: Deployment, time_zero: float, wan_flows: RunningFlows | None
) -> None:
    """Give the frontend the lag verdict so far (its `/stats`, key `verdict`), judged from every
    instance's stats (and the WAN's flows, `wan_flows`, when judged: `wan_flows_watch`) every
    VERDICT_PERIOD_S, or less often if gathering them takes more than VERDICT_SHARE of the wall
    time (they grow with the requests served), so the watch never takes more than that share
    of the host from the system it watches."""
    max_lag = deployment.config.scale.max_lag
    step = decode_step(deployment)
    judged = unmatched_judged(deployment.config)
    period = VERDICT_PERIOD_S
    async with aiohttp.ClientSession(headers=deployment.headers) as session:
        while True:
            await asyncio.sleep(period)
            started = time.monotonic()
            try:
                await post_verdict(deployment, session, time_zero, wan_flows, max_lag, step, judged)
            except Exception as error:  # one bad round must not end the watch: say so, go on
                print(
                    f"pddemu serve: verdict not updated: {type(error).__name__}: {error}",
                    file=sys.stderr,
                    flush=True,
                )
            period = max(VERDICT_PERIOD_S, (time.monotonic() - started) / VERDICT_SHARE)


async def post_verdict(
    deployment: Deployment,
    session: aiohttp.ClientSession,
    time_zero: float,
    wan_flows: RunningFlows | None,
    max_lag: float,
    decode_step_s: float,
    judge_unmatched: bool = True,
) -> None:
    """One round of the watch: the verdict from every instance's stats and the WAN's flows
    (`wan_flows`, None when not judged) since `time_zero` (ready), with the instances whose
    stats could not be read (`missing_stats`: name -> why), to the frontend."""
    as_of_s = time.monotonic() - time_zero
    stats = await deployment.stats()
    router = next((name for name, r in stats.items() if r.get("role") == "FE"), None)
    if router is None:
        return  # the frontend's own stats are unreadable: it keeps the last verdict
    flows = await served_wan_flows(deployment, wan_flows) if wan_flows else None
    verdict = {
        "as_of_s": as_of_s,
        **lag_verdict(stats, max_lag, decode_step_s, judge_unmatched, flows),
        "missing_stats": dict(deployment.missing_stats),
    }
    try:
        async with session.post(
            deployment.url(router, "/admin/verdict"),
            json=verdict,
            timeout=aiohttp.ClientTimeout(total=STATS_TIMEOUT_S),
        ) as reply:
            reply.raise_for_status()
    except (aiohttp.ClientError, TimeoutError):
        pass  # the frontend keeps the last verdict, dated by its `as_of_s`


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        allow_abbrev=False,  # `--rootless` is acted on before parsing, by its full name
        help="an OpenAI-compatible endpoint on an emulated system",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})"
    )
    parser.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"port to listen on (default {DEFAULT_PORT}; 0: any free port, printed when ready)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=SERVE_CONFIG,
        help="TOML scenario (default: configs/serve.toml, real time and genuine tokens 1:1)",
    )
    parser.add_argument(
        "--system", choices=SYSTEMS, default="pdd", help="the system to serve (default pdd)"
    )
    parser.add_argument(
        "--run-dir", type=Path, default=Path("runs/serve"), help="logs and instance specs"
    )
    add_rootless_flag(parser)
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    # pddemu.cli.main made the socket before entering a private namespace, if it did
    listener = getattr(args, "listener", None) or listen(args.host, args.port)
    config = load_config(args.config)
    scale = scale_model(config)
    with (
        network_for(config, scale, clock=False) as network,  # real time: the wall's
        replay_conditions(network, config, scale) as conditions,
    ):
        loop = uvloop.new_event_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        deployment = Deployment(
            args.system, config, network, args.run_dir, time.monotonic(), host_door=listener
        )
        try:
            loop.run_until_complete(serve(deployment, stop, listener, conditions))
        finally:
            loop.close()
            listener.close()
    if conditions.cross_traffic is not None:
        print(f"pddemu: cross-traffic: {json.dumps(conditions.cross_traffic)}", file=sys.stderr)
    return 0
