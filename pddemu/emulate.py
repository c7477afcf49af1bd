"""`pddemu emulate`: replay one workload through pdd, naive and indc on one emulated network,
check every token against the single-process reference, and write the run's files.

    pddemu emulate --out DIR [--config FILE] [--system pdd|naive|indc|all]
                   [--trace NAME|PATH] [--requests N] [--seed S]

Exit status: 0 when every delivered stream equals the reference (failed requests, such as
timeouts under overload, are results and are reported), 3 when a stream differs from it or the
replayer could not read the frontend's answer (an emulator defect), 2 for bad input, 1 when the
network cannot be set up or the results cannot be written, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from netem.signals import on_termination, raise_keyboard_interrupt
from netem.spec import LinkSpec
from netem.topology import LinkConfig, Network
from pddemu.config import SYSTEMS, Config, ConfigError, load_config
from pddemu.deployment import Deployment
from pddemu.emulated_network import intra_link, scale_model, wan_link
from pddemu.hardware import load_chip
from pddemu.metrics import (
    SLO,
    InstanceReport,
    RequestRecord,
    format_table,
    summarize,
    write_report,
    write_requests_csv,
    write_summary_json,
)
from pddemu.model import ModelConfig
from pddemu.reference import reference_outputs
from pddemu.replay import replay
from pddemu.runtime.clock import ModelledClock
from pddemu.scale import ScaleModel
from pddemu.workload import load_workload

REPLAY_LEAD_S = 1.0  # modelled seconds between the deployment being ready and the first arrival


@dataclass
class SystemRun:
    system: str
    records: list[RequestRecord]
    outputs: dict[str, list[int]]
    instances: list[InstanceReport]
    protocol_errors: int = 0  # frontend answers the replayer could not read
    wan_transfers: list[Any] = field(default_factory=list)  # KV transfers MD received


async def until_interrupted(work: Coroutine[Any, Any, SystemRun]) -> SystemRun:
    """Run `work`; SIGINT or SIGTERM cancels it at its next await (so its cleanup runs in
    order, never from inside a callback), then surfaces as KeyboardInterrupt."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    signals = (signal.SIGINT, signal.SIGTERM)
    for signum in signals:
        loop.add_signal_handler(signum, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


async def run_system(
    system: str, config: Config, network: Network, workload: list[Any], out: Path
) -> SystemRun:
    epoch = time.monotonic()
    deployment = Deployment(system, config, network, out, epoch)
    try:
        await deployment.start()
        clock = ModelledClock(epoch, config.scale.time_scale)
        result = await replay(
            deployment.frontend_url, workload, clock, system, clock.now() + REPLAY_LEAD_S
        )
        stats = await deployment.stats()
    finally:
        await deployment.stop()
    (out / f"instances-{system}.json").write_text(json.dumps(stats, indent=1))
    (out / f"outputs-{system}.json").write_text(json.dumps(result.outputs))  # genuine token ids
    for name, instance in stats.items():
        for error in instance["errors"]:
            print(f"[{system}] {name}: {error}", file=sys.stderr)
    return SystemRun(
        system,
        result.records,
        result.outputs,
        instance_reports(config, deployment, stats),
        result.protocol_errors,
        wan_transfers(stats),
    )


def wan_transfers(stats: dict[str, Any]) -> list[Any]:
    """The KV transfers that crossed the WAN (those an MD received), for the WAN figure."""
    from pddemu.metrics.plots import WanTransfer

    return [
        WanTransfer(
            event["start_s"],
            event["end_s"],
            int(event.get("genuine_bytes") or 0),
            [tuple(chunk) for chunk in event.get("chunks", [])],
        )
        for report in stats.values()
        if report.get("role") == "MD"
        for event in report.get("events", [])
        if event["kind"] == "kv_transfer"
    ]


def instance_reports(
    config: Config, deployment: Deployment, stats: dict[str, Any]
) -> list[InstanceReport]:
    """What each emulated chip instance reports, with its hardware and price (the frontend
    stands for no hardware of the modelled deployment)."""
    reports = []
    for name, spec in deployment.specs.items():
        if spec.me.role == "FE":
            continue
        hardware = config.hardware_for(deployment.system, spec.me.role)
        reports.append(
            InstanceReport(
                name=name,
                role=spec.me.role,
                chip=hardware.chip,
                chips=hardware.chips,
                price_per_hour=load_chip(hardware.chip).price_per_hour * hardware.chips,
                lag_samples_s=stats[name]["lag_samples_s"],
                steps=stats[name]["steps"],
                busy_s=stats[name]["busy_s"],
                tokens_generated=stats[name].get("tokens_generated", 0),
                prefill_tokens=stats[name].get("prefill_tokens", 0),
            )
        )
    return reports


DEFECT_EXIT = 3  # a stream differs from the reference, or an answer could not be read


def workload_of(config: Config) -> list[Any]:
    return load_workload(
        config.workload.trace,
        requests=config.workload.requests,
        seed=config.workload.seed,
        token_scale=config.scale.token_scale,
        arrival_rate=config.workload.arrival_rate,
        block_size=config.workload.block_size,
    )


def emulate(config: Config, systems: list[str], out: Path, workload: list[Any]) -> int:
    scale = scale_model(config)
    out.mkdir(parents=True, exist_ok=True)
    link = wan_link(config, scale)
    print(
        f"pddemu: {len(workload)} requests of {config.workload.trace}, systems {', '.join(systems)}; "
        f"emulated WAN {link.rate_bps / 1e6 if link.rate_bps else float('inf'):.1f} Mbit/s, "
        f"{link.delay_s * 1e3:.1f} ms one way (modelled {config.wan.rate_bps / 1e9 if config.wan.rate_bps else 0:g} Gbit/s, "
        f"{config.wan.delay_s * 1e3:g} ms); scale: token 1/{config.scale.token_scale}, time x{config.scale.time_scale:g}",
        file=sys.stderr,
    )
    runs: dict[str, SystemRun] = {}
    with Network(
        LinkConfig.symmetric(link), intra=intra_link(config, scale), seed=config.workload.seed
    ) as network:
        for system in systems:
            runs[system] = uvloop.run(
                until_interrupted(run_system(system, config, network, workload, out))
            )
            on_termination(raise_keyboard_interrupt)  # the loop's own handlers are gone with it
    print("pddemu: checking every token against the single-process reference ...", file=sys.stderr)
    reference = reference_outputs(
        workload,
        ModelConfig(**config.model),
        config.prefill.chunk_tokens // config.scale.token_scale,
    )
    for run in runs.values():
        for record in run.records:
            if (
                record.state == "completed"
                and run.outputs.get(record.request_id) != reference[record.request_id]
            ):
                record.token_mismatch = True
    return write_outputs(config, scale, link, runs, out)


def write_outputs(
    config: Config, scale: ScaleModel, link: LinkSpec, runs: dict[str, SystemRun], out: Path
) -> int:
    from pddemu.metrics.plots import WanUse, write_plots

    all_records = [record for run in runs.values() for record in run.records]
    write_requests_csv(out / "requests.csv", all_records)
    slo = SLO(config.slo.ttft_s, config.slo.tpot_s)
    summaries = {
        system: summarize(
            system,
            run.records,
            run.instances,
            slo,
            scale.describe(),
            link.rate_bps if system != "indc" else None,
            config.wan_cost_per_hour(system),
        )
        for system, run in runs.items()
    }
    meta = {
        "config": config.source,
        "trace": config.workload.trace,
        "requests": config.workload.requests,
        "seed": config.workload.seed,
        "arrival_rate": config.workload.arrival_rate or "trace",
        "wan_modelled": {
            "rate_bps": config.wan.rate_bps,
            "delay_s": config.wan.delay_s,
            "jitter_s": config.wan.jitter_s,
        },
    }
    write_summary_json(out / "summary.json", summaries, meta)
    crossing = {system: run for system, run in runs.items() if system != "indc"}
    wan = WanUse(
        {system: run.wan_transfers for system, run in crossing.items()},
        {
            system: min((r.arrival_s for r in run.records), default=0.0)
            for system, run in crossing.items()
        },
        config.wan.rate_bps,
        scale.byte_scale,
    )
    plots = write_plots(
        out, {system: run.records for system, run in runs.items()}, config.slo.ttft_s, wan
    )
    report = write_report(out, summaries, meta, plots)
    print(format_table(summaries))
    print(
        f"\nwrote {out / 'summary.json'}, {out / 'requests.csv'}, {report} and {len(plots)} plots in {out}/"
    )
    failed = sum(s["requests"]["failed"] for s in summaries.values())
    mismatches = sum(s["token_mismatches"] for s in summaries.values())
    protocol_errors = sum(run.protocol_errors for run in runs.values())
    if failed or mismatches:
        print(
            f"pddemu: {failed} failed requests ({protocol_errors} of them answers the replayer "
            f"could not read), {mismatches} token mismatches (see requests.csv)",
            file=sys.stderr,
        )
    return DEFECT_EXIT if mismatches or protocol_errors else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "emulate",
        allow_abbrev=False,  # `--rootless` is acted on before parsing, by its full name
        help="replay a workload through pdd, naive and indc",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        help="the system to run, or all three one after the other (default)",
    )
    parser.add_argument(
        "--trace", help="pdd-janfeb, or a path to a trace file of a format in docs/traces.md"
    )
    parser.add_argument("--requests", type=int, help="replay a deterministic sample of N requests")
    parser.add_argument("--seed", type=int, help="seed of the workload and the link's random draws")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value, e.g. --set policy.handoff_mode=one-shot (repeatable)",
    )
    parser.add_argument(  # acted on by pddemu.cli.main, before anything starts a thread
        "--rootless",
        action="store_true",
        help="run in a private user namespace even as root (the path a non-root user takes)",
    )
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.set)
    if args.requests is not None and args.requests < 1:
        raise ConfigError("--requests must be at least 1")
    config = config.with_workload(trace=args.trace, requests=args.requests, seed=args.seed)
    workload = workload_of(config)
    systems = list(SYSTEMS) if args.system == "all" else [args.system]
    on_termination(raise_keyboard_interrupt)
    try:
        return emulate(config, systems, args.out, workload)
    except KeyboardInterrupt:
        print("pddemu: interrupted; everything the run made has been removed", file=sys.stderr)
        return 130
