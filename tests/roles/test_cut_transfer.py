"""A KV transfer cut mid-way (its sender died, or cancelled it) is cleaned up on the receiving
side: its memory is released, it is counted, and what arrived of the prompt stays in MD's DRC.
On the sending side, every transfer that could not finish is counted and reported."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from netem.clock import SharedClock
from pddemu.config import load_config
from pddemu.metrics.records import RequestRecord
from pddemu.roles.decode import DecodeRequest
from pddemu.roles.frontend import Flight, Frontend
from pddemu.roles.main_decode import MainDecodeInstance
from pddemu.roles.prefill import Destination, PrefillInstance, PrefillJob
from pddemu.roles.relay import RelayInstance
from pddemu.roles.spec import Address
from pddemu.roles.transfer import KvLinks
from pddemu.runtime.channel import Envelope
from pddemu.runtime.clock import ModelledClock
from pddemu.runtime.liveness import Liveness
from pddemu.wire import TokenIds
from pddemu.wire.tensors import kv_chunk_from_tensor
from tests.roles.in_process import WireEnd, instance, match_naming_every_page, wire


class Connection:
    """Stands for a connection: its identity, its peer and the replies sent on it."""

    peer = "P0"
    closed = False

    def __init__(self) -> None:
        self.replies: list[tuple[str, dict]] = []

    async def control(
        self, kind: str, body: dict, handed: Callable[[], None] | None = None
    ) -> None:
        self.replies.append((kind, body))
        if handed is not None:  # written at once
            handed()


def test_a_transfer_cut_mid_way_is_released_counted_and_its_prefix_kept() -> None:
    async def scenario() -> tuple[MainDecodeInstance, int]:
        md = instance(MainDecodeInstance, "MD")
        page = md.page_tokens
        prompt = list(range(1, 4 * page + 1))
        connection = Connection()
        ids = [TokenIds.from_ints("r1", 0, prompt)]
        await md.on_match(match_naming_every_page(md, "r1", prompt, Connection()))
        meta = {"input_tokens": 4096, "output_tokens": 512, "predicted_output_tokens": 300}
        begin = {"rid": "r1", "prompt_tokens": len(prompt), "offset": 0, "meta": meta}
        await md.on_kv_begin(Envelope("kv_begin", begin, ids, connection))
        reserved = md.kv_reserved
        kv, _ = md.model.prefill(prompt[: 2 * page], None, 2 * page)
        await md.on_kv_chunk(kv_chunk_from_tensor("r1", 0, 0, kv.tensor), connection)
        md.channel_closed(connection)  # the sender is gone before its kv_end
        await asyncio.sleep(0.05)  # the release runs beside
        return md, reserved

    md, reserved = asyncio.run(scenario())
    assert reserved == 4096 + 300  # the prompt and the predicted output, not the true one
    assert md.kv_reserved == 0 and md.receiving == {} and md.transfers_cut == 1
    assert md.stats()["transfers_cut"] == 1
    hit, _node, _handles = md.store.match(list(range(1, 4 * md.page_tokens + 1)))
    assert hit == 2 * md.page_tokens  # the pages that arrived stay in the DRC


class Receiver:
    """A sender's end of a KV link: it admits each transfer at once (`kv_admitted`); `fail_at`
    chunks go through, the next one finds the receiver gone (None: all go through)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.chunks = 0
        self.closed = False
        self.controls: list[str] = []
        self.writer = self  # no socket to read TCP counters from
        self.peer = "MD"
        self.links: KvLinks | None = None  # whose transfers it admits

    def get_extra_info(self, _name: str) -> None:
        return None

    async def control(
        self,
        kind: str,
        body: dict,
        *_attachments: object,
        handed: Callable[[], None] | None = None,
        on_turn: Callable[[], None] | None = None,
    ) -> None:
        if on_turn is not None:
            on_turn()
        self.controls.append(kind)
        if handed is not None:
            handed()
        if kind == "kv_begin" and self.links is not None:
            self.links.admitted(self, body["seq"])

    async def send(self, chunk: object, handed: Callable[[], None] | None = None) -> int:
        if self.fail_at is not None and self.chunks >= self.fail_at:
            raise ConnectionResetError("the receiver is gone")
        if handed is not None:
            handed()
        self.chunks += 1
        return 1000

    def close(self) -> None:
        self.closed = True


