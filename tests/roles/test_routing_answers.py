"""The routing exchange waits for an instance's answer (P's prefix hit, the decode side's
match) only as long as the router waits for a silent instance before it is down: an instance
heard from but not answering a leg no longer holds its request to the request timeout, and a
request given up so ends failed, with the reason, its instances told to let it go. A request
that is over no longer waits for the transfer reports of a P that was lost. Driven in-process:
the frontend's messages are recorded, the instances' answers made up."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pddemu.config import load_config
from pddemu.roles.frontend import Flight, Frontend
from pddemu.roles.sizing import cost_model
from pddemu.runtime.channel import Envelope
from pddemu.runtime.liveness import UP, Liveness
from tests.roles.in_process import admit, instance, tokens

DOWN_AFTER_S = 0.5  # modelled (real time in-process): the patience for an answer
WALL_BOUND_S = 10.0  # the request must have ended by then (its timeout is 600 s)


def deployment(
    silent: set[str],
    time_scale: float | None = None,
    streaming: bool = False,
    queue_ms: float | None = None,
    drc: bool = True,
) -> Frontend:
    """A frontend routing to P0, P1, RLD0, MD0 and MD1, all up; the instances named in `silent`
    never answer, the others answer at once with no hit; `streaming`: a P that answered
    streams a route's request at once (each destination's transfer reported, every token from
    the decode side); `queue_ms`: the WAN's bottleneck queue; `drc`: the decode side's cache."""
    config = load_config()
    config = config.model_copy(
        update={
            "faults": config.faults.model_copy(
                update={"suspect_after_s": 0.3, "down_after_s": DOWN_AFTER_S}
            ),
            "scale": config.scale.model_copy(update={"time_scale": time_scale}),
            "wan": config.wan.model_copy(update={"queue_ms": queue_ms}),
            "policy": config.policy.model_copy(update={"drc": drc}),
        }
    )
    fe = instance(Frontend, "FE", config)
    fe.p_names, fe.decode_names, fe.rld_names = ["P0", "P1"], ["MD0", "MD1"], ["RLD0"]
    fe.relay_cost = cost_model(config, "pdd", "RLD")
    fe.load = {name: 0 for name in [*fe.p_names, *fe.decode_names, *fe.rld_names]}
    fe.liveness = Liveness(list(fe.load), 0.3, DOWN_AFTER_S)
    for name in fe.load:
        fe.liveness.state[name] = UP
    answers = {"prefill": ("p_hit", fe.on_p_hit), "match": ("matched", fe.on_matched)}

    async def tell(name: str, kind: str, body: dict, *attachments: Any) -> int:
        fe.told.append((name, kind, body))
        if kind in answers and name not in silent:
            reply, handler = answers[kind]
            answer = Envelope(reply, {"rid": body["rid"], "hit": 0, "instance": name}, [], None)
            fe.spawn(handler(answer), f"{name}'s {reply}")
        if streaming and kind == "route" and name not in silent:
            fe.spawn(stream(fe, body), f"{body['rid']} streamed")
        return 0

    fe.tell = tell
    return fe


async def stream(fe: Frontend, route: dict[str, Any]) -> None:
    rid, names = route["rid"], [d["name"] for d in route["destinations"]]
    for name in names:
        done = {"rid": rid, "destination": name, "bytes": 0, "cancelled": False}
        done.update(tokens=1, tokens_sent=1)
        await fe.on_transfer_done(Envelope("transfer_done", done, [], None))
    decode = names[-1]  # the decode side's, after the relay's if there is one
    for index in range(3):
        await fe.on_tokens(tokens(rid, index, decode.rstrip("0123456789"), decode))


async def until_told(fe: Frontend, name: str, kind: str) -> None:
    while not any((n, k) == (name, kind) for n, k, _ in fe.told):
        await asyncio.sleep(0.01)


async def streaming_on_lost_md0(fe: Frontend) -> Flight:
    """Request "r", a P-MD request streaming from MD0, whose MD0 is then lost: it moves."""
    flight = admit(fe, "r")
    flight.record.pipeline = "P-MD"
    flight.p, flight.decode = "P0", "MD0"
    await fe.on_tokens(tokens("r", 0, "MD"))
    fe.liveness_changed(fe.liveness.lost("MD0", fe.clock.now(), "killed"))
    return flight


async def until_routed_or_abandoned(fe: Frontend, flight: Flight) -> None:
    """Until the frontend has routed a request or `flight` was given up, within the wall bound."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WALL_BOUND_S
    while not any(kind == "route" for _, kind, _ in fe.told) and loop.time() < deadline:
        if flight.abandoned:
            break
        await asyncio.sleep(0.01)


