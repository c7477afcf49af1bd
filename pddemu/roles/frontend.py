"""The frontend and router (DC A): takes requests, picks the instances and the pipeline, and
streams every request's tokens back in order, each with its time.

Per request: P (by session affinity, for its prefix cache) gets the prompt and answers with its
hit; the decode side (MD, or a baseline's D, also by session affinity for the DRC) is asked in
parallel how much of the prompt it holds, and pins it. The routing policy then picks the
pipeline and P is told where to stream the KV from which token. Tokens come back from RLD and
MD; a position delivered twice (which a seamless handoff never sends) is checked and dropped.
Only the current leg's instances stream (see below): tokens of an abandoned leg, or of an
instance relieved of the stream at a failover (perhaps only silent under load: it may send on),
are not the user's, so a failover never delivers a position twice either.

The router never reads a request's output length (which only the emulated model's end of
sequence knows): it predicts it (`pddemu/policy/output_length.py`) from the session's history and
the prompt, and learns each request's length when it ends. The anomalous-traffic filter acts
twice: early, routing a long-input request the predictor is confident is short RLD-only; and
late, cutting off mid-way the WAN transfer of a relayed request the relay finished first.

When an instance a request needs is lost (the router's view, `pddemu.runtime.liveness`), the
request fails over from what the survivors hold (`fail_over`, docs/architecture.md): routed
again from the start before its first token (once), its stream resumed on MD when the relay
is lost, finished on the relay when MD is, or moved to another decode instance, which
recomputes the KV of the tokens the user already has in one extend and streams on from there.
Instances know a request by its *leg*: its id for the first routing, a new one for each
re-routing or move, so nothing of an abandoned leg is ever mistaken for the current one.

The routing exchange takes no modelled time, as the closed form has it: the router holds the
clock (an instant hold, `ModelledClock.hold_instant`) from a request's arrival until P has its
prompt and the router P's hit, and again from the decode side's answer until P has the route
and its first KV bytes are on their way. Across the WAN the hold is let go while the decode
side's answer travels (its transit is modelled time); the shaper holds time again at the
answer's release (its DSCP mark) until the router has read it and holds the present itself
(`on_matched`), so the router's lateness in reading it does not move the route either.

Every request ends completed or failed (with the reason); nothing is left without an end.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

from pddemu.cache.page_hashes import chained_page_hashes
from pddemu.emulated_network import queue_seconds, scale_model
from pddemu.hardware import load_target
from pddemu.metrics.records import RequestRecord
from pddemu.policy.output_length import OutputLengthPredictor, OutputPrediction, PromptFeatures
from pddemu.policy.routing import RouteInputs, choose_pipeline
from pddemu.policy.wan import WanEstimator
from pddemu.roles.base import Instance, log
from pddemu.roles.client_gone import client_gone_abandons
from pddemu.roles.openai_api import OpenAIFrontDoor
from pddemu.roles.routed_prompts import RoutedPrompts
from pddemu.roles.sizing import cost_model
from pddemu.roles.spec import InstanceSpec
from pddemu.runtime.channel import Envelope
from pddemu.runtime.clock import DELIVERY_KIND, INSTANT_HOLD_CAP_S, REPORT_KIND, InstantHold
from pddemu.runtime.liveness import DOWN, Change, Liveness
from pddemu.wire import TokenIds
from pddemu.workload.expansion import output_group_start, output_index

DECODE_ROLE = {"pdd": "MD", "naive": "MD", "indc": "D"}
WAN_DECODE = {"pdd": True, "naive": True, "indc": False}
MAX_ROUTINGS = 2  # a request whose P (or routing) is lost is routed once more, on others
MAX_MOVES = 2  # its stream moves to another instance at most this often
LEG_SEPARATOR = "~"  # a request's later legs (routings, moves) are named <request id>~<n>
CLEANUP_TIMEOUT_S = 5.0  # wall seconds a cleanup message may wait for its connection (a bound)
# Reports that carry the times they report (a transfer's end and bytes, the KV's arrival, a
# handoff's start and bytes): when the frontend reads one moves no recorded time (only the
# router's later estimates a little: docs/architecture.md), so its lateness there is reported
# (`report`), not judged (docs/validation.md, "Which lag counts"). A decode instance's DRC
# report neither: read late, it leaves the router naming more points, never a different hit.
REPORTS = frozenset({"transfer_done", "kv_arrived", "handoff_sent", "drc_report"})


def routed_now(record: RequestRecord, now: float) -> None:
    """A leg is routed (a first routing, a retry or a move): the request's KV transfer is now
    this leg's (`kv_transfer_s.to_ready` measures it from here), so an earlier leg's
    transfer is not the record's any more."""
    record.routed_s = now
    record.kv_first_chunk_s = record.kv_arrived_s = None


class Unanswered(Exception):
    """An instance did not answer the routing exchange in time: alive perhaps (its handler
    failed, or it does not know the leg), but not judged down, so no failover ends the wait."""

    def __init__(self, instance: str, message: str) -> None:
        super().__init__(message)
        self.instance = instance


