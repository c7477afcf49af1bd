"""The open-loop replayer: every request leaves at its arrival time, whatever happened to the
ones before it, and every request ends in a record (completed, or failed with the reason).

The records accumulate in a `ReplayResult` the caller may hand in, so a replay that is
cancelled (Ctrl-C) leaves the caller every request that finished; the requests in flight at
that moment end failed as interrupted, and those not yet sent are counted, never recorded."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from pddemu.metrics.records import RequestRecord
from pddemu.runtime.clock import INSTANT_HOLD_CAP_S, ModelledClock

PROGRESS_EVERY_S = 1.0
INTERRUPTED = "interrupted: the run was stopped before the request ended"


class Replayable(Protocol):
    request_id: str
    arrival_s: float
    input_tokens: int
    output_tokens: int
    session: str | None

    @property
    def prompt_ids(self) -> Any: ...


@dataclass
class ReplayResult:
    records: list[RequestRecord]
    outputs: dict[str, list[int]] = field(default_factory=dict)
    protocol_errors: int = 0  # answers the replayer could not read: an emulator defect
    not_sent: int = 0  # requests whose arrival time had not come when the replay was cancelled


@dataclass
class Progress:
    """Requests done, in flight and failed, with the rate they finish at and an estimate of the
    time left, on one refreshed line (or a line a second off a tty).

    The estimate is wall-clock time: the later of the last arrival (an open-loop replay cannot
    end before it) and the requests left at the rate they have finished so far."""

    system: str
    total: int
    clock: ModelledClock
    last_arrival_s: float = 0.0  # modelled
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    _last: float = 0.0
    _started: float = field(default_factory=time.monotonic)

    def rate(self, now: float) -> float:
        """Requests finished (done or failed) per wall-clock second since the replay began."""
        return (self.done + self.failed) / max(now - self._started, 1e-9)

    def eta_s(self, now: float) -> float:
        finished = self.done + self.failed
        until_arrivals = self.clock.wall_delay(self.last_arrival_s)
        if finished == 0:
            return until_arrivals if self.total else 0.0
        return max(until_arrivals, (self.total - finished) / self.rate(now))

    def show(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        width = 24
        finished = self.done + self.failed
        filled = int(width * finished / max(1, self.total))
        left = "done" if final else f"ETA {_duration(self.eta_s(now))}"
        line = (
            f"[{self.system:>5}] [{'#' * filled}{'.' * (width - filled)}] "
            f"{finished}/{self.total} done, {self.in_flight} in flight, "
            f"{self.failed} failed, {self.rate(now):.2f} req/s wall, {left}, "
            f"t={self.clock.now():.0f} s modelled"
        )
        if sys.stderr.isatty():
            sys.stderr.write("\r" + line + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


async def replay(
    frontend_url: str,
    workload: Sequence[Replayable],
    clock: ModelledClock,
    system: str,
    start_s: float,
    result: ReplayResult | None = None,
    headers: dict[str, str] | None = None,
) -> ReplayResult:
    """Send `workload` to the frontend, request i at modelled time `start_s + arrival_s`.

    Cancelled, it first ends every request in flight as failed (interrupted) in `result`."""
    last = max((r.arrival_s for r in workload), default=0.0)
    progress = Progress(system, len(workload), clock, start_s + last)
    result = result if result is not None else ReplayResult([])
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=headers
    ) as session:
        tasks: list[asyncio.Task] = []
        ordered = sorted(workload, key=lambda r: r.arrival_s)
        due_of: dict[str, float] = {}
        try:
            for sent, request in enumerate(ordered):
                result.not_sent = len(ordered) - sent
                due = start_s + request.arrival_s
                due_of[request.request_id] = due
                # Time stands at the arrival until the frontend has the request (it then holds
                # it itself, until its routing): neither end's lateness moves the arrival.
                with clock.holding(due):
                    await clock.sleep_until(due, precise=True)  # its lateness: below
                    admitted = asyncio.get_running_loop().create_future()
                    task = asyncio.ensure_future(
                        _one(
                            session, frontend_url, request, system, progress, result, due, admitted
                        )
                    )
                    tasks.append(task)
                    await asyncio.wait(
                        {admitted, task},
                        timeout=INSTANT_HOLD_CAP_S,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                progress.show()
            result.not_sent = 0
            while not all(task.done() for task in tasks):
                await asyncio.wait(tasks, timeout=PROGRESS_EVERY_S)
                progress.show()
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            progress.show(final=True)
            raise
    progress.show(final=True)
    for record in result.records:  # held, 0; a hold that ran out of its cap moved the arrival
        clock.count_lag("send", record.arrival_s - due_of.get(record.request_id, record.arrival_s))
    recorded = sorted(record.request_id for record in result.records)
    if recorded != sorted(request.request_id for request in workload):
        raise RuntimeError(f"replay of {system}: the records do not match the workload's requests")
    result.records.sort(key=lambda record: (record.arrival_s, record.request_id))
    return result


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    request: Replayable,
    system: str,
    progress: Progress,
    result: ReplayResult,
    sent_at: float,
    admitted: asyncio.Future | None = None,
) -> None:
    progress.in_flight += 1
    record: RequestRecord | None = None
    body = {
        "rid": request.request_id,
        "prompt_ids": [int(x) for x in request.prompt_ids],
        "input_tokens": int(request.input_tokens),
        "output_tokens": int(request.output_tokens),
        "session": request.session,
        "stream_tokens": False,  # the record holds every token's time: no line per token
    }
    try:
        async with session.post(f"{url}/generate", json=body) as reply:
            if admitted is not None and not admitted.done():
                admitted.set_result(None)  # the frontend has it: its answer has begun
            if reply.status != 200:
                raise RuntimeError(
                    f"frontend answered {reply.status}: {(await reply.text())[:200]}"
                )
            async for line in reply.content:
                item = json.loads(line)
                if "record" in item:
                    record = RequestRecord(**item["record"])
                    result.outputs[request.request_id] = item["output_ids"]
        if record is None:
            raise RuntimeError("the frontend closed the stream without the request's record")
    except asyncio.CancelledError:
        record = RequestRecord(
            request_id=request.request_id,
            system=system,
            arrival_s=sent_at,
            input_tokens=int(request.input_tokens),
            expected_output_tokens=int(request.output_tokens),
            state="failed",
            failure_reason=INTERRUPTED,
        )
    except Exception as error:  # any failure ends the request in a record, never in a lost task
        lost_connection = isinstance(error, TimeoutError | aiohttp.ClientError)
        result.protocol_errors += not lost_connection
        kind = "" if lost_connection else "protocol error: "
        record = RequestRecord(
            request_id=request.request_id,
            system=system,
            arrival_s=sent_at,
            input_tokens=int(request.input_tokens),
            expected_output_tokens=int(request.output_tokens),
            state="failed",
            failure_reason=f"replayer: {kind}{type(error).__name__}: {error}",
        )
    result.records.append(record)
    progress.in_flight -= 1
    if record.state == "completed":
        progress.done += 1
    else:
        progress.failed += 1
