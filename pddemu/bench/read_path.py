"""A message's path into the frontend, against a bare loopback hop, in one process.

The shared clock runs no faster than the frontend reads its messages (docs/validation.md, "What
holds `auto` at x0.4"): each message's wall time from its sender's stamp to the frontend's
handler bounds the rate. This measures that path on this host, in-process, as a deployment
runs it: a relay-like sender's `Channel.send` (stamp, encode, write) over loopback TCP to a
`Frontend` reading the connection with kernel-dated reads on a real clock page, parsing the
frame, dating it (`modelled_at`), counting its lag, and handling it (`on_tokens` delivering a
token group to a request's stream, `on_heartbeat`). Against it, in the same run and alternated
with it round by round: a bare hop, 8 bytes written on one loopback socket and read on the other
by the same event loop (uvloop). The figure is the ratio of the two (p50s), so it holds on any
host: how many bare hops one message's Python costs.

Each message is sent alone and waited for (no queueing behind the previous one), while the
clock page gets a few anchors written between messages, as the controller and the holds write
them in a run (a kernel date is then a few anchors old).
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop

from netem.clock import SharedClock
from pddemu.config import config_to_json, load_config
from pddemu.roles.frontend import Flight, Frontend
from pddemu.roles.spec import Address, InstanceSpec
from pddemu.runtime.channel import Channel, Envelope
from pddemu.wire import Control, Message
from pddemu.workload.expansion import output_group_start

ANCHORS_BETWEEN_MESSAGES = 2  # a run writes ~2,000 anchors a wall second, a message per ~1 ms
WARM_UP = 50  # messages of each kind before the measured ones (and the kernel's dating on)


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "p50_us": round(ordered[len(ordered) // 2] * 1e6, 1),
        "p90_us": round(ordered[int(len(ordered) * 0.9)] * 1e6, 1),
        "mean_us": round(statistics.fmean(ordered) * 1e6, 1),
    }


async def _loopback_pair() -> tuple[socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    sender = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sender.setblocking(False)
    loop = asyncio.get_running_loop()
    connecting = loop.create_task(loop.sock_connect(sender, listener.getsockname()))
    accepted, _ = await loop.sock_accept(listener)
    await connecting
    listener.close()
    for sock in (sender, accepted):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sender, accepted


class _Bench:
    """A frontend on a fresh clock page, a relay's connection into it, and a bare pair."""

    def __init__(self, page: Path) -> None:
        self.page = page
        config = load_config()
        self.scale = config.scale.token_scale
        me = Address("FE0", "FE", "127.0.0.1", 1, 2)
        relay = Address("RLD0", "RLD", "127.0.0.1", 3, 4)
        spec = InstanceSpec(
            me,
            "pdd",
            "",
            {"FE0": me, "RLD0": relay},
            config_to_json(config),
            time.monotonic(),
            clock=str(page),
        )
        self.frontend = Frontend(spec)
        self.writer_clock = SharedClock(page)  # the controller's and the holds' anchor writes
        self.handled: asyncio.Future | None = None
        self.flight: Flight | None = None
        self.index = 0

    async def start(self) -> None:
        fe = self.frontend
        self.senders: dict[str, Channel] = {}
        self.serving: list[asyncio.Future] = []
        for purpose in ("control", "heartbeat"):  # as the relay's process opens them
            sender, accepted = await _loopback_pair()
            self.senders[purpose] = Channel.dated(sender, peer="FE0", purpose=purpose)
            receiver = Channel.dated(accepted, peer="RLD0", purpose=purpose)
            receiver.modelled_at = fe.modelled_at
            self.serving.append(asyncio.ensure_future(receiver.serve(self._handle)))
        self.senders["control"].stamp = fe.clock.now  # heartbeats carry their own time
        self.bare_out, self.bare_in = await _loopback_pair()
        self._new_flight()

    def _new_flight(self) -> None:
        fe = self.frontend
        rid = f"r{len(fe.flights)}"
        self.outputs = 1
        while output_group_start(self.outputs + 1, self.scale) + 96 <= fe.max_request_tokens:
            self.outputs += 1
        self.flight = fe.admit(
            {
                "rid": rid,
                "prompt_ids": [1, 2, 3],
                "input_tokens": 96,
                "output_tokens": output_group_start(self.outputs, self.scale),
            }
        )
        assert self.flight.arrival_hold is not None
        self.flight.arrival_hold.release()
        self.flight.arrival_hold = None
        self.index = 0

    async def _handle(self, item: Envelope | Message, channel: Channel) -> None:
        await self.frontend._dispatch(item, channel)
        if self.handled is not None and not self.handled.done():
            self.handled.set_result(None)

    def _write_anchors(self) -> None:
        rate = self.writer_clock.rate
        for _ in range(ANCHORS_BETWEEN_MESSAGES):
            self.writer_clock.set_rate(rate)

    def _tokens(self) -> Control:
        """The relay's next token group for the request (one genuine output's positions)."""
        assert self.flight is not None
        if self.index == self.outputs:  # the request is complete: the next one
            self._new_flight()
        first = output_group_start(self.index, self.scale)
        count = output_group_start(self.index + 1, self.scale) - first
        now = self.frontend.clock.now()
        body = {
            "rid": self.flight.record.request_id,
            "index": self.index,
            "id": 5 + self.index % 200,
            "first": first,
            "times": [now - 1e-4 * (count - k) for k in range(count)],
            "role": "RLD",
            "source": "RLD0",
            "sent": now,
        }
        self.index += 1
        return Control("tokens", body)

    def _heartbeat(self) -> Control:
        return Control("heartbeat", {"at": self.frontend.clock.now()})

    async def message_hop(self, make: Callable[[], Control], purpose: str) -> tuple[float, float]:
        """Wall and CPU seconds from the sender's send to the end of the frontend's handler."""
        self._write_anchors()
        self.handled = asyncio.get_running_loop().create_future()
        control = make()
        cpu, started = time.process_time(), time.perf_counter()
        await self.senders[purpose].send(control)
        await self.handled
        return time.perf_counter() - started, time.process_time() - cpu

    async def bare_hop(self) -> tuple[float, float]:
        """Wall and CPU seconds for 8 bytes from one loopback socket to a read of the other
        already waiting on the loop (as the frontend's read of its next message waits)."""
        self._write_anchors()
        loop = asyncio.get_running_loop()
        reading = loop.create_task(loop.sock_recv(self.bare_in, 8))
        await asyncio.sleep(0)  # the read waits on the loop
        cpu, started = time.process_time(), time.perf_counter()
        await loop.sock_sendall(self.bare_out, b"01234567")
        await reading
        return time.perf_counter() - started, time.process_time() - cpu

    async def close(self) -> None:
        for channel in self.senders.values():
            channel.close()
        for serving in self.serving:
            serving.cancel()
        await asyncio.gather(*self.serving, return_exceptions=True)
        for sock in (self.bare_out, self.bare_in):
            sock.close()
        self.writer_clock.close()
        self.frontend.clock.close()


