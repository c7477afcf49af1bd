"""Cross-traffic: other tenants' TCP flows on the emulated WAN (see `spec` for the model).

`CrossTraffic(network, spec).start(at)` runs the generator process in the run's namespaces
from `at` (a time.monotonic() instant, possibly ahead: pddemu starts it with each replay);
`prepare()` then `begin(at)` do the same in two steps, so the slow part (a process starting)
can come before the instant is chosen. `stop()` ends it and returns what it achieved per
direction: bytes received, flows, and the mean utilisation of the link's rate against the
mean target.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from netem.crosstraffic.spec import (
    CrossTrafficSpec,
    TimedChange,
    load_cross_schedule,
    parse_cross_traffic,
    spec_from_pairs,
)
from netem.nsexec import command_in

if TYPE_CHECKING:
    from netem.topology import Network

__all__ = [
    "CrossTraffic",
    "CrossTrafficError",
    "CrossTrafficSpec",
    "TimedChange",
    "load_cross_schedule",
    "parse_cross_traffic",
    "spec_from_pairs",
]

PORT = 5999  # on the run's own cross-traffic addresses, so it collides with nothing
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0


class CrossTrafficError(RuntimeError):
    """The generator could not start, or ended without its report."""


def _line(process: subprocess.Popen, timeout: float) -> dict[str, Any]:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.2)
        if ready:
            line = process.stdout.readline()
            try:
                return json.loads(line)
            except ValueError:
                raise CrossTrafficError(f"the cross-traffic generator said {line!r}") from None
        if process.poll() is not None:
            raise CrossTrafficError(f"the cross-traffic generator exited ({process.returncode})")
    raise CrossTrafficError(f"the cross-traffic generator gave no answer within {timeout:.0f} s")


class CrossTraffic:
    def __init__(self, network: Network, spec: CrossTrafficSpec) -> None:
        self.network = network
        self.spec = spec.validate()
        self.process: subprocess.Popen | None = None

    def rates(self) -> dict[str, float]:
        rates = {"a2b": self.network.wan.a2b.rate_bps, "b2a": self.network.wan.b2a.rate_bps}
        for direction in self.spec.directions():
            if not rates[direction]:
                raise CrossTrafficError(
                    f"cross-traffic needs a rate on the WAN's {direction} direction to load it"
                )
        return {d: rate or 0.0 for d, rate in rates.items()}

    def start(self, at: float | None = None) -> None:
        self.prepare()
        self.begin(time.monotonic() if at is None else at)

    def prepare(self) -> None:
        """Start the generator and wait until its receivers listen."""
        addresses = self.network.addresses
        config = {
            "spec": self.spec.to_dict(),
            "ends": {
                "a": {"netns": self.network.a.netns, "addr": addresses.cross_a},
                "b": {"netns": self.network.b.netns, "addr": addresses.cross_b},
            },
            "rates": self.rates(),
            "port": PORT,
            # flows start on the links' clock (a dilated one included), not the wall's
            "clock": str(self.network.clock_path) if self.network.clock_path else None,
            "die_with_parent": threading.current_thread() is threading.main_thread(),
        }
        self.process = subprocess.Popen(
            command_in(
                self.network.a.netns, [sys.executable, "-m", "netem.crosstraffic.generator"]
            ),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(config) + "\n")
        self.process.stdin.flush()
        try:
            if not _line(self.process, START_TIMEOUT_S).get("ready"):
                raise CrossTrafficError("the cross-traffic generator did not start")
        except BaseException:
            self.process.kill()
            self.kill()
            raise

    def begin(self, at: float) -> None:
        """Time 0 of the flows: `at`, on the network's clock page when it has one, else a
        time.monotonic() instant."""
        if self.process is None or self.process.stdin is None:
            raise CrossTrafficError("cross-traffic was not prepared")
        self.process.stdin.write(json.dumps({"start": at}) + "\n")
        self.process.stdin.close()

    def stop(self) -> dict[str, Any]:
        """End the flows; the generator's report (per direction: bytes, flows, utilisation)."""
        process = self.process
        if process is None:
            raise CrossTrafficError("cross-traffic was not started")
        try:
            process.send_signal(signal.SIGTERM)
            return _line(process, STOP_TIMEOUT_S)
        finally:
            self.kill()

    def kill(self) -> None:
        """Make sure the generator is gone (a prepared one that never began is killed)."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None and process.stdin is not None and not process.stdin.closed:
            process.kill()  # never begun: it has nothing to report
        if process.poll() is None:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()