@dataclass
class Flight:
    """A request in the frontend, from arrival to its end state."""

    record: RequestRecord
    prompt: list[int]
    session: str | None
    p: str = ""
    decode: str = ""
    rld: str = ""
    ids: dict[int, int] = field(default_factory=dict)  # genuine output index -> id
    pending: dict[int, tuple[float, str, float, str]] = field(
        default_factory=dict
    )  # position -> (delivery time, role, time its instance produced it, the instance)
    delivered: int = 0  # modelled output positions delivered in order
    replies: dict[str, asyncio.Future] = field(default_factory=dict)
    stream: asyncio.Queue = field(default_factory=asyncio.Queue)  # the user's tokens, then None
    streams_tokens: bool = True  # whether its client reads the tokens as they come (or the end)
    done: asyncio.Event = field(default_factory=asyncio.Event)  # every token delivered
    transfers: set[str] = field(
        default_factory=set
    )  # destinations whose transfer P has not reported
    transfers_reported: asyncio.Event = field(default_factory=asyncio.Event)
    decode_reported: asyncio.Event = field(default_factory=asyncio.Event)  # its transfer's end
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # the record is final
    loaded: list[str] = field(default_factory=list)  # instances whose load counts this request
    recorded: bool = False  # the record is written: tokens arriving later are not the user's
    work: asyncio.Task | None = None  # routing and waiting for the tokens (run_flight)
    abandoned: str = ""  # why the request was given up before its end (its client went away)
    leg: str = ""  # the id the instances know the current routing by
    legs: list[str] = field(default_factory=list)  # every leg it had
    relieved: set[str] = field(default_factory=set)  # instances of this leg no longer streaming
    page_hashes: list[int] | None = None  # the prompt's chained page hashes, once (prompt_hashes)
    attempt: asyncio.Task | None = None  # the current routing and wait for the tokens
    reroute: str = ""  # why the current attempt is being replaced by a new routing
    routings: int = 0
    unanswered: set[str] = field(default_factory=set)  # left out of its next routing if others are
    moves: int = 0
    arrival_hold: InstantHold | None = None  # the present held from its arrival to its routing
    answer_hold: InstantHold | None = None  # the present held from reading the decode side's answer
    end_held_by: str = ""  # the relay holding the present at its end until it is settled
    # how long after its recorded time the first token's instance sent it (modelled seconds):
    # its step's genuine work outlasting the modelled length, where nothing holds the clock
    first_token_sent_late_s: float | None = None

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

    def note(self, at: float, text: str) -> None:
        path = self.record.failover_path
        self.record.failover_path = f"{path}; {at:.2f} s: {text}" if path else f"{at:.2f} s: {text}"