async def ended(fe: Frontend, flight: Flight, task: asyncio.Task) -> bool:
    """Whether the request ended within the wall bound (it is stopped if not)."""
    try:
        await asyncio.wait_for(asyncio.shield(task), WALL_BOUND_S)
        return True
    except TimeoutError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False


async def served(
    silent: set[str], lose_p0: bool = False, drc: bool = True
) -> tuple[bool, Frontend, Flight]:
    """Request "r" served by `deployment(silent)` (P0 lost once it was asked to prefill):
    whether it ended within the wall bound, the frontend, its flight."""
    fe = deployment(silent, streaming=True, drc=drc)
    flight = admit(fe, "r")
    task = asyncio.ensure_future(fe.serve_flight(flight))
    await until_told(fe, "P0", "prefill")
    if lose_p0:
        fe.liveness_changed(fe.liveness.lost("P0", fe.clock.now(), "killed"))
    return await ended(fe, flight, task), fe, flight


@pytest.mark.parametrize(
    ("silent", "lose_p0", "reason"),
    [
        # P0 dies mid-prefill; the retried leg's P (P1, the only one left) never answers
        ({"P0", "P1"}, True, "P1 did not answer p_hit for r~1 within {} modelled s"),
        # neither P answers: the retried leg goes to the other, P1
        ({"P0", "P1"}, False, "P1 did not answer p_hit for r~1 within {} modelled s"),
    ],
)
def test_a_routing_answer_that_never_comes_fails_the_request_and_releases_it(
    silent: set[str], lose_p0: bool, reason: str
) -> None:
    """Routed again once, then failed with the reason; every leg's P is told to cancel and its
    decode instance to release (its pinned match), and no load is left counted. On the code
    before 45036b9, the request was still waiting for the answer after 10 s (its timeout is
    600 s)."""
    done, fe, flight = asyncio.run(served(silent, lose_p0))
    assert done, "still waiting for the answer"
    record = flight.record
    assert (record.state, record.failure_reason) == (
        "failed",
        reason.format(fe.answer_patience_s()),
    )
    assert record.retries == 1 and flight.legs == ["r", "r~1"]
    said = {(name, kind, body["rid"]) for name, kind, body in fe.told}
    p_again, md_again = ("P1" if "P0" in silent else "P0"), ("MD1" if "MD0" in silent else "MD0")
    assert {("P0", "cancel", "r"), ("MD0", "release", "r")} <= said
    assert {(p_again, "cancel", "r~1"), (md_again, "release", "r~1")} <= said
    assert set(fe.load.values()) == {0}


def test_a_request_routed_again_after_an_unanswered_exchange_goes_to_another_instance() -> None:
    """A P that did not answer the routing exchange is left out of the request's next
    routing while another is up: the request completes there. On the code before, the retry
    went to the silent instance again (least loaded by name, or the session's), waited as
    long, and failed the request, other instances healthy."""
    silent, served_by = {"P0"}, ("P1", "MD0")
    done, fe, flight = asyncio.run(served(silent))
    assert done, "still waiting"
    assert (flight.record.state, flight.record.retries, flight.legs) == (
        "completed",
        1,
        ["r", "r~1"],
    )
    routed = [(name, body) for name, kind, body in fe.told if kind == "route"]
    assert [(name, body["rid"]) for name, body in routed] == [(served_by[0], "r~1")]
    assert served_by[1] in [d["name"] for d in routed[0][1]["destinations"]]
    # the first leg was never routed: its decode side, which only matched, expects no KV (on the
    # code before, kv_expected=True: MD kept the leg's id in `released` for good)
    (release,) = [body for name, kind, body in fe.told if (kind, body["rid"]) == ("release", "r")]
    assert release["kv_expected"] is False


@pytest.mark.parametrize("silent", [{"MD0"}, {"MD0", "MD1"}])
def test_a_match_unanswered_in_time_routes_the_request_with_no_hit_there(silent: set[str]) -> None:
    """MD0 (the session's decode instance) is up, heard from, but its answer to the match does
    not come within the patience (at full load the emulated WAN can hold a match for seconds:
    docs/validation.md, "Which lag counts"): the request is routed on its first leg all the same,
    to MD0 with the whole prompt (no hit there), and completes; the record says it was routed
    unmatched. On the code before, it was routed again from the start (to MD1, after another
    wait), and with MD1 as late failed unrouted: "MD1 did not answer matched for r~1"."""
    done, fe, flight = asyncio.run(served(silent))
    assert done, "still waiting"
    record = flight.record
    assert (record.state, record.retries, flight.legs) == ("completed", 0, ["r"])
    assert record.unmatched and record.md_hit_tokens == 0
    assert fe.stats()["unmatched"] == 1  # what serve's verdict judges
    assert "MD0 did not answer matched for r within" in record.failover_path
    (route,) = [body for name, kind, body in fe.told if kind == "route"]
    md = [d for d in route["destinations"] if d["name"] == "MD0"]
    assert [d["offset"] for d in md] == [0]
    assert flight.replies["matched"].cancelled()  # an answer read later is not waited for


