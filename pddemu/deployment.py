"""Where every instance of a system runs, starting them, watching them, and stopping them.

    DC A, host a  : FE (frontend/router), P x n_P
    DC A, host a2 : RLD x n_RLD (pdd), D x n_D (indc: decode on chip A over the intra-DC path)
    DC B, host b  : MD x n_MD (pdd, naive)

Each instance is one OS process in its namespace; ports are numbered per instance (the
namespaces belong to this run, so they never collide with another run's).

The instances are forked from a launcher that has imported their code once
(`pddemu.roles.launcher`), started with the deployment and ended with it. The run's secret is
made here and handed to each instance through the launcher's standard input (never on disk or
in an environment a local user could read): control requests carry it, data-plane connections
prove it (`pddemu.runtime.auth`).

Every process is watched through a pidfd, so its death is noticed the moment it happens, with
its exit status; `kill`, `pause`, `resume` and `restart` are the instance faults a scenario can
schedule, and every one of them, planned or not, lands in `events`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from netem.clock import SharedClock
from netem.topology import Network
from pddemu.config import Config, config_to_json
from pddemu.roles.launcher import InstanceProcess, Launcher, LaunchError
from pddemu.roles.spec import Address, InstanceSpec
from pddemu.runtime.auth import RunSecret
from pddemu.runtime.clock import ModelledClock, PauseError, pause_process
from pddemu.runtime.liveness import UP

BASE_PORT = 7100
HOST_OF_ROLE = {"FE": "a", "P": "a", "RLD": "a2", "D": "a2", "MD": "b"}
# wall seconds the launched instances have to answer /health (a launch is bounded by the
# launcher: pddemu.roles.launcher.LAUNCH_TIMEOUT_S)
START_TIMEOUT_S = 120.0
HEALTH_POLL_S = 0.05  # wall seconds between asking the instances not yet up whether they are
STATS_TIMEOUT_S = 30.0
ERROR_TAIL_CHARS = 2000


def heard(view: dict[str, Any]) -> set[str]:
    """The instances a router's liveness view (its `/liveness`) has heard from and holds up."""
    return {
        name
        for name, seen in view["instances"].items()
        if seen["heard_at_s"] is not None and seen["state"] == UP
    }


class DeploymentError(RuntimeError):
    """An instance did not start, or died."""


@dataclass(frozen=True)
class InstanceEvent:
    """Something that happened to an instance process, at a modelled time of the run."""

    at_s: float
    instance: str
    kind: str  # started | killed | paused | resumed | restarted | died | exited
    planned: bool  # a fault the scenario asked for (or the deployment's own start and stop)
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "at_s": self.at_s,
            "instance": self.instance,
            "kind": self.kind,
            "planned": self.planned,
            "detail": self.detail,
        }


