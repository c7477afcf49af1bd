"""P holds the clock at a prefill step's end until the step's chunks are handed to their
connections: its own late wake-up from the step does not make them enter the network late."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from netem.clock import SharedClock
from pddemu.roles.prefill import PrefillInstance
from pddemu.roles.spec import Address
from pddemu.runtime.channel import Envelope
from pddemu.wire import TokenIds
from tests.roles.in_process import QuietFrontend, instance, run_started
from tests.roles.test_cut_transfer import links_to

WAKE_LATE_S = 0.05  # wall seconds P wakes late from each step (a busy host)


class Receiver:
    """MD's end of a KV connection: when (modelled) each part was handed to it."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.handed: list[tuple[str, float]] = []
        self.closed = False
        self.writer = self  # no socket to read TCP counters from
        self.links: Any = None  # whose transfers it admits at once

    def get_extra_info(self, _name: str) -> None:
        return None

    async def control(
        self, kind: str, body: dict, *_attachments: Any, handed: Any = None, on_turn: Any = None
    ) -> None:
        if on_turn is not None:
            on_turn()
        self.handed.append((kind, self.clock.now()))
        if handed is not None:
            handed()
        if kind == "kv_begin":
            self.links.admitted(self, body["seq"])

    async def send(self, chunk: object, handed: Any = None) -> int:
        self.handed.append(("chunk", self.clock.now()))
        if handed is not None:
            handed()
        return 1000

    def close(self) -> None:
        self.closed = True


def late_wake_ups(p: Any) -> None:
    """Every sleep of P's on the clock ends WAKE_LATE_S of wall time late."""
    sleep_until = p.clock.sleep_until

    async def late(modelled: float, precise: bool = False) -> float:
        lateness = await sleep_until(modelled, precise)
        time.sleep(WAKE_LATE_S)
        return lateness

    p.clock.sleep_until = late


def test_a_late_wake_up_after_a_prefill_step_does_not_make_its_chunks_late(
    tmp_path: Path,
) -> None:
    SharedClock.create(tmp_path / "clock", rate=1.0)
    p = instance(PrefillInstance, "P", clock=str(tmp_path / "clock"))
    receiver = Receiver(p.clock)
    late_wake_ups(p)

    async def opened(_name: str, _purpose: str) -> Receiver:
        return receiver

    async def scenario() -> None:
        p.links = links_to(opened, p)
        p.spec.peers["MD0"] = Address("MD0", "MD", "127.0.0.1", 3, 4)
        prompt = [1 + i % 200 for i in range(3 * p.chunk_genuine)]
        body = {"rid": "r1", "input_tokens": 32 * len(prompt), "output_tokens": 2}
        ids = [TokenIds.from_ints("r1", 0, prompt)]
        await p.on_prefill(Envelope("prefill", body, ids, QuietFrontend()))
        route = {"rid": "r1", "destinations": [{"name": "MD0", "offset": 0}]}
        await p.on_route(Envelope("route", route, [], QuietFrontend()))
        deadline = time.monotonic() + 10
        while not any(kind == "kv_end" for kind, _ in receiver.handed):
            assert time.monotonic() < deadline and not p.errors, p.errors
            await asyncio.sleep(0.01)

    run_started([p], scenario)
    ends = [event["end_s"] for event in p.events.events if event["kind"] == "prefill_chunk"]
    handed = [at for kind, at in receiver.handed if kind in ("chunk", "kv_end")]
    frames = 3 * p.chunk_genuine // p.slice_genuine  # P sends each chunk in slices
    assert len(set(ends)) == 1 and len(handed) == frames + 1  # one step of 3 chunks, the end
    # each part left at the step's end: on the code before, 50 ms late and more
    assert max(handed) - ends[0] < 0.001, (ends, handed)
