"""The process every emulated instance is: a uvloop event loop, a TCP data plane speaking the
wire format, and an aiohttp control plane (health, stats, shutdown).

Both are closed to anyone without the run's secret (`pddemu.runtime.auth`): every HTTP route
but `/health` asks for it, and a data-plane connection whose hello does not prove it is dropped
before any of its frames is read. An HTTP handler is cancelled when its client goes away.

Subclasses register handlers by control-message kind (`on_<kind>` methods) and may handle bare
KV chunks / token-id frames (`on_kv_chunk`, `on_token_ids`). Long-lived connections to peers
are opened on first use and kept (`peer(name)`), as are P's KV links (`open`, `KvLinks`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from aiohttp import web

from netem.elements.delay import lowest_jitter
from pddemu.config import ROLES, Config, config_from_json
from pddemu.host_door import public_application
from pddemu.metrics.reservoir import Reservoir
from pddemu.model import ModelConfig
from pddemu.roles.carried_lag import CarriedLag
from pddemu.roles.sizing import cost_model
from pddemu.roles.spec import Address, InstanceSpec
from pddemu.runtime.auth import AuthError, HelloCheck, RunSecret
from pddemu.runtime.channel import HELLO, Channel, Envelope
from pddemu.runtime.clock import ModelledClock
from pddemu.runtime.events import EventLog
from pddemu.wire import Control, KVChunk, Limits, Message, TokenIds, read_message

log = logging.getLogger("pddemu.instance")
T = TypeVar("T")
BACK_TO_BACK_S = 0.05  # real time: a step this soon after the last one continues its timeline
MAX_HTTP_BODY_BYTES = 16 << 20  # a request to an instance (a prompt's ids, a policy change)
OPEN_ROUTES = frozenset({"/health"})  # what answers without the run's secret
HELLO_LIMITS = Limits(
    max_frame_bytes=4096, max_tensor_bytes=1, max_control_body_bytes=2048, max_token_ids=1
)
# loop turns the stop cancels its background tasks in at most (`Instance.end_tasks`): one
# for each await of a task's clean-up, which these are far from
END_TASK_TURNS = 100
HELLO_TIMEOUT_S = 10.0  # wall seconds a new connection has to say hello (a bound, not a measure)
# Forced lateness, for tests that show which lag reaches a result: "FE0:p_hit,routed:0.02;..."
# makes instance FE0 block its event loop 20 ms of wall time before handling each message of
# those kinds, as a host busy elsewhere would; "0.02m" blocks it 20 ms of modelled time (wall
# time at the clock's present rate), a lateness the same in the results whatever the rate.
STALL_ENV = "PDDEMU_STALL"


class Instance:
    role = "?"
    # Whether its connections are read with kernel-dated reads (`pddemu.runtime.dated_reads`),
    # on a shared clock: each control message then says when it reached the host (`received`).
    dated_reads = False

    def __init__(self, spec: InstanceSpec) -> None:
        self.spec = spec
        self.name = spec.me.name
        self.use_secret(RunSecret.new())  # a run's instances are given the run's (__main__)
        self.refused = {"control": 0, "data": 0}  # requests and connections without the secret
        self.broken_channels = 0  # connections that ended mid-frame or with a bad frame
        self.config: Config = config_from_json(spec.config)
        # before the clock's slot is claimed: a malformed setting leaves none behind
        self.stalls = stalls_of(os.environ.get(STALL_ENV, ""), self.name)
        self.clock = (
            ModelledClock.attach(spec.clock, self.name)
            if spec.clock
            else ModelledClock.fixed(spec.epoch, 1.0)  # a network without a page: real time
        )
        self.transit = self._transits()
        self._peers: dict[str, Channel] = {}
        self._peer_locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task] = set()
        self._accepting: set[asyncio.Task] = set()  # the accepted connections' (not dated)
        self._compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")
        self._heartbeat_thread: threading.Thread | None = None
        self._heartbeat_loop: asyncio.AbstractEventLoop | None = None
        self._heartbeat_task: asyncio.Task | None = None
        self.stopping = asyncio.Event()
        self.errors: list[str] = []
        # a bounded sample, exact totals (serve has no end)
        self.lag_samples_s = Reservoir(seed=f"step lag:{self.name}")  # its own slots
        # Each request's share of the step lag: the lateness of the steps it was in, summed
        # (leg ids, requests with none left out): what its recorded times can carry of it.
        self.carried_lag_s = CarriedLag()  # the most recent legs' only: serve runs without end
        self.resumed_at = -math.inf  # modelled time the last pause fault ended (SIGCONT)
        self.dates_past_history = 0  # kernel dates older than the clock's anchor history
        self.steps = 0
        self.busy_s = 0.0
        self.events = EventLog()  # spans for timelines (pddemu export --format perfetto)
        self.model_config = ModelConfig(**self.config.model)
        scale = self.config.scale.token_scale
        self.page_tokens = max(1, self.config.cache_page_tokens // scale)
        self.chunk_genuine = self.config.prefill.chunk_tokens // scale
        self.cost = (
            cost_model(self.config, spec.system, spec.me.role) if spec.me.role in ROLES else None
        )

    def use_secret(self, secret: RunSecret) -> None:
        self.secret = secret
        self.hellos = HelloCheck(secret, self.name)

    def kv_capacity_genuine(self) -> int:
        """Genuine tokens of KV this instance may keep (its hardware's capacity, scaled)."""
        assert self.cost is not None
        return self.cost.kv_capacity_tokens() // self.config.scale.token_scale

    # -- life cycle ---------------------------------------------------------------------

    @property
    def reads_dated(self) -> bool:
        return self.dated_reads and self.clock.shared

    async def run(self) -> None:
        server: asyncio.Server | DatedServer
        if self.reads_dated:
            server = DatedServer(self.spec.me.addr, self.spec.me.data_port, self._accept_dated)
        else:
            server = await asyncio.start_server(
                self._accept, self.spec.me.addr, self.spec.me.data_port, limit=1 << 22
            )
        app = web.Application(client_max_size=MAX_HTTP_BODY_BYTES, middlewares=[self._authenticate])
        app.router.add_get("/health", self._health)
        app.router.add_get("/stats", self._stats)
        app.router.add_post("/shutdown", self._shutdown)
        app.router.add_post("/admin/policy", self._admin_policy)
        self.add_routes(app)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, self.spec.me.addr, self.spec.me.http_port).start()
        public = await self._open_host_door()
        if threading.current_thread() is threading.main_thread():
            # A Python-level handler, not the loop's: it runs before any coroutine goes on
            # after the resume (the loop's would be queued behind what woke with it).
            signal.signal(signal.SIGCONT, self._resumed)
        try:
            await self.start()
            if self.role != "FE":
                self.start_heartbeats()
            await self.stopping.wait()
        finally:
            try:
                await self.close_connections(server)
                await runner.cleanup()
                if public is not None:
                    await public.cleanup()
            finally:  # a failed close still ends the tasks and threads before the clock's page
                await self.end_tasks()
                self._compute.shutdown(wait=True)
                self.stop_heartbeats()
                self.clock.close()

    async def close_connections(self, server: asyncio.Server | DatedServer) -> None:
        """Stop accepting and end every connection, and the tasks serving them: none is left
        pending when the process closes its loop."""
        server.close()
        for channel in self._peers.values():
            channel.close()
        for task in self._accepting:
            task.cancel()
        await asyncio.gather(*self._accepting, return_exceptions=True)
        if isinstance(server, DatedServer):
            await server.wait_closed()

    async def end_tasks(self) -> None:
        """End the background tasks (`spawn`) before the clock's page is closed, so that none
        wakes and reads it after (the loop may run a task already due after the stop). Each is
        cancelled again every loop turn while its clean-up awaits (a flight waiting for its
        transfers' reports, from peers being closed too): the stop waits for no one's answer,
        and a task that swallowed END_TASK_TURNS cancellations is left as it is."""
        for _ in range(END_TASK_TURNS):
            pending = [task for task in self._tasks if not task.done()]
            if not pending:
                return
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=0)

    async def start(self) -> None:
        """Start the role's own loops (subclasses)."""

    def add_routes(self, app: web.Application) -> None:
        """Extra HTTP routes (the frontend's request API)."""

    def add_public_routes(self, app: web.Application) -> None:
        """The routes a host client may reach through `pddemu serve`'s door (the frontend's)."""

    async def _open_host_door(self) -> web.AppRunner | None:
        """Serve `pddemu serve`'s host door on the socket handed to this process, if one was
        (`pddemu.host_door`): made in the host's namespace, it is reachable from the host."""
        fd = self.spec.extra.get("host_door_fd")
        if fd is None:
            return None
        app = public_application(self.add_public_routes, self._health, MAX_HTTP_BODY_BYTES)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.SockSite(runner, socket.socket(fileno=int(fd))).start()
        return runner

    def start_heartbeats(self) -> None:
        """Heartbeats come from a thread of their own, on a connection of their own: they prove
        the process runs (a kill or a SIGSTOP ends them), not that its event loop is free
        (genuine compute may hold the loop for longer than a heartbeat period, and a busy
        instance is not a lost one). The caller waits until the thread's loop runs or the
        thread has failed (then raises), with no time limit a slow host could exceed."""
        started = threading.Event()
        failed: list[BaseException] = []

        async def beat() -> None:
            self._heartbeat_loop = asyncio.get_running_loop()
            self._heartbeat_task = asyncio.current_task()
            started.set()
            try:
                await self.heartbeats()
            except asyncio.CancelledError:  # stopped (`stop_heartbeats`)
                pass

        def thread() -> None:
            try:
                asyncio.run(beat())
            except BaseException as error:
                if started.is_set():
                    raise
                failed.append(error)  # handed to the caller, which waits for it
                started.set()

        self._heartbeat_thread = threading.Thread(target=thread, name="heartbeats", daemon=True)
        self._heartbeat_thread.start()
        started.wait()
        if failed:
            self._heartbeat_thread.join()
            self._heartbeat_thread = None
            raise RuntimeError(
                f"the heartbeat thread failed before its loop ran: {failed[0]!r}"
            ) from failed[0]

    def stop_heartbeats(self) -> None:
        """End the heartbeat thread and wait for it: it reads the clock's page, which must
        outlive it (`clock.close` unmaps it, and a read after that raises in the thread)."""
        thread = self._heartbeat_thread
        if thread is None:
            return
        loop, task = self._heartbeat_loop, self._heartbeat_task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # its loop has already closed: the thread is ending
                pass
        thread.join()
        self._heartbeat_thread = None

    async def heartbeats(self) -> None:
        """Tell the router this instance is alive, every heartbeat period of modelled time (a
        late wake-up sends one heartbeat, never a burst). Runs on its own thread's loop."""
        routers = [a.name for a in self.spec.peers_with_role("FE")]
        channels: dict[str, Channel] = {}
        period = self.config.faults.heartbeat_period_s
        due = self.clock.now()
        try:
            while True:
                for router in routers:
                    try:
                        channel = channels.get(router)
                        if channel is None or channel.closed:
                            channel = channels[router] = await self.open(router, "heartbeat")
                            log.info("%s: heartbeats to %s from %.3f s", self.name, router, due)
                        await channel.send(Control("heartbeat", {"at": self.clock.now()}))
                    except OSError:  # the router is unreachable: the next heartbeat tries again
                        lost = channels.pop(router, None)
                        if lost is not None:
                            lost.close()
                due = max(due + period, self.clock.now())
                await self.clock.sleep_until(due)
        finally:
            for channel in channels.values():
                channel.close()

    def spawn(self, coroutine: Any, what: str) -> asyncio.Task:
        """A background task whose failure is logged and counted, never silently lost."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)

        def finished(done: asyncio.Task) -> None:
            self._tasks.discard(done)
            if not done.cancelled() and done.exception() is not None:
                error = done.exception()
                text = "".join(traceback.format_exception(error))
                self.errors.append(f"{what}: {error!r}")
                log.error("%s: %s failed:\n%s", self.name, what, text)

        task.add_done_callback(finished)
        return task

    # -- control plane ------------------------------------------------------------------

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path in OPEN_ROUTES or self.secret.allows(request.headers):
            return await handler(request)
        self.refused["control"] += 1
        return web.json_response({"error": "this run's secret is required"}, status=401)

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"name": self.name, "role": self.role, "ok": not self.errors})

    async def _stats(self, _request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _shutdown(self, _request: web.Request) -> web.Response:
        asyncio.get_running_loop().call_soon(self.stopping.set)
        return web.json_response({"stopping": True})

    async def _admin_policy(self, request: web.Request) -> web.Response:
        """Change policy fields live (routing, handoff mode and payload, thresholds, ...), each
        checked as a config file's would be; nothing changes unless every value is valid."""
        try:
            changes = await request.json()
            if not isinstance(changes, dict):
                raise ValueError("the body must be a JSON object of policy fields")
            self.config = self.config.with_policy(**changes)
        except (ValueError, TypeError) as error:
            return web.json_response({"error": str(error)}, status=400)
        return web.json_response({"policy": self.config.policy.model_dump()})

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "lag_samples_s": self.lag_samples_s,
            "lag_samples_totals": self.lag_samples_s.totals(),  # exact [count, sum, max]
            "lags_s": self.clock.lags,
            "lag_totals_s": {kind: lags.totals() for kind, lags in self.clock.lags.items()},
            "carried_lag_s": self.carried_lag_s,
            "carried_lag_dropped": self.carried_lag_s.dropped,
            "holds": self.clock.hold_counts(),
            "steps": self.steps,
            "busy_s": self.busy_s,
            "errors": self.errors,
            "refused": self.refused,
            "broken_channels": self.broken_channels,
            "dates_past_history": self.dates_past_history,
            "cpu_s": time.process_time(),  # genuine CPU this process used: what the emulation costs
            "events": list(self.events.events),
            "events_dropped": self.events.dropped,
        }

    # -- data plane -----------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._accepting.add(task)
        try:
            await self._accept_channel(Channel(reader, writer, peer="?", purpose="?"))
        except asyncio.CancelledError:
            pass  # ended by `close_connections`: asyncio's streams log a cancelled one as an error
        finally:
            self._accepting.discard(task)

    async def _accept_dated(self, sock: socket.socket) -> None:
        channel = Channel.dated(sock, peer="?", purpose="?")
        channel.modelled_at = self.modelled_at
        await self._accept_channel(channel)

    async def _accept_channel(self, channel: Channel) -> None:
        reader = channel.reader
        try:  # the hello is read under caps sized for it: nothing after it is parsed before it is proven
            hello = await asyncio.wait_for(read_message(reader, HELLO_LIMITS), HELLO_TIMEOUT_S)
            if not isinstance(hello, Control) or hello.kind != HELLO or "attach" in hello.body:
                raise AuthError("the first frame is not a hello")
            self.hellos.verify(hello.body)
        except asyncio.CancelledError:  # the instance is stopping
            channel.close()
            raise
        except Exception as error:  # noqa: BLE001 - a peer that cannot say hello is dropped
            self.refused["data"] += 1
            log.warning("%s: refused a connection: %s", self.name, error)
            channel.close()
            return
        channel.peer = str(hello.body["from"])
        channel.purpose = str(hello.body["purpose"])
        channel.stamp = self.clock.now
        if not self.exact(channel.peer):  # its routing messages cross a shaper
            channel.hold_until_shaped = self.clock.hold_until_shaped
        await channel.serve(self._dispatch)
        if channel.broken:
            self.broken_channels += 1
            log.warning("%s: connection from %s broke: %s", self.name, channel.peer, channel.broken)
        self.channel_closed(channel)

    async def _dispatch(self, item: Envelope | Message, channel: Channel) -> None:
        self.heard_from(channel.peer)
        try:
            if isinstance(item, Envelope):
                if item.kind in self.stalls:  # a forced lateness (STALL_ENV)
                    seconds, modelled = self.stalls[item.kind]
                    time.sleep(seconds / self.clock.rate if modelled else seconds)
                if "t" in item.body:
                    self.count_message_lag(item.kind, channel.peer, float(item.body["t"]))
                handler = getattr(self, f"on_{item.kind}", None)
                if handler is None:
                    raise ValueError(
                        f"{self.role} has no handler for {item.kind!r} (from {channel.peer})"
                    )
                await handler(item)
            elif isinstance(item, KVChunk):
                await self.on_kv_chunk(item, channel, channel.read_date())
            elif isinstance(item, TokenIds):
                await self.on_token_ids(item, channel)
        except Exception as error:  # noqa: BLE001 - one bad message must not stop the channel
            self.errors.append(f"{channel.peer}: {error!r}")
            log.exception("%s: handling a message from %s", self.name, channel.peer)

    async def on_kv_chunk(
        self, chunk: KVChunk, channel: Channel, received: float | None = None
    ) -> None:
        raise ValueError(f"{self.role} does not take KV chunks")

    async def on_token_ids(self, ids: TokenIds, channel: Channel) -> None:
        raise ValueError(f"{self.role} does not take bare token ids")

    def address(self, name: str) -> Address:
        try:
            return self.spec.peers[name]
        except KeyError:
            raise ValueError(f"unknown peer {name!r}") from None

    async def peer(self, name: str) -> Channel:
        """The long-lived control connection to a peer (opened once, reopened if closed)."""
        lock = self._peer_locks.setdefault(name, asyncio.Lock())
        async with lock:
            channel = self._peers.get(name)
            if channel is None or channel.closed:
                channel = await self.open(name, "control")
                self._peers[name] = channel
                self.spawn(self._serve_replies(channel), f"replies from {name}")
            return channel

    def connect_early(self, name: str) -> None:
        """Open the control connection to a known peer now, in the background, if there is
        none: a long-lived connection's handshake (a round trip, across the WAN) then falls
        before the first message that needs it. One that fails is opened again on first use."""
        channel = self._peers.get(name)
        if name in self.spec.peers and (channel is None or channel.closed):
            self.spawn(self._connect_quietly(name), f"connection to {name}")

    async def _connect_quietly(self, name: str) -> None:
        try:
            await self.peer(name)
        except OSError:  # unreachable now: the first message to it tries again, and says so
            pass

    async def _serve_replies(self, channel: Channel) -> None:
        await channel.serve(self._dispatch)
        self.channel_closed(channel)

    async def open(self, name: str, purpose: str) -> Channel:
        address = self.address(name)
        channel = await Channel.connect(
            address.addr, address.data_port, self.name, name, purpose, self.secret, self.reads_dated
        )
        if self.reads_dated:
            channel.modelled_at = self.modelled_at
        if purpose != "heartbeat":  # when a heartbeat is handled changes nothing modelled
            channel.stamp = self.clock.now
        if not self.exact(name):  # its routing messages cross a shaper
            channel.hold_until_shaped = self.clock.hold_until_shaped
        return channel

    async def tell(self, name: str, kind: str, body: dict[str, Any], *attachments: Message) -> int:
        channel = await self.peer(name)
        return await channel.send(Control(kind, body), *attachments)

    async def compute(self, work: Callable[..., T], *args: Any) -> T:
        """Run genuine computation on the instance's compute thread: its event loop goes on
        handling messages meanwhile, as a real instance's host does while its chips compute."""
        return await asyncio.get_running_loop().run_in_executor(self._compute, work, *args)

    def genuine_work(self, started: float, duration: float) -> AbstractContextManager[float]:
        """Around the genuine work of a step of the modelled duration: modelled time is held at
        the step's end until the work is done, so no step ends before its work, however slow
        the host."""
        return self.clock.holding(started + duration)

    def step_start(self, last_end: float, ready_at: float) -> float:
        """When a step starts: when the engine is free (`last_end`) and its work is there
        (`ready_at`). In real time (no shared clock: `pddemu serve`) nothing holds time for
        the work, so a step starts no earlier than now, unless it follows the last one within
        BACK_TO_BACK_S (a wake-up's latency, which would otherwise add to every step)."""
        start = max(last_end, ready_at)
        if not self.clock.shared:
            now = self.clock.now()
            if not 0 <= now - last_end < BACK_TO_BACK_S:
                start = max(start, now)
        return start

    async def finish_step(
        self, started: float, duration: float, rids: Sequence[str] = (), precise: bool = False
    ) -> float:
        """After a step's genuine work: wait until its modelled end; returns that end.

        Its lag is how far past its end modelled time was when its work was done (none, when
        the work began in time: the hold saw to it), and each request of the step (`rids`)
        carries it (`carried_lag_s`). A late wake-up from the wait is not lag: the step's end,
        which the next step starts from, is the modelled one.

        A pause fault that froze the instance during the step is the modelled instance's
        stall, not the emulator's lag: the step ends no earlier than the resume (its tokens
        come after it; the part left at the pause, at most one step, is not added), and the
        lateness up to the resume counts as `pause` (reported, not judged).

        `precise`: wake at the end itself (`ModelledClock.sleep_until`), for a caller that
        holds the clock there until it is awake (a late wake-up would stand it still).
        """
        end = started + duration
        late = self.clock.now() - end
        if started < self.resumed_at:
            frozen = min(max(0.0, late), max(0.0, self.resumed_at - end))
            self.clock.count_lag("pause", frozen)
            late -= frozen
        lag = self.clock.count_lag("step", late)
        self.lag_samples_s.append(lag)
        if lag > 0:
            self.carried_lag_s.carry(rids, lag)
        await self.clock.sleep_until(end, precise)
        if started < self.resumed_at:
            end = max(end, self.resumed_at)
        self.steps += 1
        self.busy_s += duration
        return end

    def _resumed(self, _signum: int = signal.SIGCONT, _frame: object = None) -> None:
        """SIGCONT: a pause fault ended (the deployment stopped this process); what it did
        late because of it is the fault's, from now on."""
        self.resumed_at = self.clock.now()

    # -- lag of messages ----------------------------------------------------------------

    def _transits(self) -> dict[str, tuple[float, bool]]:
        """For each peer: the least modelled time a message from it takes, and whether that
        is its exact time (a path the emulator does not shape: within a host, or the unshaped
        intra-DC path) or only a bound (the WAN: its queueing is modelled, and unknown here)."""
        wan, intra = self.config.wan, self.config.intra
        intra_shaped = intra.rate_bps is not None or intra.delay_s > 0 or intra.jitter_s > 0
        me = self.spec.me
        transits = {}
        for name, peer in self.spec.peers.items():
            if (peer.role == "MD") != (me.role == "MD"):
                transits[name] = (least_transit(wan.delay_s, wan.jitter_s, wan.jitter_dist), False)
            elif peer.addr == me.addr or not intra_shaped:
                transits[name] = (0.0, True)
            else:
                least = least_transit(intra.delay_s, intra.jitter_s, intra.jitter_dist)
                transits[name] = (least, False)
        return transits

    def exact(self, peer: str) -> bool:
        """Whether a message to or from `peer` takes no modelled time (an instant hold may
        wait for it)."""
        return self.transit.get(peer, (0.0, False))[1]

    def count_message_lag(self, kind: str, peer: str, sent: float) -> float:
        """How late a message is handled: now, less its send time and its transit (exactly,
        on a path without modelled time; as a bound, `<kind>_wan`, across a shaped one)."""
        transit, exact = self.transit.get(peer, (0.0, False))
        lag_kind = self.lag_kind(kind)
        due = sent + transit
        if due < self.resumed_at:  # it came while a pause fault froze this instance
            self.clock.count_lag("pause", self.resumed_at - due)
            due = self.resumed_at
        return self.clock.count_lag(
            lag_kind if exact else f"{lag_kind}_wan", self.clock.now() - due
        )

    def let_sender_go(self, message: Envelope) -> bool:
        """A message from a peer on a path without modelled time is read: let go of the
        present its sender held for it (`ModelledClock.hold_until_read`; P's `kv_begin` and
        `kv_end`), so its reading lateness moved no modelled time. Returns whether one was."""
        peer = message.channel.peer if message.channel is not None else None
        sent = message.body.get("t")
        if peer is None or sent is None or not self.exact(peer):
            return False
        return self.clock.let_sender_go(peer, float(sent))

    def modelled_at(self, wall: float) -> float | None:
        """A kernel receive date in modelled time (a dated channel's); None, counted, when
        it is older than the clock's anchor history (the message is then taken as read now)."""
        modelled = self.clock.modelled_at(wall)
        if modelled is None:
            self.dates_past_history += 1
        return modelled

    def arrival(self, message: Envelope, ready: float | None = None) -> float:
        """When a message reached this instance, in modelled time: on a path without modelled
        time, when its sender had it ready (`ready`, else its send time), so neither end's
        delay in handling it shows in what is done with it; otherwise, on a dated connection,
        when the kernel received it (its reader's lateness does not show either); else now.
        Without a shared clock (real time, `pddemu serve`) it is now: nothing can slow time
        down for the delay, and a client on the wall clock sees it."""
        sent = message.body.get("t")
        peer = message.channel.peer if message.channel is not None else "?"
        if sent is not None and self.clock.shared and self.transit.get(peer, (0.0, False))[1]:
            at = float(sent) if ready is None else min(float(ready), float(sent))
            return max(at, self.resumed_at)  # a frozen instance takes it when it resumes
        earliest = -math.inf
        if sent is not None:
            earliest = float(sent) + self.transit.get(peer, (0.0, False))[0]
        return self.kernel_dated(message.received, earliest)

    def kernel_dated(self, received: float | None, earliest: float = -math.inf) -> float:
        """A kernel receive date (modelled) as an arrival: the shaper releases packets a
        little early and the date is converted with an error, so it is kept between
        `earliest` (the least transit after sending) and now, and not before a pause fault
        ended. Without a date, or without a shared clock, now."""
        if received is None or not self.clock.shared:
            return self.clock.now()
        return max(min(max(received, earliest), self.clock.now()), self.resumed_at)

    def lag_kind(self, kind: str) -> str:
        """Which lag a message of `kind` counts as (the frontend's deliveries are its own)."""
        return "handler"

    def heard_from(self, peer: str) -> None:
        """A message from `peer` arrived (the router counts it as a sign of life)."""

    def channel_closed(self, channel: Channel) -> None:
        """A peer's connection ended (subclasses forget what was in flight on it)."""