@dataclass
class Deployment:
    system: str
    config: Config
    network: Network
    run_dir: Path
    epoch: float
    secret: RunSecret = field(default_factory=RunSecret.new)
    # `pddemu serve`'s host door (`pddemu.host_door`), handed to the frontend process
    host_door: socket.socket | None = None
    # a launcher the caller keeps for several deployments (one after the other): its imports
    # are paid once; without one, the deployment starts its own at `start` and ends it at `stop`
    launcher: Launcher | None = None

    def __post_init__(self) -> None:
        self.specs = self.plan()
        self.processes: dict[str, InstanceProcess] = {}
        self._own_launcher = self.launcher is None
        self.clock = ModelledClock.reading(self.network.clock_path, self.epoch)
        self.events: list[InstanceEvent] = []
        self.missing_stats: dict[str, str] = {}  # instance -> why its stats could not be read
        self.paused: set[str] = set()
        self._expected_exit: set[str] = set()  # killed on purpose, or being stopped
        self._pidfds: dict[str, int] = {}
        self._stopping = False

    def plan(self) -> dict[str, InstanceSpec]:
        counts = {"FE": 1, **self.config.systems[self.system]}
        addresses: dict[str, Address] = {}
        port = BASE_PORT
        for role in ("FE", "P", "RLD", "MD", "D"):
            for i in range(counts.get(role, 0)):
                host = HOST_OF_ROLE[role]
                name = f"{role}{i}"
                addresses[name] = Address(
                    name, role, getattr(self.network, host).addr, port, port + 1
                )
                port += 10
        config_json = config_to_json(self.config)
        logs = self.run_dir / "logs" / self.system
        return {
            name: InstanceSpec(
                me=address,
                system=self.system,
                netns=getattr(self.network, HOST_OF_ROLE[address.role]).netns,
                peers=addresses,
                config=config_json,
                epoch=self.epoch,
                clock=str(self.network.clock_path or ""),
                log_path=str(logs / f"{name}.log"),
                extra=self._door_of(address),
            )
            for name, address in addresses.items()
        }

    def _door_of(self, address: Address) -> dict[str, Any]:
        if self.host_door is None or address.role != "FE":
            return {}
        return {"host_door_fd": self.host_door.fileno()}

    @property
    def frontend_url(self) -> str:
        fe = self.specs["FE0"].me
        return f"http://{fe.addr}:{fe.http_port}"

    @property
    def headers(self) -> dict[str, str]:
        """What a control request to an instance of this run carries."""
        return self.secret.headers()

    def url(self, name: str, path: str) -> str:
        me = self.specs[name].me
        return f"http://{me.addr}:{me.http_port}{path}"

    # -- starting ---------------------------------------------------------------------------

    async def start(self) -> None:
        specs_dir = self.run_dir / "specs" / self.system
        specs_dir.mkdir(parents=True, exist_ok=True)
        logs = self.run_dir / "logs" / self.system
        logs.mkdir(parents=True, exist_ok=True)
        if self._own_launcher:
            door = () if self.host_door is None else (self.host_door.fileno(),)
            self.launcher = Launcher(logs / "launcher.err", pass_fds=door)
        for name in self.specs:
            await self._launch(name)
        await self.wait_healthy(set(self.specs))
        await self.wait_heard()

    async def _launch(self, name: str) -> None:
        if self.launcher is None:
            raise DeploymentError(f"{self.system}: {name} launched before the deployment started")
        path = self.run_dir / "specs" / self.system / f"{name}.json"
        path.write_text(self.specs[name].to_json())
        err = Path(self.specs[name].log_path).with_suffix(".err")
        door = self.specs[name].extra.get("host_door_fd")
        try:
            process = await self.launcher.launch(
                path,
                err,
                self.secret.line(),
                keep_fds=() if door is None else (door,),
            )
        except LaunchError as error:
            raise DeploymentError(f"{self.system}: {error}") from error
        self.processes[name] = process
        self._watch(name, process)

    def _watch(self, name: str, process: InstanceProcess) -> None:
        """Notice the process's end when it happens (its pidfd becomes readable)."""
        loop = asyncio.get_running_loop()
        fd = os.pidfd_open(process.pid)
        self._pidfds[name] = fd
        loop.add_reader(fd, self._ended, name, process)

    def _unwatch(self, name: str) -> None:
        fd = self._pidfds.pop(name, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def _ended(self, name: str, process: InstanceProcess) -> None:
        self._unwatch(name)
        code = process.wait()
        if name in self._expected_exit or self._stopping:
            return
        status = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        self.events.append(
            InstanceEvent(
                self.clock.now(), name, "died", False, f"{status}{self._error_tail(name)}"
            )
        )

    def _error_tail(self, name: str) -> str:
        err = Path(self.specs[name].log_path).with_suffix(".err")
        text = err.read_text(errors="replace").strip() if err.exists() else ""
        last = text.splitlines()[-1] if text else ""
        return f": {last[:ERROR_TAIL_CHARS]}" if last else ""

    async def wait_healthy(self, names: set[str]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = set(names)
        async with aiohttp.ClientSession() as session:
            while pending:
                for name in sorted(pending):
                    self.check_alive(name)
                    if await self._answers(session, name, "/health") is not None:
                        pending.discard(name)
                if time.monotonic() > deadline:
                    raise DeploymentError(
                        f"{self.system}: instances not healthy after {START_TIMEOUT_S:.0f} s: {sorted(pending)}"
                    )
                if pending:
                    await asyncio.sleep(HEALTH_POLL_S)

    async def wait_heard(self) -> None:
        """Until every router has heard from every instance it watches. A router does not
        judge an instance it has not heard from yet (`pddemu.runtime.liveness`): a fault on
        one before then would go unseen by it (paused, it would stay routable for good), and a
        fault may come the moment the deployment has started."""
        deadline = time.monotonic() + START_TIMEOUT_S
        routers = [name for name, spec in self.specs.items() if spec.me.role == "FE"]
        waiting = {router: "its /liveness does not answer" for router in routers}  # and why
        async with aiohttp.ClientSession(headers=self.headers) as session:
            while waiting:
                for router in sorted(waiting):
                    self.check_alive(router)
                    view = await self._answers(session, router, "/liveness")
                    if view is None:
                        continue
                    unheard = sorted(set(view["instances"]) - heard(view))
                    if unheard:
                        waiting[router] = f"{', '.join(unheard)} not heard from"
                    else:
                        del waiting[router]
                if time.monotonic() > deadline:
                    raise DeploymentError(
                        f"{self.system}: routers not ready after {START_TIMEOUT_S:.0f} s: "
                        + "; ".join(f"{router}: {why}" for router, why in waiting.items())
                    )
                if waiting:
                    await asyncio.sleep(HEALTH_POLL_S)

    async def _answers(
        self, session: aiohttp.ClientSession, name: str, path: str
    ) -> dict[str, Any] | None:
        """The instance's JSON answer at `path`, or None if it does not answer (yet)."""
        try:
            async with session.get(
                self.url(name, path), timeout=aiohttp.ClientTimeout(total=2)
            ) as reply:
                return await reply.json() if reply.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    def check_alive(self, name: str) -> None:
        process = self.processes[name]
        if process.poll() is not None:
            raise DeploymentError(
                f"{self.system}: instance {name} exited with {process.returncode}"
                f"{self._error_tail(name)}"
            )

    def alive(self, name: str) -> bool:
        process = self.processes.get(name)
        return process is not None and process.poll() is None

    @property
    def unplanned(self) -> list[InstanceEvent]:
        """Deaths nobody asked for: the run's results are then partial."""
        return [event for event in self.events if not event.planned]

    # -- instance faults --------------------------------------------------------------------

    def kill(self, name: str, at_s: float | None = None) -> None:
        """SIGKILL the instance: no goodbye to anyone, as a crashed machine."""
        self._signal(name, signal.SIGKILL)
        self._release_clock(name)
        self._expected_exit.add(name)
        self.paused.discard(name)
        self._record(name, "killed", at_s)

    def pause(self, name: str, at_s: float | None = None) -> None:
        """SIGSTOP: the process is frozen, its sockets stay open, nobody is told (but the
        run's clock, which a hold of its would stand still until the resume)."""
        if name not in self.processes:
            raise DeploymentError(f"{self.system} has no instance {name!r}")
        if self.alive(name):
            try:
                pause_process(self.clock.source, self.processes[name].pid)
            except PauseError as error:
                raise DeploymentError(f"{name} not paused: {error}") from error
        self.paused.add(name)
        self._record(name, "paused", at_s)

    def resume(self, name: str, at_s: float | None = None) -> None:
        """SIGCONT to a paused instance. Only to a paused one: a running instance's handler of
        SIGCONT could land inside its own clock write and wait on it for good."""
        if name not in self.paused:
            raise DeploymentError(f"{self.system}'s {name} is not paused")
        self._signal(name, signal.SIGCONT)
        self.paused.discard(name)
        self._record(name, "resumed", at_s)

    def _release_clock(self, name: str) -> None:
        """A killed instance holds no one's time: a hold it had on the run's clock (genuine
        work under way) goes, or the clock would stand still until it came back. (Its writers'
        lock, if it died inside one, went with its open files.)"""
        source = self.clock.source
        process = self.processes.get(name)
        if isinstance(source, SharedClock) and process is not None:
            for report in source.slots():
                if report.pid == process.pid:
                    source.release(report.index)
            source.recover()  # what it left half-written, if it died inside a write

    async def restart(self, name: str, at_s: float | None = None) -> None:
        """Start the instance again with its spec (same addresses, empty caches), killing
        what is left of it first, and wait until it answers. It is told it was restarted: a
        restarted router judges the instances it has not heard from (`pddemu.runtime.liveness`)
        rather than wait here to hear them all, which a partition or a pause standing at the
        restart would hold up for good."""
        if self.alive(name):
            self.kill(name, at_s)
            self.processes[name].wait()
        self._unwatch(name)
        self._expected_exit.discard(name)
        self.specs[name] = replace(self.specs[name], restarted=True)
        await self._launch(name)
        self._record(name, "restarted", at_s)
        await self.wait_healthy({name})

    def _signal(self, name: str, signum: signal.Signals) -> None:
        if name not in self.processes:
            raise DeploymentError(f"{self.system} has no instance {name!r}")
        if self.alive(name):
            self.processes[name].send_signal(signum)

    def _record(self, name: str, kind: str, at_s: float | None) -> None:
        when = self.clock.now() if at_s is None else at_s
        self.events.append(InstanceEvent(when, name, kind, True))

    # -- the end of a run -------------------------------------------------------------------

    async def stats(self, timeout_s: float = STATS_TIMEOUT_S) -> dict[str, dict[str, Any]]:
        """Every live instance's stats; an instance that is dead or does not answer is left
        out, with the reason in `missing_stats` (its results are lost, not the run's)."""
        why: dict[str, str] = {}
        live = []
        for name in self.specs:
            if not self.alive(name):
                why[name] = "the instance is not running"
                continue
            if name in self.paused:
                self.resume(name)
            live.append(name)
        async with aiohttp.ClientSession(headers=self.headers) as session:

            async def read(name: str) -> dict[str, Any] | str:
                """The instance's stats, or why they could not be read."""
                try:
                    async with session.get(
                        self.url(name, "/stats"), timeout=aiohttp.ClientTimeout(total=timeout_s)
                    ) as reply:
                        if reply.status != 200:
                            raise DeploymentError(f"answered {reply.status}")
                        return await reply.json()
                except (aiohttp.ClientError, TimeoutError, ValueError, DeploymentError) as error:
                    return f"stats unreadable: {type(error).__name__}: {error}"

            answers = await asyncio.gather(*(read(name) for name in live))  # all at once
        out: dict[str, dict[str, Any]] = {}
        for name, answer in zip(live, answers, strict=True):
            if isinstance(answer, str):
                why[name] = answer
            else:
                out[name] = answer
        self.missing_stats = {name: why[name] for name in self.specs if name in why}
        return out

    async def stop(self) -> None:
        self._stopping = True
        for name in list(self.paused):
            self.resume(name)
        async with aiohttp.ClientSession(headers=self.headers) as session:

            async def shut_down(name: str, process: InstanceProcess) -> None:
                try:
                    async with session.post(
                        self.url(name, "/shutdown"), timeout=aiohttp.ClientTimeout(total=5)
                    ):
                        pass
                except (aiohttp.ClientError, TimeoutError):
                    process.terminate()

            running = [(n, p) for n, p in self.processes.items() if p.poll() is None]
            await asyncio.gather(*(shut_down(name, process) for name, process in running))
        deadline = time.monotonic() + 10
        for process in self.processes.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for name in list(self._pidfds):
            self._unwatch(name)
        self.processes.clear()
        if self._own_launcher and self.launcher is not None:
            self.launcher.close()
            self.launcher = None
