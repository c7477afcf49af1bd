"""The cross-traffic process: real TCP flows between the run's extra endpoints in DC A and
DC B, through the same WAN as the emulator's own traffic.

Started by `netem.crosstraffic.CrossTraffic` inside DC A's namespace (`python -m
netem.crosstraffic.generator`, JSON config on stdin). It opens a receiver on the far end of
each direction it loads (entering DC B's namespace to make that socket) and prints one JSON
line when they listen; then it reads its time 0 (on the run's clock page when given one, so
flows follow a dilated clock like the links; else a time.monotonic() instant) as one more line,
starts each flow at its time (a new connection that sends the flow's bytes and closes), and on
SIGTERM stops, closes every connection and prints its counts as one JSON line. It dies with
its parent.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from netem import nsutil
from netem.clock import SharedClock
from netem.crosstraffic.arrivals import flows, mean_target
from netem.crosstraffic.spec import CrossTrafficSpec

PR_SET_PDEATHSIG = 1
CHUNK = bytes(64 * 1024)
CLOCK_POLL_S = 0.005  # wall seconds between looks at a clock that stands still
READ_SIZE = 256 * 1024


@dataclass
class Counts:
    """One direction's flows and bytes (bytes as the receiver read them)."""

    flows: int = 0
    completed: int = 0
    skipped: int = 0  # arrivals while max_flows were open
    bytes_offered: int = 0
    bytes: int = 0
    active: set[asyncio.Task] = field(default_factory=set)


def _socket_in(netns: str) -> socket.socket:
    """A TCP socket of another namespace (a socket stays in the one it was made in)."""
    with nsutil.inside(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


class Generator:
    def __init__(self, config: dict[str, Any]) -> None:
        self.spec = CrossTrafficSpec.from_dict(config["spec"])
        self.ends: dict[str, dict[str, str]] = config["ends"]  # a/b -> netns, addr
        self.rates: dict[str, float] = config["rates"]  # a2b/b2a -> bit/s
        self.clock = SharedClock(config["clock"]) if config.get("clock") else None
        self.now = self.clock.now if self.clock is not None else time.monotonic
        self.start = 0.0  # time 0 on self.now's clock, given once the receivers listen
        self.port: int = config["port"]
        self.directions = sorted(
            set(self.spec.directions())
            | {c.direction or self.spec.directions()[0] for c in self.spec.schedule if c.flow_bytes}
        )
        self.counts = {d: Counts() for d in self.directions}
        self.listeners = {d: self.listener(d) for d in self.directions}
        self.servers: list[asyncio.AbstractServer] = []

    @staticmethod
    def ends_of(direction: str) -> tuple[str, str]:
        return ("a", "b") if direction == "a2b" else ("b", "a")

    def listener(self, direction: str) -> socket.socket:
        """The listening socket of a direction's receiver, made in its far end's namespace."""
        far = self.ends[self.ends_of(direction)[1]]
        sock = _socket_in(far["netns"])
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((far["addr"], self.port))
        sock.listen(1024)
        return sock

    async def listen(self) -> None:
        for direction, sock in self.listeners.items():
            counts = self.counts[direction]
            self.servers.append(
                await asyncio.start_server(lambda r, w, c=counts: self.receive(r, w, c), sock=sock)
            )

    async def receive(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counts: Counts
    ) -> None:
        try:
            while data := await reader.read(READ_SIZE):
                counts.bytes += len(data)
            counts.completed += 1
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            return  # the generator is ending: a receiver has nothing to report
        finally:
            writer.close()

    async def send_flow(self, direction: str, size: int) -> None:
        near, far = (self.ends[end] for end in self.ends_of(direction))
        sock = _socket_in(near["netns"])
        writer = None
        try:
            sock.bind((near["addr"], 0))
            await asyncio.get_running_loop().sock_connect(sock, (far["addr"], self.port))
            _, writer = await asyncio.open_connection(sock=sock)
            left = size
            while left > 0:
                piece = CHUNK if left >= len(CHUNK) else CHUNK[:left]
                writer.write(piece)
                left -= len(piece)
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # an outage can outlast a connection attempt: the flow is simply lost
        finally:
            if writer is not None:
                writer.close()
            else:
                sock.close()

    async def arrivals(self, direction: str) -> None:
        counts = self.counts[direction]
        rate = self.rates[direction]
        for at, size in flows(self.spec, direction, rate, self.spec.seed):
            await self.until(self.start + at)
            if len(counts.active) >= self.spec.max_flows:
                counts.skipped += 1
                continue
            counts.flows += 1
            counts.bytes_offered += size
            task = asyncio.ensure_future(self.send_flow(direction, size))
            counts.active.add(task)
            task.add_done_callback(counts.active.discard)

    async def until(self, instant: float) -> None:
        """Sleep until `instant` on the generator's clock (re-read after each wake-up: a clock
        page's rate may change, or a hold stop it, meanwhile)."""
        while (left := instant - self.now()) > 0:
            if self.clock is None:
                await asyncio.sleep(left)
            else:
                wall = self.clock.wall_delay(instant)
                if wall > CLOCK_POLL_S:  # no speed-up meanwhile may make it late
                    wall = max(CLOCK_POLL_S, self.clock.earliest_wall_delay(instant))
                await asyncio.sleep(wall if wall > 0 else CLOCK_POLL_S)

    async def run(self, stop: asyncio.Event) -> dict[str, Any]:
        await self.listen()
        senders = [asyncio.ensure_future(self.arrivals(d)) for d in self.directions]
        await stop.wait()
        ended = self.now()
        received = {d: c.bytes for d, c in self.counts.items()}
        for task in senders + [t for c in self.counts.values() for t in c.active]:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        for server in self.servers:
            server.close()
        return self.report(max(0.0, ended - self.start), received)

    def report(self, duration_s: float, received: dict[str, int]) -> dict[str, Any]:
        out: dict[str, Any] = {"duration_s": duration_s, "directions": {}}
        for direction, counts in self.counts.items():
            rate = self.rates[direction]
            loaded = direction in self.spec.directions()
            out["directions"][direction] = {
                "rate_bps": rate,
                "target_utilisation": mean_target(self.spec, duration_s) if loaded else 0.0,
                "utilisation": received[direction] * 8 / (rate * duration_s) if duration_s else 0.0,
                "bytes": received[direction],
                "bytes_offered": counts.bytes_offered,
                "flows": counts.flows,
                "flows_completed": counts.completed,
                "flows_skipped": counts.skipped,
            }
        return out


def main() -> int:
    parent = os.getppid()
    config = json.loads(sys.stdin.readline())
    if config.get("die_with_parent", True):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the death signal was armed
            return 1
    generator = Generator(config)
    print(json.dumps({"ready": True}), flush=True)
    generator.start = float(json.loads(sys.stdin.readline())["start"])

    async def serve() -> dict[str, Any]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        return await generator.run(stop)

    print(json.dumps(asyncio.run(serve())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
