"""The replayer against a misbehaving frontend on loopback: every request still ends in a record."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass

import pytest
from aiohttp import web

from netem.clock import SharedClock
from pddemu.metrics.records import RequestRecord
from pddemu.replay import replay
from pddemu.runtime.clock import ModelledClock


@dataclass
class Request:
    request_id: str
    arrival_s: float
    input_tokens: int = 64
    output_tokens: int = 4
    session: str | None = None

    @property
    def prompt_ids(self) -> list[int]:
        return [1, 2, 3]


def good_record(rid: str) -> dict:
    return RequestRecord(rid, "pdd", 0.0, 64, 4, state="completed").to_dict()


async def generate(request: web.Request) -> web.StreamResponse:
    """r-good answers well; every other id breaks the protocol in its own way."""
    rid = (await request.json())["rid"]
    if rid == "r-status":
        return web.Response(status=503, text="overloaded")
    reply = web.StreamResponse()
    await reply.prepare(request)
    lines = {
        "r-good": {"record": good_record(rid), "output_ids": [7]},
        "r-extra-key": {"record": {**good_record(rid), "surprise": 1}, "output_ids": [7]},
        "r-no-ids": {"record": good_record(rid)},
        "r-not-json": None,
        "r-no-record": {"token": 1},
    }
    line = lines[rid]
    await reply.write(b"{not json\n" if line is None else json.dumps(line).encode() + b"\n")
    await reply.write_eof()
    return reply


@pytest.fixture
def frontend_url():
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    yield loop, f"http://127.0.0.1:{port}"
    loop.run_until_complete(runner.cleanup())
    loop.close()


def test_every_request_ends_in_a_record_whatever_the_frontend_answers(frontend_url) -> None:
    loop, url = frontend_url
    ids = ["r-no-record", "r-good", "r-extra-key", "r-no-ids", "r-not-json", "r-status"]
    workload = [Request(rid, arrival_s=0.01 * i) for i, rid in enumerate(ids)]
    clock = ModelledClock.fixed(time.monotonic(), 1.0)
    result = loop.run_until_complete(replay(url, workload, clock, "pdd", 0.0))
    by_id = {record.request_id: record for record in result.records}
    assert sorted(by_id) == sorted(ids) and len(result.records) == len(ids)
    arrivals = [(record.arrival_s, record.request_id) for record in result.records]
    assert arrivals == sorted(arrivals)  # written in arrival order, not completion order
    assert by_id["r-good"].state == "completed" and result.outputs["r-good"] == [7]
    for rid in ids[2:] + ids[:1]:
        assert by_id[rid].state == "failed", rid
        assert by_id[rid].failure_reason.startswith("replayer: "), rid
    assert "TypeError" in by_id["r-extra-key"].failure_reason
    assert "KeyError" in by_id["r-no-ids"].failure_reason
    assert "503" in by_id["r-status"].failure_reason
    assert result.protocol_errors == 5  # every failure here is the frontend's answer, not a timeout


def test_an_unreachable_frontend_is_a_failure_but_not_a_protocol_error() -> None:
    with socket.socket() as probe:  # a port nothing listens on any more
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    clock = ModelledClock.fixed(time.monotonic(), 1.0)
    result = asyncio.run(replay(f"http://127.0.0.1:{port}", [Request("r", 0.0)], clock, "pdd", 0))
    (record,) = result.records
    assert record.state == "failed" and "ClientConnectorError" in record.failure_reason
    assert result.protocol_errors == 0


async def generate_admitted_late(request: web.Request) -> web.StreamResponse:
    """A frontend whose record dates the arrival 0.3 s after it was due (its admission
    outlasted the replayer's hold)."""
    rid = (await request.json())["rid"]
    record = RequestRecord(rid, "pdd", 0.35, 64, 4, state="completed").to_dict()
    reply = web.StreamResponse()
    await reply.prepare(request)
    await reply.write(json.dumps({"record": record, "output_ids": [7]}).encode() + b"\n")
    await reply.write_eof()
    return reply


def test_an_arrival_the_frontend_took_late_is_counted_as_send_lag() -> None:
    async def scenario() -> list[float]:
        app = web.Application()
        app.router.add_post("/generate", generate_admitted_late)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        clock = ModelledClock.fixed(time.monotonic(), 1.0)
        try:
            await replay(f"http://127.0.0.1:{port}", [Request("r", 0.05)], clock, "pdd", 0.0)
        finally:
            await runner.cleanup()
        return clock.lags["send"]

    assert asyncio.run(scenario()) == [pytest.approx(0.3)]


async def generate_slowly(request: web.Request) -> web.StreamResponse:
    """A frontend that has the request at once (its answer begins) and ends it 0.5 s later."""
    rid = (await request.json())["rid"]
    reply = web.StreamResponse()
    await reply.prepare(request)
    await asyncio.sleep(0.5)
    await reply.write(json.dumps({"record": good_record(rid), "output_ids": [7]}).encode() + b"\n")
    await reply.write_eof()
    return reply


def test_the_arrivals_hold_ends_when_the_frontend_has_the_request(tmp_path) -> None:
    """Time stands at each arrival until the frontend's answer has begun, not until the
    request is over: before, the hold waited for both, and so always for its cap (0.25 s of
    wall time an arrival)."""

    async def scenario() -> dict:
        app = web.Application()
        app.router.add_post("/generate", generate_slowly)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        page = tmp_path / "clock"
        SharedClock.create(page, rate=1.0)
        clock = ModelledClock.attach(page, "replay-pdd/instant")
        try:
            workload = [Request("r1", 0.05), Request("r2", 0.1)]
            result = await replay(f"http://127.0.0.1:{port}", workload, clock, "pdd", 0.0)
            assert [r.state for r in result.records] == ["completed", "completed"]
            return clock.hold_counts()
        finally:
            clock.close()
            await runner.cleanup()

    holds = asyncio.run(scenario())
    assert holds["posted"] == 2
    assert holds["frozen_wall_s"] < 0.2, holds  # two arrivals; 0.5 s at their caps before
