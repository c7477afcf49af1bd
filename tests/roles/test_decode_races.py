"""Message orders the protocol must survive, driven in-process (no network: `tell` recorded)."""

from __future__ import annotations

import asyncio
from typing import Any

from pddemu.roles.decode import DecodeRequest
from pddemu.roles.main_decode import MainDecodeInstance
from pddemu.roles.relay import RelayInstance
from pddemu.runtime.channel import Envelope
from pddemu.wire import TokenIds
from tests.roles.in_process import instance

META = {
    "input_tokens": 40 * 32,
    "output_tokens": 400,
    "genuine_output_tokens": 14,
    "frontend": "FE0",
    "pipeline": "P-RLD-MD",
    "rld": "RLD0",
    "md": "MD0",
}


def prompt_request(made: Any, rid: str) -> DecodeRequest:
    prompt = list(range(40))
    kv, _ = made.model.prefill(prompt, None, 64)
    return DecodeRequest(rid, dict(META), kv, len(prompt))


def test_a_release_racing_a_handoff_part_leaves_the_decode_loop_running() -> None:
    async def scenario() -> tuple[list[str], bool]:
        md = instance(MainDecodeInstance, "MD")
        await md.start()
        md.requests["r1"] = prompt_request(md, "r1")
        md.known["r1"] = []
        part = {"rid": "r1", "start": 0, "end": 3, "final": False, "payload": "extend"}
        part["sent_at"] = md.clock.now()
        await md.on_handoff(
            Envelope("handoff", part, [TokenIds.from_ints("r1", 0, [1, 2, 3])], None)
        )
        await md.on_release(Envelope("release", {"rid": "r1", "kv_expected": False}, [], None))
        await asyncio.sleep(0.3)
        # a late part for the released request is ignored, and the loop still serves others
        await md.on_handoff(
            Envelope("handoff", part, [TokenIds.from_ints("r1", 0, [1, 2, 3])], None)
        )
        loop_alive = any(not task.done() for task in md._tasks)
        return md.errors, loop_alive

    errors, loop_alive = asyncio.run(scenario())
    assert errors == [] and loop_alive


def test_md_ready_before_the_relay_has_the_request_still_starts_the_handoff() -> None:
    async def scenario() -> set[str]:
        rld = instance(RelayInstance, "RLD")
        await rld.on_md_ready(Envelope("md_ready", {"rid": "r2"}, [], None))  # KV not here yet
        request = prompt_request(rld, "r2")
        await rld.reserve_memory(request)
        await rld.kv_arrived(request, first_token=7, begin={}, genuine_bytes=0)
        return set(rld.handoffs)

    assert asyncio.run(scenario()) == {"r2"}


def test_a_step_after_idling_never_starts_before_its_work_arrived() -> None:
    async def scenario() -> tuple[float, float]:
        md = instance(MainDecodeInstance, "MD")
        md.last_end = md.clock.now() - 0.01  # a step ended a moment ago, then the loop idled
        ready = md.clock.now() + 0.02
        return md._start_time(ready), ready

    started, ready = asyncio.run(scenario())
    assert started >= ready
