"""P holds the present from sending `kv_begin` and `kv_end` on a path without modelled time
until the receiver has read them (`ModelledClock.hold_until_read`): a relay that reads them
late (its process waiting for a core) neither counts handler lag for them nor takes the
request into its batch later than the end's time, while it decodes another request."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from netem.clock import SharedClock
from pddemu.model import greedy
from pddemu.model.kv import KV
from pddemu.roles.prefill import Destination, PrefillInstance, PrefillJob
from pddemu.roles.relay import RelayInstance
from pddemu.roles.spec import Address
from pddemu.roles.transfer import KvLinks
from pddemu.runtime.channel import Channel, Control, Envelope
from pddemu.runtime.clock import ModelledClock
from pddemu.wire import TokenIds, read_message
from pddemu.wire.tensors import kv_chunk_from_tensor
from tests.roles.in_process import QuietFrontend, instance, run_started

LATE_S = 0.1  # wall seconds the relay reads each message of a transfer after it was sent
PROMPT = [1 + i % 200 for i in range(64)]  # genuine tokens


class LateConnection:
    """P's connection to RLD0 (the intra-DC path, which takes no modelled time): each message,
    stamped as a channel stamps it, reaches the relay's dispatch LATE_S of wall time after it
    was sent, in order."""

    def __init__(self, p: Any, rld: Any) -> None:
        self.p, self.rld = p, rld
        self.peer = "RLD0"
        self.closed = False
        self.writer = self  # no socket to read TCP counters from
        # RLD's end: what RLD says back (`kv_admitted`) reaches P at once
        self.rld_end = SimpleNamespace(
            peer="P0", read_date=lambda: None, closed=False, control=self._back
        )
        self.queue: asyncio.Queue = asyncio.Queue()
        p.spawn(self._deliver(), "late connection to RLD0")

    def get_extra_info(self, _name: str) -> None:
        return None

    async def control(
        self, kind: str, body: dict, *_attachments: Any, handed: Any = None, on_turn: Any = None
    ) -> int:
        if on_turn is not None:  # its turn on the connection: at once
            on_turn()
        stamped = Control(kind, {**body, "t": self.p.clock.now()})
        self.queue.put_nowait((time.monotonic() + LATE_S, stamped))
        return 100

    async def _back(self, kind: str, body: dict) -> int:
        stamped = {**body, "t": self.rld.clock.now()}
        await self.p._dispatch(Envelope(kind, stamped, [], self), self)
        return 100

    async def send(self, chunk: Any, handed: Any = None) -> int:
        self.queue.put_nowait((time.monotonic() + LATE_S, chunk))
        if handed is not None:
            handed()
        return int(chunk.nbytes)

    async def _deliver(self) -> None:
        while True:
            due, item = await self.queue.get()
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if isinstance(item, Control):
                item = Envelope(item.kind, item.body, [], self.rld_end)
            await self.rld._dispatch(item, self.rld_end)

    def close(self) -> None:
        self.closed = True


def meta(rid: str, output_tokens: int) -> dict[str, Any]:
    return {
        "rid": rid,
        "input_tokens": 32 * len(PROMPT),
        "output_tokens": output_tokens,
        "predicted_output_tokens": output_tokens,
        "pipeline": "P-RLD-MD",
        "frontend": "FE0",
    }


def test_a_relay_reading_a_transfer_late_takes_it_in_at_its_end(tmp_path: Path) -> None:
    SharedClock.create(tmp_path / "clock", rate=1.0)
    p = instance(PrefillInstance, "P", clock=str(tmp_path / "clock"))
    rld = instance(RelayInstance, "RLD", clock=str(tmp_path / "clock"), epoch=p.spec.epoch)
    # one datacenter, its path unshaped: messages between them take no modelled time
    p.spec.peers["RLD0"] = Address("RLD0", "RLD", "127.0.0.1", 3, 4)
    rld.spec.peers["P0"] = Address("P0", "P", "127.0.0.1", 1, 2)
    p.transit, rld.transit = p._transits(), rld._transits()
    assert p.exact("RLD0") and rld.exact("P0")

    async def request(rid: str, output_tokens: int) -> None:
        ids = [TokenIds.from_ints(rid, 0, PROMPT)]
        await p.on_prefill(Envelope("prefill", meta(rid, output_tokens), ids, QuietFrontend()))
        route = {"rid": rid, "destinations": [{"name": "RLD0", "offset": 0}]}
        await p.on_route(Envelope("route", route, [], QuietFrontend()))

    def second_group(rid: str) -> list[float]:
        """The modelled times of the request's second genuine output's tokens, as sent."""
        return next(
            (
                body["times"]
                for _, kind, body in rld.told
                if kind == "tokens" and body["rid"] == rid and body["index"] == 1
            ),
            [],
        )

    async def until(condition: Any) -> None:
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline, (p.errors, rld.errors)
            await asyncio.sleep(0.005)

    async def scenario() -> None:
        p.links = KvLinks(
            lambda _name, _purpose: opened(),
            lambda _channel: None,
            spawn=p.spawn,
            clock=p.clock,
            open_within_s=2,
        )

        async def opened() -> LateConnection:
            return LateConnection(p, rld)

        await request("r0", 100_000)  # keeps the relay stepping
        await until(lambda: "r0" in rld.requests and rld.steps > 3)
        await request("r1", 100_000)
        await until(lambda: second_group("r1"))

    run_started([p, rld], scenario)
    assert p.errors == [] and rld.errors == [], (p.errors, rld.errors)
    ended = next(e for e in rld.events.events if e["kind"] == "kv_transfer" and e["rid"] == "r1")
    first_step_end = second_group("r1")[0]
    # r1 joined the relay's batch at the first step after its KV's end (that step, and the one
    # under way then: two steps at most); on the code before it joined a step after the relay
    # read the end, LATE_S of wall (at rate 1, modelled) time later
    assert first_step_end - ended["end_s"] < 2 * rld.last_step_s + 0.005, (
        first_step_end - ended["end_s"],
        rld.last_step_s,
    )
    # and its reading of the transfer's messages was not late: the present stood until it read
    assert rld.clock.lags["handler"].largest < 0.002, list(rld.clock.lags["handler"])


def test_a_message_held_for_stands_time_still_until_read_or_its_cap(tmp_path: Path) -> None:
    """The sender's hold stands until the reader lets go of its message (and not for another
    message's let-go, stamped after the hold was posted), or, never read, until the cap."""
    SharedClock.create(tmp_path / "clock", rate=1.0)
    sender = ModelledClock.attach(tmp_path / "clock", "P0")
    reader = ModelledClock.attach(tmp_path / "clock", "RLD0")

    async def scenario() -> tuple[float, float, bool, float, float]:
        sender.hold_until_read()
        sent = sender.now()
        await asyncio.sleep(0.05)
        stood = reader.now() - sent  # the reader has not read it: time stood still
        let_go = reader.let_sender_go("P0", sent)
        await asyncio.sleep(0.05)
        went_on = reader.now() - sent
        sender.hold_until_read()  # never read
        capped_from = sender.now()
        assert not reader.let_sender_go("P0", sent)  # an earlier message's: not this hold's
        await asyncio.sleep(0.2)
        within_cap = reader.now() - capped_from
        await asyncio.sleep(0.1)  # the cap: INSTANT_HOLD_CAP_S, 0.25 s
        return stood, went_on, let_go, within_cap, reader.now() - capped_from

    try:
        stood, went_on, let_go, within_cap, after_cap = asyncio.run(scenario())
    finally:
        sender.close()
        reader.close()
    assert stood < 0.001 and let_go and went_on > 0.04
    assert within_cap < 0.001 and after_cap > 0.02


