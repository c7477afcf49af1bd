"""KV transfers from P to a decode side share one persistent link (`KvLinks`), over real TCP
on the loopback: transfers interleave on it chunk by chunk, so a small one begun behind a
large one ends about as processor sharing would have it; one cut leaves the others; a link
that breaks ends every transfer on it at both ends; a transfer waiting for memory blocks
none of the others on its link."""

from __future__ import annotations

import asyncio
import gc
import socket
import time
import warnings
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from netem.clock import SharedClock
from pddemu.config import Config, load_config
from pddemu.model import greedy
from pddemu.roles.prefill import Destination, PrefillInstance, PrefillJob
from pddemu.roles.relay import RelayInstance
from pddemu.roles.spec import Address
from pddemu.roles.transfer import UNSENT_BYTES, KvLinks, LinkUnavailable
from pddemu.runtime.auth import RunSecret
from pddemu.runtime.channel import Channel, Envelope
from pddemu.runtime.clock import ModelledClock
from pddemu.wire import KVChunk
from tests.roles.in_process import instance, run_started

READ_LIMIT = 16 << 10  # the relay's reader buffers at most twice this ahead of its handler
RECEIVE_BUFFER = 32 << 10  # the relay's socket's (the window P may have in flight)


class Reports:
    """The frontend's end of P's control connection: the transfer reports it is told."""

    peer = "FE0"
    closed = False

    def __init__(self) -> None:
        self.done: dict[str, dict] = {}

    async def control(self, kind: str, body: dict) -> None:
        if kind == "transfer_done":
            self.done[body["rid"]] = body


class Link:
    """P and a relay, P's KV link to it a real TCP connection: the relay reads it as it reads
    any (`Instance._accept`), each chunk `chunk_s` wall seconds after the last (a bottleneck
    of one chunk per `chunk_s`), with little buffered ahead of its reading."""

    def __init__(self, chunk_s: float = 0.0, config: Config | None = None) -> None:
        self.p = instance(PrefillInstance, "P", config)
        self.rld = instance(RelayInstance, "RLD", config, epoch=self.p.spec.epoch)
        self.rld.use_secret(self.p.secret)
        self.chunk_s = chunk_s
        self.read: list[tuple[str, int, int]] = []  # frames the relay read: (rid, tokens, bytes)
        self.accepted: list[asyncio.StreamWriter] = []
        self.reports = Reports()
        self.jobs: dict[str, PrefillJob] = {}
        on_chunk = self.rld.on_kv_chunk

        async def slow_chunk(chunk: KVChunk, channel: Any, received: float | None = None) -> None:
            if self.chunk_s:
                await asyncio.sleep(self.chunk_s)
            self.read.append((chunk.request_id, chunk.token_end - chunk.token_start, chunk.nbytes))
            await on_chunk(chunk, channel, received)

        self.rld.on_kv_chunk = slow_chunk

    async def open(self, listener: socket.socket | None = None) -> asyncio.Server:
        """The relay serving its KV links (on `listener`, if it is already listening)."""

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.accepted.append(writer)
            await self.rld._accept(reader, writer)

        listener = listener or self.listen()
        return await asyncio.start_server(accept, sock=listener, limit=READ_LIMIT)

    def listen(self, backlog: int = 128) -> socket.socket:
        """The relay's listening socket, known to P (not accepting until `open`)."""
        listener = socket.create_server(("127.0.0.1", 0), backlog=backlog)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        port = listener.getsockname()[1]
        self.p.spec.peers["RLD0"] = Address("RLD0", "RLD", "127.0.0.1", port, 0)
        return listener

    async def send(self, rid: str, chunks: int, computed: int | None = None) -> PrefillJob:
        """A transfer of a prompt of `chunks` chunks to the relay, `computed` of them (all by
        default) computed already."""
        p = self.p
        prompt = [1 + (i * 7 + len(rid)) % 200 for i in range(chunks * p.chunk_genuine)]
        kv, logits = p.model.prefill(prompt, None, len(prompt))
        meta = {
            "input_tokens": 32 * len(prompt),
            "output_tokens": 2,
            "predicted_output_tokens": 2,
            "pipeline": "P-RLD-MD",
            "frontend": "FE0",
            "md": "MD0",
        }
        job = PrefillJob(rid, prompt, meta, self.reports, kv=kv, first_token=greedy(logits))
        done = chunks if computed is None else computed
        await job.progress.advance(done * p.chunk_genuine, 0.0, finished=done == chunks)
        destination = Destination("RLD0", 0, {})
        destination.task = p.spawn(p.send(job, destination), f"KV of {rid}")
        job.destinations.append(destination)
        job.routed.set()
        p.jobs[rid] = job
        self.jobs[rid] = job
        return job

    def chunks_read(self, rid: str) -> float:
        """Prefill chunks' worth of `rid`'s KV the relay read (P sends them in slices)."""
        return sum(tokens for read, tokens, _ in self.read if read == rid) / self.p.chunk_genuine

    def bytes_read(self, rid: str) -> int:
        return sum(size for read, _, size in self.read if read == rid)