def test_a_move_whose_target_never_answers_its_match_sends_the_whole_prompt() -> None:
    """MD0, streaming a P-MD request, is lost; MD1 never answers the match the move asks: the
    move goes on after the patience, with the whole prompt, also at `time_scale = "auto"`
    (the default). On the code before, the patience was down_after / time_scale, a TypeError
    under "auto": the failover failed and the request was given up."""

    async def scenario() -> tuple[Flight, list[tuple[str, str, dict]]]:
        fe = deployment({"MD1"}, time_scale=None)
        flight = await streaming_on_lost_md0(fe)
        await until_routed_or_abandoned(fe, flight)
        return flight, fe.told

    flight, told = asyncio.run(scenario())
    assert flight.abandoned == "", flight.abandoned
    (route,) = [body for name, kind, body in told if kind == "route"]
    assert route["rid"] == "r~1" and route["destinations"][0]["name"] == "MD1"
    assert route["destinations"][0]["offset"] == 0


def test_a_request_over_whose_p_is_lost_before_reporting_its_transfers_settles_at_once() -> None:
    """A request has all its tokens, but P0 has not yet reported its KV transfers (their bytes
    belong to the record) when it is lost: they will never be reported, so the request settles
    (its final record goes to the client) at once. On the code before, a failover skipped a
    request already recorded, and it waited for the reports to its timeout (600 s)."""

    async def scenario() -> tuple[bool, Flight, list[str]]:
        fe = deployment(set())
        flight = admit(fe, "r")
        task = asyncio.ensure_future(fe.serve_flight(flight))
        await until_told(fe, "P0", "route")
        for index in range(3):  # every position, from the decode side
            await fe.on_tokens(tokens("r", index, "MD"))
        while not flight.recorded:
            await asyncio.sleep(0.01)
        fe.liveness_changed(fe.liveness.lost("P0", fe.clock.now(), "killed"))
        return await ended(fe, flight, task), flight, fe.errors

    done, flight, errors = asyncio.run(scenario())
    assert done, "still waiting for the lost P's transfer reports"
    assert flight.record.state == "completed" and flight.settled.is_set()
    assert errors == []


def test_an_answer_waiting_while_the_frontend_itself_was_late_is_not_taken_for_silence() -> None:
    """MD0 answers its match at once, but the frontend's loop is then busy (a stall longer
    than the answer's patience) and reads the answer only after its wait's timer is due: the
    late wake-up does not count, and the answer, read next, routes the request on its first
    leg. On the code before, the timer judged MD0 silent (the request routed again, to MD1)."""

    async def scenario() -> tuple[bool, Frontend, Flight]:
        fe = deployment({"MD0"}, streaming=True)
        recorded = fe.tell
        loop = asyncio.get_running_loop()

        async def tell(name: str, kind: str, body: dict, *attachments: Any) -> int:
            if (name, kind) == ("MD0", "match"):
                loop.call_later(0.05, answer_then_stall, body["rid"])
            return await recorded(name, kind, body, *attachments)

        def answer_then_stall(rid: str) -> None:
            fe.spawn(read_late(rid), "MD0's matched, read late")
            time.sleep(fe.answer_patience_s() + 0.5)  # the frontend's loop is busy

        async def read_late(rid: str) -> None:
            for _ in range(10):  # a read, its parsing, its dispatch: later than the timer
                await asyncio.sleep(0)
            answer = {"rid": rid, "hit": 0, "instance": "MD0"}
            await fe.on_matched(Envelope("matched", answer, [], None))

        fe.tell = tell
        flight = admit(fe, "r")
        task = asyncio.ensure_future(fe.serve_flight(flight))
        return await ended(fe, flight, task), fe, flight

    done, fe, flight = asyncio.run(scenario())
    assert done, "still waiting"
    routed = [body for name, kind, body in fe.told if kind == "route"]
    assert (flight.record.state, flight.legs) == ("completed", ["r"]), flight.record.failover_path
    assert "MD0" in [d["name"] for d in routed[0]["destinations"]]


