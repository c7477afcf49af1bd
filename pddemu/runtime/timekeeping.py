"""One system's run on the shared clock: the replayer's view of it, the dilation controller, the
TCP timers that follow its rate, and the marks its timing is summarised from.

    timing = RunTiming(network, config, system)
    async with timing as clock:          # controller running, the clock at its starting rate
        result = await replay(..., clock, ...)
    timing.report(instance_stats)        # lag, dilation, validity: pddemu.metrics.timing
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from netem.clock import INGRESS_SLOT, ROUTING_SLOT_PREFIX, SharedClock
from netem.procstat import process_cpu_s, steal_between, steal_s
from netem.topology import Network, TopologyError
from pddemu.config import Config
from pddemu.metrics.timing import cpu_summary, timing_summary
from pddemu.roles.sizing import cost_model
from pddemu.runtime.clock import INSTANT, ModelledClock, participant_of
from pddemu.runtime.dilation import Dilation, DilationPolicy

DECODE_ROLE = {"pdd": "MD", "naive": "MD", "indc": "D"}
RETIME_TCP_CHANGE = 0.3  # re-set the routes' TCP timers when the rate moved this much
CONTROL_SHARE = 0.8  # the controller keeps the mean lag within this share of the bound
TYPICAL_CONTEXT = 65536  # modelled tokens: pdd-janfeb's typical prompt


def expected_tpot(config: Config, system: str, context_tokens: int = TYPICAL_CONTEXT) -> float:
    """A decode step of the system's decode side at a batch of one and a typical context: the
    scale of the lag bound before the run's own TPOT is known."""
    return cost_model(config, system, DECODE_ROLE[system]).decode_step([context_tokens])


class RunTiming:
    def __init__(
        self,
        network: Network,
        config: Config,
        system: str,
        context_tokens: int = TYPICAL_CONTEXT,
        tpot_p50: Callable[[], float | None] | None = None,
    ) -> None:
        """`context_tokens`: the workload's typical context (prompt and output), which sets
        the decode step the lag is bounded by until `tpot_p50` (the TPOT p50 of the requests
        completed so far, which judges the run) has an answer; then the controller's target
        follows it."""
        if network.clock_path is None:
            raise TopologyError("the emulated network has no clock page (Network(clock=True))")
        self.network = network
        self.config = config
        self.system = system
        self.page = network.clock_path
        self.decode_step_s = expected_tpot(config, system, context_tokens)
        self.lag_bound_estimate = config.scale.max_lag * self.decode_step_s
        self.clock: ModelledClock | None = None
        self.dilation: Dilation | None = None
        self._controller: asyncio.Task | None = None
        self._retimed_at = 0.0
        self.marks: dict[str, tuple[float, float]] = {}  # wall, modelled
        self._release_before: dict[str, Any] | None = None
        self.release_lag: dict[str, Any] | None = None
        self.replayer_holds: dict[str, Any] | None = None
        self._routing_holds_before: dict[str, float] = {}
        self.routing_holds: dict[str, float] = {}  # the shaper's at routing answers, in the replay
        self.tpot_p50 = tpot_p50
        self._cpu_before: dict[int, tuple[str, float]] = {}
        self.cpu_s: dict[str, float] = {}  # each process's CPU seconds over the replay
        self._steal_before: list[float] = []
        # each CPU's steal over the replay; None when the host's CPUs changed in between
        self.host_steal_s: list[float] | None = []

    async def __aenter__(self) -> ModelledClock:
        shared = SharedClock(self.page)
        shared.set_lag_target(CONTROL_SHARE * self.lag_bound_estimate)
        policy = DilationPolicy.for_time_scale(
            self.config.scale.time_scale, self.config.scale.frozen_share
        )
        if shared.rate > policy.start:  # where the run's last system left it
            policy = replace(policy, start=min(shared.rate, policy.ceiling))
        self.dilation = Dilation(shared, policy)
        # Its holds (each request's arrival, until the frontend has it) take no modelled
        # time by design: an instant hold's slot, whose frozen time does not slow the clock.
        self.clock = ModelledClock.attach(self.page, f"replay-{self.system}{INSTANT}")
        self._release_before = self.network.release_lag()
        await self._retime(shared.rate)
        self._controller = asyncio.ensure_future(self._control())
        self.marks["start"] = (time.monotonic(), self.clock.now())
        self._cpu_before = processes_cpu(shared, self._shaper_pid())
        self._routing_holds_before = routing_holds(shared)
        self._steal_before = steal_s()
        return self.clock

    async def __aexit__(self, *exc: object) -> None:
        assert self.clock is not None and self.dilation is not None
        self.marks["end"] = (time.monotonic(), self.clock.now())
        self.cpu_s = cpu_difference(
            processes_cpu(self.dilation.clock, self._shaper_pid()), self._cpu_before
        )
        self.host_steal_s = steal_between(self._steal_before, steal_s())
        answers_now = routing_holds(self.dilation.clock)
        self.routing_holds = {
            key: count - self._routing_holds_before.get(key, 0)
            for key, count in answers_now.items()
        }
        if self._controller is not None:
            self._controller.cancel()
            try:
                await self._controller
            except asyncio.CancelledError:
                pass
        after = self.network.release_lag()
        if after is not None and self._release_before is not None:
            self.release_lag = _difference(after, self._release_before)
        self.replayer_holds = self.clock.hold_counts()  # read before its slot is given back
        self.clock.close()
        self.dilation.clock.close()

    def _shaper_pid(self) -> int | None:
        shaper = self.network.shaper
        return None if shaper is None else shaper.pid

    async def _control(self) -> None:
        """The controller's decisions, and the TCP timers re-set as the rate moves."""
        assert self.dilation is not None
        periods = 0
        while True:
            await asyncio.sleep(self.dilation.policy.period_s)
            rate = self.dilation.step()
            periods += 1
            if periods % 20 == 0:
                self.dilation.release_dead()
                self._follow_the_bound()
            if abs(rate - self._retimed_at) > RETIME_TCP_CHANGE * self._retimed_at:
                await self._retime(rate)

    def _follow_the_bound(self) -> None:
        """The controller aims within the bound the run will be judged by: max_lag x the
        TPOT p50 of the requests completed so far, once there are some."""
        tpot = self.tpot_p50() if self.tpot_p50 is not None else None
        if tpot and self.dilation is not None:
            target = CONTROL_SHARE * self.config.scale.max_lag * tpot
            self.dilation.clock.set_lag_target(target)

    async def _retime(self, rate: float) -> None:
        """The routes' TCP timers for `rate` (netlink from a thread: pyroute2 cannot use a
        uvloop loop for it)."""
        self._retimed_at = rate
        if self.network.tcp is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.network.retime_tcp, rate)

    def report(self, instance_stats: dict[str, dict[str, Any]], tpot_p50: float | None) -> dict:
        """The run's lag, dilation and validity (summary.json's keys for the system); a run
        without a TPOT is judged against the modelled decode step its controller aimed at."""
        assert self.clock is not None and self.dilation is not None
        (wall0, modelled0), (wall1, modelled1) = self.marks["start"], self.marks["end"]
        return timing_summary(
            instance_stats,
            self.clock.lags,
            self.release_lag,
            self.dilation.summary((wall0, wall1), (modelled0, modelled1)),
            tpot_p50,
            self.config.scale.max_lag,
            self.replayer_holds,
            cpu_summary(
                self.cpu_s,
                _roles(instance_stats),
                modelled1 - modelled0,
                wall1 - wall0,
                host_steal_s=self.host_steal_s,
            ),
            decode_step_s=self.decode_step_s,
            routing_holds=self.routing_holds,
        )