async def until(condition: Callable[[], bool], what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.002)


def run(link: Link, scenario: Callable[[], Awaitable[Any]]) -> Any:
    async def served() -> Any:
        server = await link.open()
        try:
            return await scenario()
        finally:
            server.close()

    return run_started([link.p, link.rld], served)


def test_transfers_share_one_link_interleaved_and_a_cut_leaves_the_others() -> None:
    """Three transfers to one relay ride one connection, their chunks interleaved; one cut
    mid-way (P says `kv_cut`) is released at the relay and reported cut, while the other two
    arrive whole and decode."""
    link = Link(chunk_s=0.01)

    async def scenario() -> None:
        await link.send("r1", 4)
        await link.send("r2", 4, computed=1)  # its other chunks never come: it is cut
        await link.send("r3", 4)
        await until(lambda: link.chunks_read("r2") == 1, "r2's first chunk read")
        await link.p.on_cut(Envelope("cut", {"rid": "r2", "destination": "RLD0"}, [], None))
        await until(lambda: len(link.reports.done) == 3, "every transfer reported")
        await until(lambda: link.rld.kv_reserved == 0, "the relay's memory back")

    run(link, scenario)
    rld, done = link.rld, link.reports.done
    assert len(link.accepted) == 1  # one connection for the three
    assert not done["r1"]["cancelled"] and not done["r3"]["cancelled"]
    assert done["r2"]["cancelled"] and not done["r2"]["unreachable"]
    assert (link.chunks_read("r1"), link.chunks_read("r2"), link.chunks_read("r3")) == (4, 1, 4)
    order = [rid for rid, _, _ in link.read]
    last = {rid: len(order) - 1 - order[::-1].index(rid) for rid in ("r1", "r3")}
    assert order.index("r3") < last["r1"] and order.index("r1") < last["r3"], order  # shared
    assert link.p.slice_genuine < link.p.chunk_genuine  # in slices of chunks
    assert rld.transfers_cut == 1 and rld.receiving == {} and not rld.admitting
    told = {body["rid"] for name, kind, body in rld.told if kind == "tokens"}
    assert told == {"r1", "r3"}  # both decoded on the relay, the cut one not
    assert link.p.transfers_cut == 1 and link.p.errors == [] and rld.errors == []


