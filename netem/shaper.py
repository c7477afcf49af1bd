"""The userspace shaper process: TUN pairs joined by shaped directions, and a control socket.

Started by the controller (`python -m netem.shaper`, JSON config on stdin). It creates a TUN
interface in each end's namespace, prints one JSON line when they exist, then forwards: every
IP packet the kernel routes out of one end is pushed into that direction's element chain and
written into the other end when the chain releases it. One thread, one select() loop with
microsecond timeouts (libuv timers have millisecond resolution, too coarse for the delay
target). A schedule (`netem.schedule`) runs in the same loop: each step is applied at its own
time, after every packet due before it has left. It dies with its parent (PR_SET_PDEATHSIG),
and its TUN interfaces die with it.

Given a clock page (`netem.clock`), the elements and the schedule run in the clock's time:
rates, delays and schedule steps are then in that (modelled) time, so a clock that slows down
(dilation) or stands still (a hold) slows or stops the link with it; a select() timeout is the
wall time left at the clock's rate, never longer than MAX_WALL_WAIT_S while the clock is held.
How late each packet leaves, in the clock's time, is counted (`release_lag`); asked for
(`record_interval_s`), what each direction delivered per interval is recorded too, both by
when it was due and by when it was written (`netem.delivery`: a host's stall of the shaper
shows there, apart from the link's own schedule), and how many TCP flows sent data through
each direction per window, with its drops (`flow_window_s`, `netem.flow_count`).

Each turn of the loop (`turn`) runs at one reading of the time: first the schedule's steps due
by then, each after everything due before it has left (so a late turn still changes the link
at each step's own time, never after packets that reached the shaper later); then the packets
read, which arrive at that time; then everything due leaves. The per-packet work is kept
small, since at a gigabit the shaper's Python loop is what bounds the link: a turn hands each
fd's packets to their direction in one call (`push_many`, the same as one push each, tested),
and a direction with nothing due by then is not visited.
"""

from __future__ import annotations

import bisect
import ctypes
import json
import math
import os
import select
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netem.clock import (
    INGRESS_SLOT,
    LAG_COUNTED_KINDS,
    ROUTING_DSCP,
    ROUTING_ENDED_SLOT,
    ROUTING_HOLD_CAP_S,
    ROUTING_SLOTS_KEPT,
    Anchor,
    ClockError,
    SharedClock,
    routing_slot,
)
from netem.delivery import DeliveryRecord
from netem.direction import SEED_LIMIT, Direction
from netem.flow_count import FlowCount
from netem.packet import ends_a_tcp_connection, ends_a_tcp_write, tcp_ends
from netem.schedule import Cursor, Schedule, Step, apply_step
from netem.spec import LinkSpec, SpecError, changes_from_dict
from netem.tun import DEFAULT_TUN_DEVICE, open_tun

PR_SET_PDEATHSIG = 1
PR_SET_TIMERSLACK = 29
READ_BATCH = 256
REALTIME_PRIORITY = 10  # SCHED_FIFO, when asked for: above every normal process
CONTROL_REPLY_TIMEOUT_S = 1.0
# A sleeping select() wakes some 100-200 us after the time asked (measured here); packets due
# within this margin leave at the wake-up before their time rather than one wake-up late, so
# delays centre on the configured value without a CPU-burning spin. A packet's scheduled exit
# time stays exact: releasing early never shifts the packets behind it.
EARLY_S = 0.00015
MAX_PACKET = 65536
MAX_WALL_WAIT_S = 0.002  # while the clock is held, look again this often
# how often an idle shaper looks whether a sender's hold (netem.clock.INGRESS_SLOT) stands, to
# end it at its cap if what it waits for never comes
INGRESS_LOOK_S = 0.05
LAG_SLOT = "shaper"  # the clock page's slot the shaper counts its release lag in
RELEASE_KIND = LAG_COUNTED_KINDS.index("release")
LAG_BUCKETS_S = (0.0, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0)


