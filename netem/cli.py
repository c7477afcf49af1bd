"""`netem`: bring a two-datacenter network up, change it live, list and remove runs.

netem up --name N [--rate 100mbit] [--delay 20ms] [--jitter 2ms] [--loss 0.5%]
         [--backend auto|kernel|userspace]   -> one JSON line when ready; runs until
                                                SIGINT/SIGTERM, then removes everything
netem set --name N [--link wan] [--dir both] --rate 10mbit ...   (live change)
netem link --name N [--link wan] down|up
netem exec --name N --host a|a2|b -- COMMAND...
netem ls [--json]      netem down --name N | --all      netem bench --out FILE
netem trace import mahimahi UPLINK DOWNLINK --out FILE [--bin 10ms]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
from dataclasses import replace
from typing import Any

from netem import nsutil
from netem.addressing import Addresses
from netem.direction import SEED_LIMIT
from netem.registry import (
    Registry,
    RunError,
    check_name,
    kill_namespace_processes,
    namespace_name,
    remove_host_link,
    remove_namespace,
)
from netem.schedule import load_schedule
from netem.signals import on_termination
from netem.spec import (
    FIELD_PARSERS,
    LinkSpec,
    SpecError,
    parse_assignments,
    parse_fields,
)
from netem.units import UnitError

EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments get one line on stderr and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(EXIT_USAGE)


def _field_type(key: str):
    def parse(text: str) -> Any:
        try:
            return parse_fields({key: text})[FIELD_PARSERS[key][0]]
        except UnitError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = key
    return parse


def _run_name(text: str) -> str:
    try:
        return check_name(text)
    except RunError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seed(text: str) -> int:
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= seed < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be in [0, {SEED_LIMIT}), got {seed}")
    return seed


def _assignments(text: str) -> dict[str, Any]:
    try:
        return parse_assignments(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cross_traffic(text: str) -> Any:
    from netem.crosstraffic import parse_cross_traffic

    try:
        return parse_cross_traffic(text)
    except SpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_link_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("link (both directions unless overridden)")
    group.add_argument(
        "--rate", type=_field_type("rate"), help="e.g. 100mbit, 1gbit (default unlimited)"
    )
    group.add_argument(
        "--qdisc",
        type=_field_type("qdisc"),
        help="queueing discipline at the rate: fifo (default), fq, fq_codel, prio[:fq|:fq_codel]",
    )
    group.add_argument("--delay", type=_field_type("delay"), help="one-way delay, e.g. 20ms")
    group.add_argument(
        "--jitter", type=_field_type("jitter"), help="standard deviation of the delay, e.g. 2ms"
    )
    group.add_argument(
        "--dist", type=_field_type("dist"), help="jitter distribution: uniform|normal|pareto"
    )
    group.add_argument(
        "--loss", type=_field_type("loss"), help="e.g. 0.5%%, or gemodel:P,R[,1-H[,1-K]]"
    )
    group.add_argument(
        "--limit", type=_field_type("limit"), help="queue limit, e.g. 5mb (default: >= 1 BDP)"
    )
    order = group.add_mutually_exclusive_group()
    order.add_argument(
        "--reorder", action="store_const", const=True, help="let jitter reorder packets"
    )
    order.add_argument(
        "--no-reorder",
        dest="reorder",
        action="store_const",
        const=False,
        help="keep packets in order (default)",
    )


LINK_OPTIONS = ("rate", "qdisc", "delay", "jitter", "dist", "loss", "limit", "reorder")


def _link_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The link options given on the command line, as LinkSpec fields."""
    return {
        FIELD_PARSERS[option][0]: getattr(args, option)
        for option in LINK_OPTIONS
        if getattr(args, option, None) is not None
    }


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="netem", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    up = sub.add_parser("up", help="bring a run up and keep it until SIGINT/SIGTERM")
    up.add_argument("--name", type=_run_name, help="run name (a-z, 0-9, -); default: a random one")
    up.add_argument("--backend", choices=("auto", "kernel", "userspace"), default="auto")
    _add_link_options(up)
    up.add_argument("--mtu", type=_field_type("mtu"), help="WAN MTU (default 1500)")
    up.add_argument(
        "--schedule",
        help="file of timed changes, '<seconds> [wan.|intra.][a2b.|b2a.]key=value ...' per line "
        "(key: a link field or link=down|up); time 0 is when the run is ready",
    )
    up.add_argument(
        "--cross-traffic",
        type=_cross_traffic,
        metavar="KEY=VALUE,...",
        help="other tenants' TCP flows on the WAN, e.g. utilisation=0.5,sizes=pareto,mean=1mb,"
        "arrivals=poisson|paced,dir=a2b|b2a|both,schedule=FILE; its report goes to stderr at exit",
    )
    up.add_argument(
        "--a2b",
        type=_assignments,
        default={},
        help="overrides for DC A -> DC B, e.g. rate=50mbit,loss=1%%",
    )
    up.add_argument("--b2a", type=_assignments, default={}, help="overrides for DC B -> DC A")
    up.add_argument(
        "--intra",
        type=_assignments,
        help="shape the intra-DC path a<->a2, e.g. rate=10gbit,delay=50us",
    )
    up.add_argument(
        "--tun-device", default="/dev/net/tun", help="TUN clone device (userspace backend)"
    )
    up.add_argument(
        "--seed", type=_seed, default=0, help="seed of the loss and jitter draws (0 to 2^31 - 1)"
    )
    up.add_argument(
        "--rootless", action="store_true", help="use a private user namespace even as root"
    )

    down = sub.add_parser("down", help="remove a run, the stale ones, or all of them")
    target = down.add_mutually_exclusive_group(required=True)
    target.add_argument("--name")
    target.add_argument("--stale", action="store_true", help="runs whose controller died, orphans")
    target.add_argument("--all", action="store_true", help="every run (live ones are stopped)")

    ls = sub.add_parser("ls", help="list runs")
    ls.add_argument("--json", action="store_true")

    setp = sub.add_parser("set", help="change a running link")
    setp.add_argument("--name", required=True)
    setp.add_argument("--link", default="wan", choices=("wan", "intra"))
    setp.add_argument("--dir", default="both", choices=("a2b", "b2a", "both"))
    _add_link_options(setp)

    link = sub.add_parser("link", help="take a running link down or up")
    link.add_argument("--name", required=True)
    link.add_argument("--link", default="wan", choices=("wan", "intra"))
    link.add_argument("--dir", default="both", choices=("a2b", "b2a", "both"))
    link.add_argument("state", choices=("up", "down"))

    ex = sub.add_parser("exec", help="run a command inside one of a run's namespaces")
    ex.add_argument("--name", required=True)
    ex.add_argument("--host", choices=("a", "a2", "b"), required=True)
    ex.add_argument("argv", nargs=argparse.REMAINDER)

    trace = sub.add_parser("trace", help="link traces from other tools")
    trace_sub = trace.add_subparsers(
        dest="trace_command", required=True, parser_class=OneLineParser
    )
    importer = trace_sub.add_parser("import", help="convert a trace into a netem schedule")
    formats = importer.add_subparsers(dest="format", required=True, parser_class=OneLineParser)
    mahimahi = formats.add_parser(
        "mahimahi", help="mahimahi delivery traces (one millisecond per 1500-byte opportunity)"
    )
    mahimahi.add_argument("uplink", help="uplink trace (becomes a2b)")
    mahimahi.add_argument("downlink", help="downlink trace (becomes b2a)")
    mahimahi.add_argument("--out", required=True, help="schedule file to write")
    mahimahi.add_argument(
        "--bin", type=_field_type("delay"), default=0.010, help="rate step length (default 10ms)"
    )
    mahimahi.add_argument(
        "--duration",
        type=_field_type("delay"),
        help="cover this long without repeating (default: repeat when the periods match)",
    )

    bench = sub.add_parser("bench", help="measure the link with ping and iperf3 (writes JSON)")
    bench.add_argument("--out", default="bench/results/netem.json")
    bench.add_argument(
        "--quick", action="store_true", help="shorter runs (a smoke test, not the targets)"
    )
    bench.add_argument(
        "--only",
        type=lambda text: tuple(text.split(",")),
        default=(),
        metavar="STEP,...",
        help="run only these steps (names as in the JSON, e.g. trace_replay,rate_1000mbit)",
    )
    return parser