def test_an_answer_the_wans_queue_may_hold_beyond_down_after_is_waited_for() -> None:
    """The WAN's bottleneck queue holds 300 modelled ms: a match and its answer, each queued
    behind KV under `fifo`, may take 0.6 s more than the path's delay, while MD0's heartbeats
    (the other way, not queued) say it is up. MD0 answers 0.7 s after the question (beyond
    down_after, 0.5 s here, within the WAN's bound): the request is routed on its first leg.
    On the code before, MD0 was judged silent at 0.5 s and the request routed again."""

    async def scenario() -> tuple[bool, Frontend, Flight]:
        fe = deployment({"MD0"}, streaming=True, queue_ms=300)
        recorded = fe.tell

        async def tell(name: str, kind: str, body: dict, *attachments: Any) -> int:
            if (name, kind) == ("MD0", "match"):
                fe.spawn(answer_late(body["rid"]), "MD0's matched, queued")
            return await recorded(name, kind, body, *attachments)

        async def answer_late(rid: str) -> None:
            await asyncio.sleep(DOWN_AFTER_S + 0.2)
            answer = {"rid": rid, "hit": 0, "instance": "MD0"}
            await fe.on_matched(Envelope("matched", answer, [], None))

        fe.tell = tell
        flight = admit(fe, "r")
        task = asyncio.ensure_future(fe.serve_flight(flight))
        return await ended(fe, flight, task), fe, flight

    done, fe, flight = asyncio.run(scenario())
    assert done, "still waiting"
    assert fe.answer_patience_s() > DOWN_AFTER_S + 2 * 0.3
    assert (flight.record.state, flight.legs) == ("completed", ["r"]), flight.record.failover_path


def test_a_move_target_lost_while_its_match_is_asked_is_not_counted_unmatched() -> None:
    """MD0, streaming a P-MD request, is lost; the move asks MD1 its match, and MD1 is lost
    too before it answers (a partition of the decode side's datacenter): its silence is its
    loss, not the WAN holding its answer, so the request is not counted `unmatched` and the
    run is not judged invalid for it (`judge_unmatched`). On the code before, it was: the
    run's `invalid_reason` blamed the WAN for a fault the run injected."""

    async def scenario() -> Flight:
        fe = deployment({"MD1"})
        flight = await streaming_on_lost_md0(fe)
        await asyncio.wait_for(until_told(fe, "MD1", "match"), WALL_BOUND_S)
        fe.liveness_changed(fe.liveness.lost("MD1", fe.clock.now(), "killed"))
        await until_routed_or_abandoned(fe, flight)
        return flight

    flight = asyncio.run(scenario())
    assert "MD1 did not answer matched for r~1" in flight.record.failover_path
    assert not flight.record.unmatched


@pytest.mark.parametrize("silent", [set(), {"MD0"}])
def test_with_no_drc_the_decode_side_is_not_asked_and_the_route_waits_for_p_alone(
    silent: set[str],
) -> None:
    """With `policy.drc = false` MD holds nothing of any prompt: the frontend sends it no
    match (which would cross the WAN for an answer known to be 0) and routes on P's hit
    alone, the whole prompt to the decode side, even one that would never answer a match. On
    the code before, the match was sent all the same, and at full load came seconds late:
    such requests were routed `unmatched` and the run judged not valid."""
    done, fe, flight = asyncio.run(served(silent, drc=False))
    assert done, "still waiting"
    record = flight.record
    assert (record.state, record.retries, flight.legs) == ("completed", 0, ["r"])
    assert not record.unmatched and record.md_hit_tokens == 0
    assert fe.stats()["unmatched"] == 0
    assert [kind for _, kind, _ in fe.told if kind in ("match", "release")] == []
    (route,) = [body for name, kind, body in fe.told if kind == "route"]
    assert [d["offset"] for d in route["destinations"] if d["name"].startswith("MD")] == [0]


def test_with_no_drc_a_move_asks_its_target_nothing() -> None:
    """MD0, streaming a P-MD request, is lost; with no DRC the move sends MD1 the whole
    prompt at once, asking it no match (MD1 would never answer one here: on the code before,
    the move waited the patience for it)."""

    async def scenario() -> tuple[Flight, list[tuple[str, str, dict]], float]:
        fe = deployment({"MD1"}, drc=False)
        flight = await streaming_on_lost_md0(fe)
        started = time.monotonic()
        await until_routed_or_abandoned(fe, flight)
        return flight, fe.told, time.monotonic() - started

    flight, told, took = asyncio.run(scenario())
    assert flight.abandoned == "", flight.abandoned
    assert not [name for name, kind, _ in told if kind == "match"]
    (route,) = [body for name, kind, body in told if kind == "route"]
    assert route["rid"] == "r~1" and route["destinations"][0]["name"] == "MD1"
    assert route["destinations"][0]["offset"] == 0
    assert took < DOWN_AFTER_S
    assert flight.record.md_hit_tokens == 0 and not flight.record.unmatched
