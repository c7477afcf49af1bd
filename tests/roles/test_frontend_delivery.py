"""The frontend's in-order delivery, driven in-process: duplicates dropped, gaps held and counted."""

from __future__ import annotations

import asyncio

from tests.roles.in_process import OUTPUT, SCALE, admit, frontend, tokens


def test_positions_behind_a_missing_one_are_held_and_counted_as_a_gap() -> None:
    async def scenario() -> tuple[int, int, int, int]:
        fe = frontend()
        flight = admit(fe, "r1")
        await fe.on_tokens(tokens("r1", 2, "MD"))  # outputs 0 and 1 never arrive
        held = flight.delivered
        fe.fail(flight, "test: the relay's tokens were lost")
        fe.finish_record(flight)
        return held, flight.record.gap_tokens, flight.record.output_tokens, len(flight.pending)

    held, gap, delivered, pending = asyncio.run(scenario())
    assert (held, delivered) == (0, 0)
    assert gap == pending == SCALE


def test_overlapping_copies_are_dropped_and_the_stream_completes_in_order() -> None:
    async def scenario() -> tuple[int, int, list[float], bool, int]:
        fe = frontend()
        flight = admit(fe, "r2")
        for index in (0, 1):
            await fe.on_tokens(tokens("r2", index, "RLD"))
        for index in (1, 2):  # a catch-up handoff: MD repeats output 1
            await fe.on_tokens(tokens("r2", index, "MD"))
        fe.finish_record(flight)
        record = flight.record
        return (
            record.duplicate_tokens,
            record.gap_tokens,
            record.token_times_s,
            flight.done.is_set(),
            record.handoff_position,
        )

    duplicates, gap, times, done, handoff_at = asyncio.run(scenario())
    assert (duplicates, gap, done, handoff_at) == (SCALE, 0, True, 1 + SCALE)
    assert len(times) == OUTPUT and times == sorted(times)


def test_tokens_after_the_record_is_written_leave_it_alone() -> None:
    async def scenario() -> tuple[int, int, int]:
        fe = frontend()
        flight = admit(fe, "r3")
        await fe.on_tokens(tokens("r3", 0, "RLD"))
        fe.fail(flight, "test: timed out")
        fe.finish_record(flight)
        await fe.on_tokens(tokens("r3", 1, "RLD"))  # late: the transfer wait is still running
        record = flight.record
        return record.output_tokens, len(record.token_times_s), record.gap_tokens

    output_tokens, times, gap = asyncio.run(scenario())
    assert output_tokens == times == 1 and gap == 0
