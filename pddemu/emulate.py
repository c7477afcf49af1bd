"""`pddemu emulate`: replay one workload through pdd, naive and indc, check every token against
the single-process reference, and write the run's files.

    pddemu emulate --out DIR [--config FILE] [--system pdd|naive|indc|all]
                   [--one-at-a-time] [--trace NAME|PATH] [--requests N]
                   [--seed S] [--block-size TOKENS]

`--system all` runs the three systems at once, each in a child process on an emulated network
of its own (namespaces, WAN shaper, clock and its controller: no system's traffic queues behind
another's, and each clock slows down for its own system's lag; they share the host's cores);
`--one-at-a-time` runs them one after another on one network.
The results are written after each system (summary.json, requests.csv, plots, report.md), so
a run cut short keeps every system that finished. Whatever stops a system's replay (an
instance dying, its stats unreadable, Ctrl-C or SIGTERM), the requests sent so far are written,
and the run is marked `"partial": true` with its reasons. A first Ctrl-C ends the requests in
flight (failed, interrupted) and writes; a second one stops at once.

Exit status:
  0    every delivered stream equals the reference (failed requests, such as
       timeouts under overload or requests a scheduled fault broke, are
       results and are reported)
  1    the network cannot be set up, or the results cannot be written, or
       (systems at once) a system's process ended without results
  2    bad input (config, trace, arguments)
  3    a stream differs from the reference, or the replayer could not read
       the frontend's answer (an emulator defect)
  4    a run is not valid: the emulator fell behind the model by more than
       `scale.max_lag`, or routed requests with no decode-side hit because
       the WAN held their match too long, or its WAN left TCP too few
       packets per flow (summary.json's invalid_reason says how)
  5    the results are written but partial: an instance died unplanned, did
       not start, or its stats could not be read (summary.json's
       partial_reasons says which)
  130  interrupted (SIGINT or SIGTERM); what finished is written, marked
       partial
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
import traceback
from collections.abc import Collection, Coroutine
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from netem.control import ControlError
from netem.signals import on_termination, raise_keyboard_interrupt
from netem.spec import LinkSpec
from netem.topology import Network, TopologyError
from pddemu.at_once import run_at_once
from pddemu.cli import add_rootless_flag
from pddemu.config import SYSTEMS, Config, ConfigError, load_config
from pddemu.deployment import Deployment, DeploymentError, InstanceEvent
from pddemu.emulated_network import (
    ReplayConditions,
    network_for,
    path_packets,
    replay_conditions,
    scale_model,
    timeline_of,
    wan_link,
)
from pddemu.faults import inject, timeline_rows
from pddemu.hardware import load_chip
from pddemu.help_format import HelpFormatter
from pddemu.metrics import (
    SLO,
    InstanceReport,
    RequestRecord,
    format_table,
    judge_unmatched,
    summarize,
    write_report,
    write_requests_csv,
    write_summary_json,
)
from pddemu.metrics.distribution import percentile
from pddemu.metrics.reservoir import Reservoir
from pddemu.metrics.wan_flows import judge_wan_flows, wan_flows_summary
from pddemu.model import ModelConfig
from pddemu.reference import reference_outputs
from pddemu.replay import ReplayResult, replay
from pddemu.roles.launcher import Launcher
from pddemu.runtime.events import EVENT_CAPACITY
from pddemu.runtime.timekeeping import TYPICAL_CONTEXT, RunTiming
from pddemu.scale import ScaleModel
from pddemu.workload import load_workload
from pddemu.workload.synthetic import SyntheticShape

REPLAY_LEAD_S = 1.0  # modelled seconds between the deployment being ready and the first arrival
INTERRUPT_STATS_TIMEOUT_S = 5.0  # wall seconds an interrupted run waits for each instance's stats
DEFECT_EXIT = 3  # a stream differs from the reference, or an answer could not be read
INVALID_EXIT = 4  # the emulator fell behind the model more than the run's lag bound allows, or
# routed requests unmatched (`judge_unmatched`), or its WAN starved TCP (`judge_wan_flows`)
PARTIAL_EXIT = 5  # the results are written but incomplete: see "partial_reasons"
INTERRUPTED_EXIT = 130


@dataclass
class SystemRun:
    system: str
    records: list[RequestRecord]
    outputs: dict[str, list[int]]
    instances: list[InstanceReport] = field(default_factory=list)
    protocol_errors: int = 0  # frontend answers the replayer could not read
    partial: list[str] = field(default_factory=list)  # why its results are incomplete
    events: list[InstanceEvent] = field(default_factory=list)  # what happened to instances
    replay_start_s: float = 0.0  # modelled time of the replay's start (the faults' time 0)
    interrupted: bool = False
    faults_skipped: list[str] = field(default_factory=list)  # scheduled faults not carried out
    router: dict[str, Any] = field(default_factory=dict)  # the router's view and failovers
    wan_transfers: list[Any] = field(default_factory=list)  # KV transfers MD received
    cross_traffic: dict[str, Any] | None = None  # what other tenants got on the WAN meanwhile
    timing: dict[str, Any] = field(default_factory=dict)  # lag, dilation, validity
    events_dropped: dict[str, int] = field(default_factory=dict)  # instance -> timeline events
    # it dropped (oldest first, past its bound): the WAN figure and exports miss them
    phases_wall_s: dict[str, float] = field(default_factory=dict)  # where its wall time went
    wan_flows: dict[str, Any] | None = None  # the WAN's flows per window over the replay


async def until_interrupted(work: Coroutine[Any, Any, SystemRun]) -> SystemRun:
    """Run `work`; the first SIGINT or SIGTERM cancels it at its next await (it then ends what
    is in flight, keeps what finished and returns), a second one stops at once
    (KeyboardInterrupt: what the run made is still removed, this system's results are lost)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    signals = (signal.SIGINT, signal.SIGTERM)

    def first_signal() -> None:
        print("pddemu: stopping; writing what finished (again to stop at once)", file=sys.stderr)
        task.cancel()
        for signum in signals:
            loop.remove_signal_handler(signum)
        on_termination(raise_keyboard_interrupt)

    for signum in signals:
        loop.add_signal_handler(signum, first_signal)
    try:
        return await task
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


async def run_system(
    system: str,
    config: Config,
    network: Network,
    workload: list[Any],
    out: Path,
    launcher: Launcher | None = None,
) -> SystemRun:
    """One system's replay. Whatever happens (an instance dying, its stats unreadable, the
    run interrupted) it returns the records of every request sent, with what went wrong in
    `partial`; only a second interrupt loses them. `launcher`: the instances' launcher, kept
    by the caller across systems (without one the deployment starts its own)."""
    from pddemu.metrics.figure_inputs import wan_transfers

    epoch = time.monotonic()
    phases = Phases("start")
    deployment = Deployment(system, config, network, out, epoch, launcher=launcher)
    result = ReplayResult([])
    timing = RunTiming(
        network, config, system, typical_context(workload), lambda: completed_tpot_p50(result)
    )
    run = SystemRun(system, result.records, result.outputs, phases_wall_s=phases.wall_s)
    stats: dict[str, Any] = {}
    started = False
    conditions: ReplayConditions | None = None
    try:
        await deployment.start()
        started = True
        phases.enter("replay")
        with replay_conditions(network, config, scale_model(config)) as conditions:
            async with timing as clock:
                run.replay_start_s = clock.now() + REPLAY_LEAD_S  # the replay's and timeline's 0
                conditions.begin(run.replay_start_s)  # on the network's clock, as the links
                injecting = asyncio.ensure_future(
                    inject(
                        timeline_of(config).instance_faults,
                        deployment,
                        clock.now,
                        clock.sleep_until,
                        run.replay_start_s,
                        run.faults_skipped,
                    )
                )
                try:
                    await replay(
                        deployment.frontend_url,
                        workload,
                        clock,
                        system,
                        run.replay_start_s,
                        result,
                        deployment.headers,
                    )
                finally:
                    await stop_injecting(injecting, run)
        phases.enter("stats")
        stats = await deployment.stats()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        run.interrupted = True
        run.partial.append(
            f"interrupted {deployment.clock.now() - run.replay_start_s:.1f} modelled s into "
            f"the replay; "
            f"{result.not_sent} requests not sent"
            if started
            else "interrupted before the replay started"
        )
        if started:
            phases.enter("stats")
            stats = await deployment.stats(INTERRUPT_STATS_TIMEOUT_S)
    except DeploymentError as error:
        run.partial.append(str(error))
    except Exception as error:  # noqa: BLE001 - a defect: keep the trace, and the results
        traceback.print_exc()
        run.partial.append(f"emulator defect: the replay failed: {error!r}")
        result.protocol_errors += 1
    finally:
        phases.enter("stop")
        await deployment.stop()
        phases.end()
    run.events = list(deployment.events)
    if conditions is not None:
        run.cross_traffic = conditions.cross_traffic
    if started:
        run.partial += lost_instances(deployment, run.replay_start_s)
    run.protocol_errors = result.protocol_errors
    (out / f"instances-{system}.json").write_text(json.dumps(stats, indent=1))
    (out / f"outputs-{system}.json").write_text(json.dumps(result.outputs))  # genuine token ids
    for name, instance in stats.items():
        for error in instance["errors"]:
            print(f"[{system}] {name}: {error}", file=sys.stderr)
    run.instances = instance_reports(config, deployment, stats)
    run.router = next((report for report in stats.values() if report.get("role") == "FE"), {})
    run.wan_transfers = wan_transfers(stats)
    run.events_dropped = dropped_events(stats)
    if "end" in timing.marks:
        run.timing = timing.report(stats, completed_tpot_p50(result))
        run.wan_flows = replay_wan_flows(network, config, run, timing.marks["end"][1], out)
    for reason in run.partial:
        print(f"[{system}] partial: {reason}", file=sys.stderr)
    return run


def replay_wan_flows(
    network: Network, config: Config, run: SystemRun, end_s: float, out: Path
) -> dict[str, Any] | None:
    """The WAN's flows over the replay (`pddemu.metrics.wan_flows`), from the shaper's count,
    whose windows are kept in `wan-flows-<system>.json`; None for an unshaped WAN. A count
    that cannot be read leaves the results partial."""
    packets = path_packets(config, scale_model(config))
    if packets is None or network.flow_window_s is None:
        return None
    try:
        records = network.flow_counts()["wan"]
    except (OSError, KeyError, TopologyError, ControlError) as error:
        run.partial.append(f"the WAN's flow count could not be read: {error}")
        return None
    (out / f"wan-flows-{run.system}.json").write_text(json.dumps(records))
    return wan_flows_summary(records, run.replay_start_s, end_s, packets)


class Phases:
    """Wall seconds spent in each phase of a run (summary.json's `phases_wall_s`): where a
    command's wall time goes, the replay being one phase of several."""

    def __init__(self, first: str, wall_s: dict[str, float] | None = None) -> None:
        self.wall_s = {} if wall_s is None else wall_s
        self.current: str | None = first
        self.since = time.monotonic()

    def enter(self, phase: str | None) -> None:
        """The phase under way ends (its time is added to what it had), `phase` begins."""
        now = time.monotonic()
        if self.current is not None:
            self.wall_s[self.current] = round(
                self.wall_s.get(self.current, 0.0) + now - self.since, 3
            )
        self.current, self.since = phase, now

    def end(self) -> None:
        self.enter(None)


async def stop_injecting(injecting: asyncio.Future, run: SystemRun) -> None:
    """The replay is over: faults still due will not happen (they are reported skipped)."""
    injecting.cancel()
    try:
        await injecting
    except asyncio.CancelledError:
        pass
    except Exception as error:  # noqa: BLE001 - a fault that could not be done, not a lost run
        run.partial.append(f"a scheduled fault could not be carried out: {error}")


def completed_tpot_p50(result: ReplayResult) -> float | None:
    """TPOT p50 of the requests completed so far (what the run's lag bound is a share of)."""
    done = [r.tpot_s for r in result.records if r.state == "completed" and r.tpot_s]
    return percentile(done, 50) if done else None


def typical_context(workload: list[Any]) -> int:
    """The median modelled context of a workload's requests halfway through their outputs."""
    contexts = [r.input_tokens + r.output_tokens // 2 for r in workload]
    return int(percentile(contexts, 50)) if contexts else TYPICAL_CONTEXT


def dropped_events(stats: dict[str, Any]) -> dict[str, int]:
    """The instances whose timeline dropped events (each keeps its latest `EVENT_CAPACITY`)."""
    return {
        name: report["events_dropped"]
        for name, report in stats.items()
        if report.get("events_dropped")
    }


def dropped_events_warning(system: str, dropped: dict[str, int]) -> str | None:
    """One line saying which timelines are incomplete, or None when none is."""
    if not dropped:
        return None
    counts = ", ".join(f"{name} {count:,}" for name, count in sorted(dropped.items()))
    return (
        f"pddemu: the {system} run's timelines dropped their oldest events ({counts}; each "
        f"instance keeps its latest {EVENT_CAPACITY:,}): the WAN figure and `pddemu export "
        f"--format perfetto` miss them (summary.json: events_dropped); the records are whole"
    )


def lost_instances(deployment: Deployment, replay_start_s: float) -> list[str]:
    """What the deployment lost that nobody planned: instances that died, and stats that could
    not be read (an instance a scheduled fault killed has none, as expected)."""
    died = {event.instance: event for event in deployment.unplanned}
    killed = {event.instance for event in deployment.events if event.kind == "killed"}
    reasons = [
        f"{name} died {event.at_s - replay_start_s:.1f} modelled s into the replay: {event.detail}"
        for name, event in died.items()
    ]
    reasons += [
        f"{name}: {why}"
        for name, why in deployment.missing_stats.items()
        if name not in died and name not in killed
    ]
    return reasons


def instance_reports(
    config: Config, deployment: Deployment, stats: dict[str, Any]
) -> list[InstanceReport]:
    """What each emulated chip instance reports, with its hardware and price (the frontend
    stands for no hardware of the modelled deployment). An instance whose stats are lost still
    costs its price."""
    reports = []
    for name, spec in deployment.specs.items():
        if spec.me.role == "FE":
            continue
        hardware = config.hardware_for(deployment.system, spec.me.role)
        own = stats.get(name, {})
        reports.append(
            InstanceReport(
                name=name,
                role=spec.me.role,
                chip=hardware.chip,
                chips=hardware.chips,
                price_per_hour=load_chip(hardware.chip).price_per_hour * hardware.chips,
                lag_samples_s=Reservoir.restored(
                    own.get("lag_samples_s", []), own.get("lag_samples_totals")
                ),
                steps=own.get("steps", 0),
                busy_s=own.get("busy_s", 0.0),
                tokens_generated=own.get("tokens_generated", 0),
                prefill_tokens=own.get("prefill_tokens", 0),
                kv_peak_over_capacity_tokens=own.get("kv_peak_over_capacity_tokens", 0),
            )
        )
    return reports


def workload_of(config: Config) -> list[Any]:
    """The warm-up requests, then the measured ones, in arrival order."""
    requests = config.workload.requests
    return load_workload(
        config.workload.trace,
        requests=None if requests is None else config.workload.warmup_requests + requests,
        seed=config.workload.seed,
        token_scale=config.scale.token_scale,
        arrival_rate=config.workload.arrival_rate,
        block_size=config.workload.block_size,
        synthetic=SyntheticShape(
            config.workload.synthetic_input_tokens,
            config.workload.synthetic_output_tokens,
            config.workload.synthetic_hit_rate,
        ),
    )


class ReferenceCheck:
    """Every completed request's tokens against the single-process reference (computed once
    per request, for the requests some system completed)."""

    def __init__(self, config: Config, workload: list[Any]) -> None:
        self.config = config
        self.workload = workload
        self.reference: dict[str, list[int]] = {}

    def check(self, run: SystemRun) -> None:
        completed = {r.request_id for r in run.records if r.state == "completed"}
        missing = [r for r in self.workload if r.request_id in completed - set(self.reference)]
        if missing:
            self.reference.update(
                reference_outputs(
                    missing,
                    ModelConfig(**self.config.model),
                    self.config.prefill.chunk_tokens // self.config.scale.token_scale,
                )
            )
        for record in run.records:
            if (
                record.state == "completed"
                and run.outputs.get(record.request_id) != self.reference[record.request_id]
            ):
                record.token_mismatch = True


def emulate(
    config: Config,
    systems: list[str],
    out: Path,
    workload: list[Any],
    launcher: Launcher | None = None,
    at_once: bool = True,
) -> int:
    """Run the systems, at once (`at_once`, each in a child process with a network of its own:
    `pddemu.at_once`) or one after another on one network; as each ends, check its tokens and
    write every result so far (a run cut short by anything keeps the systems that finished).
    Returns the exit status. `launcher`: the instances' launcher (`pddemu emulate` starts it
    before its own imports) for systems run one after another; without one, the run starts
    its own."""
    began = time.monotonic()
    scale = scale_model(config)
    out.mkdir(parents=True, exist_ok=True)
    link = wan_link(config, scale)
    time_scale = config.scale.time_scale
    at_once = at_once and len(systems) > 1
    print(
        f"pddemu: {len(workload)} requests of {config.workload.trace}, systems {', '.join(systems)}"
        f"{' at once, each on a network of its own' if at_once else ''}; "
        f"emulated WAN {link.rate_bps / 1e6 if link.rate_bps else float('inf'):.3f} Mbit/s per modelled s, "
        f"{link.delay_s * 1e3:.1f} ms one way, {link.qdisc} (modelled {config.wan.rate_bps / 1e9 if config.wan.rate_bps else 0:g} Gbit/s); "
        f"scale: token 1/{config.scale.token_scale}, time {'auto' if time_scale is None else f'up to x{time_scale:g}'}",
        file=sys.stderr,
    )
    runs: dict[str, SystemRun] = {}
    warmup_ids = frozenset(r.request_id for r in workload[: config.workload.warmup_requests])
    tokens = ReferenceCheck(config, workload)
    written: tuple[dict[str, Any], dict[str, Any]] = ({}, {})

    def finished(run: SystemRun) -> None:
        """Its tokens checked, and every result so far written."""
        nonlocal written
        print(f"pddemu: checking {run.system}'s tokens against the reference ...", file=sys.stderr)
        checking = Phases("reference_check", run.phases_wall_s)
        tokens.check(run)
        checking.end()
        runs[run.system] = run
        done = {system: runs[system] for system in systems if system in runs}
        not_run = [system for system in systems if system not in runs]
        meta = {"systems_at_once": at_once, "wall_s": round(time.monotonic() - began, 3)}
        written = write_outputs(config, scale, link, done, not_run, out, warmup_ids, meta)

    if at_once:
        if launcher is not None:
            launcher.close()  # each system's child starts its own (an instance is its child)
        outcome = run_at_once(
            systems,
            lambda system: run_in_own_network(system, config, scale, out, workload),
            lambda _system, run: finished(run),
        )
        for system, status in outcome.failed.items():
            print(
                f"pddemu: the {system} run ended without results (exit status {status})",
                file=sys.stderr,
            )
        if not runs:
            return INTERRUPTED_EXIT if outcome.interrupted else 1
        status = report(*written, runs, out)
        return 1 if outcome.failed and status != INTERRUPTED_EXIT else status
    with ExitStack() as stack:
        if launcher is None:  # one for every system's deployment
            (out / "logs").mkdir(exist_ok=True)
            launcher = stack.enter_context(Launcher(out / "logs" / "launcher.err"))
        network = stack.enter_context(network_for(config, scale))
        for system in systems:
            run = replay_system(system, config, network, workload, out, launcher)
            finished(run)
            if run.interrupted:
                break
    return report(*written, runs, out)


def replay_system(
    system: str,
    config: Config,
    network: Network,
    workload: list[Any],
    out: Path,
    launcher: Launcher,
) -> SystemRun:
    """`run_system` on its own event loop, the network's random draws (loss, jitter) started
    afresh from the run's seed first: a system meets the same WAN weather whether it runs on
    a network of its own or after others on a shared one, and whatever systems run with it."""
    network.restart_draws()
    run = uvloop.run(
        until_interrupted(run_system(system, config, network, workload, out, launcher))
    )
    on_termination(raise_keyboard_interrupt)  # the loop's own handlers are gone with it
    return run


def run_in_own_network(
    system: str, config: Config, scale: ScaleModel, out: Path, workload: list[Any]
) -> SystemRun:
    """One system's run on a network and a launcher of its own, both removed before it returns
    (a child's work in `pddemu.at_once`). A network that cannot be set up is said in one line
    (exit status 1)."""
    from netem.registry import RunError

    up = Phases("network_up")
    try:
        with ExitStack() as stack:
            (out / "logs" / system).mkdir(parents=True, exist_ok=True)
            launcher = stack.enter_context(Launcher(out / "logs" / system / "launcher.err"))
            network = stack.enter_context(network_for(config, scale))
            up.end()
            run = replay_system(system, config, network, workload, out, launcher)
            down = Phases("network_down", run.phases_wall_s)
        down.end()
    except (TopologyError, RunError) as error:
        print(
            f"pddemu: [{system}] the emulated network could not be set up: {error}",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    run.phases_wall_s = {**up.wall_s, **run.phases_wall_s}
    return run


def write_outputs(
    config: Config,
    scale: ScaleModel,
    link: LinkSpec,
    runs: dict[str, SystemRun],
    not_run: list[str],
    out: Path,
    warmup_ids: Collection[str],
    run_meta: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """summary.json and requests.csv first (the results), then the plots and report.md;
    `warmup_ids` are the warm-up's requests (the workload's first `warmup_requests`);
    `run_meta`: how the command ran (summary.json's top level)."""
    from pddemu.metrics.figure_inputs import measured_wan_use, split_warmup
    from pddemu.metrics.plots import write_plots

    all_records = [record for run in runs.values() for record in run.records]
    write_requests_csv(out / "requests.csv", all_records)
    slo = SLO(config.slo.ttft_s, config.slo.tpot_s)
    split = {system: split_warmup(run.records, warmup_ids) for system, run in runs.items()}
    measured = {system: records for system, (_, records) in split.items()}
    summaries = {}
    for system, run in runs.items():
        arguments = (
            run.instances,
            slo,
            {**scale.describe(), "time_scale": _speedup(run)},
            link.rate_bps if system != "indc" else None,
            config.wan_cost_per_hour(system),
        )
        summaries[system] = summarize(system, measured[system], *arguments)
        warm = split[system][0]
        summaries[system]["warmup"] = (
            {key: summarize(system, warm, *arguments)[key] for key in WARMUP_FIELDS}
            if warm
            else None
        )
        summaries[system].update(run.timing)
        summaries[system]["partial"] = bool(run.partial)
        summaries[system]["partial_reasons"] = run.partial
        summaries[system]["events_dropped"] = run.events_dropped
        summaries[system]["phases_wall_s"] = run.phases_wall_s
        summaries[system]["instance_events"] = [
            {**e.to_dict(), "at_s": e.at_s - run.replay_start_s} for e in run.events
        ]
        if run.cross_traffic is not None:
            summaries[system]["cross_traffic"] = run.cross_traffic
        timeline = timeline_of(config)
        links = timeline.link_events
        summaries[system]["faults"] = {
            "scheduled": [fault.to_dict() for fault in timeline.instance_faults],
            "link_events": links.to_dict()["steps"] if links is not None else [],
            "skipped": run.faults_skipped,
            "replay_start_s": run.replay_start_s,  # the timeline's 0 on the records' clock
            "timeline": timeline_rows(
                links,
                summaries[system]["instance_events"],
                run.router,
                run.replay_start_s,
            ),
        }
        if run.wan_flows is not None:
            summaries[system]["wan_flows"] = run.wan_flows
        judge_unmatched(summaries[system])
        if system != "indc":  # no KV of its own crosses the WAN: its flows are others'
            judge_wan_flows(summaries[system])
    reasons = {system: run.partial for system, run in runs.items() if run.partial}
    meta = {
        "partial": bool(reasons or not_run),
        "partial_reasons": reasons,
        "systems_not_run": not_run,
        "config": config.source,
        "trace": config.workload.trace,
        "requests": config.workload.requests,
        "warmup_requests": config.workload.warmup_requests,
        "warmup_request_ids": sorted(warmup_ids),  # for `pddemu plot`, which leaves them out
        "seed": config.workload.seed,
        "arrival_rate": config.workload.arrival_rate or "trace",
        "wan_modelled": {
            "rate_bps": config.wan.rate_bps,
            "delay_s": config.wan.delay_s,
            "jitter_s": config.wan.jitter_s,
            "qdisc": config.wan.qdisc,
            "loss": config.wan.loss,
            "schedule": config.wan.schedule,
        },
        "faults": config.faults.schedule,
        **(run_meta or {}),
    }
    write_summary_json(out / "summary.json", summaries, meta)
    transfers = {system: run.wan_transfers for system, run in runs.items()}
    wan = measured_wan_use(transfers, measured, config.wan.rate_bps, scale.byte_scale)
    plots = write_plots(out, measured, config.slo.ttft_s, wan)
    write_report(out, summaries, meta, plots)
    return summaries, meta


# a warm-up's own figures, kept apart from the measured ones (summary.json's `warmup`)
WARMUP_FIELDS = (
    "requests",
    "pipelines",
    "rld_token_share",
    "tokens",
    "hit_rate",
    "wan_bytes",
    "slo_attainment",
    "ttft_s",
    "duration_s",
    "token_mismatches",
    "delivery",
    "failover",
)


def report(
    summaries: dict[str, Any], meta: dict[str, Any], runs: dict[str, SystemRun], out: Path
) -> int:
    """Print the table and what was written; the exit status says how the run went."""
    print(format_table(summaries))
    print(f"\nwrote {out / 'summary.json'}, {out / 'requests.csv'}, {out / 'report.md'} in {out}/")
    # the warm-up's are counted too: a wrong token or a failure is a defect wherever it falls
    every = [*summaries.values(), *(s["warmup"] for s in summaries.values() if s.get("warmup"))]
    failed = sum(s["requests"]["failed"] for s in every)
    mismatches = sum(s["token_mismatches"] for s in every)
    protocol_errors = sum(run.protocol_errors for run in runs.values())
    if failed or mismatches:
        print(
            f"pddemu: {failed} failed requests ({protocol_errors} of them answers the replayer "
            f"could not read), {mismatches} token mismatches (see requests.csv)",
            file=sys.stderr,
        )
    if any(run.interrupted for run in runs.values()):
        print(
            "pddemu: interrupted; the results of what finished are written (partial), and "
            "everything the run made has been removed",
            file=sys.stderr,
        )
        return INTERRUPTED_EXIT
    invalid = {
        s: summary["invalid_reason"]
        for s, summary in summaries.items()
        if not summary.get("valid", True)
    }
    for system, reason in invalid.items():
        print(f"pddemu: the {system} run is not valid: {reason}", file=sys.stderr)
    for system, run in runs.items():
        warning = dropped_events_warning(system, run.events_dropped)
        if warning:
            print(warning, file=sys.stderr)
    if mismatches or protocol_errors:
        return DEFECT_EXIT
    if meta["partial"]:
        print(
            "pddemu: the results are partial: see partial_reasons in summary.json", file=sys.stderr
        )
        return PARTIAL_EXIT
    return INVALID_EXIT if invalid else 0


def _speedup(run: SystemRun) -> float:
    """summary.json's `scale.time_scale`: modelled seconds per wall second the run achieved."""
    return run.timing.get("dilation", {}).get("speedup") or 1.0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "emulate",
        allow_abbrev=False,  # `--rootless` is acted on before parsing, by its full name
        help="replay a workload through pdd, naive and indc",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="directory for summary.json, requests.csv, plots, report.md",
    )
    parser.add_argument("--config", type=Path, help="TOML scenario (default: configs/default.toml)")
    parser.add_argument(
        "--system",
        choices=[*SYSTEMS, "all"],
        default="all",
        help="the system to run, or all three (default): at once, each on a network of its own",
    )
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="with --system all: run the systems one after another on one network (slower; "
        "each replay has the host to itself)",
    )
    parser.add_argument(
        "--trace", help="pdd-janfeb, or a path to a trace file of a format in docs/traces.md"
    )
    parser.add_argument("--requests", type=int, help="replay a deterministic sample of N requests")
    parser.add_argument("--seed", type=int, help="seed of the workload and the link's random draws")
    parser.add_argument(
        "--block-size",
        type=int,
        metavar="TOKENS",
        help="tokens per hash id of a Mooncake trace whose lines do not say (default 512); "
        "sets [workload] block_size",
    )
    parser.add_argument(
        "--faults",
        type=Path,
        metavar="FILE",
        help="faults at modelled times from the replay's start: instance faults (kill=MD0, "
        "pause=RLD0,3s, restart=MD0) and link events (link=down, a2b.rate=1gbit); sets "
        "[faults] schedule (docs/architecture.md)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value, e.g. --set policy.handoff_mode=one-shot (repeatable)",
    )
    add_rootless_flag(parser)
    parser.set_defaults(func=run_cli)


def config_of(args: argparse.Namespace) -> Config:
    """The scenario a command line asks for: --config, then --set, then the workload flags."""
    faults = [f"faults.schedule={json.dumps(str(args.faults))}"] if args.faults else []
    config = load_config(args.config, [*args.set, *faults])
    if args.requests is not None and args.requests < 1:
        raise ConfigError("--requests must be at least 1")
    if args.block_size is not None and args.block_size < 1:
        raise ConfigError("--block-size must be at least 1")
    return config.with_workload(
        trace=args.trace, requests=args.requests, seed=args.seed, block_size=args.block_size
    )


def run_cli(args: argparse.Namespace) -> int:
    config = config_of(args)
    workload = workload_of(config)
    systems = list(SYSTEMS) if args.system == "all" else [args.system]
    on_termination(raise_keyboard_interrupt)
    try:
        return emulate(
            config, systems, args.out, workload, args.launcher, at_once=not args.one_at_a_time
        )
    except KeyboardInterrupt:
        print(
            "pddemu: stopped at once; the systems that finished before are written, everything "
            "the run made has been removed",
            file=sys.stderr,
        )
        return INTERRUPTED_EXIT