def links_to(
    open_channel: Callable[[str, str], Awaitable[Receiver]], p: PrefillInstance
) -> KvLinks:
    """`p`'s KV links to fake receivers, which admit each transfer at once (opened within the
    default bound, `faults.down_after`)."""

    async def opened(name: str, purpose: str) -> Receiver:
        receiver = await open_channel(name, purpose)
        receiver.links = links
        return receiver

    bound = load_config().faults.down_after_s
    links = KvLinks(
        opened, lambda _channel: None, spawn=p.spawn, clock=p.clock, open_within_s=bound
    )
    return links


def test_the_sender_counts_each_transfer_it_could_not_finish() -> None:
    """P counts a send cut by the frontend, one whose receiver died mid-way and one whose
    receiver could not be reached, and reports each to the frontend as cancelled (the last
    two as unreachable); a finished send is not counted."""

    async def scenario() -> tuple[PrefillInstance, dict, Connection]:
        p = instance(PrefillInstance, "P")
        step = p.chunk_genuine
        frames = step // p.slice_genuine  # a chunk's: P sends it in slices
        receivers = {"MD0": Receiver(), "MD1": Receiver(fail_at=frames), "MD2": Receiver()}

        async def open_channel(name: str, _purpose: str) -> Receiver:
            if name == "MD3":
                raise ConnectionRefusedError("nobody listens")
            return receivers[name]

        p.links = links_to(open_channel, p)
        for name in receivers:
            p.spec.peers[name] = Address(name, "MD", "127.0.0.1", 3, 4)
        frontend = Connection()
        frontend.closed = False
        prompt = [1 + i % 200 for i in range(3 * step)]
        kv, logits = p.model.prefill(prompt, None, len(prompt))
        job = PrefillJob("r1", prompt, {}, frontend, kv=kv, first_token=1)
        await job.progress.advance(2 * step, 0.0)  # two chunks computed, the third not yet
        for name in ("MD0", "MD1", "MD2", "MD3"):
            destination = Destination(name, 0, {})
            destination.task = p.spawn(p.send(job, destination), name)
            job.destinations.append(destination)
        p.jobs["r1"] = job
        await asyncio.sleep(0.05)  # MD1's second chunk failed, MD3 refused; MD0, MD2 wait
        await p.on_cut(Envelope("cut", {"rid": "r1", "destination": "MD2"}, [], None))
        await asyncio.sleep(0.01)
        await job.progress.advance(3 * step, 0.0, finished=True)  # MD0's transfer completes
        await asyncio.sleep(0.05)
        return p, receivers, frontend

    p, receivers, frontend = asyncio.run(scenario())
    reports = {body["destination"]: body for kind, body in frontend.replies}
    assert {kind for kind, _ in frontend.replies} == {"transfer_done"}
    assert (
        reports["MD0"]["cancelled"] is False
        and reports["MD0"]["tokens_sent"] == 3 * p.chunk_genuine
    )
    assert receivers["MD0"].controls == ["kv_begin", "kv_end"]
    assert reports["MD1"]["cancelled"] and reports["MD1"]["unreachable"]
    assert reports["MD1"]["tokens_sent"] == p.chunk_genuine and receivers["MD1"].closed
    assert reports["MD2"]["cancelled"] and not reports["MD2"]["unreachable"]
    assert reports["MD2"]["tokens_sent"] == 2 * p.chunk_genuine
    # the cut one's link goes on: the receiver is told (`kv_cut`); the broken one is closed
    assert receivers["MD2"].controls == ["kv_begin", "kv_cut"] and not receivers["MD2"].closed
    assert reports["MD3"]["cancelled"] and reports["MD3"]["unreachable"]
    assert "nobody listens" in reports["MD3"]["cause"] and not reports["MD3"]["silent"]
    assert p.transfers_cut == 3 and p.stats()["transfers_cut"] == 3


