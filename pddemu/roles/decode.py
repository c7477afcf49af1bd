"""The decode engine shared by RLD, MD and a baseline's decode instance.

Continuous batching: every step decodes one genuine token for each running request (up to
`max_batch`), which stands for `token_scale` modelled tokens, so the step's modelled duration is
that many modelled decode steps; requests join and leave between steps. A request's state is its
KV (prompt and the outputs whose KV is computed) and its outputs; the last output is the one the
next step feeds in. Tokens go to the frontend with the modelled time of every modelled token
they stand for, so per-token latency survives the token scale.

Extends (MD catching up after a handoff) and KV appends (KV-delta handoffs) run as their own
steps between decode steps.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pddemu.model import TinyTransformer, greedy
from pddemu.model.kv import KV
from pddemu.roles.base import Instance
from pddemu.roles.spec import InstanceSpec
from pddemu.runtime.channel import Envelope
from pddemu.wire import KVChunk
from pddemu.wire.tensors import kv_tensor


@dataclass
class DecodeRequest:
    rid: str
    meta: dict[str, Any]
    kv: KV
    prompt_len: int  # genuine prompt tokens
    outputs: list[int] = field(default_factory=list)  # genuine output tokens so far
    decoding: bool = False  # in the batch
    streaming: bool = False  # sends its tokens to the frontend
    finished: bool = False
    reserved: int = 0  # modelled tokens of KV memory held for this request
    on_step: Callable[[DecodeRequest], Awaitable[None]] | None = None  # role hook after each step

    @property
    def total(self) -> int:
        """Genuine output tokens to produce."""
        return int(self.meta["genuine_output_tokens"])


@dataclass
class SideStep:
    """Work that is not a decode step: an extend or a KV append for one request."""

    request: DecodeRequest
    run: Callable[[], float]  # does the genuine work, returns the modelled duration
    then: Callable[[float], Awaitable[None]]  # called with the step's modelled end time


class DecodeInstance(Instance):
    def __init__(self, spec: InstanceSpec) -> None:
        super().__init__(spec)
        self.model = TinyTransformer(self.model_config)
        self.requests: dict[str, DecodeRequest] = {}
        self.side_steps: deque[SideStep] = deque()
        self.work = asyncio.Event()
        self.tokens_generated = 0  # modelled
        self.memory = asyncio.Condition()
        self.kv_reserved = 0  # modelled tokens of KV held by the requests here
        self.admission_waits = 0

    async def start(self) -> None:
        self.spawn(self.loop(), "decode loop")

    # -- token accounting ---------------------------------------------------------------

    def modelled_count(self, request: DecodeRequest, index: int) -> int:
        """Modelled tokens that genuine output `index` stands for."""
        total = int(request.meta["output_tokens"])
        if index == 0:
            return 1
        return max(
            0,
            min(
                self.config.scale.token_scale,
                total - 1 - (index - 1) * self.config.scale.token_scale,
            ),
        )

    def modelled_outputs(self, request: DecodeRequest, genuine: int) -> int:
        """Modelled tokens that the first `genuine` outputs stand for."""
        if genuine <= 0:
            return 0
        total = int(request.meta["output_tokens"])
        return min(total, 1 + (genuine - 1) * self.config.scale.token_scale)

    def modelled_context(self, request: DecodeRequest) -> int:
        return int(request.meta["input_tokens"]) + self.modelled_outputs(
            request, len(request.outputs)
        )

    # -- the loop -----------------------------------------------------------------------

    async def loop(self) -> None:
        while True:
            await self.work.wait()
            if self.side_steps:
                await self._side_step(self.side_steps.popleft())
                continue
            batch = [r for r in self.requests.values() if r.decoding and not r.finished][
                : self.config.decode.max_batch
            ]
            if not batch:
                self.work.clear()
                continue
            await self._decode_step(batch)

    async def _decode_step(self, batch: list[DecodeRequest]) -> None:
        started = self.clock.now()
        wall = time.monotonic()
        step_kvs, logits = self.model.decode_batch(
            [r.outputs[-1] for r in batch], [r.kv for r in batch]
        )
        new_tokens = [greedy(logits[i]) for i in range(len(batch))]
        for request, kv in zip(batch, step_kvs, strict=True):
            request.kv.append(kv)
        genuine_s = (time.monotonic() - wall) * self.config.scale.time_scale
        per_token = self.cost.decode_step([self.modelled_context(r) for r in batch])
        groups = [self.modelled_count(r, len(r.outputs)) for r in batch]
        duration = per_token * max(groups)
        late = await self.clock.sleep_until(started + duration)
        self.record_step(started, duration, max(late, genuine_s - duration, 0.0))
        for request, token, group in zip(batch, new_tokens, groups, strict=True):
            times = [started + per_token * (i + 1) for i in range(group)]
            await self.emit(request, token, times)
            if request.on_step is not None:
                await request.on_step(request)

    async def _side_step(self, step: SideStep) -> None:
        started = self.clock.now()
        wall = time.monotonic()
        duration = step.run()
        genuine_s = (time.monotonic() - wall) * self.config.scale.time_scale
        late = await self.clock.sleep_until(started + duration)
        self.record_step(started, duration, max(late, genuine_s - duration, 0.0))
        await step.then(started + duration)

    def add_side_step(self, step: SideStep) -> None:
        self.side_steps.append(step)
        self.work.set()

    def start_decoding(self, request: DecodeRequest) -> None:
        request.decoding = True
        self.work.set()

    # -- emitting tokens ------------------------------------------------------------------

    async def emit(self, request: DecodeRequest, token: int, times: list[float]) -> None:
        """Record a new output token; stream it when this instance owns the request's stream."""
        index = len(request.outputs)
        request.outputs.append(token)
        self.tokens_generated += len(times)
        if request.streaming:
            await self.tell(
                request.meta["frontend"],
                "tokens",
                {
                    "rid": request.rid,
                    "index": index,
                    "id": token,
                    "times": times,
                    "sent": self.clock.now(),
                    "source": self.name,
                    "role": self.role,
                },
            )
        if len(request.outputs) >= request.total:
            request.finished = True
            request.decoding = False
            await self.finished(request)

    async def finished(self, request: DecodeRequest) -> None:
        """The request produced its last token (subclasses release what they hold)."""
        self.requests.pop(request.rid, None)
        await self.release_memory(request)

    async def drop(self, request: DecodeRequest) -> None:
        """The request leaves this instance before its end (handed over, or ended elsewhere)."""
        request.decoding = False
        request.streaming = False
        self.requests.pop(request.rid, None)
        await self.release_memory(request)

    async def reserve_memory(self, request: DecodeRequest) -> None:
        """Wait until the request's whole KV (prompt and outputs) fits beside the others'.

        A request that does not fit waits for earlier ones to finish (it is admitted alone
        when nothing else holds memory, so a too-long request still runs).
        """
        need = int(request.meta["input_tokens"]) + int(request.meta["output_tokens"])
        capacity = self.cost.kv_capacity_tokens()
        async with self.memory:
            if self.kv_reserved + need > capacity:
                self.admission_waits += 1
            await self.memory.wait_for(lambda: self.kv_reserved == 0 or self.kv_reserved + need <= capacity)
            self.kv_reserved += need
            request.reserved = need

    async def release_memory(self, request: DecodeRequest) -> None:
        async with self.memory:
            self.kv_reserved -= request.reserved
            request.reserved = 0
            self.memory.notify_all()

    # -- KV arriving from P ---------------------------------------------------------------

    def receiving(self) -> dict[str, dict[str, Any]]:
        if not hasattr(self, "_receiving"):
            self._receiving: dict[str, dict[str, Any]] = {}
        return self._receiving

    async def on_kv_begin(self, message: Envelope) -> None:
        body = message.body
        prompt_len = int(body["prompt_tokens"])
        kv = KV.empty(
            self.model_config, capacity=prompt_len + int(body["meta"]["genuine_output_tokens"]) + 1
        )
        prefix = self.prefix_for(body["rid"], int(body["offset"]))
        if prefix is not None:
            kv.append(prefix)
        self.receiving()[body["rid"]] = {
            "kv": kv,
            "body": body,
            "channel": message.channel,
            "bytes": 0,
        }

    async def on_kv_chunk(self, chunk: KVChunk, channel: Any) -> None:
        state = self.receiving().get(chunk.request_id)
        if state is None:
            raise ValueError(f"KV chunk for {chunk.request_id} without kv_begin")
        if chunk.token_start != state["kv"].tokens:
            raise ValueError(
                f"KV chunk of {chunk.request_id} starts at {chunk.token_start}, expected {state['kv'].tokens}"
            )
        state["kv"].append(KV(kv_tensor(chunk)))
        state["bytes"] += chunk.nbytes

    async def on_kv_end(self, message: Envelope) -> None:
        rid = message.body["rid"]
        state = self.receiving().pop(rid, None)
        if state is None:
            raise ValueError(f"kv_end for {rid} without kv_begin")
        body = state["body"]
        if state["kv"].tokens != int(body["prompt_tokens"]):
            raise ValueError(
                f"{rid}: KV has {state['kv'].tokens} tokens, prompt has {body['prompt_tokens']}"
            )
        request = DecodeRequest(rid, body["meta"], state["kv"], int(body["prompt_tokens"]))
        await self.reserve_memory(request)
        await self.kv_arrived(request, int(message.body["first_token"]), body, state["bytes"])

    def prefix_for(self, rid: str, offset: int) -> KV | None:
        """KV of the first `offset` prompt tokens, which this instance already holds."""
        if offset:
            raise ValueError(f"{self.role} holds no prefix, but {rid} was sent from {offset}")
        return None

    async def kv_arrived(
        self, request: DecodeRequest, first_token: int, begin: dict[str, Any], genuine_bytes: int
    ) -> None:
        raise NotImplementedError

    async def start_stream(self, request: DecodeRequest, first_token: int) -> None:
        """Own the request's stream from its first token (the one P computed) and decode on."""
        self.requests[request.rid] = request
        request.streaming = True
        await self.emit(request, first_token, [self.clock.now()])
        if not request.finished:
            self.start_decoding(request)

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "tokens_generated": self.tokens_generated,
            "active": len(self.requests),
        }
