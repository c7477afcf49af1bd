"""`python -m pddemu.roles SPEC.json`: run one emulated instance in its namespace.

A deployment forks its instances from a launcher (`pddemu.roles.launcher`), which runs
`serve_instance` in each; this command runs one by itself. Either way the instance dies with
the process that started the run (PR_SET_PDEATHSIG), so a crashed emulator leaves no instance
behind even before namespace cleanup kills what is left.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import sys
from pathlib import Path

import uvloop

from netem import nsutil
from pddemu.roles.spec import InstanceSpec
from pddemu.runtime.auth import RunSecret

PR_SET_PDEATHSIG = 1
# Niceness by role, on the shared clock: genuine computation (prefill, then decode) yields the
# cores to what handles messages (the frontend), so a message waits for a core as little as
# possible. A step's own timeline does not suffer: its hold stands the clock still while its
# work runs. In real time (no clock page: `pddemu serve`) nothing holds time for the work, and
# a niced instance would yield its core to every other process of the host (a benchmark client
# first): each of its steps would end late by the time it waited. There every role runs at 0.
NICE = {"P": 10, "RLD": 5, "MD": 5, "D": 5}


def niceness(role: str, shared_clock: bool) -> int:
    """How much an instance of `role` yields the cores (`NICE`; 0 in real time)."""
    return NICE.get(role, 0) if shared_clock else 0


def role_class(role: str) -> type:
    if role == "FE":
        from pddemu.roles.frontend import Frontend

        return Frontend
    if role == "P":
        from pddemu.roles.prefill import PrefillInstance

        return PrefillInstance
    if role == "RLD":
        from pddemu.roles.relay import RelayInstance

        return RelayInstance
    if role in ("MD", "D"):
        from pddemu.roles.main_decode import MainDecodeInstance

        return MainDecodeInstance
    raise ValueError(f"unknown role {role!r}")


def main(argv: list[str]) -> int:
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    spec = InstanceSpec.from_json(Path(argv[0]).read_text())
    serve_instance(spec, RunSecret.read(sys.stdin))
    return 0


def serve_instance(spec: InstanceSpec, secret: RunSecret) -> None:
    """Run the instance `spec` describes in its namespace until it is told to stop."""
    nsutil.enter(spec.netns)
    logging.basicConfig(
        filename=spec.log_path or None,
        level=logging.INFO,
        format=f"%(asctime)s {spec.me.name} %(levelname)s %(message)s",
    )
    os.nice(niceness(spec.me.role, shared_clock=bool(spec.clock)))
    # The event loop and the compute thread share the interpreter: the loop gets it back
    # within half a millisecond, not the default five, while the model computes.
    sys.setswitchinterval(0.0005)
    instance = role_class(spec.me.role)(spec)
    instance.use_secret(secret)
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, instance.stopping.set)
    try:
        loop.run_until_complete(instance.run())
    finally:
        loop.close()


def exit_at_once(code: int) -> None:
    """End the process without the interpreter's finalization, its files flushed: with torch
    loaded the finalization costs over a second of CPU a process, and a deployment stops all
    its instances at once on a few cores. Nothing of an instance is left for it to do: its run
    has closed its connections, threads and clock page (`Instance.run`)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    # One intra-op thread per instance: several instances share few cores, and spinning
    # OpenMP threads of one instance would steal time from the others (the model's results
    # do not depend on the thread count, docs/model.md).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    exit_at_once(main(sys.argv[1:]))