def test_a_cut_while_the_connection_opens_is_reported() -> None:
    """A cut that reaches P while its sender is still opening the KV connection (a first
    transfer across the WAN) is reported to the frontend as cancelled: before, the cancel
    escaped the connection's opening unreported, and the frontend waited for the report to
    the request's timeout."""

    async def scenario() -> tuple[PrefillInstance, Connection]:
        p = instance(PrefillInstance, "P")
        opening = asyncio.Event()

        async def never_opens(_name: str, _purpose: str) -> Receiver:
            opening.set()
            await asyncio.sleep(3600)
            raise AssertionError("the connection never opens")

        p.links = links_to(never_opens, p)
        p.spec.peers["MD0"] = Address("MD0", "MD", "127.0.0.1", 3, 4)
        frontend = Connection()
        frontend.closed = False
        prompt = [1 + i % 200 for i in range(p.chunk_genuine)]
        kv, _ = p.model.prefill(prompt, None, len(prompt))
        job = PrefillJob("r1", prompt, {}, frontend, kv=kv, first_token=1)
        destination = Destination("MD0", 0, {})
        destination.task = p.spawn(p.send(job, destination), "MD0")
        job.destinations.append(destination)
        p.jobs["r1"] = job
        await opening.wait()
        await p.on_cut(Envelope("cut", {"rid": "r1", "destination": "MD0"}, [], None))
        await asyncio.sleep(0.02)
        return p, frontend

    p, frontend = asyncio.run(scenario())
    assert [kind for kind, _ in frontend.replies] == ["transfer_done"]
    report = frontend.replies[0][1]
    assert report["cancelled"] and not report["unreachable"] and report["tokens_sent"] == 0
    assert p.transfers_cut == 1


def test_a_cut_is_reported_as_of_its_date_not_its_reading() -> None:
    """The anomaly filter's cut says when it was decided (`at`): what P handed over after that
    (here a chunk sent while the cut was on its way) counts as not sent, so the WAN bytes and
    the tokens cut off do not depend on when the router got round to sending it."""

    async def scenario() -> tuple[PrefillInstance, dict, float, float]:
        p = instance(PrefillInstance, "P")
        step = p.chunk_genuine
        receiver = Receiver()
        p.links = links_to(lambda _name, _purpose: _opened(receiver), p)
        p.spec.peers["MD0"] = Address("MD0", "MD", "127.0.0.1", 3, 4)
        frontend = Connection()
        frontend.closed = False
        prompt = [1 + i % 200 for i in range(3 * step)]
        kv, _ = p.model.prefill(prompt, None, len(prompt))
        job = PrefillJob("r1", prompt, {}, frontend, kv=kv, first_token=1)
        await job.progress.advance(step, 0.0)
        destination = Destination("MD0", 0, {})
        destination.task = p.spawn(p.send(job, destination), "MD0")
        job.destinations.append(destination)
        p.jobs["r1"] = job
        frames = step // p.slice_genuine  # a chunk's: P sends it in slices
        await _until(lambda: receiver.chunks == frames)  # the first chunk is handed over
        decided = p.clock.now()
        await asyncio.sleep(0.02)
        await job.progress.advance(2 * step, 0.0)  # the second leaves after the decision
        await _until(lambda: receiver.chunks == 2 * frames)
        await p.on_cut(Envelope("cut", {"rid": "r1", "destination": "MD0", "at": decided}, []))
        await _until(lambda: bool(frontend.replies))
        return p, frontend.replies[-1][1], decided, receiver.chunks

    p, report, decided, chunks = asyncio.run(scenario())
    frames = p.chunk_genuine // p.slice_genuine  # a chunk's: P sends it in slices
    assert chunks == 2 * frames  # both crossed, the second after the decision
    assert report["cancelled"] and report["tokens_sent"] == p.chunk_genuine
    assert report["bytes"] == 1000 * frames  # the first chunk's Receiver frames
    assert report["started"] <= report["ended"] == decided