class Frontend(Instance):
    role = "FE"
    dated_reads = True  # MD's tokens take the time they reached the host, not their reading

    def __init__(self, spec: InstanceSpec) -> None:
        super().__init__(spec)
        self.system = spec.system
        self.flights: dict[str, Flight] = {}
        self.legs: dict[str, Flight] = {}  # every leg of a request in flight -> its flight
        self.failover_log: list[dict[str, Any]] = []  # what was done when instances were lost
        self.door = OpenAIFrontDoor(self)
        self.verdict: dict[str, Any] | None = None  # `pddemu serve`'s lag verdict so far
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
        self.inexact_dates = 0
        self.unmatched = 0  # requests routed with no decode-side hit (`decode_side_hit`)
        # what it sent each decode instance (from the first), named in its `match` (DRC only)
        self.routed_prompts: dict[str, RoutedPrompts] = {}
        # the matches' bytes as sent (framing included): count, total, smallest, largest
        self.match_bytes = {"count": 0, "total": 0, "min": 0, "max": 0}

    def request_token_limit(self) -> int:
        """Modelled tokens (prompt and output) one request may have: what the smallest instance
        serving it can hold, as KV (the bound on every size a client sends)."""
        roles = {"P", DECODE_ROLE[self.system], *(["RLD"] if self.rld_names else [])}
        return min(
            cost_model(self.config, self.system, role).kv_capacity_tokens() for role in roles
        )

    async def start(self) -> None:
        if self.spec.restarted:  # its peers run already: their silence counts from now
            self.liveness.unheard_since = self.clock.now()
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
        """A connection an instance keeps with the router closed: the process is gone (an
        idle instance has only its heartbeats' connection)."""
        if channel.purpose in ("control", "heartbeat"):
            change = self.liveness.lost(channel.peer, self.clock.now(), "its connection closed")
            if change is not None:
                self.liveness_changed(change)

    def liveness_changed(self, change: Change) -> None:
        self.liveness_changes.append(change)
        log.info(
            "%s: %s %s at %.3f s: %s",
            self.name,
            change.instance,
            change.state,
            change.at_s,
            change.reason,
        )
        if change.state == DOWN:
            if change.instance in self.routed_prompts:  # paused, cut off, or restarted: unknown
                self.routed_prompts[change.instance].lost()
            self.spawn(self.fail_over(change.instance), f"failover from {change.instance}")

    def routable(self, names: list[str]) -> list[str]:
        """The instances among `names` to route to: those up; if none is, those suspect (not
        down); if all are down, all (the request then fails with the reason)."""
        return (
            [name for name in names if self.liveness.routable(name)]
            or [name for name in names if not self.liveness.down(name)]
            or names
        )

    async def tell(self, name: str, kind: str, body: dict[str, Any], *attachments: Any) -> int:
        """An instance that cannot be reached at all (its port refuses: the process is gone)
        is down, as if its connection had closed."""
        try:
            return await super().tell(name, kind, body, *attachments)
        except ConnectionError:
            change = self.liveness.lost(name, self.clock.now(), "its port refused a connection")
            if change is not None:
                self.liveness_changed(change)
            raise

    # -- failover -------------------------------------------------------------------------

    async def fail_over(self, lost: str) -> None:
        """`lost` is down: every request that needs it goes on from what the others hold."""
        for flight in list(self.flights.values()):
            await self.fail_over_one(flight, lost)

    async def fail_over_one(self, flight: Flight, lost: str, why: str = "") -> None:
        """`why`: `lost` said it no longer holds the request (not merely silent)."""
        if flight.recorded:  # over: only the reports of its P's transfers may be awaited
            if lost == flight.p and flight.transfers:
                self.log_failover(flight, lost, "transfers from it dropped")
                self.wan.forget(flight.leg)
                self.transfers_over(flight, set(flight.transfers))
            return
        if lost not in (flight.p, flight.decode, flight.rld):
            return
        try:
            await self.fail_over_flight(flight, lost, why)
        except Exception as error:  # noqa: BLE001 - one request's failover, not the others'
            self.errors.append(f"failover of {flight.record.request_id}: {error!r}")
            flight.abandon(f"{lost} was lost and its failover failed: {error}")

    async def fail_over_flight(self, flight: Flight, lost: str, why: str = "") -> None:
        record = flight.record
        leg = flight.leg
        if not record.pipeline or (lost == flight.p and not flight.ids):
            self.log_failover(flight, lost, "routed again")
            if flight.routings >= MAX_ROUTINGS:
                flight.abandon(f"{lost} was lost before the first token, twice")
            else:  # before its first token: route it again from the start, elsewhere
                flight.reroute = f"{lost} lost before the first token"
                if flight.attempt is not None:
                    flight.attempt.cancel()
            return
        if lost == flight.p:  # its prompt is computed: only P's unreported transfers end
            self.log_failover(flight, lost, "transfers from it dropped")
            self.wan.forget(leg)
            self.transfers_over(flight, set(flight.transfers))
            return
        if lost == flight.rld and record.pipeline == "P-RLD-MD" and not flight.md_took_over:
            if self.liveness.routable(flight.decode):  # MD holds (or gets) the prompt's KV
                self.log_failover(flight, lost, f"resumed on {flight.decode}")
                flight.note(self.clock.now(), f"{lost} lost: {flight.decode} resumes the stream")
                record.failovers += 1
                ids, position = self.resume_point(flight)
                await self.tell(
                    flight.decode, "resume", {"rid": leg, "ids": ids, "position": position}
                )
                await self._quietly(self.tell(lost, "release", {"rid": leg, "kv_expected": True}))
                self.relieve(flight, lost)
                flight.rld = ""
                return
        if (
            lost == flight.decode
            and record.pipeline == "P-RLD-MD"
            and not flight.md_took_over
            and flight.rld
            and self.liveness.routable(flight.rld)
        ):  # the relay finishes it, as PDD's fallback
            self.log_failover(flight, lost, f"finished on {flight.rld}")
            flight.note(self.clock.now(), f"{lost} lost: {flight.rld} finishes the request")
            await self._quietly(self.tell(flight.rld, "md_lost", {"rid": leg}))
            await self._quietly(self.tell(flight.p, "cut", {"rid": leg, "destination": lost}))
            await self._quietly(self.tell(lost, "release", {"rid": leg, "kv_expected": True}))
            self.wan.forget(leg)
            self.transfers_over(flight, {lost})
            self.relieve(flight, lost)
            flight.decode = ""
            return
        if lost == flight.rld and flight.md_took_over and flight.decode:
            return  # the relay had handed the request over (not moved to it: MD lost)
        await self.move(flight, lost, why)

    def relieve(self, flight: Flight, lost: str) -> None:
        """`lost` no longer streams this leg (its survivor streams from the user's position on):
        what it sent and the user has not got yet is dropped, and so is what it still sends
        (it may only have seemed lost: a silence under load, a slow link)."""
        flight.relieved.add(lost)
        for position in [p for p, held in flight.pending.items() if held[3] == lost]:
            del flight.pending[position]

    async def move(self, flight: Flight, lost: str, why: str = "") -> None:
        """Move the stream to another decode instance (another MD or D; for pdd, the relay if
        no MD is left): P sends it the prompt's KV (its prefix cache makes the prefill cheap;
        an MD's DRC keeps the transfer to the increment), it recomputes the KV of the tokens
        the user already has in one extend and streams on from the next position."""
        if flight.moves >= MAX_MOVES:
            flight.abandon(f"{lost} was lost after {flight.moves} moves")
            return
        target = self.move_target(flight)
        if target is None and not why and lost not in self.liveness.gone:
            # only silent (a partition, or paused): it may still hold the request; wait for it
            self.log_failover(flight, lost, "waits: nothing to move to")
            return
        if target is None:
            self.log_failover(flight, lost, "failed: nothing to move to")
            flight.abandon(f"{lost} was lost and no decode instance is left to take the request")
            return
        flight.moves += 1
        record = flight.record
        old = flight.leg
        await self._quietly(self.tell(lost, "release", {"rid": old, "kv_expected": True}))
        if flight.p:
            await self._quietly(self.tell(flight.p, "cut", {"rid": old, "destination": lost}))
        self.wan.forget(old)
        self.transfers_over(flight, set(flight.transfers))
        leg = self.new_leg(flight, f"{record.request_id}{LEG_SEPARATOR}{len(flight.legs)}")
        ids, position = self.resume_point(flight)
        self.log_failover(flight, lost, f"moved to {target}")
        why = why or f"{lost} lost"
        flight.note(self.clock.now(), f"{why}: moved to {target} at position {position}")
        record.failovers += 1
        p = flight.p if flight.p and self.liveness.routable(flight.p) else ""
        flight.p = p or self.pick(self.p_names, flight.session)
        self.add_load(flight, flight.p)
        self.add_load(flight, target)
        relay = target in self.rld_names
        offset = 0 if relay else await self.held_prefix(flight, target, leg)
        meta = {
            **self.leg_meta(flight),
            "pipeline": "RLD-only" if relay else "P-MD",
            "md": target,
            "resume": {"ids": ids, "position": position},
        }
        if relay:
            flight.rld, flight.decode = target, ""
        else:
            flight.decode = target
            if WAN_DECODE[self.system]:
                increment = self.modelled_tokens(record, len(flight.prompt) - offset)
                self.wan.started(leg, increment * self.target_kv_bytes)
        flight.transfers = {target}
        flight.transfers_reported.clear()
        prompt = TokenIds.from_ints(leg, 0, flight.prompt)
        await self.tell(flight.p, "prefill", {"rid": leg, **meta}, prompt)
        if not relay:
            self.routed_there(target, leg, flight)
        destination = {"name": target, "offset": offset, "meta": meta}
        routed_now(record, self.clock.now())
        await self.tell(flight.p, "route", {"rid": leg, "destinations": [destination]})

    def move_target(self, flight: Flight) -> str | None:
        """A live decode instance of the system's kind; for pdd, else a live relay."""
        decodes = [n for n in self.decode_names if self.liveness.routable(n)]
        if decodes:
            return self.pick(decodes, flight.session)
        relays = [n for n in self.rld_names if self.liveness.routable(n)]
        return self.pick_least_loaded(relays) if relays else None

    async def held_prefix(self, flight: Flight, target: str, leg: str) -> int:
        """How much of the prompt `target`'s DRC holds (pinned for the leg), asked with a
        deadline: a target that does not answer in time gets the whole prompt."""
        if not self.asks_decode_side:
            flight.record.md_hit_tokens = 0
            return 0
        loop = asyncio.get_running_loop()
        flight.replies = {"matched": loop.create_future()}
        await self.ask_match(target, leg, flight)
        try:
            hit = await self.decode_side_hit(flight, target)
        finally:
            self.drop_answer_hold(flight)
        flight.record.md_hit_tokens = self.modelled_tokens(flight.record, hit)
        return hit

    async def ask_match(self, target: str, leg: str, flight: Flight) -> None:
        """Ask `target` how much of the prompt its DRC holds: named by the chained hashes of
        the points where it leaves the prompts routed there (`RoutedPrompts`), not its ids."""
        record = self.prompts_routed_to(target)
        body = {
            "rid": leg,
            "prompt_tokens": len(flight.prompt),
            "prefixes": record.named(flight.prompt, self.prompt_hashes(flight)),
            "heard": record.acknowledged(),
        }
        sent = await self.tell(target, "match", body)
        tally = self.match_bytes
        tally["min"] = min(tally["min"], sent) if tally["count"] else sent
        tally["max"] = max(tally["max"], sent)
        tally["count"] += 1
        tally["total"] += sent

    def routed_there(self, target: str, leg: str, flight: Flight) -> None:
        """P is told to send the leg's KV to `target`: its record of what it may hold."""
        if self.asks_decode_side:
            self.prompts_routed_to(target).routed(leg, flight.prompt, self.prompt_hashes(flight))

    def prompt_hashes(self, flight: Flight) -> list[int]:
        """The chained hashes of the prompt's pages, computed once for the request (its
        matches name points by them, the DRC's reports keep pages by them)."""
        if flight.page_hashes is None:
            flight.page_hashes = chained_page_hashes(flight.prompt, self.page_tokens)
        return flight.page_hashes

    def prompts_routed_to(self, target: str) -> RoutedPrompts:
        if target not in self.routed_prompts:
            self.routed_prompts[target] = RoutedPrompts(self.page_tokens)
        return self.routed_prompts[target]

    @property
    def asks_decode_side(self) -> bool:
        """Whether the decode side is asked how much of a prompt it holds (`match`): only
        with a DRC. Without one it holds nothing, its answer is 0 whatever the prompt, and the
        question would still cross the WAN (at full load late enough to route `unmatched`)."""
        return self.config.policy.drc

    def resume_point(self, flight: Flight) -> tuple[list[int], int]:
        """The genuine ids of every output whose tokens the user has begun to get, and the
        modelled position the stream goes on from."""
        position = flight.delivered
        if position == 0:
            return [], 0
        count = output_index(position - 1, self.config.scale.token_scale) + 1
        return [flight.ids[i] for i in range(count)], position

    def transfers_over(self, flight: Flight, names: set[str]) -> None:
        """Transfers that will not be reported (their P or their receiver is lost)."""
        flight.transfers -= names
        if not flight.transfers:
            flight.transfers_reported.set()

    def log_failover(self, flight: Flight, lost: str, action: str) -> None:
        self.failover_log.append(
            {
                "at_s": self.clock.now(),
                "instance": lost,
                "request": flight.record.request_id,
                "action": action,
            }
        )

    async def forget_leg(self, flight: Flight) -> None:
        """An abandoned routing: what its instances hold for it is released (an instance that
        was lost gets the message if it comes back), and nothing of it counts any more."""
        leg = flight.leg
        for name in flight.loaded:
            self.load[name] -= 1
        flight.loaded = []
        if flight.p:
            await self._quietly(self.tell(flight.p, "cancel", {"rid": leg}))
        # KV is on its way only to the destinations P was routed to (the relay is picked with
        # the route); a decode side that only got the match keeps nothing waiting for it
        routed_to_decode = flight.record.pipeline not in ("", "RLD-only")
        for name, kv_expected in ((flight.rld, True), (flight.decode, routed_to_decode)):
            if name:
                body = {"rid": leg, "kv_expected": kv_expected}
                await self._quietly(self.tell(name, "release", body))
        self.wan.forget(leg)
        flight.p = flight.decode = flight.rld = ""
        flight.transfers = set()
        flight.transfers_reported.set()
        record = flight.record
        record.pipeline = ""
        record.md_hit_tokens = None
        record.wan_bytes_without_drc = 0

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/generate", self.http_generate)
        app.router.add_post("/admin/verdict", self._admin_verdict)
        app.router.add_get("/liveness", self._liveness)
        self.door.add_routes(app)

    async def _liveness(self, _request: web.Request) -> web.Response:
        """Who is alive as this router sees it (`Liveness.view`): what the deployment waits on
        before it counts an instance started, lighter to ask for often than `/stats`."""
        return web.json_response(self.liveness.view(self.clock.now()))

    async def _admin_verdict(self, request: web.Request) -> web.Response:
        """`pddemu serve`'s judgement of the lag so far (`pddemu.serve.keep_verdict_live`),
        kept to be shown in `/stats`: the frontend alone does not see every instance's lag."""
        try:
            verdict = await request.json()
        except ValueError as error:
            return web.json_response({"error": f"bad verdict: {error}"}, status=400)
        if not isinstance(verdict, dict):
            return web.json_response({"error": "the verdict must be a JSON object"}, status=400)
        self.verdict = verdict
        return web.json_response({"ok": True})

    def add_public_routes(self, app: web.Application) -> None:
        self.door.add_routes(app)  # the same door: one count of the requests it holds

    # -- the request API ------------------------------------------------------------------

    async def http_generate(self, request: web.Request) -> web.StreamResponse:
        """POST a request; the answer streams NDJSON lines: tokens as they come, then the record.
        With `"stream_tokens": false` only the record (which holds every token's time): the
        replayer's, which needs no line per token, written while the next message waits."""
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

    def admit(self, body: dict[str, Any], arrival: float | None = None) -> Flight:
        """A request from a client; `arrival` (modelled) is when the door received it (now, if
        not given)."""
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
        streams_tokens = body.get("stream_tokens", True)
        if not isinstance(streams_tokens, bool):
            raise ValueError("stream_tokens must be true or false")
        record = RequestRecord(
            request_id=rid,
            system=self.system,
            arrival_s=self.clock.now() if arrival is None else arrival,
            input_tokens=input_tokens,
            expected_output_tokens=output_tokens,
        )
        flight = Flight(record, prompt, session, streams_tokens=streams_tokens)
        flight.arrival_hold = self.clock.hold_instant()  # until route() has P's hit
        self.flights[rid] = flight
        self.new_leg(flight, rid)
        return flight

    def new_leg(self, flight: Flight, leg: str) -> str:
        """A new routing: its instances stream every position from the user's, so what earlier
        legs sent and the user has not got yet is theirs to send again."""
        flight.leg = leg
        flight.pending.clear()
        flight.relieved.clear()
        flight.legs.append(leg)
        self.legs[leg] = flight
        return leg

    # -- one request ----------------------------------------------------------------------

    async def serve_flight(self, flight: Flight) -> None:
        record = flight.record
        timeout = self.config.request_timeout_s  # modelled seconds
        flight.work = asyncio.ensure_future(self.run_flight(flight))
        if flight.abandoned:  # before it started
            flight.work.cancel()
        try:
            await self.clock.within(flight.work, timeout)
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
        except Unanswered as error:  # its message says it all
            self.fail(flight, str(error))
        except Exception as error:  # noqa: BLE001 - the request fails, the frontend goes on
            self.fail(flight, f"{type(error).__name__}: {error}")
        finally:
            if flight.arrival_hold is not None:  # it never got to its routing
                flight.arrival_hold.release()
            self.finish_record(flight)
            flight.stream.put_nowait(None)  # the user's stream is complete
            try:
                await self.settle(flight)
            finally:  # a relay holding the clock at this end waits for `settled` whatever
                await self.let_end_go(flight)
            await self.await_transfers(flight, timeout)
            self.flights.pop(record.request_id, None)
            for leg in flight.legs:
                self.legs.pop(leg, None)
            flight.settled.set()

    async def await_transfers(self, flight: Flight, timeout: float) -> None:
        """A transfer can outlive its request (the relay finished it while MD's copy of the KV
        was still crossing the WAN); its bytes belong to the request's record all the same."""
        if not flight.transfers:
            return
        try:
            await self.clock.within(flight.transfers_reported.wait(), timeout)
        except TimeoutError:
            self.errors.append(
                f"{flight.record.request_id}: transfers to {sorted(flight.transfers)} never reported"
            )

    def fail(self, flight: Flight, reason: str) -> None:
        flight.record.state = "failed"
        flight.record.failure_reason = reason

    async def run_flight(self, flight: Flight) -> None:
        """Route the request and wait for its tokens; an instance lost before the first token
        has it routed once more from the start, on other instances."""
        while True:
            flight.routings += 1
            flight.attempt = asyncio.ensure_future(self.route(flight))
            try:
                await flight.attempt
                return
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not flight.reroute or (task is not None and task.cancelling()):
                    raise
            except (ConnectionError, Unanswered) as error:  # gone, or silent on this leg
                if flight.ids or flight.routings >= MAX_ROUTINGS:
                    raise
                if isinstance(error, Unanswered):
                    flight.unanswered.add(error.instance)
                flight.reroute = (
                    str(error)
                    if isinstance(error, Unanswered)
                    else f"an instance could not be reached ({error})"
                )
            reason, flight.reroute = flight.reroute, ""
            await self.forget_leg(flight)
            flight.record.retries += 1
            leg = self.new_leg(
                flight, f"{flight.record.request_id}{LEG_SEPARATOR}{len(flight.legs)}"
            )
            flight.note(self.clock.now(), f"{reason}: routed again as {leg}")

    async def route(self, flight: Flight) -> None:
        hold, flight.arrival_hold = flight.arrival_hold or self.clock.hold_instant(), None
        try:
            await self.route_exchange(flight, hold)
        finally:
            hold.release()
            self.drop_answer_hold(flight)
        await flight.done.wait()

    async def route_exchange(self, flight: Flight, hold: InstantHold) -> None:
        """Ask P and the decode side, choose the pipeline, tell P: under `hold`, let go only
        while an answer crosses a path with modelled time, and taken again once it is read."""
        rid = flight.leg
        flight.p = self.pick(self.answering(flight, self.p_names), flight.session)
        flight.decode = self.pick(self.answering(flight, self.decode_names), flight.session)
        meta = self.leg_meta(flight)
        loop = asyncio.get_running_loop()
        flight.replies = {"p_hit": loop.create_future(), "routed": loop.create_future()}
        prompt = TokenIds.from_ints(rid, 0, flight.prompt)
        self.add_load(flight, flight.p)
        # Both leave now; the match is not waited for under the hold: across the WAN, a
        # connection still to open takes modelled time (the run's first request to an MD).
        # With no DRC there is nothing to ask: the route waits for P alone.
        match = None
        if self.asks_decode_side:
            flight.replies["matched"] = loop.create_future()
            match = asyncio.ensure_future(self.ask_match(flight.decode, rid, flight))
        try:
            await self.tell(flight.p, "prefill", {"rid": rid, **meta}, prompt)
            if not self.exact(flight.p):
                hold.release()
            p_hit = (await self.answer(flight, "p_hit", flight.p))["hit"]
            if match is not None:
                if not self.exact(flight.decode):
                    hold.release()  # its answer crosses modelled time (the WAN)
                await match
        finally:
            if match is not None and not match.done():
                match.cancel()
            elif match is not None and not match.cancelled():
                match.exception()  # raised above when it failed; retrieved either way
        md_hit = 0 if match is None else await self.decode_side_hit(flight, flight.decode)
        if hold.released and self.exact(flight.p):  # the decision and the route take no time
            hold, flight.answer_hold = flight.answer_hold or self.clock.hold_instant(), None
        try:
            await self.decide_and_route(flight, p_hit, md_hit, meta, hold.wall_left())
        finally:
            hold.release()

    async def decode_side_hit(self, flight: Flight, instance: str) -> int:
        """How much of the prompt `instance`'s DRC holds for the flight's leg (pinned there);
        0 when its answer does not come within the patience (`answer`). The instance is heard
        from (it is not down), so it is routed to all the same, with the whole prompt: a cache
        lookup that comes late costs the request its hit, as with a real router, not its
        routing. Its late answer, if it comes, is not waited for. The record says so
        (`unmatched`): the modelled WAN holds an answer no longer than the patience, so such a
        run is not valid (`pddemu.metrics.summary.judge_unmatched`). An instance found down
        meanwhile (a move's target lost while asked) was silent for its loss, not for the WAN:
        that is a failover's, not counted."""
        try:
            return int((await self.answer(flight, "matched", instance))["hit"])
        except Unanswered as error:
            flight.replies["matched"].cancel()
            if not self.liveness.down(instance) and not flight.record.unmatched:
                flight.record.unmatched = True
                self.unmatched += 1
            flight.note(self.clock.now(), f"{error}: routed with no hit there")
            return 0

    async def answer(self, flight: Flight, kind: str, instance: str) -> dict[str, Any]:
        """`instance`'s reply `kind` for the flight's leg, waited for no longer than the router
        gives a silent instance before it is down, beyond what the WAN may hold the question
        and its answer (`answer_patience_s`): only that reply or a failover ends the wait, and
        an instance that is heard from but never answers this leg would otherwise hold the
        request until its timeout. As the liveness checks do, the wait counts only while this
        frontend runs on time: a wake-up late by a heartbeat period or more (its own loop was
        busy, and the answer may be waiting unread) does not count."""
        patience = self.answer_patience_s()
        period = self.config.faults.heartbeat_period_s
        reply = flight.replies[kind]
        counted = 0.0
        while not reply.done() and counted < patience:
            step = min(period, patience - counted)
            timer = asyncio.ensure_future(self.clock.sleep_until(self.clock.now() + step))
            try:
                await asyncio.wait({reply, timer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
            if reply.done():
                break
            await asyncio.sleep(0)  # what arrived meanwhile is read before it is judged
            if timer.result() < period:
                counted += step
        if reply.done():
            return reply.result()
        raise Unanswered(
            instance,
            f"{instance} did not answer {kind} for {flight.leg} within {patience:g} modelled s",
        )

    def answer_patience_s(self) -> float:
        """How long an answer to the routing exchange is waited for (modelled): the silence
        after which an instance would be down (`faults.down_after`), plus the longest the WAN
        can hold a question and its answer without losing them: each way, the one-way delay,
        3 jitter deviations and a full bottleneck queue (`[wan] queue_ms` at its rate, by
        default one round trip: `queue_seconds`), so that a question queued behind KV (under
        `fifo`) is not taken for silence. A loss adds the retransmission timeout (200 ms at
        least), which the 2 s default of down_after covers several times over."""
        wan = self.config.wan
        queue_s = queue_seconds(self.config) or 0.0
        return self.config.faults.down_after_s + 2 * (wan.delay_s + 3 * wan.jitter_s + queue_s)

    async def decide_and_route(
        self,
        flight: Flight,
        p_hit: int,
        md_hit: int,
        meta: dict[str, Any],
        held_for_s: float,
    ) -> None:
        """Choose the pipeline and tell P; on P's host, wait until P says its sends are under
        way, or `held_for_s` of wall time (what is left of the hold over the exchange: the wait
        keeps the clock held no longer than its cap)."""
        record = flight.record
        rid = flight.leg
        scale = self.config.scale.token_scale
        record.p_hit_tokens = min(p_hit * scale, record.input_tokens)
        increment = self.modelled_tokens(record, len(flight.prompt) - md_hit)
        flight.features = self.routing_features(flight)
        if self.system == "pdd":
            flight.prediction = self.predictor.predict(flight.features)
            record.predicted_output_tokens = flight.prediction.tokens
        decided = self.decide(flight.features, flight.prediction, increment)
        pipeline = self.reachable(decided)
        if pipeline != decided:
            flight.note(self.clock.now(), f"routed {pipeline}, not {decided}: instances down")
        record.pipeline = pipeline
        record.wan_bytes_without_drc = (
            record.input_tokens * self.target_kv_bytes
            if WAN_DECODE[self.system] and pipeline != "RLD-only"
            else 0
        )
        destinations = []
        meta = {**meta, **self.leg_meta(flight), "pipeline": pipeline, "md": flight.decode}
        if pipeline in ("P-RLD-MD", "RLD-only"):
            flight.rld = self.pick_least_loaded(self.rld_names)
            meta["rld"] = flight.rld
            destinations.append({"name": flight.rld, "offset": 0, "meta": meta})
            self.add_load(flight, flight.rld)
        if pipeline != "RLD-only":
            record.md_hit_tokens = min(md_hit * scale, record.input_tokens)
            destinations.append({"name": flight.decode, "offset": md_hit, "meta": meta})
            self.routed_there(flight.decode, rid, flight)
            self.add_load(flight, flight.decode)
            if WAN_DECODE[self.system]:
                self.wan.started(rid, increment * self.target_kv_bytes)
        else:
            if decided == "RLD-only":  # the anomaly filter's choice, not a failover's
                record.anomaly_filtered = True
                record.wan_bytes_cancelled = increment * self.target_kv_bytes
            if self.asks_decode_side:  # it pinned the prompt's hit for the leg
                await self.tell(flight.decode, "release", {"rid": rid, "kv_expected": False})
        flight.transfers = {d["name"] for d in destinations}
        routed_now(record, self.clock.now())
        await self.tell(flight.p, "route", {"rid": rid, "destinations": destinations})
        if self.exact(flight.p):  # P answers once its sends are under way (or the hold's cap)
            try:
                await asyncio.wait_for(flight.replies["routed"], held_for_s)
            except TimeoutError:
                pass

    def leg_meta(self, flight: Flight) -> dict[str, Any]:
        """What every instance a leg goes to is told of the request: what it plans with is the
        router's prediction of the output length (once made); `output_tokens` is the position
        of the model's EOS, which an instance reads only as each position is produced
        (`DecodeRequest.ended`)."""
        record = flight.record
        meta = {
            "input_tokens": record.input_tokens,
            "output_tokens": record.expected_output_tokens,
            "frontend": self.name,
            "session": flight.session,
        }
        if flight.prediction is not None:
            meta["predicted_output_tokens"] = round(flight.prediction.tokens)
        return meta

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

    def reachable(self, pipeline: str) -> str:
        """The pipeline without a part every instance of which is down (suspect ones, only
        silent a while, still count): no relay left, P-MD; no MD left, RLD-only."""
        if self.system != "pdd":
            return pipeline
        relay = any(not self.liveness.down(name) for name in self.rld_names)
        md = any(not self.liveness.down(name) for name in self.decode_names)
        if pipeline in ("P-RLD-MD", "RLD-only") and not relay and md:
            return "P-MD"
        if pipeline in ("P-RLD-MD", "P-MD") and not md and relay:
            return "RLD-only"
        return pipeline

    def answering(self, flight: Flight, names: list[str]) -> list[str]:
        """`names` without those that did not answer this request's earlier routing (alive,
        perhaps, but not answering it), unless no other is left that is not down."""
        others = [n for n in names if n not in flight.unanswered and not self.liveness.down(n)]
        return others or names

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
        A completed request's delivered length teaches the output length predictor.

        Where such an end comes from the relay (a path without modelled time), the relay holds
        the clock at it until this is done (`let_end_go`), so none of it moves with this
        frontend's lateness in reading the last token. The cut also says when it was decided
        (`at`: the last token's time): P counts as not sent what it handed over after that
        (bytes the relay's own lateness let through, or, past the hold's cap, this one's)."""
        rid = flight.leg
        for name in flight.loaded:
            self.load[name] -= 1
        flight.loaded = []
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
            times = flight.record.token_times_s
            decided = times[-1] if times else self.clock.now()
            await self._quietly(
                self.tell(
                    flight.p, "cut", {"rid": rid, "destination": flight.decode, "at": decided}
                )
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

    async def let_end_go(self, flight: Flight) -> None:
        """The request is settled: the relay that holds the clock at its end
        (`RelayInstance.to_frontend`) lets time go on, once P has applied the cut, if one was
        sent (P's report on the transfer: cut, or ended before the cut came; the hold's cap
        at most)."""
        if not flight.end_held_by:
            return
        if flight.cut:
            try:
                await asyncio.wait_for(flight.decode_reported.wait(), INSTANT_HOLD_CAP_S)
            except TimeoutError:
                pass
        await self.settled(flight.end_held_by, flight.leg)

    async def settled(self, holder: str, rid: str) -> None:
        """Tell the relay holding the clock at request `rid`'s end that time may go on."""
        await self._quietly(self.tell(holder, "settled", {"rid": rid}))

    async def _quietly(self, coroutine: Any) -> None:
        """A cleanup message: an instance that cannot be reached (lost, or across a WAN that
        is down) is not waited for beyond a bound, and not an error."""
        try:
            await asyncio.wait_for(coroutine, CLEANUP_TIMEOUT_S)
        except (OSError, TimeoutError):
            pass
        except ValueError as error:
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

    async def on_heartbeat(self, message: Envelope) -> None:
        """Heard (as every message is, in `heard_from`). From a peer on a path without
        modelled time it also says how late this frontend reads its messages (`delivery`,
        reported), all through the run, whatever the system. Read late, a heartbeat delays
        failure detection by as much: a live instance leaves routing only if
        this frontend reads it more than suspect_after - heartbeat_period late (0.4 modelled s
        by default)."""
        at = message.body.get("at")
        if at is not None and message.channel is not None and self.exact(message.channel.peer):
            self.count_message_lag("heartbeat", message.channel.peer, float(at))

    async def on_stream_lost(self, message: Envelope) -> None:
        """An instance no longer holds a request (asked to resume it or finish it alone, or
        its step failed): the request fails over as from a lost instance, so that what the
        leg's other instances hold is resumed or released and P's transfers to it are cut."""
        flight = self.legs.get(message.body["rid"])
        if flight is None or flight.recorded or message.body["rid"] != flight.leg:
            return
        instance = str(message.body["instance"])
        await self.fail_over_one(flight, instance, f"{instance} does not hold it")

    async def on_p_hit(self, message: Envelope) -> None:
        self._reply(message, "p_hit")

    async def on_matched(self, message: Envelope) -> None:
        """The decode side's answer. Across the WAN the shaper held modelled time at its
        release (`Channel.send`'s mark) until this frontend reads it: it holds the present
        itself for the route (`Flight.answer_hold`), then lets the shaper's hold go, so the
        route is decided as of the answer's arrival however late it is read here."""
        wan = message.channel is not None and not self.exact(message.channel.peer)
        # the shaper's hold has stood since the answer's arrival: this one ends at the cap
        # from then, so the two stand the clock still no longer than one cap together
        since = 0.0 if message.received_wall is None else time.monotonic() - message.received_wall
        hold = self.clock.hold_instant(max(0.0, INSTANT_HOLD_CAP_S - since)) if wan else None
        if wan:
            self.clock.let_routing_go(message.received, message.routing_slot)
        flight = self._reply(message, "matched")
        if flight is None or hold is None:
            if hold is not None:
                hold.release()
            return
        self.drop_answer_hold(flight)
        flight.answer_hold = hold

    @staticmethod
    def drop_answer_hold(flight: Flight) -> None:
        """Let go of the present held from reading the decode side's answer, if still held."""
        if flight.answer_hold is not None:
            flight.answer_hold.release()
            flight.answer_hold = None

    async def on_routed(self, message: Envelope) -> None:
        self._reply(message, "routed")

    def _reply(self, message: Envelope, kind: str) -> Flight | None:
        """Hand the reply to the flight's leg waiting for it; returns that flight (else None)."""
        flight = self.legs.get(message.body["rid"])
        if (
            flight is not None
            and message.body["rid"] == flight.leg
            and kind in flight.replies
            and not flight.replies[kind].done()
        ):
            flight.replies[kind].set_result(message.body)
            return flight
        return None

    async def on_drc_report(self, message: Envelope) -> None:
        """What a decode instance's DRC took in and dropped: its record here follows. Only
        a decode instance's (no record is made for another peer's)."""
        if message.channel.peer not in self.decode_names:
            raise ValueError(f"a DRC report from {message.channel.peer}, not a decode instance")
        self.prompts_routed_to(message.channel.peer).reported(message.body)

    async def on_transfer_done(self, message: Envelope) -> None:
        destination = message.body["destination"]
        if destination in self.routed_prompts and int(message.body["tokens_sent"]) == 0:
            # no new page of it can enter the DRC there: the instance may never report on it
            self.routed_prompts[destination].never_came(message.body["rid"])
        flight = self.legs.get(message.body["rid"])
        if flight is None:
            return
        if message.body["rid"] != flight.leg:  # an abandoned leg's: its bytes did cross
            if WAN_DECODE[self.system] and destination in self.decode_names:
                self.add_wan_bytes(flight, int(message.body["bytes"]))
            return
        if destination == flight.decode:
            flight.decode_reported.set()
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
        if message.body.get("unreachable") and not flight.recorded:
            # P could not reach it: it is lost (the router may not have seen it yet); one that
            # did not answer (`silent`) may be alive behind a partition: its heartbeats judge
            # it, and only this request, whose KV will not come, fails over
            cause = message.body.get("cause") or "no cause given"
            change = None
            if message.body.get("silent"):
                flight.note(self.clock.now(), f"P could not reach {destination} ({cause})")
            else:
                change = self.liveness.lost(
                    destination, self.clock.now(), f"P could not reach it ({cause})"
                )
            if change is not None:
                self.liveness_changed(change)  # fails over every request that needs it
            else:
                await self.fail_over_one(flight, destination)

    def add_wan_bytes(
        self, flight: Flight, genuine_bytes: int, modelled_bytes: float | None = None
    ) -> None:
        """KV bytes scale by the byte scale; other payloads say what they stand for."""
        flight.record.wan_bytes_genuine += genuine_bytes
        if modelled_bytes is None:
            modelled_bytes = self.scale.modelled_bytes(genuine_bytes)
        flight.record.wan_bytes += int(modelled_bytes)

    async def on_kv_arrived(self, message: Envelope) -> None:
        """The decode side holds a leg's whole KV. The record keeps its request's current
        leg's transfer (named by the leg, as every routing and move is): an earlier leg's,
        arriving late, is the WAN's estimate's only."""
        body = message.body
        self.wan.arrived(body["rid"], float(body["at"]) - float(body["first_chunk_at"]))
        flight = self.legs.get(body["rid"])
        if flight is not None and flight.leg == body["rid"]:
            flight.record.kv_first_chunk_s = float(body["first_chunk_at"])
            flight.record.kv_arrived_s = float(body["at"])

    async def on_handoff_sent(self, message: Envelope) -> None:
        flight = self.legs.get(message.body["rid"])
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
        flight = self.legs.get(body["rid"])
        held_by = str(body["source"]) if body.get("end_held") else ""
        if flight is None or flight.recorded:  # a failed request's stream is already closed
            if held_by:
                await self.settled(held_by, body["rid"])
            return
        if body["rid"] != flight.leg or body.get("source") in flight.relieved:
            # an abandoned leg's, or a relieved instance's: the stream is another's now (counted,
            # so that an instance streaming after its release stays visible)
            flight.record.dropped_stale_tokens += len(body["times"])
            if held_by:
                await self.settled(held_by, body["rid"])
            return
        if held_by:  # the relay's last token: it holds the clock until this settles it
            flight.end_held_by = held_by
        index, token, first = int(body["index"]), int(body["id"]), int(body["first"])
        known = flight.ids.setdefault(index, token)
        if known != token:
            flight.record.token_mismatch = True
        # Delivery latency to the frontend: none on a path without modelled time (the relay,
        # a baseline's decode), the measured one across the WAN (its queueing is modelled).
        peer = message.channel.peer if message.channel is not None else ""
        if message.received is not None and not message.exact and not self.exact(peer):
            self.inexact_dates += 1
        shift = self.arrival(message) - float(body["sent"])
        times = body["times"]
        if first == 0 and times and flight.first_token_sent_late_s is None:
            flight.first_token_sent_late_s = max(0.0, float(body["sent"]) - float(times[0]))
        if times and first == flight.delivered and not flight.pending:
            # the next positions, nothing held: the group goes to the user's stream whole
            self.deliver(flight, [float(time) + shift for time in times], body["role"], times[0])
        else:
            for offset, time in enumerate(times):
                position = first + offset
                if position < flight.delivered or position in flight.pending:
                    flight.record.duplicate_tokens += 1
                    continue
                flight.pending[position] = (
                    float(time) + shift,
                    body["role"],
                    float(time),
                    str(body.get("source", "")),
                )
            while flight.delivered in flight.pending:
                time, role, produced, _ = flight.pending.pop(flight.delivered)
                self.deliver(flight, [time], role, produced)
        if flight.delivered >= flight.record.expected_output_tokens:
            flight.done.set()

    def deliver(self, flight: Flight, times: list[float], role: str, produced: float) -> None:
        """Hand the next modelled tokens (from one instance's role; `produced`: when it made
        the first) to the user's stream, at `times`. A stream is in order, so no token reaches
        the user before the one ahead of it (a message delayed by the frontend's own load or
        by jitter could otherwise make a later one look earlier)."""
        record = flight.record
        start = flight.delivered
        last = record.token_times_s[-1] if record.token_times_s else -math.inf
        in_order = list(itertools.accumulate(times, max, initial=last))[1:]
        if role == "RLD":
            record.rld_tokens += len(times)
        else:
            if record.rld_tokens and record.handoff_position is None:
                record.handoff_position = start
                record.handoff_resumed_s = float(produced)
            record.md_tokens += len(times)
        record.token_times_s.extend(in_order)
        flight.delivered += len(times)
        if not flight.streams_tokens:
            return
        scale = self.config.scale.token_scale
        index = output_index(start, scale)
        position = output_group_start(index, scale)
        if position < start:  # the group of the first position began before it
            index += 1
            position = output_group_start(index, scale)
        while position < flight.delivered:
            time = in_order[position - start]
            flight.stream.put_nowait({"index": index, "id": flight.ids[index], "time": time})
            index += 1
            position = output_group_start(index, scale)

    def lag_kind(self, kind: str) -> str:
        """Tokens and heartbeats: `delivery`, this frontend's lateness in reading, reported:
        tokens are dated by their sending or the kernel's receipt, an end it must act on is held
        by the relay, a heartbeat only delays failure detection (MD's `matched`, which the route
        waits for, is held by the shaper until read: `on_matched`)."""
        if kind in ("tokens", "heartbeat"):
            return DELIVERY_KIND
        return REPORT_KIND if kind in REPORTS else "handler"

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "in_flight": len(self.flights),
            # MD's token messages whose kernel date a later segment may have pushed back
            # (bytes waited behind them when read): late by at most this frontend's lateness
            "inexact_dates": self.inexact_dates,
            "wan_correction": self.wan.correction,
            "liveness": [asdict(change) for change in self.liveness_changes],
            "liveness_view": self.liveness.view(self.clock.now()),
            "failovers": self.failover_log,
            "door": self.door.stats(),
            "unmatched": self.unmatched,  # serve's verdict judges them (emulate: the records)
            "match_bytes": self.match_bytes,
            "verdict": self.verdict,  # pddemu serve's lag verdict so far (None elsewhere)
        }
