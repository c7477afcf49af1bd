"""MD: main decode across the WAN (and, with other wiring, a baseline's decode instance D).

It keeps a decode-side radix cache (DRC) of prompt KV, so the frontend can ask how much of a
prompt it already holds (`match`, which pins that prefix) and P sends only the rest. Then:
- pipeline P-MD (and the baselines): MD owns the stream from the first token;
- pipeline P-RLD-MD: MD tells the relay it has the KV (`md_ready`) and takes the request over
  through the relay's handoff parts: token ids it extends in one forward pass, or KV it appends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pddemu.model import greedy
from pddemu.model.kv import KV
from pddemu.roles.decode import DecodeInstance, DecodeRequest, SideStep
from pddemu.roles.prefix_store import PrefixKVStore
from pddemu.roles.sizing import kv_copy_time
from pddemu.runtime.channel import Envelope
from pddemu.wire.tensors import kv_tensor


@dataclass
class Pinned:
    """A prefix held for a request: from the frontend's match until the KV has arrived."""

    prompt: list[int]
    length: int
    node: Any
    handles: list = field(default_factory=list)


class MainDecodeInstance(DecodeInstance):
    role = "MD"

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.role = spec.me.role  # MD, or D for a baseline
        capacity = self.kv_capacity_genuine() if self.config.policy.drc else 0
        self.store = PrefixKVStore(self.page_tokens, capacity)
        self.matches: dict[str, Pinned] = {}
        self.held: dict[str, Any] = {}  # rid -> DRC node pinned while the request decodes here
        self.released: set[str] = set()
        self.known: dict[str, list[int]] = {}  # outputs received in handoff parts (KV computed)
        self.next_token: dict[str, int] = {}  # what the last extend predicts

    # -- the frontend's questions ---------------------------------------------------------

    async def on_match(self, message: Envelope) -> None:
        rid = message.body["rid"]
        prompt = message.token_ids()
        length, node, handles = (
            self.store.match(prompt) if self.config.policy.drc else (0, None, [])
        )
        length = min(length, len(prompt) - 1)
        length -= length % self.page_tokens
        self.matches[rid] = Pinned(prompt, length, node, handles)
        await message.channel.control("matched", {"rid": rid, "hit": length, "instance": self.name})

    async def on_release(self, message: Envelope) -> None:
        """The request ended elsewhere (relay-only, finished on the relay, or failed)."""
        rid = message.body["rid"]
        self._unpin_match(rid)
        request = self.requests.get(rid)
        if request is not None and not request.streaming:
            await self.drop(request)
            self._release_held(rid)
        elif request is None:
            self.released.add(rid)

    def _unpin_match(self, rid: str) -> None:
        pinned = self.matches.pop(rid, None)
        if pinned is not None and pinned.node is not None:
            self.store.release(pinned.node)

    def _release_held(self, rid: str) -> None:
        node = self.held.pop(rid, None)
        if node is not None:
            self.store.release(node)
        self.known.pop(rid, None)

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
        pinned = self.matches.get(rid)
        if self.config.policy.drc and pinned is not None:
            self.held[rid] = self.store.insert(
                pinned.prompt, request.kv.token_slice(0, request.prompt_len)
            )
        self._unpin_match(rid)
        await self.tell(
            request.meta["frontend"],
            "kv_arrived",
            {
                "rid": rid,
                "bytes": genuine_bytes,
                "offset": begin["offset"],
                "at": self.clock.now(),
            },
        )
        if rid in self.released:
            self.released.discard(rid)
            self._release_held(rid)
            await self.release_memory(request)
            return
        if request.meta["pipeline"] == "P-RLD-MD":
            self.requests[rid] = request
            self.known[rid] = []
            await self.tell(request.meta["rld"], "md_ready", {"rid": rid})
            return
        await self.start_stream(request, first_token)

    # -- handoff from the relay -----------------------------------------------------------

    async def on_handoff(self, message: Envelope) -> None:
        body = message.body
        rid = body["rid"]
        request = self.requests.get(rid)
        if request is None:
            raise ValueError(f"handoff for {rid}, which is not waiting here")
        known = self.known[rid]
        if int(body["start"]) != len(known):
            raise ValueError(
                f"{rid}: handoff part starts at {body['start']}, MD has {len(known)} outputs"
            )
        if body["payload"] == "extend":
            ids = message.token_ids()
            self.add_side_step(
                SideStep(
                    request,
                    lambda: self._extend(request, ids),
                    lambda at: self._after_part(request, body, at),
                )
            )
        else:
            chunks = message.kv_chunks()
            self.add_side_step(
                SideStep(
                    request,
                    lambda: self._append(request, chunks, body),
                    lambda at: self._after_part(request, body, at),
                )
            )

    def _extend(self, request: DecodeRequest, ids: list[int]) -> float:
        kv, logits = self.model.extend(ids, request.kv)
        request.kv.append(kv)
        known = self.known[request.rid]
        context = self.modelled_context_of(request, len(known))
        known.extend(ids)
        self.next_token[request.rid] = greedy(logits[-1])
        k = self.modelled_outputs(request, len(known)) - self.modelled_outputs(
            request, len(known) - len(ids)
        )
        return self.cost.extend_step(max(1, k), context)

    def _append(self, request: DecodeRequest, chunks: list, body: dict[str, Any]) -> float:
        """KV-delta: store the eager tokens' KV as it came; the final part's last id has none
        yet and is fed to the next decode step."""
        ids = [int(x) for x in body["ids"]]
        tokens = sum(chunk.token_end - chunk.token_start for chunk in chunks)
        if tokens != len(ids) - (1 if body["final"] else 0):
            raise ValueError(
                f"{request.rid}: KV-delta part has KV of {tokens} tokens for {len(ids)} ids"
            )
        for chunk in chunks:
            request.kv.append(KV(kv_tensor(chunk)))
        known = self.known[request.rid]
        known.extend(ids)
        modelled = self.modelled_outputs(request, len(known)) - self.modelled_outputs(
            request, len(known) - tokens
        )
        return kv_copy_time(self.cost, modelled)

    def modelled_context_of(self, request: DecodeRequest, outputs: int) -> int:
        return int(request.meta["input_tokens"]) + self.modelled_outputs(request, outputs)

    async def _after_part(self, request: DecodeRequest, body: dict[str, Any], at: float) -> None:
        rid = request.rid
        known = self.known[rid]
        if not body["final"]:
            await self.tell(request.meta["rld"], "caught_up", {"rid": rid, "upto": len(known)})
            return
        request.outputs = known
        self.known[rid] = []
        request.streaming = True
        if body["payload"] == "extend":
            index = len(known)
            await self.tell(request.meta["rld"], "took_over", {"rid": rid, "index": index})
            await self.emit(request, self.next_token.pop(rid), [at])
        else:
            await self.tell(
                request.meta["rld"], "took_over", {"rid": rid, "index": len(request.outputs)}
            )
        if not request.finished:
            self.start_decoding(request)

    async def finished(self, request: DecodeRequest) -> None:
        await super().finished(request)
        self._release_held(request.rid)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "drc_tokens": self.store.size_tokens}