async def _opened(receiver: Receiver) -> Receiver:
    return receiver


async def _until(condition: Callable[[], bool]) -> None:
    """Wait for what the sender does in its own tasks, however late the host runs them: a
    fixed sleep let a busy host's test read the clock before the first chunk was handed."""
    deadline = asyncio.get_running_loop().time() + 5
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "never happened"
        await asyncio.sleep(0.001)


class Released:
    """MD as the end of a request sees it: the releases it is told."""

    def __init__(self) -> None:
        self.released: list[dict] = []

    async def on_release(self, message: Envelope) -> None:
        self.released.append(message.body)


CHUNK_EVERY_S = 0.02  # modelled: P computes a chunk of the prompt this often
RELAY_ENDS_AT_S = 0.01  # modelled: the relay's last token, between P's first and second chunk


def _relay_ends_a_request_during_ps_transfer(
    tmp_path: Path, frontend_late_s: float
) -> tuple[RequestRecord, int, list[tuple[dict, float]]]:
    """One P-RLD-MD request on a shared clock (rate 1): P streams its prompt's KV to MD0 as
    each of 3 chunks is computed, one every CHUNK_EVERY_S; the relay finishes the request
    (its one token) at RELAY_ENDS_AT_S, while the transfer is under way; the frontend reads
    the relay's messages `frontend_late_s` of wall time after they are sent. Returns the
    request's record, the chunks MD0 received, and each release MD0 was told with how long
    after the relay's last token (modelled) it was sent."""
    page = tmp_path / f"clock-{frontend_late_s}"
    SharedClock.create(page, rate=1.0, ceiling=1.0)

    async def scenario() -> tuple[RequestRecord, int, list[tuple[dict, float]]]:
        p = instance(PrefillInstance, "P", clock=str(page))
        fe = instance(Frontend, "FE", clock=str(page))
        rld = instance(RelayInstance, "RLD", clock=str(page))
        md = Released()
        for one, other in ((fe, p), (fe, rld)):  # one host: no modelled time between them
            one.transit[other.name] = other.transit[one.name] = (0.0, True)
        wire({"P0": p, "FE0": fe, "RLD0": rld, "MD0": md}, {("RLD0", "FE0"): frontend_late_s})
        receiver = Receiver()
        p.links = links_to(lambda _name, _purpose: _opened(receiver), p)
        p.spec.peers["MD0"] = Address("MD0", "MD", "127.0.0.1", 3, 4)
        step = p.chunk_genuine
        scale = fe.config.scale.token_scale
        prompt = [1 + i % 200 for i in range(3 * step)]

        record = RequestRecord(
            request_id="r1",
            system="pdd",
            arrival_s=0.0,
            input_tokens=len(prompt) * scale,
            expected_output_tokens=1,
            pipeline="P-RLD-MD",
        )
        flight = Flight(record, prompt, None, p="P0", decode="MD0", rld="RLD0")
        flight.transfers = {"MD0"}
        fe.flights["r1"] = flight
        fe.new_leg(flight, "r1")
        fe.route = lambda routed: routed.done.wait()  # routed already: wait for its tokens
        serving = asyncio.ensure_future(fe.serve_flight(flight))

        kv, _ = p.model.prefill(prompt, None, len(prompt))
        job = PrefillJob("r1", prompt, {}, WireEnd("FE0", p.tell), kv=kv, first_token=1)
        job.routed.set()
        p.jobs["r1"] = job
        destination = Destination("MD0", 0, {})
        destination.task = p.spawn(p.send(job, destination), "MD0")
        job.destinations.append(destination)
        # The relay's last token is due at RELAY_ENDS_AT_S: the clock is held there until the
        # relay has posted its own hold, so however late the host wakes the relay (the clock
        # runs at the wall's rate) P's second chunk, due at CHUNK_EVERY_S, cannot come first.
        schedule = ModelledClock.attach(page, "relay's schedule")
        start = p.clock.now()
        with schedule.holding(start + RELAY_ENDS_AT_S):

            async def compute() -> None:
                for chunk in (1, 2, 3):
                    await p.clock.sleep_until(start + CHUNK_EVERY_S * (chunk - 1))
                    await job.progress.advance(chunk * step, p.clock.now(), finished=chunk == 3)

            computing = p.spawn(compute(), "prefill")
            await rld.clock.sleep_until(start + RELAY_ENDS_AT_S)
            meta = {"pipeline": "P-RLD-MD", "frontend": "FE0", "md": "MD0", "output_tokens": 1}
            ended = DecodeRequest("r1", meta, kv, len(prompt))
            body = {"rid": "r1", "index": 0, "id": 5, "first": 0, "source": "RLD0", "role": "RLD"}
            end = rld.clock.now()
            assert end == pytest.approx(start + RELAY_ENDS_AT_S)
            sending = asyncio.ensure_future(rld.send_tokens(ended, {**body, "times": [end]}))
            await asyncio.sleep(0)  # the relay's hold is posted before its send's first wait
            assert "r1" in rld.ends_held
        schedule.close()  # from here only the relay's hold stands for the frontend's lateness
        await sending
        await asyncio.wait_for(serving, 5.0)
        await asyncio.wait_for(computing, 5.0)
        for made in (p, fe, rld):
            made.clock.close()
        released = [
            ({"rid": b["rid"], "kv_expected": b["kv_expected"]}, b["t"] - end) for b in md.released
        ]
        return record, receiver.chunks * p.slice_genuine // step, released  # in chunks

    return asyncio.run(scenario())


