"""Instances driven in-process (no network: what they `tell` is recorded), and the token
messages RLD and MD would send a frontend."""

from __future__ import annotations

import time
from typing import Any

from pddemu.config import config_to_json, load_config
from pddemu.roles.frontend import Flight, Frontend
from pddemu.roles.spec import Address, InstanceSpec
from pddemu.runtime.channel import Envelope
from pddemu.workload.expansion import output_group_start

SCALE = load_config().scale.token_scale
OUTPUT = 1 + 2 * SCALE  # genuine outputs 0 (position 0), 1 and 2 (SCALE positions each)


def instance(cls: type, role: str) -> Any:
    me = Address(f"{role}0", role, "127.0.0.1", 1, 2)
    spec = InstanceSpec(
        me, "pdd", "", {me.name: me}, config_to_json(load_config()), time.monotonic()
    )
    made = cls(spec)
    made.told = []

    async def tell(name: str, kind: str, body: dict, *attachments: Any) -> int:
        made.told.append((name, kind, body))
        return 0

    made.tell = tell
    return made


def frontend() -> Frontend:
    return instance(Frontend, "FE")


def tokens(rid: str, index: int, role: str) -> Envelope:
    """Genuine output `index` and the modelled positions it stands for, as RLD or MD send it."""
    first = output_group_start(index, SCALE)
    count = output_group_start(index + 1, SCALE) - first
    body = {
        "rid": rid,
        "index": index,
        "id": 5 + index,
        "first": first,
        "times": [0.1 * (first + i) for i in range(count)],
        "sent": 0.0,
        "role": role,
    }
    return Envelope("tokens", body, [], None)


def admit(fe: Frontend, rid: str) -> Flight:
    return fe.admit(
        {"rid": rid, "prompt_ids": [1, 2, 3], "input_tokens": 96, "output_tokens": OUTPUT}
    )
