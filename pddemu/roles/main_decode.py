"""MD: main decode across the WAN (and, with other wiring, a baseline's decode instance D).

It keeps a decode-side radix cache (DRC) of prompt KV, so the frontend can ask how much of a
prompt it already holds (`match`, which pins that prefix) and P sends only the rest. The match
names the prompt's prefixes by chained page hashes (`pddemu.roles.routed_prompts`), which MD
resolves to ids through its index of the prefixes its DRC holds and of the prompts whose KV is
coming (`PrefixIndex`); the ids beyond the hit come with P's `kv_begin`. MD reports to the
frontend what its DRC took in and dropped (`drc_report`), which the router's record mirrors.
Then:
- pipeline P-MD (and the baselines): MD owns the stream from the first token;
- pipeline P-RLD-MD: MD tells the relay it has the KV (`md_ready`, with what the relay needs to
  pick the handoff mode: MD's batch and the message's send time) and takes the request over
  through the relay's handoff parts: token ids it recomputes inside its next batched step
  (Extend-Decode), or KV it copies into its cache (KV-delta). The final part names the switch
  position S: MD decodes on from the relay's position and streams from S, the relay up to S.
- the relay lost (`resume`): the frontend sends the ids the user has; MD extends those it lacks
  (as a handoff part) and streams on from the user's position, or, if it had already taken
  over, sends the positions the relay never delivered.

The DRC keeps copies of the prompts' KV, not views into the requests' buffers (which hold room
for every output too): it pins exactly what it counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pddemu.cache.page_hashes import PrefixIndex, parse_hash
from pddemu.model import greedy
from pddemu.model.kv import KV
from pddemu.policy.handoff import PACE_SLACK
from pddemu.roles.decode import DecodeInstance, DecodeRequest, Extend
from pddemu.roles.prefix_store import PrefixKVStore
from pddemu.roles.recent import Recent
from pddemu.runtime.channel import Channel, Envelope


@dataclass
class Pinned:
    """A prefix held for a request: from the frontend's match until the KV has arrived.
    `prefix` holds the ids of the `length` tokens held; `prompt`, the whole prompt's, once
    its `kv_begin` has brought the rest (the DRC's insert keys)."""

    prefix: list[int]
    length: int
    node: Any
    handles: list = field(default_factory=list)
    prompt: list[int] | None = None
    hashes: list[int] | None = None  # the prompt's pages', held in the index until let go
    kept: bool = False  # the DRC took its KV in (and the frontend is told)


class MainDecodeInstance(DecodeInstance):
    role = "MD"
    # A transfer's end (`kv_end`) and a handoff part take the time they reached the host, not
    # their reading: this instance's lateness in reading them moves neither when decoding
    # starts nor when a part is taken in.
    dated_reads = True

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.role = spec.me.role  # MD, or D for a baseline
        capacity = self.kv_capacity_genuine() if self.config.policy.drc else 0
        self.prefixes = PrefixIndex(self.page_tokens)  # what the frontend's match names
        self.store = PrefixKVStore(self.page_tokens, capacity, self.prefixes)
        # the reports are sent in order by one task (`_report_sender`), woken by `reports_due`
        self.reports_due = asyncio.Event()
        self.report_sender: asyncio.Task | None = None
        self.report_channel: Channel | None = None  # the connection the reports were last sent on
        self.reports_sent = 0  # the last report sent on it
        self.report_bytes = {"count": 0, "total": 0, "min": 0, "max": 0}  # as match_bytes
        self.matches: dict[str, Pinned] = {}
        self.held: dict[str, Any] = {}  # rid -> DRC node pinned while the request decodes here
        # finished or dropped here: a release that comes after has no KV still on its way
        self.ended: Recent[None] = Recent()
        self.known: dict[str, list[int]] = {}  # outputs received in handoff parts (KV computed)
        self.predicted: dict[str, int] = {}  # the next output the last extend predicts
        self.part_delays: dict[str, float] = {}  # relay -> how long its last part took to come
        self.pending_resume: dict[str, dict[str, Any]] = {}  # relay lost before the KV came
        self.etas: dict[str, float] = {}  # the last `md_eta` told the relay, by request
        # whose KV began to come: a match read after that was given up by the frontend (routed
        # with no hit here), and pins nothing (nothing after it would let the pin go)
        self.kv_begun: Recent[None] = Recent()

    # -- the frontend's questions ---------------------------------------------------------

    async def on_match(self, message: Envelope) -> None:
        """How much of the prompt the DRC holds, pinned for the request. Across the WAN the
        shaper holds modelled time at the match's release until the answer has left
        (`let_routing_go`): it leaves as of the match's arrival, however late it is read."""
        exact = self.exact(message.channel.peer)
        # the shaper held the present for the match: let go once the answer is written (the
        # wait for the send buffer can wait on acknowledgements the hold keeps still), or when
        # reading the match or writing the answer failed or was cancelled
        let_go = _once(lambda: self.clock.let_routing_go(message.received, message.routing_slot))
        try:
            rid = message.body["rid"]
            prompt_tokens, named = self.named_prefixes(message.body)
            self.prefixes.heard(*self.reports_heard(message.body))
            if self.prefixes.unheard and self.reports_lost():
                self.send_reports()  # a quiet MD's would wait for its next change
            prefix = self.prefixes.longest(named)
            length, node, handles = (
                self.store.match(prefix, prompt_tokens)
                if self.config.policy.drc and rid not in self.kv_begun
                else (0, None, [])
            )
            if rid not in self.kv_begun:
                self.matches[rid] = Pinned(prefix[:length], length, node, handles)
            answer = {"rid": rid, "hit": length, "instance": self.name}
            if exact:
                await message.channel.control("matched", answer)
            else:
                await message.channel.control("matched", answer, handed=let_go)
        finally:
            if not exact:
                let_go()
        # The request's KV comes a round trip and a prefill after this at the earliest: by then
        # this instance's own connection to the frontend (its tokens and reports) is open, as a
        # deployment's long-lived one is. Opened on first use, its handshake held the run's
        # first token back by a WAN round trip.
        self.connect_early(message.channel.peer)

    def named_prefixes(self, body: dict[str, Any]) -> tuple[int, list[tuple[int, int]]]:
        """A match's prompt length (genuine tokens) and the prefixes it names, (tokens, hash)
        pairs; ValueError naming what is malformed."""
        prompt_tokens = self.bounded(body, "prompt_tokens", 1, self.kv_capacity_genuine())
        named = body.get("prefixes")
        if not isinstance(named, list):
            raise ValueError(f"prefixes must be a list, got {named!r:.80}")
        pairs = []
        for item in named:
            if not (isinstance(item, list) and len(item) == 2):
                raise ValueError(f"a named prefix is [tokens, hash], got {item!r:.80}")
            tokens = self.bounded({"tokens": item[0]}, "tokens", 1, prompt_tokens)
            pairs.append((tokens, parse_hash(item[1])))
        return prompt_tokens, pairs

    @staticmethod
    def reports_heard(body: dict[str, Any]) -> tuple[str, int]:
        """Which of this instance's DRC reports the frontend had applied when it sent the match
        (`heard`: [process, number]; absent: none); ValueError if malformed."""
        heard = body.get("heard", ["", 0])
        if not (
            isinstance(heard, list)
            and len(heard) == 2
            and isinstance(heard[0], str)
            and isinstance(heard[1], int)
            and not isinstance(heard[1], bool)
            and heard[1] >= 0
        ):
            raise ValueError(f"heard must be [process, report number], got {heard!r:.80}")
        return heard[0], heard[1]

    async def on_kv_begin(self, message: Envelope) -> None:
        self.kv_begun.add(message.body["rid"])
        # With no DRC the frontend asks no match: the connection to it (see `on_match`) is
        # opened at the first KV's beginning, which comes a transfer before any token.
        for frontend in self.spec.peers_with_role("FE"):
            self.connect_early(frontend.name)
        await super().on_kv_begin(message)

    def prompt_begun(self, message: Envelope) -> None:
        """The prompt's ids, for the DRC's insert when its KV comes: those of the prefix held
        here for the request (its match's), then those `kv_begin` carries from its offset.
        Every prefix of it is indexed by its hash, for the matches that name it."""
        if not self.config.policy.drc:
            return
        body = message.body
        rid, offset, tokens = body["rid"], body["offset"], body["prompt_tokens"]
        increment = message.token_ids()
        position = offset
        for part in message.attachments:  # the request's ids, in order from the offset
            if part.request_id != rid or part.first_position != position:
                raise ValueError(
                    f"{rid}: kv_begin's ids from token {position} expected, got "
                    f"{part.request_id}'s from token {part.first_position}"
                )
            position += len(part.ids)
        pinned = self.matches.get(rid)
        held = pinned.prefix if pinned is not None else []
        if offset > len(held) or offset + len(increment) != tokens:
            raise ValueError(
                f"{rid}: kv_begin carries {len(increment)} ids from token {offset} of a prompt "
                f"of {tokens}, {len(held)} of which are held here"
            )
        prompt = held[:offset] + increment
        if pinned is not None:  # held before its KV can come: the DRC's keys are all indexed
            before = pinned.hashes  # a kv_begin repeated: its hold goes, the new one stays
            pinned.prompt = prompt
            pinned.hashes = self.prefixes.hold(prompt)
            if before is not None:
                self.prefixes.let_go(before)

    async def on_release(self, message: Envelope) -> None:
        """The request ended elsewhere (relay-only, finished on the relay, or failed): drop it,
        and, if its KV is still on its way, drop that when it comes (keeping it in the DRC).
        The router's `kv_expected` may not know of KV that is on its way: a failed request's
        transfer may have ended before P read its cancel, and its beginning not be read here
        yet, so a release of a request whose KV has not come is remembered whatever it says."""
        rid = message.body["rid"]
        self._unpin_match(rid)
        self.pending_resume.pop(rid, None)
        request = self.requests.get(rid)
        if request is not None:
            await self.drop(request)
            self.ended.pop(rid, None)
        elif self.ended.pop(rid, 0) is not None:  # not ended here: its KV may still come
            self.released.add(rid)

    def _unpin_match(self, rid: str) -> None:
        pinned = self.matches.pop(rid, None)
        if pinned is not None and pinned.node is not None:
            self.store.release(pinned.node)
        if pinned is not None and pinned.hashes is not None:
            if not pinned.kept:
                self.prefixes.kept(rid, 0)
            self.prefixes.let_go(pinned.hashes)
        self.report_drc()

    def _release_held(self, rid: str) -> None:
        self.etas.pop(rid, None)
        node = self.held.pop(rid, None)
        if node is not None:
            self.store.release(node)
            self.report_drc()
        self.known.pop(rid, None)
        self.predicted.pop(rid, None)

    def keep(self, pinned: Pinned, rid: str, tokens: int, kv: KV) -> Any:
        """The DRC's copy of the first `tokens` of the prompt (pinned), the frontend told."""
        assert pinned.prompt is not None and pinned.hashes is not None
        pinned.kept = True
        self.prefixes.kept(rid, tokens)
        return self.store.insert(pinned.prompt[:tokens], kv, pinned.hashes)

    def report_drc(self) -> None:
        """Tell the frontend what the DRC took in and dropped since the last report (sent
        after those before it)."""
        if self.prefixes.report() is not None:
            self.send_reports()

    def send_reports(self) -> None:
        """Wake the reports' sender: one task, spawned at the first report, ended at the stop
        (`end_tasks`)."""
        self.reports_due.set()
        if self.report_sender is None:
            self.report_sender = self.spawn(self._report_sender(), "drc reports")

    def reports_lost(self) -> bool:
        """Whether the reports sent may not have reached the frontend: the last sending
        failed, or its connection has closed (what it carried may not have been read)."""
        return self.report_channel is None or self.report_channel.closed

    async def _report_sender(self) -> None:
        """Send the reports, in order, each time it is woken: a send that stalls (a full
        connection) holds the later reports back here, not in a task each."""
        while True:
            await self.reports_due.wait()
            self.reports_due.clear()
            await self._send_unsent()

    async def _send_unsent(self) -> None:
        """Send the reports not sent yet; all those the frontend has not acknowledged if the
        last sending failed or the connection is another (what the closed one carried may
        not have been read): the frontend skips those it applied."""
        routers = [a.name for a in self.spec.peers_with_role("FE")]
        if not routers:  # an instance on its own (tests): nobody to tell
            return
        try:
            channel = await self.peer(routers[0])
            if channel is not self.report_channel:
                self.report_channel, self.reports_sent = channel, 0
            for body in list(self.prefixes.unheard):
                if body["report"] <= self.reports_sent:
                    continue
                sent = await self.tell(routers[0], "drc_report", body)
                self.reports_sent = body["report"]
                tally = self.report_bytes
                tally["min"] = min(tally["min"], sent) if tally["count"] else sent
                tally["max"] = max(tally["max"], sent)
                tally["count"] += 1
                tally["total"] += sent
        except OSError:  # sent again at the next report, or the next match that misses it
            self.report_channel = None

    def transfer_cut(self, rid: str, kv: KV) -> None:
        """The transfer was cut off mid-way: keep what arrived of the prompt (whole pages) in
        the DRC, so the session's next turn sends less."""
        pinned = self.matches.get(rid)
        prompt = pinned.prompt if pinned is not None else None
        if self.config.policy.drc and prompt is not None and kv.tokens:
            self.store.release(self.keep(pinned, rid, kv.tokens, kv.clone()))  # type: ignore[arg-type]
        self._unpin_match(rid)
        resume = self.pending_resume.pop(rid, None)
        if resume is not None:  # its relay is lost too: the frontend moves it elsewhere
            (router,) = [a.name for a in self.spec.peers_with_role("FE")]
            lost = {"rid": rid, "instance": self.name}
            self.spawn(self.tell(router, "stream_lost", lost), f"{rid} lost")

    def prefix_for(self, rid: str, offset: int) -> KV | None:
        if offset == 0:
            return None
        pinned = self.matches.get(rid)
        if pinned is None or pinned.length < offset:
            raise ValueError(
                f"{rid}: sent from token {offset}, but only {pinned.length if pinned else 0} are held here"
            )
        return self.store.assemble(pinned.handles, offset)

    # -- KV from P ------------------------------------------------------------------------

    async def kv_arrived(
        self, request: DecodeRequest, first_token: int, begin: dict[str, Any], genuine_bytes: int
    ) -> None:
        rid = request.rid
        # The intake, under its hold (`DecodeInstance.intake_done`): the DRC's copy of the
        # prompt, then the request in the batch (if it streams now), before anything is sent.
        pinned = self.matches.get(rid)
        if self.config.policy.drc and pinned is not None and pinned.prompt is not None:
            prompt_kv = request.kv.token_slice(0, request.prompt_len).clone()
            self.held[rid] = self.keep(pinned, rid, len(pinned.prompt), prompt_kv)
        self._unpin_match(rid)
        streams_now = request.meta["pipeline"] != "P-RLD-MD" and rid not in self.released
        arrival = {
            "rid": rid,
            "bytes": genuine_bytes,
            "offset": begin["offset"],
            "at": begin["ended_at"],
            "first_chunk_at": begin["first_chunk_at"],
        }

        async def report() -> None:
            await self.tell(request.meta["frontend"], "kv_arrived", arrival)

        if streams_now:  # a failed start drops the request (`drop`: its DRC pin too)
            await self.start_stream(request, first_token, report)
            return
        self.intake_done(request)
        await report()
        if rid in self.released:
            self.released.discard(rid)
            self._release_held(rid)
            await self.release_memory(request)
            return
        if request.meta["pipeline"] == "P-RLD-MD":
            self.requests[rid] = request
            self.known[rid] = []
            request.meta["p_first_token"] = first_token
            resume = self.pending_resume.pop(rid, None)
            if resume is not None:  # the relay was lost meanwhile
                await self.take_over(request, resume)
                return
            rld = request.meta["rld"]
            await self.tell(rld, "md_ready", {"rid": rid, **self.outlook(rld)})

    def outlook(self, relay: str) -> dict[str, Any]:
        """What a relay needs to predict this instance's side of a handoff: the contexts of the
        batch a part would join, when this was said (the relay measures the way back), and how
        long the last part from that relay took to come (the way there)."""
        batch = [r for r in self.requests.values() if r.decoding and not r.finished]
        said = {
            "batch_contexts": [self.modelled_context(r) for r in batch],
            "sent": self.clock.now(),
        }
        if relay in self.part_delays:  # each measured delay is reported once
            said["part_delay"] = self.part_delays.pop(relay)
        return said

    # -- the relay lost --------------------------------------------------------------------

    async def on_resume(self, message: Envelope) -> None:
        """The relay streaming this request was lost: take the stream over from the user's
        position, now or when the prompt's KV has come."""
        body = message.body
        rid = body["rid"]
        request = self.requests.get(rid)
        if request is not None:
            await self.take_over(request, body)
        elif self.expects(rid):
            self.pending_resume[rid] = body
        else:
            await message.channel.control("stream_lost", {"rid": rid, "instance": self.name})

    async def take_over(self, request: DecodeRequest, body: dict[str, Any]) -> None:
        """Stream from the user's position: extend the outputs the user has beyond the relay's
        parts; or, the parts being ahead of the user, produce the positions between from them;
        or, already streaming from the relay's switch, send what the relay left out."""
        rid = request.rid
        ids = [int(x) for x in body["ids"]]
        position = int(body["position"])
        known = self.known.get(rid)
        if known is None:
            if request.streaming and position < request.stream_from:
                await self.resend_from(request, position)
            return
        self.extends = type(self.extends)(e for e in self.extends if e.request is not request)
        common = min(len(known), len(ids))
        if known[:common] != ids[:common]:
            raise ValueError(f"{rid}: the relay's parts differ from the user's tokens")
        predicted = self.predicted.pop(rid, None)
        if not ids:  # the user has nothing yet: the stream is this instance's from P's token
            self.known.pop(rid, None)
            await self.start_stream(request, int(request.meta["p_first_token"]))
        elif len(ids) > len(known):
            self.known.pop(rid, None)
            await self.resume_stream(request, ids, position, have=len(known))
        elif predicted is not None:  # the parts are ahead: their outputs, then the prediction
            self.known.pop(rid, None)
            request.outputs = [*known, predicted]
            request.emitted = request.stream_from = self.group_start(len(known))
            request.produced = []
            request.streaming = True
            self.resumed += 1
            await self.resend_from(request, position)
            self.start_decoding(request)
        else:  # KV-delta parts ahead of the user, the next output unknown here: move it
            await self.on_release(Envelope("release", {"rid": rid}, [], None))
            await self.tell(
                request.meta["frontend"], "stream_lost", {"rid": rid, "instance": self.name}
            )

    # -- handoff from the relay -----------------------------------------------------------

    async def on_handoff(self, message: Envelope) -> None:
        """A part of the relay's handoff. One this instance cannot take (out of order,
        malformed) loses the request here, so that the relay finishes it rather than hand it
        over at the switch to an instance that never streams; the error still counts."""
        request = self.requests.get(message.body["rid"])
        known = self.known.get(message.body["rid"])
        if request is None or known is None:  # released meanwhile: the relay finished it
            return
        await self._or_lose(request, self._take_part(request, known, message))

    async def _or_lose(self, request: DecodeRequest, work: Awaitable[None]) -> None:
        """`work` on a handoff part; if it fails, the request is lost here (and the error
        raised on)."""
        try:
            await work
        except Exception:
            if self.requests.get(request.rid) is request:
                await self.lose(request)
            raise

    async def _take_part(self, request: DecodeRequest, known: list[int], message: Envelope) -> None:
        body = message.body
        rid = request.rid
        if int(body["start"]) != len(known):
            raise ValueError(
                f"{rid}: handoff part starts at output {body['start']}, MD has {len(known)}"
            )
        arrived = body["arrived_at"] = self.arrival(message)
        self.part_delays[request.meta["rld"]] = arrived - float(body["sent_at"])
        if body["payload"] == "extend":
            ids = message.token_ids()
            if not ids:
                await self._after_part(request, body, arrived)
                return
            start = len(known)
            tokens = self.group_start(start + len(ids)) - self.group_start(start)
            context = int(request.meta["input_tokens"]) + self.group_start(start)
            self.add_extend(
                Extend(
                    request,
                    tokens,
                    context,
                    lambda: self._extend(request, ids),
                    lambda at: self._after_part(request, body, at),
                    arrived,
                )
            )
        else:
            chunks = message.kv_chunks()
            ids = [int(x) for x in body["ids"]]
            copy = self._copy(request, body, chunks, ids, arrived)
            self.spawn(self._or_lose(request, copy), f"KV-delta part of {rid}")

    def _extend(self, request: DecodeRequest, ids: list[int]) -> None:
        """Recompute the KV of the relay's eager outputs in one forward pass (Extend-Decode)."""
        known = self.known[request.rid]  # present: the loop skips released requests
        self._check_predicted(request.rid, ids[0])
        kv, logits = self.model.extend(ids, request.kv)
        request.kv.append(kv)
        known.extend(ids)
        self.predicted[request.rid] = greedy(logits[-1])

    async def _copy(
        self, request: DecodeRequest, body: dict[str, Any], chunks: list, ids: list[int], at: float
    ) -> None:
        """Place the eager outputs' KV as it came (KV-delta): the copy into the cache takes
        `CostModel.kv_copy` beside the decode steps, then the request may go on."""
        rid = request.rid
        tokens = sum(chunk.token_end - chunk.token_start for chunk in chunks)
        if tokens != len(ids):
            raise ValueError(f"{rid}: KV-delta part has KV of {tokens} tokens for {len(ids)} ids")
        known = self.known.get(rid)
        if known is None:
            return
        done = at
        if ids:
            start = len(known)
            modelled = self.group_start(start + len(ids)) - self.group_start(start)
            for chunk in chunks:
                request.kv.append(self.received_kv(chunk))
            known.extend(ids)
            done = at + self.cost.kv_copy(modelled)
            await self.clock.sleep_until(done)
        await self._after_part(request, body, done)

    def _check_predicted(self, rid: str, token: int) -> None:
        """The next id the relay sends must be what this instance's own model predicts."""
        predicted = self.predicted.pop(rid, None)
        if predicted is not None and predicted != token:
            raise ValueError(
                f"{rid}: the relay's output {token} differs from MD's prediction {predicted}"
            )

    async def _after_part(self, request: DecodeRequest, body: dict[str, Any], at: float) -> None:
        """A part is absorbed. Not the last: tell the relay (it sends the next). The last: decode
        on from the relay's position, streaming from the agreed switch position."""
        rid = request.rid
        known = self.known.get(rid)
        if known is None or rid not in self.requests:  # released meanwhile
            return
        self.events.record(  # sent by the relay -> arrived here (`arrived_s`) -> absorbed
            "handoff_part",
            rid,
            float(body["sent_at"]),
            at,
            arrived_s=body["arrived_at"],
            final=body["final"],
            outputs=int(body["end"]) - int(body["start"]),
        )
        if not body["final"]:  # a relay lost meanwhile: the frontend's `resume` comes instead
            rld = request.meta["rld"]
            said = {"rid": rid, "upto": len(known), **self.outlook(rld)}
            await self._tell_relay(rld, "caught_up", said)
            return
        if body["payload"] == "extend":
            self._check_predicted(rid, int(body["last_id"]))
        request.outputs = [*known, int(body["last_id"])]
        request.emitted = int(body["position"])
        request.stream_from = int(body["switch"])
        request.produced = []
        self.known.pop(rid, None)
        request.streaming = True
        if request.ended(request.emitted):
            request.finished = True
            await self.finished(request)
        else:  # from when the part was absorbed, however late this process got here
            self.start_decoding(request, at)
            if request.stream_from > request.emitted:  # the relay streams a lead meanwhile
                request.on_step = self.catching_up
                start = max(at, self.last_end)
                self.tell_eta(request, start, self.cost.decode_step(self.batch_contexts()))

    def batch_contexts(self) -> list[int]:
        batch = [r for r in self.requests.values() if r.decoding and not r.finished]
        return [self.modelled_context(r) for r in batch]

    def tell_eta(self, request: DecodeRequest, after: float, step_s: float) -> None:
        """Tell the relay when this instance will produce the token at the switch: one step
        per position from its position after `after`, at `step_s` a step."""
        eta = after + (request.stream_from + 1 - request.position) * step_s
        self.etas[request.rid] = eta
        body = {"rid": request.rid, "at": eta, "step_s": step_s, "sent": self.clock.now()}
        self.spawn(self._tell_relay(request.meta["rld"], "md_eta", body), "md_eta")

    async def catching_up(self, request: DecodeRequest) -> None:
        """After each step towards the switch: tell the relay again when the prediction has
        moved by more than PACE_SLACK of a step (MD's batch and its steps change as it goes);
        the relay re-paces the lead it still holds."""
        if request.position > request.stream_from:  # the switch's token is out: done
            request.on_step = None
            self.etas.pop(request.rid, None)
            return
        step = self.last_step_s
        eta = self.last_end + (request.stream_from + 1 - request.position) * step
        if abs(eta - self.etas.get(request.rid, eta)) > PACE_SLACK * step:
            self.tell_eta(request, self.last_end, step)

    async def _tell_relay(self, relay: str, kind: str, body: dict[str, Any]) -> None:
        try:
            await self.tell(relay, kind, body)
        except OSError:  # the relay is gone: the frontend fails its streams over
            pass

    async def finished(self, request: DecodeRequest) -> None:
        await super().finished(request)
        self._release_held(request.rid)
        self.ended.add(request.rid)

    async def drop(self, request: DecodeRequest) -> None:
        """Whatever dropped it (a release, a failed step), its prompt in the DRC is unpinned."""
        await super().drop(request)
        self._release_held(request.rid)
        self.ended.add(request.rid)

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "drc_tokens": self.store.size_tokens,
            "drc_prefixes_known": len(self.prefixes),
            "drc_report_bytes": dict(self.report_bytes),
        }


def _once(action: Callable[[], object]) -> Callable[[], None]:
    """`action`, done at the first call only: a hold let go twice could let go the next one."""
    done = False

    def act() -> None:
        nonlocal done
        if not done:
            done = True
            action()

    return act
