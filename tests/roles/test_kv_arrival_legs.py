"""The record's KV transfer is its request's current leg's: a late arrival of an earlier leg's
KV (moved away from) does not stand for the leg routed since, and a moved leg's own arrival
is recorded against its own routing."""

from __future__ import annotations

import asyncio

from pddemu.roles.frontend import LEG_SEPARATOR, routed_now
from pddemu.runtime.channel import Envelope
from tests.roles.in_process import admit, frontend


def arrived(leg: str, first_chunk_at: float, at: float) -> Envelope:
    return Envelope("kv_arrived", {"rid": leg, "first_chunk_at": first_chunk_at, "at": at}, [])


def test_only_the_current_legs_arrival_is_recorded() -> None:
    async def scenario() -> list[tuple[float | None, float | None, float | None]]:
        fe = frontend()
        flight = admit(fe, "r1")
        fe.new_leg(flight, "r1")
        record = flight.record
        routed_now(record, 1.0)
        seen = []
        await fe.on_kv_arrived(arrived("r1", 1.5, 2.0))  # the first leg's KV, in time
        seen.append((record.routed_s, record.kv_first_chunk_s, record.kv_arrived_s))
        moved = fe.new_leg(flight, f"r1{LEG_SEPARATOR}1")
        routed_now(record, 3.0)  # its stream moved: a new leg, routed now
        seen.append((record.routed_s, record.kv_first_chunk_s, record.kv_arrived_s))
        await fe.on_kv_arrived(arrived("r1", 3.2, 3.4))  # the old leg's, late: not this one's
        seen.append((record.routed_s, record.kv_first_chunk_s, record.kv_arrived_s))
        await fe.on_kv_arrived(arrived(moved, 3.6, 4.5))
        seen.append((record.routed_s, record.kv_first_chunk_s, record.kv_arrived_s))
        return seen

    assert asyncio.run(scenario()) == [
        (1.0, 1.5, 2.0),
        (3.0, None, None),
        (3.0, None, None),
        (3.0, 3.6, 4.5),
    ]