def test_a_small_transfer_behind_a_large_one_gets_its_fair_share() -> None:
    """A large transfer (LARGE chunks) fills the link (the relay reads a frame per 5 ms); a
    small one (SMALL chunks) begins behind it. Shared frame by frame, as two flows share a
    bottleneck (processor sharing), the small one ends after its own bytes and as many of the
    large one's, plus what was queued ahead of its `kv_begin` and, a round trip later, of its
    first frame, once admitted (each at most what the link's buffers hold: P's unsent bound
    twice, the relay's window and its reader's buffer, and the frame being written); one
    behind the other (FIFO), after all the large one's. Measured in bytes read (at a
    bottleneck of constant rate, its time)."""
    large, small = 8, 1
    link = Link(chunk_s=0.005)
    marks: dict[str, int] = {}

    async def scenario() -> None:
        await link.send("large", large)
        await until(lambda: link.chunks_read("large") >= 1, "the large one under way")
        marks["before"] = link.bytes_read("large")
        await link.send("small", small)
        await until(lambda: link.chunks_read("small") == small, "the small one read", 30)
        marks["during"] = link.bytes_read("large") - marks["before"]
        await until(lambda: "large" in link.reports.done, "the large one's end", 30)

    run(link, scenario)
    frame = max(size for _, _, size in link.read)
    buffered = 2 * UNSENT_BYTES + 2 * RECEIVE_BUFFER + 2 * READ_LIMIT  # the kernel doubles it
    fair = link.bytes_read("small") + 2 * (buffered + frame)  # large bytes till the small's end
    assert marks["during"] <= fair, (marks, fair)
    left = link.bytes_read("large") - marks["before"]
    assert marks["during"] < left / 2  # not behind all the large one's (FIFO)
    assert not link.reports.done["large"]["cancelled"] and link.p.errors == []


def test_a_broken_link_ends_every_transfer_on_it_at_both_ends() -> None:
    """The link breaks (the relay's end closes it) with two transfers under way: the relay
    releases both, P reports both unreachable; a transfer after opens a new link."""
    link = Link()

    async def scenario() -> None:
        one = await link.send("r1", 3, computed=1)
        two = await link.send("r2", 3, computed=1)
        await until(lambda: len(link.rld.receiving) == 2, "both admitted")
        await until(lambda: link.chunks_read("r1") == link.chunks_read("r2") == 1, "read")
        link.accepted[0].close()
        await until(lambda: link.rld.transfers_cut == 2, "both cut at the relay")
        for job in (one, two):
            await job.progress.advance(3 * link.p.chunk_genuine, 0.0, finished=True)
        await until(lambda: len(link.reports.done) == 2, "both reported")
        await link.send("r3", 2)
        await until(lambda: "r3" in link.reports.done, "a transfer on a new link")
        await until(lambda: link.rld.kv_reserved == 0, "the relay's memory back")

    run(link, scenario)
    done = link.reports.done
    assert all(done[rid]["cancelled"] and done[rid]["unreachable"] for rid in ("r1", "r2"))
    assert not done["r3"]["cancelled"] and len(link.accepted) == 2
    assert link.p.transfers_cut == 2 and link.rld.receiving == {}


def test_a_transfer_waiting_for_memory_blocks_none_on_its_link() -> None:
    """The relay's memory is nearly full: a transfer that does not fit waits for it (no
    chunk of it is sent before `kv_admitted`) while a small one behind it on the same link
    is admitted, read and taken in; once memory is freed the first goes on."""
    link = Link()
    rld = link.rld

    async def scenario() -> None:
        capacity = rld.cost.kv_capacity_tokens()
        small_need = 32 * 1 * link.p.chunk_genuine + 2
        filler = await rld.reserve_tokens(capacity - small_need)
        await link.send("big", 3)
        await until(lambda: "big" in rld.admitting, "the big one waiting for memory")
        await link.send("small", 1)
        await until(lambda: "small" in link.reports.done, "the small one's end")
        await until(lambda: "small" in rld.requests or rld.kv_reserved == filler, "taken in")
        assert link.chunks_read("big") == 0 and "big" in rld.admitting
        await rld.release_tokens(filler)
        await until(lambda: "big" in link.reports.done, "the big one's end")
        await until(lambda: rld.kv_reserved == 0, "the relay's memory back")

    run(link, scenario)
    assert [rid for rid, _, _ in link.read][0] == "small"
    assert link.chunks_read("big") == 3 and not link.reports.done["big"]["cancelled"]
    assert rld.admission_waits == 1 and rld.transfers_cut == 0 and len(link.accepted) == 1
    assert link.p.errors == [] and rld.errors == []


