"""P: prefill with a prefix cache, streaming each chunk's KV to every destination at once.

A request arrives from the frontend with its prompt; P answers with its prefix-cache hit and
queues the prefill. The frontend's route names the destinations (the relay over the intra-DC
path, the main decode across the WAN, or a baseline's decode) and from which token each needs
the KV (a destination that already holds a prefix gets only the rest). Chunks leave as soon as
they are computed, to all destinations in parallel: PDD's dual-path transfer.

Each step batches up to `max_batch_chunks` chunk slots across requests, first come first
served; its modelled duration comes from the cost model (a tail chunk costs a full slot).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pddemu.model import TEXT_IDS, TinyTransformer, greedy
from pddemu.model.kv import KV
from pddemu.roles.base import Instance
from pddemu.roles.prefix_store import PrefixKVStore
from pddemu.roles.spec import InstanceSpec
from pddemu.roles.transfer import (
    KvLinks,
    LinkLost,
    LinkUnavailable,
    Progress,
    TcpLedger,
    TransferRefused,
    slice_tokens,
)
from pddemu.runtime.channel import Channel, Envelope
from pddemu.runtime.clock import INSTANT_HOLD_CAP_S
from pddemu.wire import TokenIds
from pddemu.wire.tensors import kv_chunk_from_tensor


@dataclass
class Destination:
    name: str
    offset: int  # first genuine token this destination needs
    meta: dict[str, Any]  # forwarded in kv_begin (pipeline, relay/main names, ...)
    task: asyncio.Task | None = None
    bytes_sent: int = 0
    tokens_sent: int = 0  # genuine prompt tokens whose KV has been sent
    # (modelled time, bytes_sent, tokens_sent) as each chunk was handed to the link (its turn
    # there, among the other transfers'): what had been sent as of a cut's date
    handed: list[tuple[float, int, int]] = field(default_factory=list)
    cut_at: float | None = None  # the modelled time a cut dated itself (`on_cut`)

    def as_of_cut(self) -> None:
        """Count as sent only what was handed over by the cut's date: what a router that took
        no time to act would have let through (what left after it is not sent)."""
        if self.cut_at is None:
            return
        self.bytes_sent = self.tokens_sent = 0
        for at, bytes_sent, tokens_sent in self.handed:
            if at > self.cut_at:
                break
            self.bytes_sent, self.tokens_sent = bytes_sent, tokens_sent


@dataclass
class PrefillJob:
    rid: str
    prompt: list[int]
    meta: dict[str, Any]
    frontend: Channel
    hit: int = 0
    node: Any = None
    kv: KV | None = None
    scheduled: int = 0  # genuine tokens handed to a step
    progress: Progress = field(default_factory=Progress)
    last_logits: Any = None
    first_token: int | None = None
    destinations: list[Destination] = field(default_factory=list)
    routed: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: bool = False
    arrived: float = -math.inf  # modelled time P had the request


class PrefillInstance(Instance):
    role = "P"

    def __init__(self, spec: InstanceSpec) -> None:
        super().__init__(spec)
        self.model = TinyTransformer(self.model_config)
        self.warm_up()
        self.store = PrefixKVStore(self.page_tokens, self.kv_capacity_genuine())
        self.jobs: dict[str, PrefillJob] = {}
        self.queue: deque[PrefillJob] = deque()
        self.work = asyncio.Event()
        self.links = KvLinks(
            self.open,
            self._serve_link,
            self._peers,
            spawn=self.spawn,
            clock=self.clock,
            open_within_s=self.config.faults.down_after_s,
        )
        config = self.model_config
        token_bytes = 2 * config.n_layers * config.n_kv_heads * config.head_dim
        token_bytes *= KV.empty(config).tensor.element_size()  # a token's KV, every layer
        self.slice_genuine = slice_tokens(token_bytes, self.chunk_genuine)
        self.tcp = TcpLedger(lambda: self.clock.rate, self.name)
        self.prefill_tokens = 0
        self.transfers_cut = 0  # sends that ended unfinished (cut, cancelled, receiver lost)
        self.last_end = -math.inf

    def warm_up(self) -> None:
        """One chunk's prefill before any request: torch's first pass at a size allocates and
        picks its kernels (tens of ms, several times a warm pass), which would otherwise fall
        in the first request's step. In real time (`pddemu serve`) no hold covers it."""
        size = max(1, self.chunk_genuine)
        self.model.prefill([TEXT_IDS[i % len(TEXT_IDS)] for i in range(size)], chunk_size=size)

    async def start(self) -> None:
        self.spawn(self.schedule(), "prefill scheduler")

    async def close_connections(self, server: Any) -> None:
        """No KV link opens once the connections are being closed (`KvLinks.close`)."""
        self.links.close()
        await super().close_connections(server)

    # -- messages from the frontend -----------------------------------------------------

    async def on_prefill(self, message: Envelope) -> None:
        rid = message.body["rid"]
        prompt = message.token_ids()
        if not 0 < len(prompt) <= self.kv_capacity_genuine():
            raise ValueError(f"{rid}: a prompt of {len(prompt)} tokens does not fit this instance")
        hit, node, handles = self.store.match(prompt)
        job = PrefillJob(rid, prompt, message.body, message.channel, hit=hit, node=node)
        job.arrived = self.arrival(message)
        self.jobs[rid] = job
        # The hit goes out first: the frontend's route waits on it, and the copy of the cached
        # prefix below is the emulator's own (a paged cache shares the pages), so its host
        # time must not delay the route. Until the prefix is in place nothing can be sent: the
        # job's progress stays at 0 and it is not queued.
        await message.channel.control("p_hit", {"rid": rid, "hit": hit, "instance": self.name})
        if job.cancelled:
            self.store.release(job.node)
            self.jobs.pop(rid, None)
            return
        job.kv = KV.empty(self.model_config, capacity=len(prompt))
        prefix = self.store.assemble(handles, hit)
        if prefix is not None:
            job.kv.append(prefix)
        job.scheduled = hit
        await job.progress.advance(hit, job.arrived)
        self.queue.append(job)
        self.work.set()

    async def on_route(self, message: Envelope) -> None:
        """Start the sends, then tell the router: it holds the clock until then (an instant
        hold), so the KV leaves at the route's modelled time, however late this is read. The
        sends run to their first wait before this goes on (tasks run in the order they were
        made): what is computed is written, and a connection to open is being opened."""
        job = self.jobs.get(message.body["rid"])
        if job is not None:
            for dest in message.body["destinations"]:
                destination = Destination(dest["name"], int(dest["offset"]), dest.get("meta", {}))
                destination.task = self.spawn(
                    self.send(job, destination), f"KV of {job.rid} to {destination.name}"
                )
                job.destinations.append(destination)
            job.routed.set()
            await asyncio.sleep(0)
        await message.channel.control("routed", {"rid": message.body["rid"]})

    async def on_cancel(self, message: Envelope) -> None:
        """Stop a request's transfers: it failed or timed out at the frontend."""
        job = self.jobs.get(message.body["rid"])
        if job is None:
            return
        job.cancelled = True
        for destination in job.destinations:
            if destination.task is not None:
                destination.task.cancel()
        if job in self.queue and job.scheduled == job.progress.tokens:  # no chunk in a step now
            self.queue.remove(job)
            self.store.release(job.node)
            self.jobs.pop(job.rid, None)
        self._forget_if_done(job)

    async def on_cut(self, message: Envelope) -> None:
        """Stop one destination's transfer mid-way (the anomaly filter: the relay finished the
        request before its KV reached MD); the receiver is told `kv_cut`. A cut that
        says when it was decided (`at`, modelled) is reported as of then: what was handed over
        after it counts as not sent, so the router's lateness in sending it shows in no byte."""
        job = self.jobs.get(message.body["rid"])
        if job is None:  # every transfer of it is over
            return
        at = message.body.get("at")
        for destination in job.destinations:
            if destination.name == message.body["destination"] and destination.task is not None:
                if at is not None and not destination.task.done():
                    destination.cut_at = float(at)
                destination.task.cancel()

    # -- the prefill loop -----------------------------------------------------------------

    async def schedule(self) -> None:
        chunk = self.chunk_genuine
        while True:
            await self.work.wait()
            batch: list[tuple[PrefillJob, int, int]] = []
            slots = self.config.prefill.max_batch_chunks
            for job in self.queue:
                while slots and job.scheduled < len(job.prompt):
                    end = min(job.scheduled + chunk, len(job.prompt))
                    batch.append((job, job.scheduled, end))
                    job.scheduled = end
                    slots -= 1
                if not slots:
                    break
            if not batch:
                self.work.clear()
                continue
            started = self._step_start(batch)
            duration = self.cost.prefill_step(
                [
                    (self.modelled_span(job, begin, end), self.modelled_span(job, 0, begin))
                    for job, begin, end in batch
                ]
            )
            # Held at the step's end until its chunks are handed to their connections: this
            # process's wake-up from the wait does not make them enter the network late.
            with self.genuine_work(started, duration):
                for job, begin, end in batch:
                    kv, logits = await self.compute(
                        self.model.prefill, job.prompt[begin:end], job.kv, end - begin
                    )
                    job.kv.append(kv)
                    job.last_logits = logits
                rids = [job.rid for job, _, _ in batch]
                held = self.clock.shared  # a hold stands at the end: wake there precisely
                step_end = self.last_end = await self.finish_step(started, duration, rids, held)
                for job, _begin, end in batch:
                    tokens = self.modelled_span(job, _begin, end)
                    self.events.record("prefill_chunk", job.rid, started, step_end, tokens=tokens)
                    self.prefill_tokens += tokens
                    if end == len(job.prompt):
                        self.finish(job)
                    await job.progress.advance(end, step_end, finished=end == len(job.prompt))
                await self.handed_over([job for job, _, _ in batch])

    async def handed_over(self, jobs: list[PrefillJob]) -> None:
        """Until the senders a step's chunks woke have handed them to their connections (each
        does before it waits again), or INSTANT_HOLD_CAP_S of wall time: a sender that cannot
        go on keeps the clock held no longer than an instant hold's cap."""
        deadline = time.monotonic() + INSTANT_HOLD_CAP_S
        while any(job.progress.due() for job in jobs) and time.monotonic() < deadline:
            await asyncio.sleep(0)

    def _step_start(self, batch: list[tuple[PrefillJob, int, int]]) -> float:
        """A step starts when the engine is free (the last step's end: back to back, however
        late this process woke from it) and its requests are there (when they arrived, however
        late this process handled them): `Instance.step_start`."""
        return self.step_start(self.last_end, max(job.arrived for job, _, _ in batch))

    def finish(self, job: PrefillJob) -> None:
        """The prompt is computed: its first output token is known, its KV joins the cache."""
        job.first_token = greedy(job.last_logits)
        self.queue.remove(job)
        self.store.release(job.node)
        self.store.release(self.store.insert(job.prompt, job.kv))
        self._forget_if_done(job)

    def modelled_span(self, job: PrefillJob, begin: int, end: int) -> int:
        """Modelled tokens of genuine positions [begin, end) of the job's prompt."""
        total = int(job.meta["input_tokens"])
        scale = self.config.scale.token_scale
        return max(0, min(end * scale, total) - min(begin * scale, total))

    # -- sending --------------------------------------------------------------------------

    async def send(self, job: PrefillJob, destination: Destination) -> None:
        """One destination's transfer on its KV link (`KvLinks`): `kv_begin`, the chunks as
        they are computed once the receiver has admitted it (`kv_admitted`), `kv_end`. Cut
        (cancelled) or its link lost, it ends with a `kv_cut` where the link still stands."""
        started = self.clock.now()
        try:
            channel = await self.links.acquire(destination.name)
        except (asyncio.CancelledError, ConnectionError) as error:
            # The receiver is gone, or the transfer was cut while its link was still
            # opening: either way the frontend must hear that it will not complete (it waits
            # for every transfer's report before it settles the request).
            self.transfers_cut += 1
            lost = isinstance(error, ConnectionError)
            silent = isinstance(error, LinkUnavailable) and error.silent
            cause = str(error) if lost else ""
            await self._report(
                job, destination, started, True, unreachable=lost, cause=cause, silent=silent
            )
            self._forget_if_done(job)
            if not lost:
                raise
            return
        seq, admission = self.links.expect_admission(channel, job.rid)
        self.tcp.begin(channel)
        # On a path without modelled time its reader's lateness is held (`hold_until_read`),
        # from the moment the link takes the message: a transfer cancelled while it queued
        # behind the others' sends posts no hold its reader would never let go of.
        held = self.clock.hold_until_read if self.exact(destination.name) else None
        begun = asyncio.Event()  # kv_begin handed to the link: the receiver will hear of a cut
        try:
            await channel.control(
                "kv_begin",
                {
                    "rid": job.rid,
                    "offset": destination.offset,
                    "prompt_tokens": len(job.prompt),
                    "meta": {**job.meta, **destination.meta},
                    "p": self.name,
                    "p_hit": job.hit,
                    "seq": seq,
                },
                *self.increment_ids(job, destination),
                handed=begun.set,
                on_turn=held,
            )
            await admission
            position = destination.offset
            while position < len(job.prompt):
                await job.progress.wait_beyond(position)
                end = min(job.progress.tokens, position + self.slice_genuine)
                if end <= position:
                    continue
                if channel.closed:  # it ended while this transfer waited for its KV
                    raise LinkLost(f"{job.rid}: the KV link to {destination.name} ended")
                chunk = kv_chunk_from_tensor(
                    job.rid, 0, position, job.kv.token_slice(position, end).tensor
                )
                taken: list[float] = []  # when the link took it: its turn among the transfers

                def take(taken: list[float] = taken) -> None:
                    taken.append(self.clock.now())

                destination.bytes_sent += await channel.send(chunk, handed=take)
                destination.tokens_sent += end - position
                handed = (taken[0], destination.bytes_sent, destination.tokens_sent)
                destination.handed.append(handed)
                position = end
            await job.progress.wait_beyond(len(job.prompt))
            await channel.control(
                "kv_end",
                {
                    "rid": job.rid,
                    "seq": seq,
                    "first_token": job.first_token,
                    "ready": job.progress.at,  # the modelled time the whole KV was computed
                },
                on_turn=held,
            )
            wan = self.address(destination.name).role == "MD"
            self.tcp.charge(channel, wan, destination.bytes_sent)
        except (asyncio.CancelledError, ConnectionError, TransferRefused) as error:
            # Cancelled, refused, or the link broke (the receiver was lost): the receiver sees
            # the transfer cut (`kv_cut`, or its link's end) and forgets it; the frontend hears
            # that it will not complete.
            self.links.forget(channel, seq)
            self.tcp.forget(channel)
            lost = isinstance(error, ConnectionError)
            if lost:  # the link is broken: every transfer on it ends (its reader sees it too)
                channel.close()
            elif begun.is_set() and not channel.closed:
                cut = self._cut(channel, job.rid, seq)
                self.spawn(cut, f"cut of {job.rid} to {destination.name}")
            self.transfers_cut += 1
            destination.as_of_cut()
            cause = str(error) if lost else ""
            await self._report(job, destination, started, True, unreachable=lost, cause=cause)
            self._forget_if_done(job)
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        await self._report(job, destination, started, cancelled=False)
        self._forget_if_done(job)

    def increment_ids(self, job: PrefillJob, destination: Destination) -> tuple[TokenIds, ...]:
        """The ids of the prompt beyond the destination's offset, for a decode instance that
        keeps a DRC: its insert takes the prompt's ids from here (the part it holds it knows from
        the frontend's `match`), so that the match need not carry them. The relay keeps nothing
        across requests: it gets none."""
        if not self.config.policy.drc or self.address(destination.name).role == "RLD":
            return ()
        increment = job.prompt[destination.offset :]
        return (TokenIds.from_ints(job.rid, destination.offset, increment),)

    async def _cut(self, channel: Channel, rid: str, seq: int) -> None:
        """Tell the receiver transfer `seq` on a link that goes on is cut (after whatever of
        it was handed to the link: the channel's lock keeps the order; a newer transfer of
        the same request may go first, which its number tells apart)."""
        with contextlib.suppress(ConnectionError):
            await channel.control("kv_cut", {"rid": rid, "seq": seq})

    def _serve_link(self, channel: Channel) -> None:
        """Read what a KV link's receiver says (`kv_admitted`) until the link ends, then fail
        the transfers still waiting on it."""

        async def serve() -> None:
            await channel.serve(self._dispatch)
            self.links.closed(channel)

        self.spawn(serve(), f"KV link to {channel.peer}")

    async def on_kv_admitted(self, message: Envelope) -> None:
        """The receiver has the request's memory: its chunks may go. On a path without modelled
        time the receiver held the present until this was read (`let_sender_go`)."""
        self.let_sender_go(message)
        assert message.channel is not None
        self.links.admitted(message.channel, message.body.get("seq"))

    async def on_kv_refused(self, message: Envelope) -> None:
        """The receiver refused a transfer (its `kv_begin` could not be admitted): it ends,
        reported cut; the link and its other transfers go on. One for a transfer cut
        meanwhile finds nothing waiting."""
        assert message.channel is not None
        body = message.body
        rid, reason = str(body.get("rid")), str(body.get("reason", ""))
        self.links.refused(message.channel, body.get("seq"), rid, reason)

    def _forget_if_done(self, job: PrefillJob) -> None:
        """Drop a job once its prefill is done and nothing is left to send."""
        current = asyncio.current_task()
        sending = any(
            d.task is not None and not d.task.done() and d.task is not current
            for d in job.destinations
        )
        done = job.first_token is not None and (job.cancelled or job.routed.is_set())
        if done and not sending and self.jobs.get(job.rid) is job:
            self.jobs.pop(job.rid, None)

    async def _report(
        self,
        job: PrefillJob,
        destination: Destination,
        started: float,
        cancelled: bool,
        unreachable: bool = False,
        cause: str = "",
        silent: bool = False,
    ) -> None:
        """Tell the frontend how a transfer ended (`unreachable`: its receiver was lost, for
        `cause`: the link's error; `silent`: it did not answer, which tells nothing of its
        liveness)."""
        if job.frontend.closed:
            return
        ended = self.clock.now()
        if destination.cut_at is not None:  # as of the cut's date
            ended = max(started, min(ended, destination.cut_at))
        await job.frontend.control(
            "transfer_done",
            {
                "rid": job.rid,
                "destination": destination.name,
                "bytes": destination.bytes_sent,
                "tokens": len(job.prompt) - destination.offset,
                "tokens_sent": destination.tokens_sent,
                "started": started,
                "ended": ended,
                "cancelled": cancelled,
                "unreachable": unreachable,
                "cause": cause,
                "silent": silent,
            },
        )

    def stats(self) -> dict[str, Any]:
        self.tcp.settle()  # the tails of the transfers on idle connections
        return {
            **super().stats(),
            "prefill_tokens": self.prefill_tokens,
            "transfers_cut": self.transfers_cut,
            "kv_link_opens": self.links.open_attempts,
            "kv_link_stale_replies": self.links.stale_replies,
            "cache_tokens": self.store.size_tokens,
            "kv_transfers_tcp": list(self.tcp.transfers),  # the latest KEPT_TRANSFERS
            "kv_transfers_tcp_totals": self.tcp.totals.as_dict(),
        }
