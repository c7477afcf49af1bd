"""The frontend and router (DC A): takes requests, picks the instances and the pipeline, and
streams every request's tokens back in order, each with its time.

Per request: P (by session affinity, for its prefix cache) gets the prompt and answers with its
hit; the decode side (MD, or a baseline's D, also by session affinity for the DRC) is asked in
parallel how much of the prompt it holds, and pins it. The routing policy then picks the
pipeline and P is told where to stream the KV from which token. Tokens come back from RLD and
MD; a position delivered twice (which a seamless handoff never sends) is checked and dropped.

The router never reads a request's output length (which only the emulated model's end of
sequence knows): it predicts it (`pddemu/policy/output_length.py`) from the session's history and
the prompt, and learns each request's length when it ends. The anomalous-traffic filter acts
twice: early, routing a long-input request the predictor is confident is short RLD-only; and
late, cutting off mid-way the WAN transfer of a relayed request the relay finished first.

Every request ends completed or failed (with the reason); nothing is left without an end.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

from pddemu.emulated_network import scale_model
from pddemu.hardware import load_target
from pddemu.metrics.records import RequestRecord
from pddemu.policy.output_length import OutputLengthPredictor, OutputPrediction, PromptFeatures
from pddemu.policy.routing import RouteInputs, choose_pipeline
from pddemu.policy.wan import WanEstimator
from pddemu.roles.base import Instance
from pddemu.roles.client_gone import client_gone_abandons
from pddemu.roles.openai_api import OpenAIFrontDoor
from pddemu.roles.sizing import cost_model
from pddemu.roles.spec import InstanceSpec
from pddemu.runtime.channel import Envelope
from pddemu.runtime.liveness import Change, Liveness
from pddemu.wire import TokenIds
from pddemu.workload.expansion import genuine_output_length, output_group_start, output_index

DECODE_ROLE = {"pdd": "MD", "naive": "MD", "indc": "D"}
WAN_DECODE = {"pdd": True, "naive": True, "indc": False}


@dataclass
class Flight:
    """A request in the frontend, from arrival to its end state."""

    record: RequestRecord
    prompt: list[int]
    genuine_output: int
    session: str | None
    p: str = ""
    decode: str = ""
    rld: str = ""
    ids: dict[int, int] = field(default_factory=dict)  # genuine output index -> id
    pending: dict[int, tuple[float, str, float]] = field(
        default_factory=dict
    )  # position -> (delivery time, role, time its instance produced it)
    delivered: int = 0  # modelled output positions delivered in order
    replies: dict[str, asyncio.Future] = field(default_factory=dict)
    stream: asyncio.Queue = field(default_factory=asyncio.Queue)  # the user's tokens, then None
    done: asyncio.Event = field(default_factory=asyncio.Event)  # every token delivered
    transfers: set[str] = field(
        default_factory=set
    )  # destinations whose transfer P has not reported
    transfers_reported: asyncio.Event = field(default_factory=asyncio.Event)
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # the record is final
    loaded: list[str] = field(default_factory=list)  # instances whose load counts this request
    recorded: bool = False  # the record is written: tokens arriving later are not the user's
    work: asyncio.Task | None = None  # routing and waiting for the tokens (run_flight)
    abandoned: str = ""  # why the request was given up before its end (its client went away)

    def abandon(self, reason: str) -> None:
        """Give the request up: it fails with `reason`, and what it holds is released."""
        if self.recorded or self.abandoned:
            return
        self.abandoned = reason
        if self.work is not None:
            self.work.cancel()

    features: PromptFeatures | None = None  # what the router knew when it routed
    prediction: OutputPrediction | None = None  # its output length prediction then
    cut: bool = False  # the anomaly filter cut the WAN transfer off

    @property
    def output_ids(self) -> list[int]:
        return [self.ids[i] for i in range(len(self.ids))]

    @property
    def md_took_over(self) -> bool:
        return self.record.md_tokens > 0


class Frontend(Instance):
    role = "FE"

    def __init__(self, spec: InstanceSpec) -> None:
        super().__init__(spec)
        self.system = spec.system
        self.flights: dict[str, Flight] = {}
        self.p_names = [a.name for a in spec.peers_with_role("P")]
        self.decode_names = [a.name for a in spec.peers_with_role(DECODE_ROLE[self.system])]
        self.rld_names = [a.name for a in spec.peers_with_role("RLD")]
        wan = self.config.wan
        self.wan = WanEstimator(capacity_bps=wan.rate_bps or 1e12, one_way_delay_s=wan.delay_s)
        self.relay_cost = cost_model(self.config, self.system, "RLD") if self.rld_names else None
        self.load: dict[str, int] = {
            name: 0 for name in [*self.p_names, *self.decode_names, *self.rld_names]
        }
        self.target_kv_bytes = load_target(self.config.target).kv_bytes_per_token
        self.scale = scale_model(self.config)
        self.max_request_tokens = self.request_token_limit()
        faults = self.config.faults
        self.liveness = Liveness(list(self.load), faults.suspect_after_s, faults.down_after_s)
        self.liveness_changes: list[Change] = []
        self.predictor = OutputLengthPredictor()

    def request_token_limit(self) -> int:
        """Modelled tokens (prompt and output) one request may have: what the smallest instance
        serving it can hold, as KV (the bound on every size a client sends)."""
        roles = {"P", DECODE_ROLE[self.system], *(["RLD"] if self.rld_names else [])}
        return min(
            cost_model(self.config, self.system, role).kv_capacity_tokens() for role in roles
        )

    async def start(self) -> None:
        self.spawn(self.watch_liveness(), "liveness checks")

    # -- who is alive -----------------------------------------------------------------------

    async def watch_liveness(self) -> None:
        """Judge the instances' silences every heartbeat period of modelled time; a check
        that woke late judges nobody (this process, not they, was not listening)."""
        period = self.config.faults.heartbeat_period_s
        due = self.clock.now() + period
        while True:
            late = await self.clock.sleep_until(due)
            await asyncio.sleep(0)  # what arrived meanwhile is read before anyone is judged
            now = self.clock.now()
            for change in self.liveness.check(now, on_time=late < period):
                self.liveness_changed(change)
            due = max(due + period, now)

    def heard_from(self, peer: str) -> None:
        change = self.liveness.heard(peer, self.clock.now())
        if change is not None:
            self.liveness_changed(change)

    def channel_closed(self, channel: Any) -> None:
        if channel.purpose == "control":
            change = self.liveness.lost(channel.peer, self.clock.now(), "its connection closed")
            if change is not None:
                self.liveness_changed(change)

    def liveness_changed(self, change: Change) -> None:
        self.liveness_changes.append(change)

    def routable(self, names: list[str]) -> list[str]:
        """The instances among `names` to route to: those alive, or all if none is."""
        return [name for name in names if self.liveness.routable(name)] or names

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/generate", self.http_generate)
        OpenAIFrontDoor(self).add_routes(app)

    # -- the request API ------------------------------------------------------------------

    async def http_generate(self, request: web.Request) -> web.StreamResponse:
        """POST a request; the answer streams NDJSON lines: tokens as they come, then the record."""
        try:
            body = await request.json()
            flight = self.admit(body)
        except (ValueError, KeyError, TypeError) as error:
            return web.json_response({"error": f"bad request: {error}"}, status=400)
        self.spawn(self.serve_flight(flight), f"request {flight.record.request_id}")
        with client_gone_abandons(flight):
            response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
            await response.prepare(request)
            while True:
                item = await flight.stream.get()
                if item is None:
                    break
                await response.write(json.dumps(item).encode() + b"\n")
            await flight.settled.wait()
            final = {"record": flight.record.to_dict(), "output_ids": flight.output_ids}
            await response.write(json.dumps(final).encode() + b"\n")
            await response.write_eof()
            return response

    def admit(self, body: dict[str, Any]) -> Flight:
        rid = str(body["rid"])
        if rid in self.flights:
            raise ValueError(f"request id {rid!r} is already in flight")
        ids = body["prompt_ids"]
        if not isinstance(ids, list) or len(ids) > self.max_request_tokens:
            raise ValueError(f"prompt_ids must be a list of at most {self.max_request_tokens} ids")
        prompt = [int(x) for x in ids]
        if not prompt or min(prompt) < 0 or max(prompt) >= self.model_config.vocab_size:
            raise ValueError(
                "prompt_ids must be a non-empty list of token ids of the model's vocabulary"
            )
        input_tokens, output_tokens = int(body["input_tokens"]), int(body["output_tokens"])
        if input_tokens < 1 or output_tokens < 1:
            raise ValueError("input_tokens and output_tokens must be at least 1")
        if input_tokens + output_tokens > self.max_request_tokens:
            raise ValueError(
                f"input_tokens + output_tokens = {input_tokens + output_tokens}: a request's KV "
                f"must fit one instance ({self.max_request_tokens} tokens)"
            )
        session = body.get("session")
        if session is not None and not isinstance(session, str):
            raise ValueError("session must be a string")
        genuine_output = genuine_output_length(output_tokens, self.config.scale.token_scale)
        record = RequestRecord(
            request_id=rid,
            system=self.system,
            arrival_s=self.clock.now(),
            input_tokens=input_tokens,
            expected_output_tokens=output_tokens,
        )
        flight = Flight(record, prompt, genuine_output, session)
        self.flights[rid] = flight
        return flight

    # -- one request ----------------------------------------------------------------------

    async def serve_flight(self, flight: Flight) -> None:
        record = flight.record
        timeout = self.config.request_timeout_s / self.config.scale.time_scale
        flight.work = asyncio.ensure_future(self.run_flight(flight))
        if flight.abandoned:  # before it started
            flight.work.cancel()
        try:
            await asyncio.wait_for(flight.work, timeout)
            record.state = "completed"
        except asyncio.CancelledError:
            if not flight.abandoned:  # the frontend itself is stopping
                raise
            self.fail(flight, flight.abandoned)
        except TimeoutError:
            self.fail(
                flight,
                f"timed out after {self.config.request_timeout_s:.0f} modelled s "
                f"({flight.delivered}/{flight.record.expected_output_tokens} tokens delivered)",
            )
        except Exception as error:  # noqa: BLE001 - the request fails, the frontend goes on
            self.fail(flight, f"{type(error).__name__}: {error}")
        finally:
            self.finish_record(flight)
            flight.stream.put_nowait(None)  # the user's stream is complete
            await self.settle(flight)
            await self.await_transfers(flight, timeout)
            self.flights.pop(record.request_id, None)
            flight.settled.set()

    async def await_transfers(self, flight: Flight, timeout: float) -> None:
        """A transfer can outlive its request (the relay finished it while MD's copy of the KV
        was still crossing the WAN); its bytes belong to the request's record all the same."""
        if not flight.transfers:
            return
        try:
            await asyncio.wait_for(flight.transfers_reported.wait(), timeout)
        except TimeoutError:
            self.errors.append(
                f"{flight.record.request_id}: transfers to {sorted(flight.transfers)} never reported"
            )

    def fail(self, flight: Flight, reason: str) -> None:
        flight.record.state = "failed"
        flight.record.failure_reason = reason

    async def run_flight(self, flight: Flight) -> None:
        record = flight.record
        rid = record.request_id
        flight.p = self.pick(self.p_names, flight.session)
        flight.decode = self.pick(self.decode_names, flight.session)
        meta = {
            "input_tokens": record.input_tokens,
            "output_tokens": record.expected_output_tokens,
            "genuine_output_tokens": flight.genuine_output,
            "frontend": self.name,
            "session": flight.session,
        }
        loop = asyncio.get_running_loop()
        flight.replies = {"p_hit": loop.create_future(), "matched": loop.create_future()}
        prompt = TokenIds.from_ints(rid, 0, flight.prompt)
        self.add_load(flight, flight.p)
        await asyncio.gather(
            self.tell(flight.p, "prefill", {"rid": rid, **meta}, prompt),
            self.tell(flight.decode, "match", {"rid": rid}, prompt),
        )
        p_hit = (await flight.replies["p_hit"])["hit"]
        md_hit = (await flight.replies["matched"])["hit"]
        scale = self.config.scale.token_scale
        record.p_hit_tokens = min(p_hit * scale, record.input_tokens)
        increment = self.modelled_tokens(record, len(flight.prompt) - md_hit)
        flight.features = self.routing_features(flight)
        if self.system == "pdd":
            flight.prediction = self.predictor.predict(flight.features)
            record.predicted_output_tokens = flight.prediction.tokens
        pipeline = self.decide(flight.features, flight.prediction, increment)
        record.pipeline = pipeline
        record.wan_bytes_without_drc = (
            record.input_tokens * self.target_kv_bytes
            if WAN_DECODE[self.system] and pipeline != "RLD-only"
            else 0
        )
        destinations = []
        meta = {**meta, "pipeline": pipeline, "md": flight.decode}
        if pipeline in ("P-RLD-MD", "RLD-only"):
            flight.rld = self.pick_least_loaded(self.rld_names)
            meta["rld"] = flight.rld
            destinations.append({"name": flight.rld, "offset": 0, "meta": meta})
            self.add_load(flight, flight.rld)
        if pipeline != "RLD-only":
            record.md_hit_tokens = min(md_hit * scale, record.input_tokens)
            destinations.append({"name": flight.decode, "offset": md_hit, "meta": meta})
            self.add_load(flight, flight.decode)
            if WAN_DECODE[self.system]:
                self.wan.started(rid, increment * self.target_kv_bytes)
        else:
            record.anomaly_filtered = True
            record.wan_bytes_cancelled = increment * self.target_kv_bytes
            await self.tell(flight.decode, "release", {"rid": rid, "kv_expected": False})
        flight.transfers = {d["name"] for d in destinations}
        await self.tell(flight.p, "route", {"rid": rid, "destinations": destinations})
        await flight.done.wait()

    @staticmethod
    def routing_features(flight: Flight) -> PromptFeatures:
        """What the router knows of a request once P has said its hit: its session, its prompt
        length and how much of it is new."""
        record = flight.record
        return PromptFeatures(
            flight.session, record.input_tokens, record.input_tokens - record.p_hit_tokens
        )

    def modelled_tokens(self, record: RequestRecord, genuine_prompt_tokens: int) -> int:
        return min(genuine_prompt_tokens * self.config.scale.token_scale, record.input_tokens)

    def decide(
        self, features: PromptFeatures, prediction: OutputPrediction | None, increment_tokens: int
    ) -> str:
        """The pipeline, from what a router knows: the prompt, the WAN's state, the relay's
        load and the predicted output length (never the true one)."""
        if self.system != "pdd":
            return "P-D" if self.system == "indc" else "P-MD"
        assert prediction is not None
        policy = self.config.policy
        predicted_wan = self.wan.predict(increment_tokens * self.target_kv_bytes)
        relay_batch = max(
            1, sum(self.load[name] for name in self.rld_names) // max(1, len(self.rld_names))
        )
        context = features.input_tokens + int(prediction.tokens) // 2
        per_token = self.relay_cost.decode_step(
            [context] * min(relay_batch + 1, self.config.decode.max_batch)
        )
        inputs = RouteInputs(
            features.input_tokens,
            prediction.probability_below(policy.anomaly_output_threshold),
            predicted_wan,
            per_token * prediction.quantile(policy.anomaly_confidence),
        )
        return choose_pipeline(policy, inputs)

    def pick(self, names: list[str], session: str | None) -> str:
        """Session affinity keeps a conversation on the instance whose cache holds its prefix."""
        names = self.routable(names)
        if session is None:
            return self.pick_least_loaded(names)
        return names[zlib.crc32(session.encode()) % len(names)]

    def pick_least_loaded(self, names: list[str]) -> str:
        return min(self.routable(names), key=lambda name: (self.load[name], name))

    def add_load(self, flight: Flight, name: str) -> None:
        self.load[name] += 1
        flight.loaded.append(name)

    async def settle(self, flight: Flight) -> None:
        """Release what other instances hold for a request that is over: a failed one
        everywhere; one the relay finished before MD took over, on MD, its WAN transfer cut off
        mid-way if still under way (the anomaly filter; what reached MD stays in its DRC).
        A completed request's delivered length teaches the output length predictor."""
        rid = flight.record.request_id
        for name in flight.loaded:
            self.load[name] -= 1
        failed = flight.record.state == "failed"
        routed_to_md = flight.record.pipeline not in ("", "RLD-only")
        if not failed and flight.features is not None and flight.prediction is not None:
            self.predictor.observe(flight.features, flight.record.output_tokens, flight.prediction)
        if failed and flight.p:
            await self._quietly(self.tell(flight.p, "cancel", {"rid": rid}))
        if (
            not failed
            and self.config.policy.anomaly_filter
            and flight.record.pipeline == "P-RLD-MD"
            and not flight.md_took_over
            and flight.decode in flight.transfers
        ):
            flight.cut = True
            await self._quietly(
                self.tell(flight.p, "cut", {"rid": rid, "destination": flight.decode})
            )
        if failed and flight.rld:
            await self._quietly(self.tell(flight.rld, "release", {"rid": rid, "kv_expected": True}))
        if (
            flight.decode
            and (failed or not flight.md_took_over)
            and flight.record.pipeline != "RLD-only"
        ):
            await self._quietly(
                self.tell(
                    flight.decode,
                    "release",
                    {"rid": rid, "kv_expected": routed_to_md and not failed},
                )
            )

    async def _quietly(self, coroutine: Any) -> None:
        try:
            await coroutine
        except (OSError, ValueError) as error:
            self.errors.append(f"cleanup: {error!r}")

    def finish_record(self, flight: Flight) -> None:
        flight.recorded = True
        record = flight.record
        times = record.token_times_s
        record.output_tokens = len(times)
        record.first_token_s = times[0] if times else None
        record.finish_s = times[-1] if times and record.state == "completed" else None
        record.gap_tokens = len(flight.pending)  # held back behind a position that never came
        if record.handoff_position is not None:
            position = record.handoff_position
            record.handoff_gap_s = times[position] - times[position - 1]
            tpot = record.tpot_s
            record.handoff_stall_s = max(0.0, record.handoff_gap_s - (tpot or 0.0))

    # -- messages from the instances ------------------------------------------------------

    async def on_heartbeat(self, _message: Envelope) -> None:
        """Heard (as every message is, in `heard_from`)."""

    async def on_p_hit(self, message: Envelope) -> None:
        self._reply(message, "p_hit")

    async def on_matched(self, message: Envelope) -> None:
        self._reply(message, "matched")

    def _reply(self, message: Envelope, kind: str) -> None:
        flight = self.flights.get(message.body["rid"])
        if flight is not None and kind in flight.replies and not flight.replies[kind].done():
            flight.replies[kind].set_result(message.body)

    async def on_transfer_done(self, message: Envelope) -> None:
        flight = self.flights.get(message.body["rid"])
        if flight is None:
            return
        destination = message.body["destination"]
        if destination == flight.decode and WAN_DECODE[self.system]:
            self.add_wan_bytes(flight, int(message.body["bytes"]))
            if message.body["cancelled"]:
                self.wan.forget(flight.record.request_id)
            unsent = int(message.body["tokens"]) - int(message.body["tokens_sent"])
            if message.body["cancelled"] and flight.cut and unsent > 0:
                modelled = self.modelled_tokens(flight.record, len(flight.prompt)) - (
                    self.modelled_tokens(flight.record, len(flight.prompt) - unsent)
                )
                flight.record.anomaly_filtered = True
                flight.record.wan_bytes_cancelled = modelled * self.target_kv_bytes
        flight.transfers.discard(destination)
        if not flight.transfers:
            flight.transfers_reported.set()

    def add_wan_bytes(
        self, flight: Flight, genuine_bytes: int, modelled_bytes: float | None = None
    ) -> None:
        """KV bytes scale by the byte scale; other payloads say what they stand for."""
        flight.record.wan_bytes_genuine += genuine_bytes
        if modelled_bytes is None:
            modelled_bytes = self.scale.modelled_bytes(genuine_bytes)
        flight.record.wan_bytes += int(modelled_bytes)

    async def on_kv_arrived(self, message: Envelope) -> None:
        body = message.body
        self.wan.arrived(body["rid"], float(body["at"]) - float(body["first_chunk_at"]))

    async def on_handoff_sent(self, message: Envelope) -> None:
        flight = self.flights.get(message.body["rid"])
        if flight is None:
            return
        record = flight.record
        record.handoff_mode = message.body["mode"]
        record.handoff_payload = "extend" if message.body["payload"] == "extend" else "kv_delta"
        record.handoff_rounds = int(message.body["rounds"])
        record.handoff_started_s = float(message.body["started_at"])
        if message.body["final"]:
            record.handoff_switch = int(message.body["switch"])
        # A genuine id stands for token_scale modelled ids (4 bytes each); KV scales by bytes;
        # the frames' own headers are the same size in both worlds.
        sent, kv, ids = (
            int(message.body["bytes"]),
            int(message.body["kv_bytes"]),
            int(message.body["ids"]),
        )
        id_bytes = 4 * ids
        modelled = (
            (sent - kv - id_bytes)
            + self.scale.modelled_bytes(kv)
            + id_bytes * self.config.scale.token_scale
        )
        self.add_wan_bytes(flight, sent, modelled)

    async def on_tokens(self, message: Envelope) -> None:
        """A group of modelled tokens from RLD, MD or D: positions `first`.. with their times.

        The first copy of a position wins; a second one (which a seamless handoff never sends)
        is counted, and its genuine id must agree with the first's.
        """
        body = message.body
        flight = self.flights.get(body["rid"])
        if flight is None or flight.recorded:  # a failed request's stream is already closed
            return
        index, token, first = int(body["index"]), int(body["id"]), int(body["first"])
        known = flight.ids.setdefault(index, token)
        if known != token:
            flight.record.token_mismatch = True
        shift = self.clock.now() - float(body["sent"])  # delivery latency to the frontend
        for offset, time in enumerate(body["times"]):
            position = first + offset
            if position < flight.delivered or position in flight.pending:
                flight.record.duplicate_tokens += 1
                continue
            flight.pending[position] = (float(time) + shift, body["role"], float(time))
        while flight.delivered in flight.pending:
            self.deliver(flight, *flight.pending.pop(flight.delivered))
        if flight.delivered >= flight.record.expected_output_tokens:
            flight.done.set()

    def deliver(self, flight: Flight, time: float, role: str, produced: float) -> None:
        """Hand the next modelled token to the user's stream. A stream is in order, so no token
        reaches the user before the one ahead of it (a message delayed by the frontend's own
        load or by jitter could otherwise make a later one look earlier)."""
        record = flight.record
        position = flight.delivered
        if record.token_times_s:
            time = max(time, record.token_times_s[-1])
        if role == "RLD":
            record.rld_tokens += 1
        else:
            record.md_tokens += 1
            if record.rld_tokens and record.handoff_position is None:
                record.handoff_position = position
                record.handoff_resumed_s = produced
        record.token_times_s.append(time)
        flight.delivered += 1
        scale = self.config.scale.token_scale
        index = output_index(position, scale)
        if position == output_group_start(index, scale):
            flight.stream.put_nowait({"index": index, "id": flight.ids[index]})

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "in_flight": len(self.flights),
            "wan_correction": self.wan.correction,
            "liveness": [asdict(change) for change in self.liveness_changes],
        }
