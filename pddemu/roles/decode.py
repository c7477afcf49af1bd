"""The decode engine shared by RLD, MD and a baseline's decode instance.

The loop runs one *modelled* decode step per iteration (continuous batching: requests join and
leave between steps, as in a real engine), so a request joins, is handed over or starts its
extend within one modelled step, whatever the token scale. With a token scale of G, a genuine
output token stands for a group of G modelled tokens: its id is computed (one genuine decode,
batched with the other requests starting a group in the same step) when the group starts, and
its G modelled tokens are produced over the next G modelled steps, each with its own time. A
group is sent to the frontend when it is complete, or when the request stops here mid-group
(a handoff), with the modelled time of every modelled token.

Request state: `outputs` are the genuine ids known; the KV covers the prompt and every output
but the last (the one the next genuine decode feeds in). `emitted` counts modelled output
positions already produced and passed on, `produced` holds the times of the current group's
tokens not yet passed on. Positions before `stream_from` are produced but not sent: another
instance (the relay) delivers them.

Extends (MD recomputing the KV of a relay's eager outputs at a handoff) run inside the batched
decode step, as chunked prefill piggybacks on decode: one forward pass over the batch's decode
tokens and the extend's tokens, costed by `CostModel.forward_step`. The same step takes over a
stream another instance lost (`resume_stream`): the outputs the user already has are extended
and checked against this model's own prediction, and decoding goes on from the next position.

No oracle: an instance does not know how long a request's output will be. It plans with the
router's prediction (`predicted_output_tokens` in the leg's meta; absent for a system without a
predictor, which plans no output at all) and learns the end only when it comes: the leg's
`output_tokens` is the position at which the model emits EOS (the workload's), read only by
`DecodeRequest.ended`, once per produced position.

A transfer's intake (the copy of its KV into the decode side's own structures, joining the
batch) is genuine work the modelled instance does in no time: modelled time is held from the
transfer's end until the request is taken in and, if it decodes at once, until its first step
holds the clock (`intake_done`), so a slow intake does not make that step late.

Memory is admitted before anything is allocated: a KV transfer begun (`kv_begin`) waits, apart
from its KV link, which other transfers share and which goes on meanwhile, until the request's
prompt and predicted output fit beside the others'; only then is its buffer made and its sender
told `kv_admitted`, and only then does it send the KV. A request that outlives its
prediction grows its reservation token by token as it decodes (never waiting: a running request
is not stalled; `kv_grown_tokens` counts the growth, and admission waits while it leaves too
little room). Every size a peer announces is bounded by what this instance can hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pddemu.model import TinyTransformer, greedy
from pddemu.model.kv import KV
from pddemu.roles.base import Instance
from pddemu.roles.recent import Recent
from pddemu.roles.spec import InstanceSpec
from pddemu.roles.transfer import first_chunk_end
from pddemu.runtime.channel import Envelope
from pddemu.runtime.clock import InstantHold
from pddemu.wire import KVChunk
from pddemu.wire.tensors import kv_tensor
from pddemu.workload.expansion import genuine_output_length, output_group_start, output_index

log = logging.getLogger("pddemu.decode")
# Where the decode loop stands, for an intake's hold (`DecodeInstance.intake_done`): waiting for
# work; on its way to a step (it holds the clock for that step before modelled time can move
# here); in a step's genuine work (the step holds the clock itself, and an intake now joins the
# next step); or waiting for a step's modelled end, and after it.
IDLE, STEPPING, COMPUTING, WAITING = "idle", "stepping", "computing", "waiting"


@dataclass
class DecodeRequest:
    rid: str
    meta: dict[str, Any]
    kv: KV
    prompt_len: int  # genuine prompt tokens
    outputs: list[int] = field(default_factory=list)  # genuine output ids known
    emitted: int = 0  # modelled output positions sent (or left to another instance)
    produced: list[float] = field(
        default_factory=list
    )  # times of the current group's unsent tokens
    decoding: bool = False  # in the batch
    streaming: bool = False  # sends its tokens to the frontend
    stream_from: int = 0  # modelled position from which this instance delivers (a handoff's switch)
    finished: bool = False
    reserved: int = 0  # modelled tokens of KV memory held for this request
    arrived: float = 0.0  # modelled time its KV was here, and memory for it
    on_step: Callable[[DecodeRequest], Awaitable[None]] | None = None  # role hook after each step
    intake_hold: InstantHold | None = None  # time held from its KV's end until it is taken in

    @property
    def planned(self) -> int:
        """Modelled output tokens the router predicts (0 without a prediction): what planning
        here (memory, the relay's handoff) goes by."""
        return round(float(self.meta.get("predicted_output_tokens", 0)))

    def ended(self, position: int) -> bool:
        """Whether the token at modelled `position` - 1 was the last (the model's EOS): asked
        of each position as it is produced, never to plan."""
        return position >= int(self.meta["output_tokens"])

    @property
    def position(self) -> int:
        """Modelled output tokens produced so far (sent or not)."""
        return self.emitted + len(self.produced)


class DecodeInstance(Instance):
    def __init__(self, spec: InstanceSpec) -> None:
        super().__init__(spec)
        self.model = TinyTransformer(self.model_config)
        self.requests: dict[str, DecodeRequest] = {}
        self.extends: deque[Extend] = deque()  # waiting for the next step
        self.work = asyncio.Event()
        self.tokens_generated = 0  # modelled
        self.memory = asyncio.Condition()
        self.kv_reserved = 0  # modelled tokens of KV held by the requests here
        self.kv_grown_tokens = 0  # reserved beyond predictions, as requests outlived them
        self.kv_peak_over_capacity_tokens = 0  # the most reserved beyond capacity at once
        self.admission_waits = 0
        self.last_end = -math.inf
        self.last_step_s = 0.0  # modelled duration of the last step
        self.admitting: set[str] = set()  # KV transfers begun, waiting for memory
        self.admissions: dict[str, Admission] = {}  # their waits, by request
        self.receiving: dict[str, dict[str, Any]] = {}  # KV transfers in progress, by request
        self.arriving: set[str] = set()  # KV complete, being taken in (kv_arrived)
        # over here while their KV was (or may have been) on its way: dropped when it comes
        self.released: Recent[None] = Recent()
        self.transfers_cut = 0  # transfers that ended before their kv_end (sender lost or cut)
        self.stale_link_messages = 0  # kv_cut / kv_end of an earlier transfer on its link
        self.resumed = 0  # streams taken over from a lost instance
        self.loop_state = IDLE
        self.intake_holds: list[InstantHold] = []  # let go when the loop's next step holds

    async def start(self) -> None:
        self.spawn(self.loop(), "decode loop")

    # -- modelled positions of genuine outputs --------------------------------------------

    def group_start(self, index: int) -> int:
        """Modelled output position where genuine output `index` begins (the first output is
        P's single modelled token; every later one stands for `token_scale` tokens)."""
        return output_group_start(index, self.config.scale.token_scale)

    def group_done(self, request: DecodeRequest) -> bool:
        """Whether the current genuine output's group is complete: all its modelled tokens
        produced, or the request's last token (EOS) among them."""
        position = request.position
        return position >= self.group_start(len(request.outputs)) or request.ended(position)

    def modelled_context(self, request: DecodeRequest) -> int:
        return int(request.meta["input_tokens"]) + request.position

    # -- the loop -------------------------------------------------------------------------

    async def loop(self) -> None:
        """Steps until the process ends. A step that fails takes down only its requests (they
        leave this instance, and the frontend moves them elsewhere), never the loop."""
        while True:
            self.loop_state = IDLE
            await self.work.wait()
            self.loop_state = STEPPING
            for extend in [e for e in self.extends if e.request.rid not in self.requests]:
                self.extends.remove(extend)  # released while it waited
            batch = [r for r in self.requests.values() if r.decoding and not r.finished]
            batch = batch[: self.config.decode.max_batch]
            if not batch and not self.extends:
                self.work.clear()
                self.last_end = -math.inf  # idle: the next step starts when its work arrives
                self._let_intakes_go()
                continue
            started = self._start_time(
                max(r.arrived for r in batch) if batch else self.extends[0].ready_at
            )
            extends = [e for e in self.extends if e.ready_at <= started]
            for extend in extends:
                self.extends.remove(extend)
            involved = batch + [e.request for e in extends]
            await self._guarded(self._step(started, batch, extends), involved)

    async def _guarded(self, step: Awaitable[None], requests: list[DecodeRequest]) -> None:
        try:
            await step
        except Exception as error:  # noqa: BLE001 - contain it to the requests of the step
            self.errors.append(f"step for {[r.rid for r in requests]}: {error!r}")
            log.exception("%s: step failed; dropping %s", self.name, [r.rid for r in requests])
            for request in requests:
                if self.requests.get(request.rid) is request:  # not finished in the step
                    await self.lose(request)

    async def lose(self, request: DecodeRequest) -> None:
        """Drop a request this instance cannot go on with, and tell the frontend, which moves
        it elsewhere (or fails it): nothing else would tell it that these tokens stop, and it
        would wait for them to its timeout."""
        await self.drop(request)
        lost = {"rid": request.rid, "instance": self.name}
        self.spawn(self.tell(request.meta["frontend"], "stream_lost", lost), f"{request.rid} lost")

    def _start_time(self, ready_at: float = -math.inf) -> float:
        """A step starts when the engine is free (the last step's end: back to back, however
        late this process woke from it) and its work is there (when it arrived, however late
        this process handled it): `Instance.step_start`."""
        return self.step_start(self.last_end, ready_at)

    def step_chunks(
        self, batch: list[DecodeRequest], extends: list[Extend]
    ) -> list[tuple[int, int]]:
        """The step's (new tokens, context) chunks, modelled: one token for each request of the
        batch, and each extend's tokens on top of what its request's KV holds."""
        return [(1, self.modelled_context(r)) for r in batch] + [
            (e.tokens, e.context) for e in extends
        ]

    async def _step(
        self, started: float, batch: list[DecodeRequest], extends: list[Extend]
    ) -> None:
        """One forward pass: the batch's decode tokens and the extends' tokens together."""
        duration = self.cost.forward_step(self.step_chunks(batch, extends))
        starting = [r for r in batch if self.group_done(r)]
        try:
            with self.genuine_work(started, duration):
                self._let_intakes_go()  # this step holds the clock now
                self.loop_state = COMPUTING  # an intake from here joins the next step
                for extend in extends:
                    extend.run()
                if starting:
                    step_kvs, logits = await self.compute(
                        self.model.decode_batch,
                        [r.outputs[-1] for r in starting],
                        [r.kv for r in starting],
                    )
                    for i, (request, kv) in enumerate(zip(starting, step_kvs, strict=True)):
                        request.kv.append(kv)
                        request.outputs.append(greedy(logits[i]))
        finally:  # from here the loop waits for the step's end: no hold may stand before it
            self.loop_state = WAITING
            self._let_intakes_go()
        rids = [r.rid for r in batch] + [e.request.rid for e in extends]
        end = self.last_end = await self.finish_step(started, duration, rids)
        self.last_step_s = duration
        for request in batch:
            if not request.decoding:  # stopped during the step (handed over)
                continue
            request.produced.append(end)
            self.tokens_generated += 1
            self.cover(request)
            if self.group_done(request):
                await self.flush(request)
            if request.on_step is not None and not request.finished:
                await request.on_step(request)
        for extend in extends:
            await extend.then(end)

    def intake_done(self, request: DecodeRequest) -> None:
        """The request is taken in (in the batch, if it decodes now): its intake's hold goes to
        the loop, which lets it go once its next step holds the clock; or at once, if the loop
        has nothing to step or waits for a step's modelled end (which the hold would keep
        from coming, or is inside a step's work, which holds the clock itself and ends before
        the request's first step). Before anything of the request is sent: a send may wait for the
        network, which moves only as modelled time does."""
        hold, request.intake_hold = request.intake_hold, None
        if hold is None:
            return
        if self.loop_state == STEPPING or (self.loop_state == IDLE and self.work.is_set()):
            self.intake_holds.append(hold)
        else:
            hold.release()

    def _let_intakes_go(self) -> None:
        holds, self.intake_holds = self.intake_holds, []
        for hold in holds:
            hold.release()

    def add_extend(self, extend: Extend) -> None:
        self.extends.append(extend)
        self.work.set()

    def start_decoding(self, request: DecodeRequest, at: float | None = None) -> None:
        """Join the batch from modelled time `at` (now by default: a handoff, a resumed
        stream), which its next step cannot start before."""
        at = self.clock.now() if at is None else at
        self.cover(request)
        request.arrived = max(request.arrived, at)
        self.events.begin("decode", request.rid, at)
        request.decoding = True
        self.work.set()

    # -- sending tokens -------------------------------------------------------------------

    async def flush(self, request: DecodeRequest) -> None:
        """Send the current group's produced tokens (all of it, or what exists when the request
        stops here mid-group), those from `stream_from` on; finish the request when its last
        token is out."""
        if request.produced:
            await self.send_group(request, self.take_group(request))

    def take_group(self, request: DecodeRequest) -> dict[str, Any] | None:
        """Take the current group's produced tokens off the request (they count as passed
        on); returns the message that sends those from `stream_from` on, if this instance
        streams any."""
        index = len(request.outputs) - 1
        times, request.produced = request.produced, []
        first = request.emitted
        request.emitted += len(times)
        skip = max(0, request.stream_from - first)
        times, first = times[skip:], first + skip
        if not (request.streaming and times):
            return None
        return {
            "rid": request.rid,
            "index": index,
            "id": request.outputs[index],
            "first": first,
            "times": times,
            "source": self.name,
            "role": self.role,
        }

    async def send_group(self, request: DecodeRequest, group: dict[str, Any] | None) -> None:
        """Send a group `take_group` took off the request; finish the request if its last
        token is out."""
        if group is not None:
            await self.send_tokens(request, group)
        if request.ended(request.emitted):
            request.finished = True
            request.decoding = False
            await self.finished(request)

    async def send_tokens(self, request: DecodeRequest, body: dict[str, Any]) -> None:
        """Hand a group's tokens to the frontend (the relay may hold them back: its pacing)."""
        await self.tell(request.meta["frontend"], "tokens", {**body, "sent": self.clock.now()})

    async def finished(self, request: DecodeRequest) -> None:
        """The request produced its last token (subclasses release what they hold)."""
        self.events.end("decode", request.rid, self.clock.now())
        self.requests.pop(request.rid, None)
        await self.release_memory(request)

    async def drop(self, request: DecodeRequest) -> None:
        """The request leaves this instance before its end (handed over, or ended elsewhere)."""
        self.events.end("decode", request.rid, self.clock.now())
        request.decoding = False
        request.streaming = False
        self.requests.pop(request.rid, None)
        await self.release_memory(request)

    # -- memory ---------------------------------------------------------------------------

    async def reserve_memory(self, request: DecodeRequest) -> None:
        """Reserve the request's KV as planned (prompt and predicted outputs), waiting until it
        fits."""
        request.reserved = await self.reserve_tokens(
            int(request.meta["input_tokens"]) + request.planned
        )

    def cover(self, request: DecodeRequest) -> None:
        """Grow the request's reservation to its KV so far, when it has outlived its
        prediction: at once (a running request does not wait for memory), so the instance may
        hold more than its capacity until requests end; new ones are admitted only below it."""
        short = self.modelled_context(request) - request.reserved
        if short > 0:
            request.reserved += short
            self.hold_tokens(short)
            self.kv_grown_tokens += short

    async def reserve_tokens(self, need: int) -> int:
        """Wait until `need` modelled tokens of KV (a request's prompt and outputs) fit beside
        the others'; returns what was reserved.

        A request that does not fit waits for earlier ones to finish (it is admitted alone
        when nothing else holds memory, so a too-long request still runs).
        """
        capacity = self.cost.kv_capacity_tokens()
        async with self.memory:
            if self.kv_reserved + need > capacity:
                self.admission_waits += 1
            await self.memory.wait_for(
                lambda: self.kv_reserved == 0 or self.kv_reserved + need <= capacity
            )
            self.hold_tokens(need)
            return need

    def hold_tokens(self, tokens: int) -> None:
        """Add to the KV reserved here, keeping the most it ever was beyond capacity: what
        growing requests (and one too long, admitted alone) hold that the modelled chip has
        no room for, which a real engine would preempt (not modelled)."""
        self.kv_reserved += tokens
        over = self.kv_reserved - self.cost.kv_capacity_tokens()
        self.kv_peak_over_capacity_tokens = max(self.kv_peak_over_capacity_tokens, over)

    async def release_tokens(self, tokens: int) -> None:
        async with self.memory:
            self.kv_reserved -= tokens
            self.memory.notify_all()

    async def release_memory(self, request: DecodeRequest) -> None:
        tokens, request.reserved = request.reserved, 0
        await self.release_tokens(tokens)

    # -- KV arriving from P ---------------------------------------------------------------

    def bounded(self, body: dict[str, Any], key: str, low: int, high: int) -> int:
        value = body.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{key} must be an integer in [{low}, {high}], got {value!r}")
        return value

    async def on_kv_begin(self, message: Envelope) -> None:
        """A transfer begins on its sender's KV link, which other transfers share: its memory
        is admitted apart from the link's reading (at once if it fits, else by a task of its
        own once earlier requests free enough), then its buffer is made and the sender told
        `kv_admitted`; only then does it send the chunks, as an RDMA engine's receiver
        allocates before the write. Its sender's hold until it was read goes first: only
        modelled time passing frees memory."""
        self.let_sender_go(message)
        rid = message.body.get("rid")
        if self.on_link(rid, message.channel)[0]:
            # an earlier transfer of the request on this link: its sender has moved on from
            # it (its kv_cut, queued behind this, will be stale); its memory goes back, and
            # what the request keeps here (a match's pin, a pending resume) stays for this one
            self._cut(rid, superseded=True)
        try:
            if rid in self.admitting or rid in self.receiving:
                # A transfer of the request on another link (one on this link was superseded
                # above). A request's KV has one sender, on one link (a routing or a move is a
                # leg of its own): the transfer here goes on untouched (its state, memory and
                # what the request keeps are its own), this one is refused.
                raise ValueError(f"{rid}: its KV is already coming here on another link")
            admission, need = self._admission(message)
        except Exception as error:  # refused: its sender, waiting for `kv_admitted`, hears why
            await self._refuse(message, error)
            raise
        if self.try_reserve(need):
            await self._admitted(admission, need)
            return
        self.admitting.add(rid)
        admission.task = self.spawn(self._admit_later(admission), f"admission of {rid}")
        self.admissions[rid] = admission

    def _admission(self, message: Envelope) -> tuple[Admission, int]:
        """A transfer's admission as its `kv_begin` asks it, and the memory (modelled tokens)
        it needs; ValueError for a `kv_begin` that cannot describe one."""
        body = message.body
        begun_at = self.arrival(message)  # the transfer's first byte, not its admission
        meta = body["meta"]
        genuine = self.kv_capacity_genuine()
        modelled = self.cost.kv_capacity_tokens()
        prompt_len = self.bounded(body, "prompt_tokens", 1, genuine)
        offset = self.bounded(body, "offset", 0, prompt_len)
        if body.get("p_hit") is not None:  # where P's chunks begin (a sender may not say)
            self.bounded(body, "p_hit", 0, prompt_len)
        seq = body.get("seq")  # the transfer's number on its link (a sender may not number)
        if seq is not None:
            self.bounded(body, "seq", 0, 2**63 - 1)
        # the true end (read only at each step, as the model's EOS) checked here, not in a step
        self.bounded(meta, "output_tokens", 1, 2**31 - 1)
        planned = meta.get("predicted_output_tokens", 0)
        if (
            isinstance(planned, bool)
            or not isinstance(planned, int | float)
            or not math.isfinite(planned)
        ):
            raise ValueError(f"predicted_output_tokens must be a finite number, got {planned!r}")
        planned = round(min(max(planned, 0), modelled))  # a prediction, bounded as a size
        need = self.bounded(meta, "input_tokens", 1, modelled) + planned
        outputs = min(
            genuine, genuine_output_length(max(1, planned), self.config.scale.token_scale)
        )
        self.prompt_begun(message)
        return Admission(message, need, prompt_len + outputs + 1, offset, begun_at, seq), need

    async def _refuse(self, message: Envelope, error: Exception) -> None:
        """Tell a transfer's sender it will not be admitted (`kv_refused`): it waits for
        `kv_admitted` on a link that goes on, and would wait for ever."""
        if message.channel is None or message.channel.closed:
            return
        with contextlib.suppress(ConnectionError):
            body = message.body
            reason = str(error)[:500]
            refused = {"rid": body.get("rid"), "seq": body.get("seq"), "reason": reason}
            await message.channel.control("kv_refused", refused)

    async def _admit_later(self, admission: Admission) -> None:
        """Wait for the transfer's memory, then admit it: the link goes on meanwhile."""
        rid = admission.message.body["rid"]
        try:
            reserved = await self.reserve_tokens(admission.need)
        finally:
            if self.admissions.get(rid) is admission:  # not a newer transfer's, admitting
                self.admitting.discard(rid)
                del self.admissions[rid]
        await self._admitted(admission, reserved)

    async def _admitted(self, admission: Admission, reserved: int) -> None:
        """The transfer has its memory: make its buffer and tell the sender to send. On a link
        that has closed meanwhile it is cut at once (its end was read before it was here)."""
        message = admission.message
        rid = message.body["rid"]
        channel = message.channel
        if channel is None or channel.closed:
            self.spawn(self.release_tokens(reserved), f"memory of {rid}")
            self._count_cut(rid, KV.empty(self.model_config))
            return
        try:
            kv = KV.empty(self.model_config, capacity=admission.capacity)  # grows past it
            prefix = self.prefix_for(rid, admission.offset)
            if prefix is not None:
                kv.append(prefix)
        except BaseException as error:
            await self.release_tokens(reserved)
            if isinstance(error, Exception):
                await self._refuse(message, error)
            raise
        self.receiving[rid] = {
            "kv": kv,
            "body": message.body,
            "bytes": 0,
            "reserved": reserved,
            "channel": channel,
            "seq": admission.seq,
            "begun_at": admission.begun_at,
        }
        with contextlib.suppress(ConnectionError):  # a link that ends cuts it (`channel_closed`)
            await channel.control("kv_admitted", {"rid": rid, "seq": admission.seq})

    def try_reserve(self, need: int) -> bool:
        """Reserve `need` modelled tokens of KV if they fit now (`reserve_tokens`' test)."""
        capacity = self.cost.kv_capacity_tokens()
        if self.kv_reserved and self.kv_reserved + need > capacity:
            return False
        self.hold_tokens(need)
        return True

    def received_kv(self, chunk: KVChunk) -> KV:
        """A chunk's KV, once it is known to be every layer of this model's KV for its tokens
        (a well-formed frame from a differently configured sender is a protocol error)."""
        config = self.model_config
        expected = (0, config.n_layers, config.n_kv_heads, config.head_dim, config.torch_dtype)
        tensor = kv_tensor(chunk)
        found = (chunk.layer_start, chunk.layer_end, tensor.shape[2], tensor.shape[4], tensor.dtype)
        if found != expected:
            raise ValueError(
                f"KV chunk of {chunk.request_id}: layers [{found[0]}, {found[1]}), "
                f"{found[2]} heads of {found[3]}, {found[4]}; this model's KV is layers "
                f"[0, {expected[1]}), {expected[2]} heads of {expected[3]}, {expected[4]}"
            )
        return KV(tensor)

    async def on_kv_chunk(
        self, chunk: KVChunk, channel: Any, received: float | None = None
    ) -> None:
        """`received`: the chunk's kernel receive date, as kv_begin's and kv_end's are dated
        (`arrival`), so the reader's lateness in taking it shows in none of the three."""
        state = self.receiving.get(chunk.request_id)
        if state is None:
            raise ValueError(f"KV chunk for {chunk.request_id} without kv_begin")
        if state["channel"] is not channel:
            raise ValueError(f"KV chunk for {chunk.request_id} on another transfer's connection")
        if chunk.token_start != state["kv"].tokens:
            raise ValueError(
                f"KV chunk of {chunk.request_id} starts at {chunk.token_start}, "
                f"expected {state['kv'].tokens}"
            )
        state["kv"].append(self.received_kv(chunk))
        state["bytes"] += chunk.nbytes
        at = max(state["begun_at"], self.kernel_dated(received))
        state.setdefault("arrivals", []).append((at, chunk.nbytes))  # timelines
        # the first prefill chunk's KV (P sends it in slices: `SLICE_BYTES`), its last byte:
        # up to P's first chunk boundary past the offset (`first_chunk_end`)
        body = state["body"]
        offset, prompt = int(body["offset"]), int(body["prompt_tokens"])
        p_hit = body.get("p_hit")
        first = first_chunk_end(
            offset, offset if p_hit is None else p_hit, self.chunk_genuine, prompt
        )
        if state["kv"].tokens >= first:
            body.setdefault("first_chunk_at", at)

    async def on_kv_end(self, message: Envelope) -> None:
        """The transfer's end: time stands still from here until the request is taken in
        (`intake_done`), or the end is refused; from its sending to here its sender held it
        (`Instance.let_sender_go`), so however late it is read the request joins the batch as
        of the end."""
        hold = self.clock.hold_instant()
        self.let_sender_go(message)
        try:
            self._end_transfer(message, hold)
        except BaseException:
            hold.release()
            raise

    def _end_transfer(self, message: Envelope, hold: InstantHold) -> None:
        rid = message.body["rid"]
        state = self.receiving.get(rid)
        if state is None or state["channel"] is not message.channel:
            raise ValueError(f"kv_end for {rid} without kv_begin on its connection")
        if message.body.get("seq") != state["seq"]:  # an earlier transfer's, on this link
            self.stale_link_messages += 1
            hold.release()
            return
        del self.receiving[rid]
        body = state["body"]
        if state["kv"].tokens != int(body["prompt_tokens"]):
            raise ValueError(
                f"{rid}: KV has {state['kv'].tokens} tokens, prompt has {body['prompt_tokens']}"
            )
        ended = body["ended_at"] = self.arrival(message, ready=message.body.get("ready"))
        # Kernel dates come in order on a connection (each read is dated by its last
        # segment), so across a shaped path nothing here is after the end. On a path without
        # modelled time the transfer takes none and ends when its sender had the KV ready,
        # which may be before its first parts were read: they are dated by that end.
        body["first_chunk_at"] = min(body.get("first_chunk_at", ended), ended)
        self.events.record(
            "kv_transfer",
            rid,
            min(state["begun_at"], ended),
            ended,
            source=body.get("p"),
            genuine_bytes=state["bytes"],
            chunks=[(min(at, ended), size) for at, size in state.get("arrivals", [])],
        )
        request = DecodeRequest(rid, body["meta"], state["kv"], int(body["prompt_tokens"]))
        request.reserved = state["reserved"]
        request.arrived = body["ended_at"]
        request.intake_hold = hold
        # Not on this link's reader, which the other transfers on it share.
        self.arriving.add(rid)
        self.spawn(
            self._arrive(request, int(message.body["first_token"]), body, state["bytes"]),
            f"arrival of {rid}",
        )

    async def _arrive(
        self, request: DecodeRequest, first_token: int, begin: dict[str, Any], genuine_bytes: int
    ) -> None:
        try:
            await self.kv_arrived(request, first_token, begin, genuine_bytes)
        finally:
            self.arriving.discard(request.rid)
            self.intake_done(request)  # whatever came of it (taken in, released, failed)

    def expects(self, rid: str) -> bool:
        """Whether a request's KV is on its way here (its transfer begun, perhaps waiting for
        memory) or being taken in."""
        return rid in self.admitting or rid in self.receiving or rid in self.arriving

    def channel_closed(self, channel: Any) -> None:
        """A KV link ended (its sender died, or closed it): every transfer on it is cut off,
        admitted or still waiting for memory."""
        for rid in [rid for rid, state in self.receiving.items() if state["channel"] is channel]:
            self._cut(rid)
        for rid in [rid for rid, a in self.admissions.items() if a.message.channel is channel]:
            self._cut(rid)

    def on_link(self, rid: str, channel: Any) -> tuple[bool, int | None]:
        """Whether `rid` has a transfer on `channel` (admitted, or waiting for its memory),
        and its number there (`seq`; None from a sender that does not number them)."""
        state = self.receiving.get(rid)
        if state is not None and state["channel"] is channel:
            return True, state["seq"]
        admission = self.admissions.get(rid)
        if admission is not None and admission.message.channel is channel:
            return True, admission.seq
        return False, None

    async def on_kv_cut(self, message: Envelope) -> None:
        """The sender cut one transfer on a link that goes on (`channel_closed`, for one). A
        cut for an earlier transfer of the request (its number not the one here: a newer one
        began since) is stale: ignored, counted."""
        rid = message.body["rid"]
        present, seq = self.on_link(rid, message.channel)
        if not present:  # nothing of it here (it ended, or was refused)
            return
        if seq != message.body.get("seq"):
            self.stale_link_messages += 1
            return
        self._cut(rid)

    def _cut(self, rid: str, superseded: bool = False) -> None:
        """A transfer cut off mid-way: its memory is released (or its wait for it ended),
        what arrived of it is the subclass's to keep or forget; unless a newer transfer of the
        request `superseded` it, which needs what the request keeps here."""
        admission = self.admissions.pop(rid, None)
        if admission is not None:
            self.admitting.discard(rid)
            if admission.task is not None:
                admission.task.cancel()
            kv = KV.empty(self.model_config)
        else:
            state = self.receiving.pop(rid)
            self.spawn(self.release_tokens(state["reserved"]), f"memory of {rid}")
            kv = state["kv"]
        if superseded:
            self.transfers_cut += 1
            return
        self._count_cut(rid, kv)

    def _count_cut(self, rid: str, kv: KV) -> None:
        self.transfers_cut += 1
        self.released.discard(rid)  # nothing more of it comes
        self.transfer_cut(rid, kv)

    def transfer_cut(self, rid: str, kv: KV) -> None:
        """A request's KV will not arrive complete; `kv` holds the prompt's first tokens that
        did (subclasses forget what they kept for it, or keep it)."""

    def prompt_begun(self, message: Envelope) -> None:
        """A transfer's `kv_begin`, its sizes checked: what a subclass keeps of the prompt it
        describes (a ValueError refuses the transfer)."""

    def prefix_for(self, rid: str, offset: int) -> KV | None:
        """KV of the first `offset` prompt tokens, which this instance already holds."""
        if offset:
            raise ValueError(f"{self.role} holds no prefix, but {rid} was sent from {offset}")
        return None

    async def kv_arrived(
        self, request: DecodeRequest, first_token: int, begin: dict[str, Any], genuine_bytes: int
    ) -> None:
        raise NotImplementedError

    async def start_stream(
        self,
        request: DecodeRequest,
        first_token: int,
        report: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Own the request's stream from its first token (the one P computed) and decode on;
        or, for a stream another instance lost, from where the user's tokens stop. `report`:
        what is told once the request is taken in, before its first token leaves (the token
        may end the request, after which the frontend records nothing of it).

        A stream that cannot start (the user's tokens are not this model's, a send fails) is
        lost here: its memory goes back and the frontend moves the request."""
        try:
            first = await self._take_in_stream(request, first_token)
            self.intake_done(request)  # before anything of the request is sent
            if report is not None:
                await report()
            if first is not None and self.requests.get(request.rid) is request:  # not released
                await self.send_group(request, first)
        except Exception:
            if not request.finished and self.requests.get(request.rid, request) is request:
                await self.lose(request)
            raise

    async def _take_in_stream(
        self, request: DecodeRequest, first_token: int
    ) -> dict[str, Any] | None:
        """The request in this instance's hands (in the batch, if it decodes on); returns its
        first token's group, taken off it and still to send (a resumed stream has none)."""
        resume = request.meta.get("resume")
        if resume and resume["ids"]:
            ids = [int(x) for x in resume["ids"]]
            if ids[0] != first_token:
                raise ValueError(
                    f"{request.rid}: P's first token {first_token} differs from the user's {ids[0]}"
                )
            await self.resume_stream(request, ids, int(resume["position"]), have=0)
            return None
        self.requests[request.rid] = request
        request.streaming = True
        request.outputs = [first_token]
        request.produced = [request.arrived]  # P computed it: it came with the KV
        self.tokens_generated += 1
        if not request.ended(request.position):  # in the batch before its first token's send
            self.start_decoding(request, request.arrived)
        # Taken off now, before any wait: the request's next step may come first, and goes on
        # from the first token's group being out.
        return self.take_group(request)

    async def resume_stream(
        self, request: DecodeRequest, ids: list[int], position: int, have: int
    ) -> None:
        """Take over a stream at modelled `position`, the user holding the genuine outputs
        `ids` (the last one's group begun). The KV of all but the last is recomputed in one
        extend inside the next step (`have` of them are in the KV already), the model's
        prediction after them must be the last, and decoding goes on, streaming from
        `position`."""
        if (
            not 0 <= have < len(ids)
            or position < self.group_start(len(ids) - 1)
            or position > self.group_start(len(ids))
        ):
            raise ValueError(f"{request.rid}: cannot resume {len(ids)} outputs at {position}")
        self.requests[request.rid] = request
        self.resumed += 1
        todo = ids[have:-1]

        def run() -> None:
            kv, logits = self.model.extend(todo, request.kv)
            request.kv.append(kv)
            if greedy(logits[-1]) != ids[-1]:
                raise ValueError(
                    f"{request.rid}: this model predicts {greedy(logits[-1])} after the user's "
                    f"tokens, the user has {ids[-1]}"
                )

        async def then(at: float) -> None:
            if request.rid not in self.requests:  # released meanwhile
                return
            request.outputs = list(ids)
            request.emitted = request.stream_from = position
            request.produced = []
            request.streaming = True
            if request.ended(position):
                request.finished = True
                await self.finished(request)
            else:
                self.start_decoding(request, at)

        if not todo:
            await then(self.clock.now())
            return
        tokens = self.group_start(len(ids) - 1) - self.group_start(have)
        context = int(request.meta["input_tokens"]) + self.group_start(have)
        self.add_extend(Extend(request, tokens, context, run, then, self.clock.now()))

    async def resend_from(self, request: DecodeRequest, position: int) -> None:
        """Stream from an earlier `position` than agreed: the positions produced here but left
        to another instance, which was lost before delivering them, are sent now."""
        upto = min(request.stream_from, request.emitted)
        scale = self.config.scale.token_scale
        now = self.clock.now()
        start = position
        while start < upto:
            index = output_index(start, scale)
            end = min(upto, self.group_start(index + 1))
            body = {
                "rid": request.rid,
                "index": index,
                "id": request.outputs[index],
                "first": start,
                "times": [now] * (end - start),
                "source": self.name,
                "role": self.role,
            }
            await self.send_tokens(request, body)
            start = end
        request.stream_from = min(request.stream_from, position)

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "transfers_cut": self.transfers_cut,
            "kv_link_stale_messages": self.stale_link_messages,
            "resumed": self.resumed,
            "tokens_generated": self.tokens_generated,
            "active": len(self.requests),
            "kv_reserved_tokens": self.kv_reserved,
            "kv_grown_tokens": self.kv_grown_tokens,
            "kv_peak_over_capacity_tokens": self.kv_peak_over_capacity_tokens,
            "admission_waits": self.admission_waits,
        }


@dataclass
class Extend:
    """Tokens whose KV a request lacks, to recompute in the next step (an Extend-Decode handoff
    part): `run` does the genuine work, `then` follows with the step's modelled end."""

    request: DecodeRequest
    tokens: int  # modelled tokens the extend stands for
    context: int  # modelled tokens already in the request's KV
    run: Callable[[], None]
    then: Callable[[float], Awaitable[None]]
    ready_at: float  # modelled time its ids arrived


@dataclass
class Admission:
    """A KV transfer begun (`kv_begin`) whose memory is being admitted."""

    message: Envelope
    need: int  # modelled tokens of KV to reserve
    capacity: int  # genuine tokens its buffer is made for
    offset: int  # first prompt token sent (those before are held here)
    begun_at: float  # modelled time of its first byte
    seq: int | None  # its number on its link (`kv_begin`'s seq)
    task: asyncio.Task | None = None  # its wait for memory, if it did not fit at once