def test_the_frontends_lateness_in_reading_the_relays_end_moves_no_cut(tmp_path: Path) -> None:
    """The relay that finishes a request while P's KV transfer to MD is still under way holds
    the clock at its last token until the frontend has settled the request: the anomaly
    filter's cut reaches P at its date however late the frontend reads that token, so the
    same request is cut with the same bytes sent, nothing handed over after the date, and
    MD is told to release it. On the code before (the cut left when the frontend got round
    to it) a frontend 100 ms late let the transfer finish: not cut, every chunk sent."""
    outcomes = [_relay_ends_a_request_during_ps_transfer(tmp_path, late) for late in (0.0, 0.1)]
    for record, chunks, released in outcomes:
        assert record.state == "completed", record.failure_reason
        assert record.anomaly_filtered, record
        assert chunks == 1  # the first chunk only: the others were computed after the date
        # MD's copy released as of the end (the clock stood still until it was sent)
        assert [body for body, _ in released] == [{"rid": "r1", "kv_expected": True}]
        assert released[0][1] == pytest.approx(0.0, abs=0.002)
    on_time, late = (record for record, *_ in outcomes)
    assert 0 < on_time.wan_bytes_cancelled == late.wan_bytes_cancelled
    assert on_time.wan_bytes == late.wan_bytes


def test_a_held_end_the_relay_cannot_send_is_let_go(tmp_path: Path) -> None:
    """The relay holds the clock at a P-RLD-MD request's last token until the frontend says
    `settled`; if that token cannot be sent (the frontend is gone), no `settled` will come,
    so the hold is let go at once: before, it stood the clock still to its cap."""
    page = tmp_path / "clock"
    SharedClock.create(page, rate=1.0, ceiling=1.0)

    async def scenario() -> tuple[dict, float]:
        rld = instance(RelayInstance, "RLD", clock=str(page))
        rld.transit["FE0"] = (0.0, True)  # one host: the end is held

        async def refused(*_args: object) -> int:
            raise ConnectionRefusedError("the frontend is gone")

        rld.tell = refused
        kv, _ = rld.model.prefill([1, 2, 3], None, 3)
        meta = {"pipeline": "P-RLD-MD", "frontend": "FE0", "md": "MD0", "output_tokens": 1}
        ended = DecodeRequest("r1", meta, kv, 3)
        body = {"rid": "r1", "index": 0, "id": 5, "first": 0, "source": "RLD0", "role": "RLD"}
        with pytest.raises(ConnectionRefusedError):
            await rld.to_frontend(ended, {**body, "times": [rld.clock.now()]})
        before = rld.clock.now()
        await asyncio.sleep(0.05)
        passed = rld.clock.now() - before
        rld.clock.close()
        return rld.ends_held, passed

    held, passed = asyncio.run(scenario())
    assert held == {}
    assert passed > 0.03  # modelled time goes on (rate 1)


