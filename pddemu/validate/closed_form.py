"""The closed-form model of one request on an idle system: what the emulator must reproduce.

It is docs/hardware.md's cost model (each prefill step and decode step of the target model on
the instance's chips) plus the WAN as a link of a rate and a one-way delay, with nothing else
in flight. For a request of n modelled prompt tokens of which h are already cached (at P and
at the decode side alike), o output tokens, on pipeline P-MD, P-RLD-MD or P-D:

- the frontend sends the prompt to P and, for the decode side's hit, to MD (across the WAN
  for MD, its token ids serialised on the link), MD answers: the route is known one round trip
  (plus the ids' serialisation) after arrival, or at once when the decode side is in DC A;
- P computes the missed part in chunk slots, `max_batch_chunks` a step, each step the cost
  model's `prefill_step`; a chunk's KV is ready when its step ends;
- each destination's KV leaves as it is ready and the route is known: over the WAN, a FIFO
  link (`WanLink`: rate at the IP layer, so a segment carries MSS of the MTU's bytes, and the
  one-way delay) that sends the frames one after the other; over the intra-DC path (an
  unshaped veth in the default scenario), at once;
- the instance that owns the stream sends the first token when the KV has arrived (the
  relay: over the intra-DC path; MD: across the WAN, and the token comes back across it);
- every later token takes one `decode_step` of a batch of one at the request's context.

The frames are the wire format's own (`pddemu.wire.encode`), so every byte counted is a byte
sent. What the model leaves out is what an idle system does not have (queueing, batching with
other requests) and what the emulator adds (its own processing); the analytic check measures
the latter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from pddemu.config import Config
from pddemu.emulated_network import scale_model
from pddemu.hardware import CostModel
from pddemu.model import ModelConfig
from pddemu.roles.sizing import cost_model
from pddemu.roles.transfer import slice_tokens
from pddemu.wire import Control, KVChunk, Message, TokenIds, encode, frame_size
from pddemu.wire.messages import KVDtype
from pddemu.wire.tensors import kv_dtype_of
from pddemu.workload.expansion import genuine_output_length

IP_TCP_HEADER_BYTES = 52  # IPv4 20 + TCP 20 + the timestamps option 12, on every segment
DECODE_ROLE = {"pdd": "MD", "naive": "MD", "indc": "D"}
WAN_SYSTEMS = ("pdd", "naive")  # the decode side across the WAN


@dataclass(frozen=True)
class WanLink:
    """The modelled WAN as the emulator carries it: genuine bytes at `rate_bps` times the byte
    scale (bits of genuine traffic per modelled second), `delay_s` one way."""

    rate_bps: float  # of genuine IP bytes per modelled second
    delay_s: float
    mtu: int = 1500

    @property
    def payload_bps(self) -> float:
        """Rate of TCP payload: each segment of MTU bytes carries MTU - headers of data."""
        return self.rate_bps * (self.mtu - IP_TCP_HEADER_BYTES) / self.mtu

    def serialise(self, payload_bytes: int) -> float:
        return payload_bytes * 8 / self.payload_bps


@dataclass(frozen=True)
class Request:
    """One request of the analytic check (modelled tokens)."""

    system: str  # pdd | naive | indc
    pipeline: str  # P-MD | P-RLD-MD | P-D
    input_tokens: int
    hit_tokens: int  # cached at P and on the decode side alike
    output_tokens: int
    rid: str = "r0"


@dataclass(frozen=True)
class Expected:
    ttft_s: float
    kv_transfer_s: float | None  # route to the last KV byte at the decode side (WAN or not)
    tpot_s: float | None
    route_s: float = 0.0  # arrival to the route's decision (reported beside, not judged)


class ClosedForm:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.scale = scale_model(config)
        self.model = ModelConfig(**config.model)
        self.token_scale = config.scale.token_scale
        self.chunk = config.prefill.chunk_tokens // self.token_scale
        wan = config.wan
        self.wan = WanLink(
            (wan.rate_bps or math.inf) * self.scale.byte_scale, wan.delay_s, mtu=1500
        )

    def costs(self, system: str, role: str) -> CostModel:
        return cost_model(self.config, system, role)

    def predict(self, request: Request) -> Expected:
        g = self.token_scale
        prompt = -(-request.input_tokens // g)  # genuine tokens
        hit = request.hit_tokens // g
        across_wan = request.system in WAN_SYSTEMS
        # with no DRC the frontend asks the decode side nothing: it routes on P's hit alone
        asks = across_wan and self.config.policy.drc
        route = self._route_time(request, prompt) if asks else 0.0
        steps = self._prefill_steps(request, prompt, hit)
        prefill_end = steps[-1][0]
        kv = self._kv_arrival(request, prompt, hit, steps, route, across_wan)
        if request.pipeline == "P-RLD-MD":
            ttft = max(prefill_end, route)  # the relay's copy crosses the intra-DC path at once
        else:
            first = self._tokens_frame(request.rid, [0.0])
            back = self.wan.delay_s + self.wan.serialise(first) if across_wan else 0.0
            ttft = kv + back
        decode_role = "RLD" if request.pipeline == "P-RLD-MD" else DECODE_ROLE[request.system]
        tpot = self._tpot(request, decode_role) if request.pipeline != "P-RLD-MD" else None
        return Expected(ttft, kv - route, tpot, route)

    # -- the parts --------------------------------------------------------------------------

    def _route_time(self, request: Request, prompt: int) -> float:
        """When the frontend knows the decode side's hit: `match` out (a lone request names no
        prefix: nothing was routed there before), `matched` back, each a one-way delay plus
        its frames' serialisation."""
        body = {"rid": request.rid, "prompt_tokens": prompt, "prefixes": []}
        out = self._size(Control("match", body))
        back = self._size(
            Control("matched", {"rid": request.rid, "hit": prompt, "instance": "MD0"})
        )
        return 2 * self.wan.delay_s + self.wan.serialise(out) + self.wan.serialise(back)

    def _prefill_steps(self, request: Request, prompt: int, hit: int) -> list[tuple[float, int]]:
        """(end time, genuine tokens computed by then) of each of P's steps."""
        cost = self.costs(request.system, "P")
        g = self.token_scale
        n = request.input_tokens

        def modelled(begin: int, end: int) -> int:
            return max(0, min(end * g, n) - min(begin * g, n))

        chunks = [(b, min(b + self.chunk, prompt)) for b in range(hit, prompt, self.chunk)]
        per_step = self.config.prefill.max_batch_chunks
        steps, now = [], 0.0
        for i in range(0, len(chunks), per_step):
            batch = chunks[i : i + per_step]
            now += cost.prefill_step([(modelled(b, e), modelled(0, b)) for b, e in batch])
            steps.append((now, batch[-1][1]))
        return steps

    def _kv_arrival(
        self,
        request: Request,
        prompt: int,
        hit: int,
        steps: list[tuple[float, int]],
        route: float,
        across_wan: bool,
    ) -> float:
        """When the last byte of the decode side's KV (from its hit on) has arrived."""
        if not across_wan:
            return max(route, steps[-1][0])
        link = self.wan
        begin = self._size(self._kv_begin(request, prompt, hit))
        if self.config.policy.drc:  # with the increment's ids, for the DRC's insert
            begin += self._size(TokenIds.from_ints(request.rid, hit, [0] * (prompt - hit)))
        sent = route + link.serialise(begin)
        # the chunks go once the receiver's `kv_admitted` is back: a round trip after the begin
        admitted = Control("kv_admitted", {"rid": request.rid, "seq": 1})
        sent += 2 * link.delay_s + link.serialise(self._size(admitted))
        position = hit
        step = slice_tokens(self._kv_chunk(request.rid, 0, 1).nbytes, self.chunk)  # a frame's
        for ready, computed in steps:
            while position < computed:
                end = min(computed, position + step)
                frame = self._size(self._kv_chunk(request.rid, position, end))
                sent = max(sent, ready) + link.serialise(frame)
                position = end
        end = {"rid": request.rid, "seq": 1, "first_token": 255}
        end_frame = self._size(Control("kv_end", end))
        sent += link.serialise(end_frame)
        return sent + link.delay_s

    def _tpot(self, request: Request, role: str) -> float | None:
        """Mean of the decode steps of a batch of one, output position 1 to o - 1."""
        if request.output_tokens < 2:
            return None
        cost = self.costs(request.system, role)
        steps = [
            cost.decode_step([request.input_tokens + i]) for i in range(1, request.output_tokens)
        ]
        return float(np.mean(steps))

    # -- frames -----------------------------------------------------------------------------

    def _kv_begin(self, request: Request, prompt: int, hit: int) -> Control:
        meta = {
            "input_tokens": request.input_tokens,
            "output_tokens": request.output_tokens,
            "genuine_output_tokens": genuine_output_length(request.output_tokens, self.token_scale),
            "frontend": "FE0",
            "session": None,
            "pipeline": request.pipeline,
            "md": "MD0",
        }
        body = {"rid": request.rid, "offset": hit, "prompt_tokens": prompt, "meta": meta}
        if self.config.policy.drc:  # the increment's ids attached
            body["attach"] = 1
        return Control("kv_begin", {**body, "p": "P0", "p_hit": hit, "seq": 1})

    def _kv_chunk(self, rid: str, begin: int, end: int) -> KVChunk:
        model = self.model
        dtype = kv_dtype_of(model.torch_dtype)
        return _kv_chunk(model.n_layers, model.n_kv_heads, model.head_dim, dtype, rid, begin, end)

    def _tokens_frame(self, rid: str, times: list[float]) -> int:
        body = {"rid": rid, "index": 0, "id": 255, "first": 0, "times": times, "sent": 0.0}
        return self._size(Control("tokens", {**body, "source": "MD0", "role": "MD"}))

    @staticmethod
    def _size(message: Message) -> int:
        return frame_size(encode(message))


@cache
def _kv_chunk(
    layers: int, heads: int, head_dim: int, dtype: KVDtype, rid: str, begin: int, end: int
) -> KVChunk:
    data = np.zeros((layers, 2, heads, end - begin, head_dim), dtype=dtype.storage)
    return KVChunk(rid, 0, layers, begin, end, dtype, data)