def routing_holds(page: SharedClock) -> dict[str, float]:
    """The holds of the routing exchange across the WAN so far, the shaper's at each message's
    release (each connection's `netem.clock.routing_slot`, and ROUTING_ENDED_SLOT, which keeps
    the counts of those given back) and its senders' until the shaper read it
    (`netem.clock.INGRESS_SLOT`): posted, how many stood the clock still, for how long (wall
    seconds); none without such slots."""
    reports = [
        r
        for r in page.slots(locked=True)
        if r.name == INGRESS_SLOT or r.name.startswith(ROUTING_SLOT_PREFIX)
    ]
    if not reports:
        return {}
    return {
        "posted": sum(r.holds for r in reports),
        "binding": sum(r.holds_binding for r in reports),
        "frozen_wall_s": sum(r.frozen_wall_s for r in reports),
    }


def processes_cpu(page: SharedClock, shaper_pid: int | None) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of every process of the run, by pid: the participants on the clock
    page (named by their slot; this process is the replayer, and runs the controller) and the
    shaper."""
    names = {r.pid: participant_of(r.name) for r in page.slots()}
    names[os.getpid()] = "replayer"
    if shaper_pid is not None:
        names[shaper_pid] = "shaper"
    readings = {}
    for pid, name in names.items():
        seconds = process_cpu_s(pid)
        if seconds is not None:
            readings[pid] = (name, seconds)
    return readings


def cpu_difference(
    after: dict[int, tuple[str, float]], before: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds each process used between two readings (by name; a process that was not
    there at the first counts from its start)."""
    used: dict[str, float] = {}
    for pid, (name, seconds) in after.items():
        then = before.get(pid, (name, 0.0))[1]
        used[name] = used.get(name, 0.0) + seconds - then
    return used


def _roles(instance_stats: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: str(stats.get("role", "")) for name, stats in instance_stats.items()}


def _difference(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The shaper's release-lag histogram of a span, from its readings at both ends."""
    return {
        "bucket_edges_s": after["bucket_edges_s"],
        "counts": [a - b for a, b in zip(after["counts"], before["counts"], strict=True)],
        "total_s": after["total_s"] - before["total_s"],
        "max_s": after["max_s"],  # the largest since the network came up
    }