def test_a_transfer_the_receiver_refuses_ends_and_the_link_goes_on() -> None:
    """A `kv_begin` the relay cannot admit (sent from an offset of a prefix it does not hold)
    is refused (`kv_refused`): P reports it cut, not unreachable, instead of waiting for ever
    for its admission; the link stays up and the next transfer on it completes."""
    link = Link()

    async def scenario() -> None:
        job = await link.send("ok", 1)
        await until(lambda: "ok" in link.reports.done, "the first transfer's end")
        assert not link.reports.done.pop("ok")["cancelled"]
        refused = Destination("RLD0", 1, {})  # the relay holds no prefix: it must refuse
        refused.task = link.p.spawn(link.p.send(job, refused), "a refused transfer")
        job.destinations.append(refused)
        await until(lambda: refused.task.done(), "the refused transfer's end", seconds=10)
        await link.send("after", 1)
        await until(lambda: "after" in link.reports.done, "a transfer after it")
        await until(lambda: link.rld.kv_reserved == 0, "the relay's memory back")

    run(link, scenario)
    done = link.reports.done
    assert done["ok"]["cancelled"] and not done["ok"]["unreachable"]  # the refused one's
    assert not done["after"]["cancelled"]
    assert len(link.accepted) == 1  # the same link throughout
    assert link.p.transfers_cut == 1 and link.p.links._admissions[link.p._peers["RLD0 (kv)"]] == {}
    assert any("holds no prefix" in error for error in link.rld.errors)


def spawn(coroutine: Coroutine[Any, Any, Any], _what: str) -> asyncio.Task:
    """A task as an instance's `spawn` makes one, for links without an instance."""
    return asyncio.ensure_future(coroutine)


def test_transfers_waiting_for_a_link_share_one_bounded_attempt() -> None:
    """The relay does not answer a connect (its listener's queue is full: the kernel drops the
    SYNs, as for a destination gone silent). Three transfers that need the link wait for ONE
    attempt, bounded by `faults.down_after` (0.5 modelled s here, in real time), and are all
    reported unreachable with its cause at once, one bound after they began: not the k-th
    after k attempts, nor never (a connect without a bound waits for the kernel's SYN
    retries, minutes). Once the relay answers, the next transfer opens the link."""
    config = load_config()
    faults = config.faults.model_copy(update={"suspect_after_s": 0.3, "down_after_s": 0.5})
    link = Link(config=config.model_copy(update={"faults": faults}))

    async def scenario() -> None:
        listener = link.listen(backlog=0)
        queued = socket.create_connection(listener.getsockname()[:2])  # fills its queue
        for rid in ("r1", "r2", "r3"):
            await link.send(rid, 1)
        await until(lambda: len(link.reports.done) == 3, "every transfer reported", 10)
        server = await link.open(listener)
        try:
            await link.send("r4", 1)
            await until(lambda: "r4" in link.reports.done, "a transfer once it answers")
        finally:
            server.close()
            queued.close()

    run_started([link.p, link.rld], scenario)
    done = link.reports.done
    for rid in ("r1", "r2", "r3"):
        assert done[rid]["cancelled"] and done[rid]["unreachable"] and done[rid]["silent"]
        assert "not done within 0.5 modelled seconds" in done[rid]["cause"], done[rid]
    ended = [done[rid]["ended"] for rid in ("r1", "r2", "r3")]
    assert max(ended) - min(ended) < 0.05, ended  # one attempt's outcome, shared
    assert 0.5 <= done["r1"]["ended"] - done["r1"]["started"] < 0.9  # one bound (modelled)
    assert not done["r4"]["cancelled"] and len(link.accepted) == 2  # the queued one, the link
    assert link.p.links.open_attempts == 2 and link.p.stats()["kv_link_opens"] == 2
    assert link.p.transfers_cut == 3 and link.p.errors == []