@dataclass
class Route:
    """Packets read from `source_fd` go through `direction` and out of `sink_fd`."""

    link: str
    name: str
    direction: Direction
    source_fd: int
    sink_fd: int
    write_errors: int = 0
    record: DeliveryRecord | None = None
    flows: FlowCount | None = None


class Shaper:
    def __init__(
        self,
        config: dict[str, Any],
        open_end: Callable[[str, str, str], int] = open_tun,
        now: Callable[[], float] | None = None,
    ) -> None:
        """`open_end(ifname, netns, tun_device)` gives a link end's packet fd (a TUN; a test
        may pass datagram sockets) and `now` the time (default: the clock page's, else
        time.monotonic)."""
        self.routes: list[Route] = []
        self.by_fd: dict[int, Route] = {}
        self.links: dict[str, dict[str, Route]] = {}
        self.link_index: dict[str, int] = {}  # its place in the config: part of its seeds
        tun_device = config.get("tun_device", DEFAULT_TUN_DEVICE)
        self.clock = SharedClock(config["clock"]) if config.get("clock") else None
        # The routing exchange's messages (netem.clock.ROUTING_DSCP): the slot this shaper
        # holds time in at their release, one a connection's direction (`routing_slot`,
        # claimed when its first message comes), and in each the wall times of the holds
        # posted there that no reader has let go of yet, oldest first (each to end at its cap).
        self.routing_slots: dict[str, int] = {}
        self.routing_held_since: dict[int, deque[float]] = {}
        # those whose connection has ended (FIN or RST seen), to give back once they hold for
        # no reader; the slot that keeps the counters of those given back
        # (netem.clock.ROUTING_SLOTS_KEPT); routing messages not held for want of a slot
        self.routing_ended: set[str] = set()
        self.routing_ended_slot = (
            self.clock.claim(ROUTING_ENDED_SLOT) if self.clock is not None else None
        )
        self.routing_unheld = 0
        # and the slot their senders hold the present in until this shaper has read them
        # (netem.clock.INGRESS_SLOT), with since when (wall) it has stood, at the latest (the
        # last look that found it standing for no sender: it was posted after that look)
        self.ingress_slot = self.clock.claim(INGRESS_SLOT) if self.clock is not None else None
        self.ingress_waiting_since: float | None = None
        self.ingress_none_seen_at = time.monotonic()
        # and the slot it counts its packets' release lag in, for the rate's controller
        self.lag_slot = self.clock.claim(LAG_SLOT) if self.clock is not None else None
        self.routing_holds = 0
        self.now = now or (self.clock.now if self.clock is not None else time.monotonic)
        self.release_lag = ReleaseLag()
        self.record_interval_s: float | None = config.get("record_interval_s")
        self.flow_window_s: float | None = config.get("flow_window_s")
        for index, link in enumerate(config["links"]):
            fd_a = open_end(link["a"]["ifname"], link["a"]["netns"], tun_device)
            fd_b = open_end(link["b"]["ifname"], link["b"]["netns"], tun_device)
            seeds = direction_seeds(int(link.get("seed", 0)), index)
            a2b = Route(
                link["name"],
                "a2b",
                Direction(LinkSpec.from_dict(link["a2b"]), seeds["a2b"]),
                fd_a,
                fd_b,
            )
            b2a = Route(
                link["name"],
                "b2a",
                Direction(LinkSpec.from_dict(link["b2a"]), seeds["b2a"]),
                fd_b,
                fd_a,
            )
            self.routes += [a2b, b2a]
            self.by_fd[fd_a], self.by_fd[fd_b] = a2b, b2a
            self.links[link["name"]] = {"a2b": a2b, "b2a": b2a}
            self.link_index[link["name"]] = index
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        Path(config["control"]).unlink(missing_ok=True)
        self.control.bind(config["control"])
        self.control.listen(8)
        self.clients: dict[int, tuple[socket.socket, bytearray]] = {}
        self._watched: list[int] | None = None  # what select() watches, made when needed
        self.cursor: Cursor | None = None
        self.before_schedule: list[tuple[Route, LinkSpec, bool]] = []
        self.restart_records(self.now())
        if self.flow_window_s is not None:  # never restarted: a reader picks its windows
            for route in self.routes:
                route.flows = FlowCount(self.flow_window_s, self.now())
        if config.get("schedule"):
            self.start_schedule(Schedule.from_dict(config["schedule"]), self.now())

    def restart_records(self, origin: float) -> None:
        """Record deliveries afresh from `origin` (when recording was asked for)."""
        if self.record_interval_s is not None:
            for route in self.routes:
                route.record = DeliveryRecord(self.record_interval_s, origin)

    def run(self) -> None:
        directions = [route.direction for route in self.routes]
        clock = self.clock
        monotonic = time.monotonic
        while True:
            next_time = math.inf
            for direction in directions:
                due = direction.next_exit()
                if due < next_time:
                    next_time = due
            if self.cursor is not None:
                next_time = min(next_time, self.cursor.next_time())
            if clock is None:
                early = EARLY_S
                timeout = (
                    None if next_time == math.inf else max(0.0, next_time - monotonic() - EARLY_S)
                )
            else:
                anchor = clock.anchor()  # one reading of the page for the whole decision
                early = EARLY_S * anchor.rate  # the wake-up latency, in the clock's time
                timeout = (
                    None
                    if next_time == math.inf
                    else self._clock_timeout(anchor, next_time - early)
                )
            held = [since[0] for since in self.routing_held_since.values() if since]
            if held:  # their caps are kept by this loop
                cap_left = min(held) + ROUTING_HOLD_CAP_S - monotonic()
                timeout = max(0.0, cap_left if timeout is None else min(timeout, cap_left))
            if clock is not None:  # a sender's hold may come while this waits: looked at often
                look = self._cap_ingress_hold(monotonic()) or INGRESS_LOOK_S
                timeout = max(0.0, look if timeout is None else min(timeout, look))
            if self._watched is None:  # the fds change only when a control client comes or goes
                self._watched = [*self.by_fd, self.control.fileno(), *self.clients]
            try:
                readable, _, _ = select.select(self._watched, [], [], timeout)
            except InterruptedError:
                continue
            self.turn(readable, self.now(), early)
            self._cap_routing_holds(monotonic())

    def turn(self, readable: Iterable[int], now: float, early: float) -> None:
        """One turn of the loop at time `now` (see the module's docstring): `readable` are the
        fds select() found ready; packets due within `early` after `now` leave now."""
        self._follow_schedule(now, now)
        for fd in readable:
            route = self.by_fd.get(fd)
            if route is None:
                self._serve_control(fd)
                now = self.now()
                self._follow_schedule(now, now)
                continue
            packets = []
            append = packets.append
            for _ in range(READ_BATCH):
                try:
                    append(os.read(fd, MAX_PACKET))
                except BlockingIOError:
                    break
            route.direction.push_many(packets, now)  # all arrived at `now`
            if route.flows is not None:
                direction = route.direction
                # a random loss needs recovering as a queue's drop does
                dropped = direction.loss.dropped + direction.rate.dropped_total
                spec = direction.spec
                route.flows.count(packets, now, dropped, spec.rate_bps, spec.mtu)
            if self.ingress_slot is not None:
                self._look_at_routing(packets)
        self._follow_schedule(now + early, now)
        self._release(now + early, now)

    def _follow_schedule(self, until: float, now: float) -> None:
        """Apply every step due by `until`, each at its own time after what was due before."""
        if self.cursor is None:
            return
        for at, step in self.cursor.due(until):
            self._release(at, now)
            self._apply_step(step, at)

    def _release(self, until: float, now: float) -> None:
        """Write out every packet due by `until`, counting how late each leaves at `now`."""
        write = os.write
        for route in self.routes:
            direction = route.direction
            if direction.next_time() > until:
                continue  # nothing leaves a direction before its next time (by construction)
            released = direction.release(until)
            sink_fd = route.sink_fd
            for packet, _ in released:
                if packet[1] >> 2 == ROUTING_DSCP and self.clock is not None:
                    self._hold_for_routing(packet, now)
                try:
                    write(sink_fd, packet)
                except OSError:
                    route.write_errors += 1
            total, worst = self.release_lag.count_released(released, now)
            if self.clock is not None and self.lag_slot is not None:  # the controller's too
                self.clock.count_lags(self.lag_slot, RELEASE_KIND, len(released), total, worst)
            if route.record is not None:
                # timed after the writes: the receiving kernel dates each packet inside its
                # write, so a stall since `now` (reading, queueing, writing) moves those dates
                # and must show as this record's lateness
                route.record.count_released(released, self.now())

    def _hold_for_routing(self, packet: bytes, now: float) -> None:
        """Hold modelled time at a routing message's release (before it is written: its reader
        cannot have it before the hold stands) until its reader lets go (`ModelledClock.
        let_routing_go`) or the cap passes: a hold for one more reader, so the first of several
        messages in flight to be read lets go of its own only. Only the segment that ends the
        marked write: the message's earlier segments left before it (one connection's segments
        stay in order), and a bare ACK so marked has no reader to let go."""
        if not ends_a_tcp_write(packet):
            return
        assert self.clock is not None
        name = routing_slot(*tcp_ends(packet))
        slot = self.routing_slots.get(name)
        if slot is None:
            slot = self._claim_routing_slot(name)
            if slot is None:
                return
        self.clock.hold_for_one_more(slot, now)
        self.routing_held_since[slot].append(time.monotonic())
        self.routing_holds += 1

    def _claim_routing_slot(self, name: str) -> int | None:
        """A new connection's routing slot: at most ROUTING_SLOTS_KEPT are kept, and with
        that many, or the page full, those holding for no reader are given back first. None
        when there is still none (every kept slot holds for a reader, or the page is full of
        other participants'): its message is not held, and dated as the turn that reads it
        (the run goes on; a dying shaper would take the WAN with it)."""
        assert self.clock is not None
        for attempt in range(2):
            if len(self.routing_slots) < ROUTING_SLOTS_KEPT:
                try:
                    slot = self.clock.claim(name)
                except ClockError:
                    pass
                else:
                    self.routing_slots[name] = slot
                    self.routing_held_since[slot] = deque()
                    return slot
            if attempt == 0:
                for idle in [n for n, i in self.routing_slots.items() if self._holds_none(i)]:
                    self._give_back(idle)
        if not self.routing_unheld:
            print(f"shaper: no clock slot for routing holds ({name}): not held", file=sys.stderr)
        self.routing_unheld += 1
        return None

    def _holds_none(self, slot: int) -> bool:
        """Whether a routing slot's hold stands for no reader (only this shaper posts there,
        so it stays so until this shaper posts again)."""
        assert self.clock is not None
        return not self.clock.readers_held_for(slot)

    def _give_back(self, name: str) -> None:
        """Free a routing slot that holds for no reader, its counters kept in
        ROUTING_ENDED_SLOT's."""
        assert self.clock is not None and self.routing_ended_slot is not None
        slot = self.routing_slots.pop(name)
        del self.routing_held_since[slot]
        self.routing_ended.discard(name)
        self.clock.free_into(slot, self.routing_ended_slot)

    def _look_at_routing(self, packets: list[bytes]) -> None:
        """Each routing message read (the segment ending its marked write) has entered the
        WAN at `now`: its sender's hold on the present since it sent it can go
        (netem.clock.INGRESS_SLOT). And a connection with a routing slot that ends (FIN or RST,
        either way): its slots, both ways, are given back once they hold for no reader."""
        assert self.clock is not None and self.ingress_slot is not None
        routing_slots = self.routing_slots
        for packet in packets:
            if len(packet) > 1 and packet[1] >> 2 == ROUTING_DSCP and ends_a_tcp_write(packet):
                self.clock.let_go_one(self.ingress_slot)
            if routing_slots and ends_a_tcp_connection(packet):
                source, source_port, destination, destination_port = tcp_ends(packet)
                for name in (
                    routing_slot(source, source_port, destination, destination_port),
                    routing_slot(destination, destination_port, source, source_port),
                ):
                    if name in routing_slots:
                        self.routing_ended.add(name)

    def _cap_ingress_hold(self, wall: float) -> float | None:
        """End the senders' hold once it has stood ROUTING_HOLD_CAP_S of wall time without
        every message it stands for read (one left unmarked and its sender did not know, or
        never left): the wall seconds left before that while it stands, None when it does not.
        Counted from this loop's last look that found it standing for no sender (its posting
        came after): a cap counted from the first look that saw it would let it stand up to
        the looks' period (INGRESS_LOOK_S) longer."""
        if self.ingress_slot is None:
            return None
        assert self.clock is not None
        if not self.clock.readers_held_for(self.ingress_slot):
            self.ingress_waiting_since = None
            self.ingress_none_seen_at = wall
            return None
        if self.ingress_waiting_since is None:
            self.ingress_waiting_since = self.ingress_none_seen_at
        left = self.ingress_waiting_since + ROUTING_HOLD_CAP_S - wall
        if left > 0:
            return left
        self.clock.release(self.ingress_slot)
        self.ingress_waiting_since = None
        self.ingress_none_seen_at = wall
        return None

    def _cap_routing_holds(self, wall: float) -> None:
        """Let go of each routing message's hold its reader has not let go of within the cap
        (the reader lost, or the segment not the message's end): `SharedClock.let_go_overdue`."""
        for slot, since in self.routing_held_since.items():
            if since:
                assert self.clock is not None
                self.clock.let_go_overdue(slot, since, wall, ROUTING_HOLD_CAP_S)
        for name in [n for n in self.routing_ended if self._holds_none(self.routing_slots[n])]:
            self._give_back(name)

    # -- schedules ------------------------------------------------------------------------

    def start_schedule(self, schedule: Schedule, start: float) -> None:
        """Follow `schedule` from `start` (the shaper's time, possibly ahead); the links as
        they are now are kept, to return to when the schedule is stopped."""
        for link in schedule.links():
            if link not in self.links:
                raise ValueError(
                    f"the schedule changes link {link!r}, which this run does not shape"
                )
        self.stop_schedule(self.now())
        self.before_schedule = [
            (route, route.direction.spec, route.direction.gate.up) for route in self.routes
        ]
        self.cursor = Cursor(schedule, start)
        self.restart_records(start)

    def stop_schedule(self, now: float) -> None:
        """Stop following the schedule; every link returns to its spec and state from before."""
        self.cursor = None
        self._release(now, now)
        for route, spec, up in self.before_schedule:
            route.direction.apply(spec, now)
            route.direction.set_up(up)
        self.before_schedule = []

    def _apply_step(self, step: Step, at: float) -> None:
        apply_step(
            step,
            at,
            {
                name: {d: r.direction for d, r in routes.items()}
                for name, routes in self.links.items()
            },
        )

    def _clock_timeout(self, anchor: Anchor, due: float) -> float:
        """Wall seconds to wait until the clock reaches `due`: as long as it takes at the
        present rate when that is short, else what it would take at the fastest rate the
        clock may reach meanwhile (its ceiling, or the controller's promise: no speed-up
        meanwhile makes the packet late); MAX_WALL_WAIT_S when a hold stands before."""
        wall = time.monotonic()
        if anchor.at(wall) >= due:
            return 0.0
        delay = anchor.wall_at(due) - wall
        if delay <= 0:
            return MAX_WALL_WAIT_S  # due, but the clock is held before it
        if delay > MAX_WALL_WAIT_S:
            assert self.clock is not None
            delay = max(MAX_WALL_WAIT_S, self.clock.earliest_wall_delay(due))
        return delay

    def _serve_control(self, fd: int) -> None:
        if fd == self.control.fileno():
            conn, _ = self.control.accept()
            conn.setblocking(False)
            self.clients[conn.fileno()] = (conn, bytearray())
            self._watched = None
            return
        conn, buffer = self.clients[fd]
        try:
            data = conn.recv(65536)
            if not data:
                raise ConnectionResetError("client closed")
            buffer += data
            while b"\n" in buffer:
                line, _, rest = bytes(buffer).partition(b"\n")
                buffer[:] = rest
                conn.setblocking(True)
                conn.settimeout(CONTROL_REPLY_TIMEOUT_S)
                conn.sendall(json.dumps(self._handle(line)).encode() + b"\n")
                conn.setblocking(False)
        except BlockingIOError:
            return
        except OSError:  # a client that hung up or stalled is dropped; the link goes on
            del self.clients[fd]
            self._watched = None
            conn.close()

    def _handle(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
            op = request["op"]
            if op == "stats":
                return {
                    "ok": True,
                    "links": self.stats(),
                    "release_lag": self.release_lag.to_dict(),
                    **({"delivery": self.deliveries()} if self.record_interval_s else {}),
                    **({"flows": self.flow_counts()} if self.flow_window_s else {}),
                }
            if op == "flows":  # one link's, from a reader's cursor on (`flows_since`)
                return {"ok": True, "flows": self.flows_since(request)}
            if op == "restart_draws":  # every link's
                self.restart_draws(int(request["seed"]))
                return {"ok": True}
            routes = self._select(request)
            now = self.now()
            if op == "set":
                changes = changes_from_dict(request["changes"])
                specs = [route.direction.spec.with_changes(**changes) for route in routes]
                self._release(now, now)
                for route, spec in zip(routes, specs, strict=True):
                    route.direction.apply(spec, now)
            elif op == "updown":
                for route in routes:
                    route.direction.set_up(bool(request["up"]))
            elif op == "schedule":
                self.start_schedule(
                    Schedule.from_dict(request["schedule"]), float(request["start"])
                )
            elif op == "unschedule":
                self.stop_schedule(now)
            else:
                return {"ok": False, "error": f"unknown op {op!r}"}
            return {"ok": True, "links": self.stats()}
        except (KeyError, TypeError, ValueError, SpecError) as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

    def restart_draws(self, seed: int) -> None:
        """Every direction's loss and jitter draws from their start, as a shaper just made with
        `seed` would draw them: a run after another on the same links meets the same weather
        as the first."""
        for name, routes in self.links.items():
            seeds = direction_seeds(seed, self.link_index[name])
            for direction, route in routes.items():
                route.direction.restart_draws(seeds[direction])

    def _select(self, request: dict[str, Any]) -> list[Route]:
        link = self.links.get(request.get("link", "wan"))
        if link is None:
            raise ValueError(f"no link {request.get('link')!r}; have {', '.join(self.links)}")
        which = request.get("direction", "both")
        if which == "both":
            return list(link.values())
        if which not in link:
            raise ValueError(f"direction must be a2b, b2a or both, not {which!r}")
        return [link[which]]

    def stats(self) -> dict[str, Any]:
        return {
            name: {
                d: {**r.direction.counters(), "write_errors": r.write_errors}
                for d, r in routes.items()
            }
            for name, routes in self.links.items()
        }

    def deliveries(self) -> dict[str, dict[str, Any]]:
        """Each direction's delivery record (`netem.delivery`), by link and direction."""
        return {
            name: {d: r.record.to_dict() for d, r in routes.items() if r.record is not None}
            for name, routes in self.links.items()
        }

    def flow_counts(self) -> dict[str, dict[str, Any]]:
        """Each direction's data flows and drops per window (`netem.flow_count`), by link and
        direction."""
        return {
            name: {
                d: r.flows.to_dict(r.direction.spec.rate_bps, r.direction.spec.mtu)
                for d, r in routes.items()
                if r.flows is not None
            }
            for name, routes in self.links.items()
        }

    def flows_since(self, request: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """One link's (`link`, default the WAN) flow counts by direction from the window its
        reader names in `since` (direction -> window, 0 for one not named) on, forgetting the
        windows before (`netem.flow_count.FlowCount.since`): what a long run's reader asks
        each round, so that the answer, built on this loop while no packet moves, is the
        windows since its last round, not the whole run's."""
        if self.flow_window_s is None:
            raise ValueError("this shaper counts no flows (no flow_window_s in its config)")
        name = request.get("link", "wan")
        routes = self.links.get(name)
        if routes is None:
            raise ValueError(f"no link {name!r}; have {', '.join(self.links)}")
        since = request.get("since", {})
        if not isinstance(since, dict) or set(since) - set(routes):
            raise ValueError(f"since must map a2b and b2a to windows, not {since!r}")
        for window in since.values():
            if isinstance(window, bool) or not isinstance(window, int) or window < 0:
                raise ValueError(f"since: a window is a number from 0, not {window!r}")
        return {
            d: r.flows.since(since.get(d, 0), r.direction.spec.rate_bps, r.direction.spec.mtu)
            for d, r in routes.items()
            if r.flows is not None
        }


class ReleaseLag:
    """How late packets left, in the clock's time: a count per bucket (upper edges in
    LAG_BUCKETS_S, the last one open), the sum and the largest."""

    def __init__(self) -> None:
        self.counts = [0] * (len(LAG_BUCKETS_S) + 1)
        self.total_s = 0.0
        self.max_s = 0.0

    def count(self, lag: float) -> None:
        if lag <= 0:
            self.counts[0] += 1
            return
        self.total_s += lag
        self.max_s = max(self.max_s, lag)
        self.counts[bisect.bisect_left(LAG_BUCKETS_S, lag)] += 1

    def count_released(
        self, released: list[tuple[bytes, float]], now: float
    ) -> tuple[float, float]:
        """Each (packet, exit time) of `released`, all written out at `now` (as `count` for
        the lag of each); returns their lag's sum and largest."""
        counts = self.counts
        total = worst = 0.0
        for _, exit_time in released:
            lag = now - exit_time
            if lag <= 0:
                counts[0] += 1
                continue
            total += lag
            if lag > worst:
                worst = lag
            counts[bisect.bisect_left(LAG_BUCKETS_S, lag)] += 1
        self.total_s += total
        self.max_s = max(self.max_s, worst)
        return total, worst

    def to_dict(self) -> dict[str, Any]:
        return {
            "bucket_edges_s": list(LAG_BUCKETS_S),
            "counts": list(self.counts),
            "total_s": self.total_s,
            "max_s": self.max_s,
        }


class _Stop(Exception):
    """Raised by the signal handler to leave a select() that would otherwise be retried."""


def direction_seeds(seed: int, index: int) -> dict[str, int]:
    """The seeds of the two directions of the config's `index`-th link, for the run's `seed`:
    distinct for every (seed, link, direction), so no run's link draws as another's does (the
    WAN, link 0, keeps `seed * 2` and `seed * 2 + 1`; each later link a range of 2 * SEED_LIMIT
    above it)."""
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"the seed must be in [0, {SEED_LIMIT}), got {seed}")
    first = seed * 2 + index * 2 * SEED_LIMIT
    return {"a2b": first, "b2a": first + 1}


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(option, value, 0, 0, 0)


def _realtime() -> None:
    """SCHED_FIFO, so the processes whose traffic this shaper carries cannot delay a release
    (the kernel's RT throttling still leaves others 5 % of each CPU). Without the privilege (a
    user namespace) it stays a normal process."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    except PermissionError:
        pass


def main() -> int:
    parent = os.getppid()
    config = json.loads(sys.stdin.readline())
    if config.get("die_with_parent", True):
        # The signal follows the thread that started us: armed only when that thread is the
        # controller's main one (otherwise the guardian's cleanup stops us).
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the death signal was armed
            return 1
    _prctl(PR_SET_TIMERSLACK, 1000)  # wake within ~1 us of the asked time, not 50 us
    if config.get("realtime"):
        _realtime()
    try:
        shaper = Shaper(config)
    except OSError as exc:
        print(json.dumps({"ready": False, "error": str(exc)}), flush=True)
        return 1

    def stop(_signum: int, _frame: object) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    try:
        shaper.run()
    except _Stop:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