def test_a_kv_begin_that_queues_on_its_link_holds_from_its_turn(tmp_path: Path) -> None:
    """P's KV link to the relay (real TCP; the relay's end reads nothing for a while) is taken
    by another transfer's frame, which waits for the socket: a transfer's `kv_begin` queues
    behind it. Cut while it queues, it posts no hold for its reading (the present goes on, not
    standing until the hold's cap); a `kv_begin` that queued is stamped when the link took it,
    not when it queued (its wait behind the others is not its transit)."""
    SharedClock.create(tmp_path / "clock", rate=1.0)
    p = instance(PrefillInstance, "P", clock=str(tmp_path / "clock"))
    watch = ModelledClock.reading(tmp_path / "clock", p.spec.epoch)
    p.spec.peers["RLD0"] = Address("RLD0", "RLD", "127.0.0.1", 3, 4)
    p.transit = p._transits()
    assert p.exact("RLD0")
    accepted: list[asyncio.StreamReader] = []

    async def scenario() -> tuple[float, float, int, float]:
        async def accept(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
            accepted.append(reader)

        listener = socket.create_server(("127.0.0.1", 0))
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 10)
        server = await asyncio.start_server(accept, sock=listener)

        async def opened(_name: str, _purpose: str) -> Channel:
            reader, writer = await asyncio.open_connection(*listener.getsockname()[:2])
            channel = Channel(reader, writer, "RLD0", "kv")
            channel.stamp = p.clock.now
            return channel

        p.links = KvLinks(
            opened, p._serve_link, p._peers, spawn=p.spawn, clock=p.clock, open_within_s=2
        )
        channel = await p.links.acquire("RLD0")
        empty = KV.empty(p.model_config).tensor
        shape = (*empty.shape[:3], 8 << 10, empty.shape[4])  # MBs: far more than sockets hold
        frame = kv_chunk_from_tensor("other", 0, 0, torch.zeros(shape, dtype=empty.dtype))
        taking = p.spawn(channel.send(frame), "another transfer's frame")
        await asyncio.sleep(0.05)
        assert not taking.done()  # it holds the link, waiting for the socket

        def transfer(rid: str) -> Destination:
            kv, logits = p.model.prefill(PROMPT, None, len(PROMPT))
            job = PrefillJob(rid, PROMPT, meta(rid, 2), QuietFrontend(), kv=kv)
            job.first_token = greedy(logits)
            destination = Destination("RLD0", 0, {})
            destination.task = p.spawn(p.send(job, destination), f"KV of {rid}")
            job.destinations.append(destination)
            job.routed.set()
            p.jobs[rid] = job
            return destination

        cut = transfer("cut")
        await asyncio.sleep(0.02)  # its kv_begin queues for the link
        cut.task.cancel()
        await asyncio.sleep(0)
        before = watch.now()
        await asyncio.sleep(0.1)  # within a hold's cap (0.25 s) of the kv_begin's queueing
        went_on = watch.now() - before
        posted = p.clock.hold_counts()["instant"]["posted"]

        queued = transfer("queued")
        await asyncio.sleep(0.02)
        freed_at = p.clock.now()  # the relay reads from here: the link is free after it
        begin: dict[str, Any] = {}
        while not begin:
            message = await read_message(accepted[0])
            if isinstance(message, Control) and message.kind == "kv_begin":
                begin = message.body
        server.close()
        queued.task.cancel()
        return went_on, freed_at, posted, float(begin["t"])

    went_on, freed_at, posted, stamped = run_started([p], scenario)
    watch.close()
    assert posted == 0 and went_on > 0.05, (posted, went_on)
    assert stamped >= freed_at, (stamped, freed_at)
    assert p.errors == [], p.errors