def test_a_stale_reply_or_cut_for_a_reused_rid_resolves_no_newer_transfer() -> None:
    """A request's id is reused on a link (a retry): transfer 1 of "r" waits for memory and is
    cut, transfer 2 of "r" begins on the same link and waits too. The relay's `kv_admitted`
    and `kv_refused` for transfer 1 (still on their way when it was cut) reach P: they are
    stale (counted), and transfer 2 sends nothing until its own admission; at the relay, a
    `kv_cut` for transfer 1 read after transfer 2 began (P's cut queued behind it) cuts
    nothing. Transfer 2 then completes. On the code before, keyed by rid alone, the stale
    admission let transfer 2's chunks go before the relay had admitted it, and the stale cut
    ended it."""
    link = Link()
    rld = link.rld

    async def scenario() -> None:
        capacity = rld.cost.kv_capacity_tokens()
        filler = await rld.reserve_tokens(capacity - 1)
        first = await link.send("r", 1)
        await until(lambda: "r" in rld.admitting, "transfer 1 waiting for memory")
        await link.p.on_cut(Envelope("cut", {"rid": "r", "destination": "RLD0"}, [], None))
        await until(lambda: "r" in link.reports.done, "transfer 1 reported cut")
        await until(lambda: "r" not in rld.admitting, "transfer 1 released at the relay")
        assert first.destinations[0].task.done()
        link.reports.done.clear()
        await link.send("r", 1)
        await until(lambda: "r" in rld.admitting, "transfer 2 waiting for memory")
        p_end = link.p._peers["RLD0 (kv)"]
        for kind, extra in (("kv_admitted", {}), ("kv_refused", {"reason": "old"})):
            stale = Envelope(kind, {"rid": "r", "seq": 1, **extra}, [], p_end)
            await link.p._dispatch(stale, p_end)
        relay_end = rld.admissions["r"].message.channel
        await rld._dispatch(Envelope("kv_cut", {"rid": "r", "seq": 1}, [], relay_end), relay_end)
        await asyncio.sleep(0.1)
        assert link.chunks_read("r") == 0 and "r" in rld.admitting and not link.reports.done
        await rld.release_tokens(filler)
        await until(lambda: "r" in link.reports.done, "transfer 2's end")
        await until(lambda: rld.kv_reserved == 0, "the relay's memory back")

    run(link, scenario)
    assert not link.reports.done["r"]["cancelled"] and link.chunks_read("r") == 1
    assert link.p.links.stale_replies == 2 and link.p.stats()["kv_link_stale_replies"] == 2
    assert rld.stale_link_messages == 1 and rld.stats()["kv_link_stale_messages"] == 1
    assert rld.transfers_cut == 1 and len(link.accepted) == 1
    assert link.p.errors == [] and rld.errors == []


def test_a_link_that_cannot_open_for_any_reason_is_unavailable(tmp_path: Path) -> None:
    """A destination the sender does not know (`Instance.address` raises ValueError), not
    only a refused connect: its transfers are reported unreachable, not left unanswered."""
    shared = SharedClock.create(tmp_path / "clock", rate=1.0, ceiling=100.0)
    clock = ModelledClock(shared, shared.claim("P0"))

    async def unknown(destination: str, _kind: str) -> Channel:
        raise ValueError(f"unknown peer {destination}")

    async def scenario() -> None:
        links = KvLinks(unknown, lambda _channel: None, spawn=spawn, clock=clock, open_within_s=0.5)
        with pytest.raises(LinkUnavailable, match="could not open: unknown peer MD9") as caught:
            await links.acquire("MD9")
        assert not caught.value.silent

    asyncio.run(scenario())