async def _measure(page: Path, rounds: int, per_round: int) -> dict:
    bench = _Bench(page)
    await bench.start()
    kinds: dict[str, Callable[[], Awaitable[tuple[float, float]]]] = {
        "bare": bench.bare_hop,
        "tokens": lambda: bench.message_hop(bench._tokens, "control"),
        "heartbeat": lambda: bench.message_hop(bench._heartbeat, "heartbeat"),
    }
    walls: dict[str, list[float]] = {kind: [] for kind in kinds}
    cpus: dict[str, list[float]] = {kind: [] for kind in kinds}
    try:
        for hop in kinds.values():
            for _ in range(WARM_UP):
                await hop()
        for _ in range(rounds):
            for kind, hop in kinds.items():
                for _ in range(per_round):
                    wall, cpu = await hop()
                    walls[kind].append(wall)
                    cpus[kind].append(cpu)
        undated = bench.frontend.dates_past_history
        errors = list(bench.frontend.errors)
    finally:
        await bench.close()
    bare = _percentiles(walls["bare"])
    result: dict = {
        "bare_hop": {**bare, "cpu_mean_us": round(statistics.fmean(cpus["bare"]) * 1e6, 1)}
    }
    for kind in ("tokens", "heartbeat"):
        figures = _percentiles(walls[kind])
        result[kind] = {
            **figures,
            "cpu_mean_us": round(statistics.fmean(cpus[kind]) * 1e6, 1),
            "bare_hops": round(figures["p50_us"] / bare["p50_us"], 2),
        }
    result["dates_past_history"] = undated
    result["handler_errors"] = errors
    return result


def run(quick: bool) -> dict:
    rounds, per_round = (3, 100) if quick else (10, 300)
    with tempfile.TemporaryDirectory(prefix="pddemu-read-path-") as directory:
        page = Path(directory) / "clock"
        SharedClock.create(page, rate=1.0, ceiling=64.0).close()
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            measured = runner.run(_measure(page, rounds, per_round))
    return {
        "method": (
            f"{rounds} rounds of {per_round} messages of each kind, alternated (bare hop, "
            "token group, heartbeat), each sent alone and waited for; wall p50 / p90 / mean "
            "per message, its mean CPU (process time, both ends: one process), and its wall "
            "p50 in bare hops"
        ),
        **measured,
        "targets": {
            "every_message_dated": measured["dates_past_history"] == 0,
            "every_message_handled": not measured["handler_errors"],
        },
    }
