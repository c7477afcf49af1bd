"""Where every instance of a system runs, starting them, and stopping them.

    DC A, host a  : FE (frontend/router), P x n_P
    DC A, host a2 : RLD x n_RLD (pdd), D x n_D (indc: decode on chip A over the intra-DC path)
    DC B, host b  : MD x n_MD (pdd, naive)

Each instance is one OS process in its namespace; ports are numbered per instance (the
namespaces belong to this run, so they never collide with another run's).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from netem.topology import Network
from pddemu.config import Config, config_to_json
from pddemu.roles.spec import Address, InstanceSpec

BASE_PORT = 7100
HOST_OF_ROLE = {"FE": "a", "P": "a", "RLD": "a2", "D": "a2", "MD": "b"}
START_TIMEOUT_S = 120.0


class DeploymentError(RuntimeError):
    """An instance did not start, or died."""


@dataclass
class Deployment:
    system: str
    config: Config
    network: Network
    run_dir: Path
    epoch: float

    def __post_init__(self) -> None:
        self.specs = self.plan()
        self.processes: dict[str, subprocess.Popen] = {}

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
                log_path=str(logs / f"{name}.log"),
            )
            for name, address in addresses.items()
        }

    @property
    def frontend_url(self) -> str:
        fe = self.specs["FE0"].me
        return f"http://{fe.addr}:{fe.http_port}"

    async def start(self) -> None:
        specs_dir = self.run_dir / "specs" / self.system
        specs_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs" / self.system).mkdir(parents=True, exist_ok=True)
        for name, spec in self.specs.items():
            path = specs_dir / f"{name}.json"
            path.write_text(spec.to_json())
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "pddemu.roles", str(path)],
                stdout=subprocess.DEVNULL,
                stderr=open(Path(spec.log_path).with_suffix(".err"), "w"),
            )
        await self.wait_healthy()

    async def wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = set(self.specs)
        async with aiohttp.ClientSession() as session:
            while pending:
                for name in sorted(pending):
                    self.check_alive(name)
                    try:
                        async with session.get(
                            self.url(name, "/health"), timeout=aiohttp.ClientTimeout(total=2)
                        ) as reply:
                            if reply.status == 200:
                                pending.discard(name)
                    except (aiohttp.ClientError, TimeoutError):
                        pass
                if time.monotonic() > deadline:
                    raise DeploymentError(
                        f"{self.system}: instances not healthy after {START_TIMEOUT_S:.0f} s: {sorted(pending)}"
                    )
                if pending:
                    await asyncio.sleep(0.2)

    def check_alive(self, name: str) -> None:
        process = self.processes[name]
        if process.poll() is not None:
            err = Path(self.specs[name].log_path).with_suffix(".err")
            tail = err.read_text()[-2000:] if err.exists() else ""
            raise DeploymentError(
                f"{self.system}: instance {name} exited with {process.returncode}:\n{tail}"
            )

    def url(self, name: str, path: str) -> str:
        me = self.specs[name].me
        return f"http://{me.addr}:{me.http_port}{path}"

    async def stats(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        async with aiohttp.ClientSession() as session:
            for name in self.specs:
                async with session.get(
                    self.url(name, "/stats"), timeout=aiohttp.ClientTimeout(total=30)
                ) as reply:
                    out[name] = await reply.json()
        return out

    async def stop(self) -> None:
        async with aiohttp.ClientSession() as session:
            for name, process in self.processes.items():
                if process.poll() is None:
                    try:
                        async with session.post(
                            self.url(name, "/shutdown"), timeout=aiohttp.ClientTimeout(total=5)
                        ):
                            pass
                    except (aiohttp.ClientError, TimeoutError):
                        process.terminate()
        deadline = time.monotonic() + 10
        for process in self.processes.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()
