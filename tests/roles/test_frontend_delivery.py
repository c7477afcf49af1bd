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
    async def scenario() -> tuple[int, int, list[float], bool, int, int]:
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
            record.dropped_stale_tokens,
        )

    duplicates, gap, times, done, handoff_at, stale = asyncio.run(scenario())
    assert (duplicates, gap, done, handoff_at, stale) == (SCALE, 0, True, 1 + SCALE, 0)
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


def test_a_relay_thought_lost_adds_nothing_after_md_resumes() -> None:
    """The relay only seemed lost (a silence under load): MD resumes from the user's position,
    and what the relay sent early (reordered) or still sends (delayed) is not the user's."""

    async def scenario() -> tuple[int, int, bool, list, int]:
        fe = frontend()
        flight = admit(fe, "r4")
        flight.record.pipeline, flight.rld, flight.decode = "P-RLD-MD", "RLD0", "MD0"
        fe.liveness.state["MD0"] = "up"
        await fe.on_tokens(tokens("r4", 0, "RLD"))
        await fe.on_tokens(tokens("r4", 2, "RLD"))  # ahead of output 1, which is delayed
        await fe.fail_over_flight(flight, "RLD0")
        await fe.on_tokens(tokens("r4", 1, "RLD"))  # the delayed one, after the resume
        for index in (1, 2):  # MD streams every position from the user's
            await fe.on_tokens(tokens("r4", index, "MD"))
        fe.finish_record(flight)
        resumes = [(name, body["position"]) for name, kind, body in fe.told if kind == "resume"]
        return (
            flight.record.duplicate_tokens,
            flight.record.gap_tokens,
            flight.done.is_set(),
            resumes,
            flight.record.dropped_stale_tokens,
        )

    duplicates, gap, done, resumes, dropped = asyncio.run(scenario())
    assert resumes == [("MD0", 1)]
    assert (duplicates, gap, done) == (0, 0, True)
    # the relieved relay's late group is not delivered, but counted
    assert dropped == len(tokens("r4", 1, "RLD").body["times"]) > 0


def test_an_abandoned_legs_tokens_are_not_the_users() -> None:
    """A request routed again (or moved) under a new leg: its old instances, which may still be
    alive, send on; only the new leg's tokens reach the user, whatever the order."""

    async def scenario() -> tuple[int, int, bool, int, int]:
        fe = frontend()
        flight = admit(fe, "r5")
        await fe.on_tokens(tokens("r5", 0, "MD"))
        await fe.on_tokens(tokens("r5", 2, "MD"))  # the old leg's, ahead of a delayed output 1
        fe.new_leg(flight, "r5~1")  # moved: the new leg streams from position 1
        await fe.on_tokens(tokens("r5", 1, "MD"))  # the old leg's, late
        for index in (2, 1):  # the new leg's, reordered
            await fe.on_tokens(tokens("r5~1", index, "MD", "MD1"))
        fe.finish_record(flight)
        record = flight.record
        return (
            record.duplicate_tokens,
            record.gap_tokens,
            flight.done.is_set(),
            record.output_tokens,
            record.dropped_stale_tokens,
        )

    duplicates, gap, done, delivered, dropped = asyncio.run(scenario())
    assert (duplicates, gap, done, delivered) == (0, 0, True, OUTPUT)
    # the old leg's late group is not delivered, but counted; the new leg's all are delivered
    assert dropped == len(tokens("r5", 1, "MD").body["times"]) > 0


def test_a_group_delivered_whole_is_delivered_as_position_by_position() -> None:
    """A group that comes next in order goes to the user's stream whole; the same groups
    arriving out of order wait and go position by position. Both give the same times (each
    at least the one before: MD's group here was produced earlier than the relay's last),
    counts, handoff position and stream."""

    async def deliveries(order: tuple[int, ...]) -> tuple:
        fe = frontend()
        fe.arrival = lambda message, ready=None: 2.0  # type: ignore[method-assign]
        flight = admit(fe, "r")
        messages = {0: tokens("r", 0, "RLD"), 1: tokens("r", 1, "RLD"), 2: tokens("r", 2, "MD")}
        messages[2].body["times"] = [t - 1.0 for t in messages[2].body["times"]]
        for index in order:
            await fe.on_tokens(messages[index])
        record = flight.record
        stream = [flight.stream.get_nowait() for _ in range(flight.stream.qsize())]
        return (
            record.token_times_s,
            record.rld_tokens,
            record.md_tokens,
            record.handoff_position,
            record.handoff_resumed_s,
            stream,
            flight.done.is_set(),
        )

    whole = asyncio.run(deliveries((0, 1, 2)))
    by_position = asyncio.run(deliveries((2, 1, 0)))
    assert whole == by_position
    times = whole[0]
    assert len(times) == OUTPUT and times == sorted(times)
    assert whole[1:5] == (1 + SCALE, SCALE, 1 + SCALE, 0.1 * (1 + SCALE) - 1.0)
    assert [item["index"] for item in whole[5]] == [0, 1, 2] and whole[6]