def _link_specs(args: argparse.Namespace) -> tuple[Any, Any]:
    from netem.topology import LinkConfig

    base = LinkSpec(**_link_changes(args))
    if args.mtu is not None:
        base = replace(base, mtu=args.mtu)
    wan = LinkConfig(base.with_changes(**args.a2b), base.with_changes(**args.b2a))
    intra = LinkConfig.symmetric(LinkSpec().with_changes(**args.intra)) if args.intra else None
    return wan, intra


def cmd_up(args: argparse.Namespace) -> int:
    from netem import rootless

    wan, intra = _link_specs(args)
    schedule = load_schedule(args.schedule) if args.schedule else None
    if args.cross_traffic is not None:
        for direction in args.cross_traffic.directions():
            if not getattr(wan, direction).rate_bps:
                print(
                    f"netem: error: --cross-traffic loads {direction}, which needs a --rate",
                    file=sys.stderr,
                )
                return EXIT_USAGE
    rootless.ensure_network_privileges(force=args.rootless)
    from netem.topology import Network, TopologyError

    stop = threading.Event()

    on_termination(lambda _signum: stop.set())
    kwargs = {"name": args.name} if args.name else {}
    try:
        network = Network(
            wan,
            intra,
            backend=args.backend,
            tun_device=args.tun_device,
            seed=args.seed,
            schedule=schedule,
            cross_traffic=args.cross_traffic,
            **kwargs,
        )
    except TopologyError as exc:  # inconsistent arguments (e.g. two MTUs for one link)
        print(f"netem: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        network.up()
        message = network.ready_message()
        if network.backend_reason:
            message["backend_reason"] = network.backend_reason
        print(json.dumps(message), flush=True)
        while not stop.wait(0.5):
            if network.shaper is not None and network.shaper.poll() is not None:
                print(
                    f"netem: the shaper of run {network.name} exited ({network.shaper.returncode})",
                    file=sys.stderr,
                )
                return 1
        return 0
    finally:
        network.down()
        if network.cross_traffic_report is not None:
            print(
                f"netem: cross-traffic: {json.dumps(network.cross_traffic_report)}", file=sys.stderr
            )


def cmd_down(args: argparse.Namespace) -> int:
    """--name: that run (stopped if its controller lives); --stale: every run whose controller
    is gone, and namespaces/links of ours that no run records; --all: every run, then --stale."""
    registry = Registry()
    if args.name is not None and args.name not in registry.names():
        print(f"netem: no run named {args.name!r}", file=sys.stderr)
        return 1
    for name in [args.name] if args.name is not None else registry.names():
        record = registry.load(name)
        alive = record is not None and record.alive
        if alive and args.stale:
            continue
        if alive:
            _stop_controller(record.pid)
        for what in registry.cleanup(name):
            print(f"removed {what} ({name})")
    if args.name is None:
        namespaces, links = registry.orphans()
        for ns in namespaces:
            kill_namespace_processes(ns)
            remove_namespace(ns)
            print(f"removed netns {ns} (stale)")
        for link in links:
            remove_host_link(link)
            print(f"removed link {link} (stale)")
    return 0


def _stop_controller(pid: int, timeout: float = 10.0) -> None:
    import time

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def cmd_ls(args: argparse.Namespace) -> int:
    registry = Registry()
    records = [r for r in (registry.load(n) for n in registry.names()) if r]
    if args.json:
        print(json.dumps([{**vars(r), "alive": r.alive} for r in records]))
        return 0
    if not records:
        print("no runs")
        return 0
    print(f"{'name':<24} {'backend':<10} {'pid':>7} {'state':<6} a / b")
    for r in records:
        state = "up" if r.alive else "stale"
        addr = Addresses.for_slot(r.slot)
        print(f"{r.name:<24} {r.backend:<10} {r.pid:>7} {state:<6} {addr.a} / {addr.b}")
    return 0


def cmd_set(args: argparse.Namespace) -> int:
    from netem.topology import apply_change

    changes = _link_changes(args)
    if not changes:
        print("netem: error: nothing to change (give --rate, --delay, ...)", file=sys.stderr)
        return EXIT_USAGE
    new = apply_change(Registry(), args.name, args.link, args.dir, changes)
    print(json.dumps({d: spec.to_dict() for d, spec in new.items()}))
    return 0


def cmd_link(args: argparse.Namespace) -> int:
    from netem.topology import apply_state

    apply_state(Registry(), args.name, args.link, args.dir, args.state == "up")
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        print("netem: error: exec needs a command after --", file=sys.stderr)
        return EXIT_USAGE
    record = Registry().load(args.name)
    if record is None:
        print(f"netem: no run named {args.name!r}", file=sys.stderr)
        return 1
    nsutil.enter(namespace_name(args.name, args.host))
    os.execvp(argv[0], argv)
    return 127


def cmd_trace(args: argparse.Namespace) -> int:
    from netem import mahimahi

    bin_ms = round(args.bin * 1000)
    if abs(bin_ms - args.bin * 1000) > 1e-6 or bin_ms < 1:
        print("netem: error: --bin must be a whole number of milliseconds", file=sys.stderr)
        return EXIT_USAGE
    print(mahimahi.import_traces(args.uplink, args.downlink, args.out, bin_ms, args.duration))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from netem import bench

    return bench.main(args.out, quick=args.quick, only=args.only)


COMMANDS = {
    "up": cmd_up,
    "down": cmd_down,
    "ls": cmd_ls,
    "set": cmd_set,
    "link": cmd_link,
    "exec": cmd_exec,
    "trace": cmd_trace,
    "bench": cmd_bench,
}


def _join_negative_values(argv: list[str]) -> list[str]:
    """`--delay -5ms` would read as a missing value; join it so the range check can speak."""
    out: list[str] = []
    for position, item in enumerate(argv):
        if item == "--":  # a command for `netem exec` follows: leave it alone
            return out + argv[position:]
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.match(r"-[0-9.]", item):
            out[-1] = f"{out[-1]}={item}"
        else:
            out.append(item)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(_join_negative_values(sys.argv[1:] if argv is None else argv))
    try:
        return COMMANDS[args.command](args)
    except (SpecError, UnitError) as exc:
        print(f"netem: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - the CLI's last word is one clear line
        from netem.control import ControlError
        from netem.rootless import RootlessError
        from netem.topology import TopologyError
        from netem.tun import TunUnavailable

        if isinstance(
            exc,
            (RunError, ControlError, RootlessError, TopologyError, TunUnavailable, PermissionError),
        ):
            print(f"netem: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
