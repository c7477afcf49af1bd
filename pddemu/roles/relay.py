"""RLD: relay decode next to P. It decodes a low-hit request as soon as its KV arrives over the
intra-DC path and streams these eager tokens to the user while MD's copy of the KV crawls
across the WAN; when MD has it, RLD hands the request over.

Handoff modes (`policy.handoff_mode`):
- one-shot: stop at once and send everything MD lacks; RLD is freed soonest, MD stalls once;
- catch-up: keep decoding and send what MD lacks in parts; when at most
  `catch_up_threshold_tokens` (modelled) are pending, send the last part and keep streaming until
  MD says it has taken over, so the user sees no gap (positions both produced are deduplicated
  by the frontend, which checks they agree);
- adaptive (default): one-shot when this RLD's batch is at least `adaptive_load_threshold`
  full, catch-up otherwise.
Payloads (`policy.handoff_payload`): extend (token ids; MD recomputes their KV in one pass)
or kv-delta (the eager tokens' KV).

What MD needs at a handoff: the outputs whose KV exists here (all but the last id, see
`decode.py`) as ids or KV, and, with the final part, the last id and the modelled position
from which MD continues the stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pddemu.roles.decode import DecodeInstance, DecodeRequest
from pddemu.runtime.channel import Envelope
from pddemu.wire import TokenIds
from pddemu.wire.tensors import kv_chunk_from_tensor


@dataclass
class Handoff:
    mode: str  # one_shot | catch_up
    sent_upto: int = 0  # genuine outputs MD holds (as KV) from the parts sent
    sent_position: int = 0  # modelled output position those parts cover
    final_sent: bool = False
    rounds: int = 0
    bytes: int = 0
    waiting: bool = False  # a part is in flight: wait for MD's answer


class RelayInstance(DecodeInstance):
    role = "RLD"

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.handoffs: dict[str, Handoff] = {}
        self.md_ready_early: set[str] = set()  # MD was ready before this relay had the request
        self.released: set[str] = set()  # ended while their KV was on its way here

    async def kv_arrived(
        self, request: DecodeRequest, first_token: int, begin: dict[str, Any], genuine_bytes: int
    ) -> None:
        if request.rid in self.released:
            self.released.discard(request.rid)
            await self.release_memory(request)
            return
        request.on_step = self.after_step
        await self.start_stream(request, first_token)
        if request.rid in self.md_ready_early and not request.finished:
            self.md_ready_early.discard(request.rid)
            self.handoffs[request.rid] = Handoff(self.choose_mode())

    def choose_mode(self) -> str:
        policy = self.config.policy
        if policy.handoff_mode == "one-shot":
            return "one_shot"
        if policy.handoff_mode == "catch-up":
            return "catch_up"
        load = sum(1 for r in self.requests.values() if r.decoding) / self.config.decode.max_batch
        return "one_shot" if load >= policy.adaptive_load_threshold else "catch_up"

    # -- messages from MD -----------------------------------------------------------------

    async def on_md_ready(self, message: Envelope) -> None:
        """MD holds the prompt KV: start the handoff (after the current step)."""
        rid = message.body["rid"]
        request = self.requests.get(rid)
        if request is None:  # still waiting for memory here, or already gone
            self.md_ready_early.add(rid)
            return
        if not request.finished:
            self.handoffs[rid] = Handoff(self.choose_mode())

    async def on_release(self, message: Envelope) -> None:
        """The request failed at the frontend: stop working on it."""
        rid = message.body["rid"]
        self.handoffs.pop(rid, None)
        self.md_ready_early.discard(rid)
        request = self.requests.get(rid)
        if request is not None:
            await self.drop(request)
        elif message.body.get("kv_expected"):
            self.released.add(rid)

    async def on_caught_up(self, message: Envelope) -> None:
        handoff = self.handoffs.get(message.body["rid"])
        if handoff is not None:
            handoff.waiting = False

    async def on_took_over(self, message: Envelope) -> None:
        """MD streams from here on: send what this instance produced meanwhile, and stop."""
        request = self.requests.get(message.body["rid"])
        self.handoffs.pop(message.body["rid"], None)
        if request is not None and not request.finished:
            await self.flush(request)
            await self.drop(request)

    # -- the handoff ----------------------------------------------------------------------

    async def after_step(self, request: DecodeRequest) -> None:
        handoff = self.handoffs.get(request.rid)
        if handoff is None or handoff.final_sent or handoff.waiting:
            return
        pending = request.position - handoff.sent_position
        final = (
            handoff.mode == "one_shot" or pending <= self.config.policy.catch_up_threshold_tokens
        )
        ready = len(request.outputs) - 1  # outputs whose KV exists here
        if not final and ready <= handoff.sent_upto:
            return  # nothing new to send yet
        if final and handoff.mode == "one_shot":
            await self.flush(request)  # the user keeps what was produced; MD continues from here
            request.decoding = False
        await self.send_part(request, handoff, final)

    async def send_part(self, request: DecodeRequest, handoff: Handoff, final: bool) -> None:
        payload = self.config.policy.handoff_payload
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
            body["position"] = request.position  # MD produces the stream from here
        handoff.sent_upto = end
        handoff.sent_position = self.group_start(end)
        handoff.rounds += 1
        handoff.waiting = not final
        handoff.final_sent = final
        sent = await self.tell(request.meta["md"], "handoff", body, *attachments)
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
            },
        )
        if final and handoff.mode == "one_shot":
            self.handoffs.pop(request.rid, None)
            await self.drop(request)

    async def finished(self, request: DecodeRequest) -> None:
        await super().finished(request)
        self.handoffs.pop(request.rid, None)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "handoffs_open": len(self.handoffs)}
