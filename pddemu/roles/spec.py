"""What an instance process is told when it starts: who it is, where everyone is, the config."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Address:
    name: str
    role: str  # FE | P | RLD | MD | D
    addr: str
    data_port: int
    http_port: int


@dataclass
class InstanceSpec:
    me: Address
    system: str  # pdd | naive | indc
    netns: str
    peers: dict[str, Address]  # every instance of the deployment, by name (me included)
    config: dict[str, Any]  # pddemu.config.config_to_json(...)
    epoch: float  # CLOCK_MONOTONIC origin of modelled time when there is no clock page
    clock: str = ""  # the run's clock page (netem.clock), which every participant reads
    log_path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # started again into a running deployment (`Deployment.restart`): its peers were all running
    # before it, so a router judges one it has not heard from (`pddemu.runtime.liveness`)
    restarted: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> InstanceSpec:
        data = json.loads(text)
        data["me"] = Address(**data["me"])
        data["peers"] = {k: Address(**v) for k, v in data["peers"].items()}
        return cls(**data)

    def peers_with_role(self, role: str) -> list[Address]:
        return sorted((p for p in self.peers.values() if p.role == role), key=lambda p: p.name)