def test_a_link_opened_as_its_attempt_is_cancelled_is_closed(tmp_path: Path) -> None:
    """The connect completes in the turn its attempt is cancelled (the instance stopping):
    the attempt cannot hand the link over, and closes it; it is in no instance's `links`,
    so nothing else would. On the code before, it was dropped open (the garbage collector's
    to close, with a ResourceWarning; the far end open until then)."""
    shared = SharedClock.create(tmp_path / "clock", rate=1.0, ceiling=100.0)
    clock = ModelledClock(shared, shared.claim("P0"))

    async def scenario() -> None:
        accepted: asyncio.Queue[asyncio.StreamReader] = asyncio.Queue()
        writers: list[asyncio.StreamWriter] = []

        async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)  # kept open: only P's end may close it
            await accepted.put(reader)

        server = await asyncio.start_server(peer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        async def connect(destination: str, purpose: str) -> Channel:
            channel = await Channel.connect(
                "127.0.0.1", port, "P0", destination, purpose, RunSecret.new()
            )
            links._opening[destination].cancel()  # as the instance's end does
            return channel

        links = KvLinks(connect, lambda _channel: None, spawn=spawn, clock=clock, open_within_s=0.5)
        async with server:
            with pytest.raises(asyncio.CancelledError):
                await links.acquire("MD0")
            reader = await accepted.get()
            try:  # the hello, then the close: not silence
                await asyncio.wait_for(reader.read(), 2.0)
            finally:
                for writer in writers:
                    writer.close()

    gc.collect()  # earlier tests' garbage: its warnings are not this test's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.run(scenario())
        gc.collect()
    assert not [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def test_the_instances_stop_ends_a_links_attempt_under_way() -> None:
    """P stops (`end_tasks`) while a link's connect is under way: the attempt ends with it,
    its connect cancelled, as every task of the instance's is; none opens a link after P
    closed its connections. On the code before, the attempt was no task of P's: it went on
    after the stop (and its bound's timer read the clock after its page was closed)."""
    p = instance(PrefillInstance, "P")

    async def scenario() -> tuple[list[str], bool]:
        connecting = asyncio.Event()
        ended: list[str] = []

        async def connect(destination: str, _purpose: str) -> Channel:
            connecting.set()
            try:
                await asyncio.sleep(3600)  # a connect the destination does not answer
            except asyncio.CancelledError:
                ended.append(destination)
                raise
            raise AssertionError("never answered")

        p.links = KvLinks(
            connect, p._serve_link, p._peers, spawn=p.spawn, clock=p.clock, open_within_s=2
        )
        p.spawn(p.links.acquire("MD0"), "a transfer")
        await connecting.wait()
        await p.end_tasks()
        await asyncio.sleep(0.01)  # its connect's own end (`ModelledClock.within` cancels it)
        return list(ended), any(not task.done() for task in p._tasks)

    assert asyncio.run(scenario()) == (["MD0"], False)
    assert p.errors == []


def test_no_link_opens_once_the_sender_stopped(tmp_path: Path) -> None:
    """A connect that completes after the sender began to close its connections
    (`KvLinks.close`, at P's stop) is closed at once and never becomes a link: none is
    added to the connections the stop already closed."""
    shared = SharedClock.create(tmp_path / "clock", rate=1.0, ceiling=100.0)
    clock = ModelledClock(shared, shared.claim("P0"))

    async def scenario() -> dict[str, Channel]:
        accepted: asyncio.Queue[asyncio.StreamReader] = asyncio.Queue()
        writers: list[asyncio.StreamWriter] = []

        async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            await accepted.put(reader)

        server = await asyncio.start_server(peer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        async def connect(destination: str, purpose: str) -> Channel:
            return await Channel.connect(
                "127.0.0.1", port, "P0", destination, purpose, RunSecret.new()
            )

        kept: dict[str, Channel] = {}
        links = KvLinks(
            connect, lambda _channel: None, kept, spawn=spawn, clock=clock, open_within_s=0.5
        )
        links.close()
        async with server:
            with pytest.raises(LinkUnavailable, match="the sender stopped"):
                await links.acquire("MD0")
            reader = await accepted.get()
            try:  # the hello, then the close
                await asyncio.wait_for(reader.read(), 2.0)
            finally:
                for writer in writers:
                    writer.close()
        return kept

    gc.collect()  # earlier tests' garbage: its warnings are not this test's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        assert asyncio.run(scenario()) == {}
        gc.collect()
    assert not [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