def test_a_settle_that_fails_still_lets_the_relays_held_end_go() -> None:
    """The frontend tells the relay `settled` (which lets its held end go) whatever settle
    did: before, a settle that raised skipped it and the relay's hold stood to its cap."""

    async def scenario() -> list[str]:
        fe = instance(Frontend, "FE")
        record = RequestRecord(
            request_id="r1",
            system="pdd",
            arrival_s=0.0,
            input_tokens=8,
            expected_output_tokens=1,
            pipeline="P-RLD-MD",
        )
        flight = Flight(record, [1, 2], None, p="P0", decode="MD0", rld="RLD0")
        fe.flights["r1"] = flight
        fe.new_leg(flight, "r1")

        async def broken(_flight: Flight) -> None:
            raise RuntimeError("broken")

        let_go: list[str] = []

        async def let_end_go(ended: Flight) -> None:
            let_go.append(ended.record.request_id)

        fe.route, fe.settle, fe.let_end_go = broken, broken, let_end_go
        with pytest.raises(RuntimeError):
            await fe.serve_flight(flight)
        return let_go

    assert asyncio.run(scenario()) == ["r1"]


def test_a_destination_that_did_not_answer_p_is_not_taken_for_gone() -> None:
    """P reports a transfer unreachable: refused (the destination's port is closed: its
    process is gone), the router takes the destination down at once; not answered within
    the link's bound (`silent`: perhaps alive behind a partition), it leaves the
    destination's liveness to its heartbeats and fails over that request alone, its cause
    in the request's failover path."""

    async def scenario() -> tuple[Frontend, dict[str, Flight]]:
        fe = instance(Frontend, "FE")
        fe.liveness = Liveness(["P0", "MD0", "MD1"], 0.5, 2.0)
        flights = {}
        for rid, md in (("r1", "MD0"), ("r2", "MD1")):
            record = RequestRecord(
                request_id=rid,
                system="pdd",
                arrival_s=0.0,
                input_tokens=8,
                expected_output_tokens=1,
                pipeline="P-MD",
            )
            flight = flights[rid] = Flight(record, [1, 2], None, p="P0", decode=md)
            flight.transfers = {md}
            fe.flights[rid] = flight
            fe.new_leg(flight, rid)
        for rid, md, silent in (("r1", "MD0", True), ("r2", "MD1", False)):
            cause = f"the KV link to {md} could not open: {'timed out' if silent else 'refused'}"
            body = {
                "rid": rid,
                "destination": md,
                "bytes": 0,
                "tokens": 2,
                "tokens_sent": 0,
                "cancelled": True,
                "unreachable": True,
                "cause": cause,
                "silent": silent,
            }
            await fe.on_transfer_done(Envelope("transfer_done", body, [], None))
        return fe, flights

    fe, flights = asyncio.run(scenario())
    assert fe.liveness.state["MD0"] == "up" and "MD0" not in fe.liveness.gone
    assert "P could not reach MD0 (the KV link to MD0 could not open: timed out)" in (
        flights["r1"].record.failover_path
    )
    assert fe.liveness.state["MD1"] == "down" and "MD1" in fe.liveness.gone
    assert any(entry["request"] == "r1" for entry in fe.failover_log)  # failed over, alone