class DatedServer:
    """A listening socket whose connections are handed over unread (as sockets), for
    kernel-dated reads: a transport would read them first, and drop the receive times."""

    def __init__(
        self, addr: str, port: int, accepted: Callable[[socket.socket], Awaitable[None]]
    ) -> None:
        self._listener = socket.create_server((addr, port), backlog=128)
        self._listener.setblocking(False)
        self._accepted = accepted
        self._connections: set[asyncio.Task] = set()
        self._task = asyncio.ensure_future(self._serve())

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(self._listener)
            task = asyncio.ensure_future(self._accepted(sock))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    def close(self) -> None:
        """Stop accepting and end every connection's task (which closes its channel): none
        is left pending when the loop closes."""
        self._task.cancel()
        self._listener.close()
        for task in self._connections:
            task.cancel()

    async def wait_closed(self) -> None:
        """Until the accepting task and every connection's task have ended."""
        await asyncio.gather(self._task, *self._connections, return_exceptions=True)


def least_transit(delay_s: float, jitter_s: float, dist: str) -> float:
    """The least delay a shaped path gives a packet: its delay plus the lowest jitter its
    distribution can draw (the shaper's own floor, `netem.elements.delay`), so a kernel date
    raised to it is one the path could not have produced."""
    return max(0.0, delay_s + lowest_jitter(dist, jitter_s))


def stalls_of(spec: str, name: str) -> dict[str, tuple[float, bool]]:
    """The forced lateness STALL_ENV gives instance `name`: message kind -> (seconds, whether
    they are modelled seconds rather than wall seconds). Every part is checked, whichever
    instance it names: a malformed one is refused with a ValueError that names it."""
    stalls = {}
    for part in filter(None, spec.split(";")):
        fields = part.split(":")
        seconds = fields[-1].removesuffix("m")
        try:
            stall = (float(seconds), fields[-1].endswith("m"))
        except ValueError:
            stall = (math.nan, False)
        kinds = fields[1].split(",") if len(fields) == 3 else []
        if not (fields[0] and kinds and all(kinds) and math.isfinite(stall[0]) and stall[0] >= 0):
            raise ValueError(
                f"{STALL_ENV}: {part!r} is not INSTANCE:KIND[,KIND...]:SECONDS[m]"
                " (seconds a number >= 0; parts separated by ';')"
            )
        if fields[0] == name:
            stalls.update(dict.fromkeys(kinds, stall))
    return stalls
