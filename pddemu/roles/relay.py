"""RLD: relay decode next to P. It decodes a low-hit request as soon as its KV arrives over the
intra-DC path and streams these eager tokens to the user while MD's copy of the KV crawls
across the WAN; when MD has it, RLD hands the request over.

The handover is seamless by construction: the relay's final part names the switch position S;
the relay streams every position before S and stops there, MD (which decodes on from the
relay's position at the final part) streams every position from S. `pddemu.policy.handoff`
picks the mode (one-shot, catch-up, or adaptively between them), S and the pace at which the
relay delivers the positions between its final part and S (holding each token until its time,
so that MD's delay is spread over them rather than seen at once), from the relay's and MD's
step times and the WAN's delays, as the relay measures them. That pace is a plan: MD, once it
has the final part, says when it will produce S (`md_eta`, again whenever its steps move that)
and the relay re-paces the positions it still holds to end one MD step before MD's first.

Payloads (`policy.handoff_payload`): extend (token ids; MD recomputes their KV inside its next
batched step), sent on the control connection to MD; or kv-delta (the eager tokens' KV, which
MD copies into its cache), sent on a KV connection, as bulk KV travels (its DSCP class, its
queue on the WAN).

What MD needs at a handoff: the outputs whose KV exists here (all but the last id, see
`decode.py`) as ids or KV, and, with the final part, the last id, the modelled position MD
decodes on from and the switch position S from which it streams.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pddemu.model.kv import KV
from pddemu.policy.handoff import (
    ONE_SHOT,
    DelayEstimate,
    HandoffOutlook,
    choose_mode,
    lead,
    paced_step,
)
from pddemu.roles.decode import DecodeInstance, DecodeRequest
from pddemu.roles.recent import Recent
from pddemu.roles.sizing import cost_model
from pddemu.runtime.channel import Channel, Envelope
from pddemu.runtime.clock import InstantHold
from pddemu.wire import Control, TokenIds
from pddemu.wire.tensors import kv_chunk_from_tensor

log = logging.getLogger("pddemu.relay")


@dataclass
class Handoff:
    mode: str  # one_shot | catch_up
    md_batch: list[int]  # MD's batch contexts (modelled) when it last said
    sent_upto: int = 0  # genuine outputs MD holds (as KV) from the parts sent
    sent_position: int = 0  # modelled output position those parts cover
    switch: int | None = None  # where MD takes over the stream (set with the final part)
    pace_s: float = 0.0  # the lead's positions reach the user at least this far apart
    paced_from: float = 0  # the lead's first position (the relay's at the final part; inf: none)
    delivered_at: float = 0.0  # when the last paced position reaches the user
    finishing: bool = False  # predicted to end here before any switch could come
    started_at: float | None = None  # modelled time the first part was sent
    rounds: int = 0
    bytes: int = 0
    waiting: bool = False  # a part is in flight: wait for MD's answer
    md_first_at: float | None = None  # MD's token at the switch reaches the user (MD's `md_eta`)
    md_step_s: float = 0.0  # MD's step then, as MD reported it
    held: deque = field(default_factory=deque)  # the lead's token groups, held until their time
    sender: asyncio.Task | None = None  # delivers `held`
    replan: asyncio.Event = field(default_factory=asyncio.Event)  # a new `md_eta` came
    handed_over: bool = False


class RelayInstance(DecodeInstance):
    role = "RLD"

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.handoffs: dict[str, Handoff] = {}
        # MD was ready before the relay had the request: of requests on their way here (kept
        # until they end), and of those not known here, not yet or no longer (the latest kept)
        self.md_ready_early: dict[str, dict[str, Any]] = {}
        self.md_ready_unknown: Recent[dict[str, Any]] = Recent()
        self.leads: dict[str, Handoff] = {}  # paced leads still delivering, by request
        self.md_lost: set[str] = set()  # held here, their MD lost: no handoff, finished here
        # finished here before any handover: the clock held until the frontend settles them
        self.ends_held: dict[str, InstantHold] = {}
        self.md_cost = cost_model(self.config, spec.system, "MD")
        self._kv_lock = asyncio.Lock()
        wan = self.config.wan
        self.to_md = DelayEstimate(wan.delay_s, wan.jitter_s)  # MD echoes its parts' delays
        self.from_md = DelayEstimate(wan.delay_s, wan.jitter_s)  # MD's messages are stamped

    async def kv_arrived(
        self, request: DecodeRequest, first_token: int, begin: dict[str, Any], genuine_bytes: int
    ) -> None:
        ready = self.md_ready_early.pop(request.rid, None) or self.md_ready_unknown.pop(
            request.rid, None
        )
        if request.rid in self.released:
            self.released.discard(request.rid)
            self.md_lost.discard(request.rid)
            await self.release_memory(request)
            return
        request.on_step = self.after_step
        await self.start_stream(request, first_token)
        if ready is not None and not request.finished:
            self.open_handoff(request, ready)

    # -- the handoff's estimates -------------------------------------------------------

    def outlook(self, request: DecodeRequest, handoff: Handoff) -> HandoffOutlook:
        """The relay's and MD's step times and the WAN's one way, as they look now."""
        batch = [r for r in self.requests.values() if r.decoding and not r.finished]
        relay_step = self.cost.decode_step([self.modelled_context(r) for r in batch or [request]])
        context = self.modelled_context(request)
        md_batch = [(1, c) for c in handoff.md_batch]

        def absorb(tokens: int) -> float:
            """MD's fused step with a part of `tokens` (extend), or the KV's transfer and copy
            (kv-delta)."""
            tokens = max(1, tokens)
            if self.config.policy.handoff_payload == "extend":
                return self.md_cost.forward_step([*md_batch, (tokens, context)])
            rate = self.config.wan.rate_bps or float("inf")
            kv = tokens * self.md_cost.target.kv_bytes_per_token
            return 8 * kv / rate + self.md_cost.kv_copy(tokens)

        return HandoffOutlook(
            pending_tokens=request.position - handoff.sent_position,
            relay_step_s=relay_step,
            md_step_s=self.md_cost.decode_step([c for _, c in md_batch] + [context]),
            round_trip_s=self.to_md.margin() + self.from_md.margin(),
            absorb_s=absorb,
            relay_load=len(batch) / self.config.decode.max_batch,
        )

    def heard_from_md(self, body: dict[str, Any]) -> None:
        """A message from MD: a sample of the WAN's way back, and of the way there when it
        answers a handoff part (the part's delay, which MD measured)."""
        if "sent" in body:
            self.from_md.observe(max(0.0, self.clock.now() - float(body["sent"])))
        if "part_delay" in body:
            self.to_md.observe(max(0.0, float(body["part_delay"])))

    def open_handoff(self, request: DecodeRequest, ready: dict[str, Any]) -> None:
        handoff = Handoff(ONE_SHOT, list(ready.get("batch_contexts", [])))
        handoff.mode = choose_mode(self.config.policy, self.outlook(request, handoff))
        self.handoffs[request.rid] = handoff

    # -- messages from MD -----------------------------------------------------------------

    async def on_md_ready(self, message: Envelope) -> None:
        """MD holds the prompt KV: start the handoff (after the current step)."""
        rid = message.body["rid"]
        self.heard_from_md(message.body)
        if rid in self.md_lost:  # an MD that was given up for lost came back: too late
            return
        request = self.requests.get(rid)
        if request is None and self.expects(rid):  # on its way, perhaps waiting for memory
            self.md_ready_early[rid] = message.body
            return
        if request is None:  # its KV not begun here yet, or the request gone
            self.md_ready_unknown[rid] = message.body
            return
        if not request.finished:
            self.open_handoff(request, message.body)

    async def on_release(self, message: Envelope) -> None:
        """The request failed at the frontend: stop working on it."""
        rid = message.body["rid"]
        self.handoffs.pop(rid, None)
        self.forget_md_ready(rid)
        held = self.leads.pop(rid, None)
        if held is not None:
            held.held.clear()
            held.replan.set()
        request = self.requests.get(rid)
        if request is not None:
            await self.drop(request)
        elif message.body.get("kv_expected"):
            self.released.add(rid)

    async def on_md_lost(self, message: Envelope) -> None:
        """MD was lost: no handoff; this relay finishes the request (PDD's relay as the
        fallback), or says it no longer holds it."""
        rid = message.body["rid"]
        self.give_up_handoff(rid)
        if rid not in self.requests and not self.expects(rid):
            await message.channel.control("stream_lost", {"rid": rid, "instance": self.name})

    def give_up_handoff(self, rid: str) -> None:
        """No handoff to MD (lost): the request is finished here, and a lead held back for
        MD's takeover goes on at once, at the times its tokens were produced: there is no MD
        to pace it to."""
        if rid in self.requests or self.expects(rid):
            self.md_lost.add(rid)
        self.handoffs.pop(rid, None)
        self.forget_md_ready(rid)
        held = self.leads.get(rid)
        if held is not None:  # kept, so that its groups still leave in order
            held.paced_from = math.inf  # no position is the lead's any more
            held.replan.set()  # the group waiting for its paced time goes now

    def forget_md_ready(self, rid: str) -> None:
        self.md_ready_early.pop(rid, None)
        self.md_ready_unknown.pop(rid, None)

    def transfer_cut(self, rid: str, kv: KV) -> None:
        """The request's KV will not come: what was kept for it is forgotten."""
        self.md_lost.discard(rid)
        self.forget_md_ready(rid)

    async def on_settled(self, message: Envelope) -> None:
        """The frontend has done what the end of a request finished here asks of it
        (`to_frontend`): time goes on."""
        hold = self.ends_held.pop(message.body["rid"], None)
        if hold is not None:
            hold.release()

    async def on_md_eta(self, message: Envelope) -> None:
        """MD's prediction of when it produces the token at the switch, from its own steps as
        they happen: the lead still held here is re-paced to end one MD step before that token
        reaches the user."""
        self.heard_from_md(message.body)
        handoff = self.leads.get(message.body["rid"])
        if handoff is None:
            return
        handoff.md_first_at = float(message.body["at"]) + self.from_md.margin()
        handoff.md_step_s = float(message.body["step_s"])
        handoff.replan.set()

    async def on_caught_up(self, message: Envelope) -> None:
        self.heard_from_md(message.body)
        handoff = self.handoffs.get(message.body["rid"])
        if handoff is not None:
            handoff.waiting = False
            handoff.md_batch = list(message.body.get("batch_contexts", handoff.md_batch))

    # -- the handoff ----------------------------------------------------------------------

    async def after_step(self, request: DecodeRequest) -> None:
        handoff = self.handoffs.get(request.rid)
        if handoff is None:
            return
        if handoff.finishing:
            if request.position < request.planned:
                return
            handoff.finishing = False  # it outlived the prediction: hand it over after all
        if handoff.switch is not None:
            if request.position >= handoff.switch:
                await self.hand_over(request)
            return
        if handoff.waiting or request.position < self.config.policy.handoff_after_eager_tokens:
            return
        pending = request.position - handoff.sent_position
        threshold = self.config.policy.catch_up_threshold_tokens
        final = handoff.mode == ONE_SHOT or pending <= threshold
        if not final:
            if len(request.outputs) - 1 > handoff.sent_upto:  # new outputs with KV here
                await self.send_part(request, handoff, None)
            return
        switch, pace = self.switch_position(request, handoff)
        if request.position < request.planned <= switch:
            # predicted to end here before the switch: nothing to hand over (unless it outlives
            # the prediction; the true end is known only when it comes)
            handoff.finishing = True
            return
        now = self.clock.now()
        self.events.record(  # the plan, beside what came of it (MD's and the frontend's times)
            "handoff_plan",
            request.rid,
            now,
            now,
            mode=handoff.mode,
            position=request.position,
            switch=switch,
            pace_s=pace,
            to_md_s=self.to_md.margin(),
            from_md_s=self.from_md.margin(),
        )
        if pace > 0:
            handoff.pace_s, handoff.paced_from = pace, request.position
            handoff.delivered_at = request.produced[-1] if request.produced else self.clock.now()
            self.leads[request.rid] = handoff
        await self.send_part(request, handoff, switch)
        if request.position >= switch:
            await self.hand_over(request)

    def switch_position(self, request: DecodeRequest, handoff: Handoff) -> tuple[int, float]:
        """Where MD is to take the stream over, named in the final part, and the pace of the
        positions until then: here and now (one-shot), or after a lead (catch-up)."""
        if handoff.mode == ONE_SHOT:
            return request.position, 0.0
        part_tokens = self.group_start(len(request.outputs) - 1) - handoff.sent_position
        threshold = self.config.policy.catch_up_threshold_tokens
        planned = lead(self.outlook(request, handoff), part_tokens, threshold)
        return request.position + planned.tokens, planned.pace_s

    async def hand_over(self, request: DecodeRequest) -> None:
        """The switch position is reached: the user keeps what was produced; MD streams on,
        unless it was lost meanwhile (its part could not be sent, or the router said so while
        this sent): then the request stays here to its end."""
        await self.flush(request)
        if request.rid in self.md_lost:
            return
        handoff = self.handoffs.pop(request.rid, None)
        if handoff is not None:
            handoff.handed_over = True
            if not handoff.held and request.rid in self.leads:
                del self.leads[request.rid]
        await self.drop(request)

    async def send_tokens(self, request: DecodeRequest, body: dict[str, Any]) -> None:
        """A paced lead's token groups are held here (an output buffer; the relay decodes on
        meanwhile) and each sent when its last position's delivery time comes."""
        handoff = self.leads.get(request.rid)
        if handoff is None:
            await self.to_frontend(request, body)
            return
        handoff.held.append(body)
        if handoff.sender is None or handoff.sender.done():
            handoff.sender = self.spawn(
                self._deliver_lead(request, handoff), f"paced tokens of {request.rid}"
            )

    async def to_frontend(self, request: DecodeRequest, body: dict[str, Any]) -> None:
        """Send a group of tokens to the frontend. The last of a P-RLD-MD request, which this
        relay finishes before any handover, leaves under an instant hold (`end_held`) that
        stands until the frontend has settled the request (`settled`): what it does at that
        end (the anomaly filter's cut of P's transfer to MD, the release of MD's copy) then
        acts at the end's modelled time, however late the frontend reads the token."""
        frontend = request.meta["frontend"]
        last = int(body["first"]) + len(body["times"])
        ends_here = request.meta.get("pipeline") == "P-RLD-MD" and request.ended(last)
        if ends_here and self.exact(frontend) and request.rid not in self.ends_held:
            for rid in [rid for rid, hold in self.ends_held.items() if hold.released]:
                del self.ends_held[rid]  # let go at the hold's cap: the frontend never said
            hold = self.clock.hold_instant()
            if not hold.released:  # a shared clock (real time holds nothing)
                self.ends_held[request.rid] = hold
                body = {**body, "end_held": True}
        try:
            await super().send_tokens(request, body)
        except BaseException:  # the frontend will not say `settled` for an end it never got
            hold = self.ends_held.pop(request.rid, None) if body.get("end_held") else None
            if hold is not None:
                hold.release()
            raise

    def lead_times(self, handoff: Handoff, body: dict[str, Any]) -> list[float]:
        """Delivery times of a held group's positions: `pace_s` apart at the earliest, as
        planned; once MD has said when its token at the switch S reaches the user, spread
        evenly from the last one delivered so that S - 1 comes one MD step before it (never
        before a position was produced)."""
        times, delivered_at = [], handoff.delivered_at
        last = body["first"] - 1  # the position delivered at `delivered_at` (or before it)
        switch = math.inf if handoff.switch is None else handoff.switch
        for position, produced in enumerate(body["times"], start=body["first"]):
            if handoff.paced_from <= position < switch:
                step = handoff.pace_s
                if handoff.md_first_at is not None:
                    end = handoff.md_first_at - handoff.md_step_s
                    step = paced_step(delivered_at, end, switch - 1 - last)
                delivered_at = produced = max(produced, delivered_at + step)
                last = position
            elif position < handoff.paced_from:  # produced before the lead: goes as it is
                delivered_at, last = max(delivered_at, produced), position
            times.append(produced)
        return times

    async def _deliver_lead(self, request: DecodeRequest, handoff: Handoff) -> None:
        """Send the held groups in order, each when its last position is due; a new `md_eta`
        re-plans the group waiting."""
        while handoff.held:
            body = handoff.held[0]
            handoff.replan.clear()
            times = self.lead_times(handoff, body)
            due = asyncio.ensure_future(self.clock.sleep_until(times[-1]))
            replanned = asyncio.ensure_future(handoff.replan.wait())
            await asyncio.wait({due, replanned}, return_when=asyncio.FIRST_COMPLETED)
            for waiting in (due, replanned):
                waiting.cancel()
            if not due.done() or due.cancelled() or not handoff.held:
                continue  # re-plan (or released meanwhile)
            handoff.held.popleft()
            handoff.delivered_at = times[-1]
            await self.to_frontend(request, {**body, "times": times})
        if handoff.handed_over and self.leads.get(request.rid) is handoff:
            del self.leads[request.rid]

    async def send_part(self, request: DecodeRequest, handoff: Handoff, switch: int | None) -> None:
        """Send MD the outputs it lacks; the final part (`switch` given) also the last id, the
        position MD decodes on from and the one it streams from."""
        payload = self.config.policy.handoff_payload
        final = switch is not None
        start, end = handoff.sent_upto, len(request.outputs) - 1
        ids = request.outputs[start:end]
        body: dict[str, Any] = {
            "rid": request.rid,
            "start": start,
            "end": end,
            "final": final,
            "mode": handoff.mode,
            "payload": payload,
            "ids": ids if payload == "kv-delta" else None,
            "sent_at": self.clock.now(),
        }
        if payload == "extend":
            attachments: list[Any] = [TokenIds.from_ints(request.rid, start, ids)] if ids else []
        else:
            kv = request.kv.token_slice(request.prompt_len + start, request.prompt_len + end)
            attachments = (
                [kv_chunk_from_tensor(request.rid, 0, request.prompt_len + start, kv.tensor)]
                if kv.tokens
                else []
            )
        if final:
            body["last_id"] = request.outputs[-1]
            body["position"] = request.position  # MD decodes on from here ...
            body["switch"] = switch  # ... and streams from here
        now = body["sent_at"]
        if handoff.started_at is None:
            handoff.started_at = now
        handoff.sent_upto = end
        handoff.sent_position = self.group_start(end)
        handoff.rounds += 1
        handoff.waiting = not final
        handoff.switch = switch
        try:
            if payload == "extend":
                sent = await self.tell(request.meta["md"], "handoff", body, *attachments)
            else:
                channel = await self.kv_channel(request.meta["md"])
                sent = await channel.send(Control("handoff", body), *attachments)
        except OSError as error:
            # MD is gone (its connection refused or broken) before the router has said so:
            # as when it does, this relay finishes the request; the step and its other
            # requests go on
            log.warning(
                "%s: handoff of %s to %s failed: %r",
                self.name,
                request.rid,
                request.meta["md"],
                error,
            )
            self.give_up_handoff(request.rid)
            return
        handoff.bytes += sent
        kv_bytes = sum(a.nbytes for a in attachments if not isinstance(a, TokenIds))
        await self.tell(
            request.meta["frontend"],
            "handoff_sent",
            {
                "rid": request.rid,
                "mode": handoff.mode,
                "rounds": handoff.rounds,
                "bytes": sent,  # genuine bytes on the WAN: framing + ids or KV
                "kv_bytes": kv_bytes,  # of which KV
                "ids": len(ids),  # genuine ids (each stands for token_scale modelled ones)
                "final": final,
                "payload": payload,
                "switch": switch,
                "started_at": handoff.started_at,
                "sent_at": now,
            },
        )

    async def kv_channel(self, name: str) -> Channel:
        """The connection KV-delta parts go to MD `name` on (opened once, reopened if closed):
        a KV connection, not the control one."""
        key = f"{name} (kv)"  # kept with the peers' connections, closed with them
        async with self._kv_lock:
            channel = self._peers.get(key)
            if channel is None or channel.closed:
                channel = self._peers[key] = await self.open(name, "kv")
            return channel

    async def finished(self, request: DecodeRequest) -> None:
        await super().finished(request)
        self.handoffs.pop(request.rid, None)
        self.leads.pop(request.rid, None)
        self.md_lost.discard(request.rid)

    async def drop(self, request: DecodeRequest) -> None:
        await super().drop(request)
        self.md_lost.discard(request.rid)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "handoffs_open": len(self.handoffs)}
