"""`pddemu` command line: one sub-command group per area, each registered by its own module."""

from __future__ import annotations

import argparse
import importlib
import os
import select
import signal
import sys
from typing import TYPE_CHECKING

from pddemu.help_format import HelpFormatter

if TYPE_CHECKING:
    import socket

    from pddemu.roles.launcher import Launcher

# (sub-command, module providing `add_parser(subparsers)`); imported lazily so that
# `pddemu trace stats` does not pay for torch.
_COMMANDS: list[tuple[str, str]] = [
    ("trace", "pddemu.workload.cli"),
    ("emulate", "pddemu.emulate"),
    ("serve", "pddemu.serve"),
    ("config", "pddemu.config_docs"),
    ("tokenizer", "pddemu.hf_tokenizer"),
    ("export", "pddemu.export"),
    ("plot", "pddemu.plot"),
    ("sweep", "pddemu.sweep.cli"),
    ("bench", "pddemu.bench._cli"),
    ("validate", "pddemu.validate.cli"),
]


DESCRIPTION = """\
pddemu emulates PDD (Prefill - Relay Decode - Main Decode), cross-datacenter
prefill/decode-disaggregated LLM serving, on one machine: two datacenters as
network namespaces joined by a shaped WAN, real processes exchanging genuine KV
over TCP. It measures TTFT, TPOT, goodput, WAN bytes and cost of pdd against an
in-datacenter (indc) and a naive cross-datacenter baseline."""

EPILOG = """\
examples:
  # a short run
  pddemu emulate --out runs/smoke --system pdd --requests 10
  # what make emulate runs
  pddemu emulate --out runs/latest
  # the emulator against its own model
  pddemu validate --out runs/validate
  # an OpenAI endpoint for AIPerf or vLLM
  pddemu serve --port 8000
  # a run's timeline, for ui.perfetto.dev
  pddemu export runs/latest --format perfetto --out trace.json
  # a run's figures, drawn again
  pddemu plot runs/latest
  # a trace's lengths and prefix hit rates
  pddemu trace stats traces/pdd-janfeb-2000.jsonl.gz
  # a scenario checked, in base units
  pddemu config show --set wan.rate=1gbit

README.md explains the output; docs/ has a page per area.
`pddemu COMMAND --help` for each command's options."""


def add_rootless_flag(
    parser: argparse.ArgumentParser,
    help: str = "run in a private user namespace even as root (the path a non-root user takes)",
) -> None:
    """`--rootless`, which `main` acts on from the raw argv before anything starts a thread."""
    parser.add_argument("--rootless", action="store_true", help=help)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pddemu",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for _name, module in _COMMANDS:
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a sub-command; a user's mistake (config, trace, arguments) or a machine that cannot
    host the network gets one line naming the problem, not a traceback."""
    from netem.rootless import RootlessError, ensure_network_privileges
    from pddemu.host_door import ListenError, listen, listen_arguments

    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv and not {"-h", "--help"} & set(argv) else None
    listener = None
    try:
        if command == "serve":
            # The host-side socket is made in the host's namespace, before a private one
            # may be entered below: it stays reachable from the host.
            listener = listen(*listen_arguments(argv[1:]))
        if command in ("emulate", "serve", "bench", "validate"):
            # A user namespace can only be entered by a single-threaded process: before the
            # imports below start numpy's and torch's thread pools.
            ensure_network_privileges(force="--rootless" in argv)
    except (RootlessError, ListenError) as error:
        print(f"pddemu: {error}", file=sys.stderr)
        return 1
    launcher = None
    if command == "validate" or (command == "emulate" and not _systems_at_once(argv[1:])):
        from pddemu.roles.launcher import Launcher

        # The instances' launcher imports their code (torch) on another core while this
        # process imports its own below; the command's deployments fork from it. Systems run
        # at once each start their own: an instance becomes the child of whoever asked for it.
        launcher = Launcher()
    try:
        return _run_command(argv, listener, launcher)
    finally:
        if launcher is not None:
            launcher.close()


def _systems_at_once(argv: list[str]) -> bool:
    """Whether a `pddemu emulate` command line runs several systems at once (`--system all`,
    the default, without `--one-at-a-time`), read before the full parse, which imports what a
    launcher started first would overlap."""
    parser = argparse.ArgumentParser(prog="pddemu emulate", add_help=False, allow_abbrev=False)
    parser.add_argument("--system", default="all")
    parser.add_argument("--one-at-a-time", action="store_true")
    known, _ = parser.parse_known_args(argv)
    return known.system == "all" and not known.one_at_a_time


def _run_command(argv: list[str], listener: socket.socket | None, launcher: Launcher | None) -> int:
    """Parse `argv` and run its sub-command; the errors a user can mend are one line."""
    from netem.registry import RunError
    from netem.topology import TopologyError
    from pddemu.config import ConfigError
    from pddemu.export.run import ExportError
    from pddemu.hardware.errors import HardwareError
    from pddemu.metrics.errors import MetricsError
    from pddemu.plot import PlotError
    from pddemu.scale import ScaleError
    from pddemu.workload.arrivals import ArrivalError
    from pddemu.workload.expansion import ExpansionError
    from pddemu.workload.janfeb_config import GeneratorError
    from pddemu.workload.records import TraceError
    from pddemu.workload.replay_source import WorkloadError

    parser = build_parser()
    args = parser.parse_args(argv)
    args.listener = listener
    args.launcher = launcher
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that has gone shows here, not in the interpreter's exit
        return status
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # a connection of the run's own broke: a defect, keep the trace
        # `pddemu config show | head`: stop as a Unix tool SIGPIPE ends would, without a trace;
        # what is left in the buffer goes nowhere instead of failing again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (
        ConfigError,
        TraceError,
        WorkloadError,
        GeneratorError,
        ExpansionError,
        ArrivalError,
        ScaleError,
        HardwareError,
        ExportError,
        PlotError,
    ) as error:
        print(f"pddemu: {error}", file=sys.stderr)
        return 2
    except MetricsError as error:
        print(f"pddemu: the results could not be written: {error}", file=sys.stderr)
        return 1
    except (TopologyError, RunError) as error:
        print(f"pddemu: the emulated network could not be set up: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        if error.filename is None:  # not about a path the user gave: a defect, keep the trace
            raise
        print(f"pddemu: {error.filename}: {error.strerror}", file=sys.stderr)
        return 1


def _stdout_reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (the kernel flags the
    writing end with an error)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
