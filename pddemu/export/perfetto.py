"""A run as a Chrome / Perfetto trace-event JSON timeline (open it at ui.perfetto.dev or in
chrome://tracing), in modelled time.

For each system two processes: its instances and its requests.
- An instance's track: P's prefill steps (each with the chunks it computed, by request); a
  counter per decode instance of the requests it is decoding and of KV transfers arriving;
  faults, when an instance reported any.
- A request's track: queued (arrival to its first prefill chunk), prefill (first to last
  chunk), then the decode phases on the instances that ran them (relay decode, the handoff
  stall from the relay's last token to MD's first, main decode; or one decode), a mark per
  delivered token and, for a failed request, the failure. Each KV transfer of the request
  (first to last byte, as its receiver saw them) has a track of its own beside it, since it
  overlaps the prefill and the relay's decode.
- A faults process, when the run had any: a track per instance or link with a mark for each
  row of the run's fault timeline (summary.json's `faults.timeline`: scheduled faults, what
  happened to instances, the router's changes of view, its failover actions).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pddemu.export.run import SystemRun
from pddemu.metrics.records import RequestRecord

US = 1e6  # trace-event times are microseconds


def _us(seconds: float) -> float:
    return round(seconds * US, 3)


class Trace:
    """Trace events with named processes and threads (tracks)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._pids: dict[str, int] = {}
        self._tids: dict[tuple[int, str], int] = {}

    def process(self, name: str) -> int:
        if name not in self._pids:
            pid = self._pids[name] = len(self._pids) + 1
            self.events.append(_meta("process_name", pid, 0, {"name": name}))
            self.events.append(_meta("process_sort_index", pid, 0, {"sort_index": pid}))
        return self._pids[name]

    def thread(self, pid: int, name: str) -> int:
        key = (pid, name)
        if key not in self._tids:
            tid = self._tids[key] = sum(1 for p, _ in self._tids if p == pid) + 1
            self.events.append(_meta("thread_name", pid, tid, {"name": name}))
            self.events.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
        return self._tids[key]

    def span(self, pid: int, tid: int, name: str, start: float, end: float, **args: Any) -> None:
        self.events.append(
            {
                "ph": "X",
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": _us(start),
                "dur": max(0.0, _us(end) - _us(start)),
                "args": args,
            }
        )

    def mark(self, pid: int, tid: int, name: str, at: float, **args: Any) -> None:
        self.events.append(
            {"ph": "i", "s": "t", "name": name, "pid": pid, "tid": tid, "ts": _us(at), "args": args}
        )

    def counter(self, pid: int, name: str, at: float, value: float) -> None:
        self.events.append(
            {"ph": "C", "name": name, "pid": pid, "ts": _us(at), "args": {"value": value}}
        )


def _meta(kind: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args}


def _events_by_request(run: SystemRun) -> dict[str, list[dict[str, Any]]]:
    """Every instance event, with the instance that recorded it, by request."""
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for name, report in run.instances.items():
        for event in report.get("events", []):
            found[event["rid"]].append({**event, "instance": name})
    return found


def _instance_tracks(trace: Trace, run: SystemRun) -> None:
    pid = trace.process(f"{run.system}: instances")
    for name in sorted(run.instances):
        report = run.instances[name]
        events = report.get("events", [])
        role = report.get("role", "")
        if role == "P" or any(e["kind"] == "prefill_chunk" for e in events):
            tid = trace.thread(pid, f"{name} prefill steps")
            steps: dict[tuple[float, float], dict[str, int]] = defaultdict(dict)
            for event in events:
                if event["kind"] == "prefill_chunk":
                    steps[(event["start_s"], event["end_s"])][event["rid"]] = event["tokens"]
            for (start, end), chunks in sorted(steps.items()):
                trace.span(pid, tid, f"prefill step ({len(chunks)} chunks)", start, end, **chunks)
        for kind, label in (("decode", "decoding"), ("kv_transfer", "KV arriving")):
            edges = sorted(
                [(e["start_s"], 1) for e in events if e["kind"] == kind]
                + [(e["end_s"], -1) for e in events if e["kind"] == kind]
            )
            level = 0
            for at, step in edges:
                level += step
                trace.counter(pid, f"{name} {label}", at, level)
        faults = [e for e in events if e["kind"] == "fault"]
        if faults:
            tid = trace.thread(pid, f"{name} faults")
            for fault in faults:
                detail = {k: v for k, v in fault.items() if k not in ("kind", "start_s", "end_s")}
                trace.span(pid, tid, "fault", fault["start_s"], fault["end_s"], **detail)


def _decode_phases(
    record: RequestRecord, decodes: list[dict[str, Any]]
) -> list[tuple[str, float, float]]:
    """(name, start, end) of the request's decode phases, from its delivered token times and
    the instances that decoded it (a relay first when it was handed over)."""
    times = record.token_times_s
    if not times:
        return []
    decoders = [e["instance"] for e in sorted(decodes, key=lambda e: e["start_s"])]
    end = record.finish_s if record.finish_s is not None else times[-1]
    position = record.handoff_position
    if position is not None and 0 < position < len(times) and len(decoders) >= 2:
        return [
            (f"relay decode on {decoders[0]}", times[0], times[position - 1]),
            ("handoff", times[position - 1], times[position]),
            (f"main decode on {decoders[-1]}", times[position], end),
        ]
    where = f" on {decoders[-1]}" if decoders else ""
    return [(f"decode{where}", times[0], end)]


def _request_tracks(trace: Trace, run: SystemRun) -> None:
    pid = trace.process(f"{run.system}: requests")
    by_request = _events_by_request(run)
    for record in run.records:
        events = by_request.get(record.request_id, [])
        label = f"{record.request_id} {record.pipeline or 'unrouted'}"
        tid = trace.thread(pid, label)
        chunks = sorted((e for e in events if e["kind"] == "prefill_chunk"), key=_start)
        if chunks:
            trace.span(pid, tid, "queued", record.arrival_s, chunks[0]["start_s"])
            trace.span(
                pid,
                tid,
                "prefill",
                chunks[0]["start_s"],
                chunks[-1]["end_s"],
                chunks=len(chunks),
                tokens=sum(c["tokens"] for c in chunks),
                instance=chunks[0]["instance"],
            )
        decodes = [e for e in events if e["kind"] == "decode"]
        for name, start, end in _decode_phases(record, decodes):
            trace.span(pid, tid, name, start, end)
        for position, at in enumerate(record.token_times_s):
            trace.mark(pid, tid, "token", at, position=position)
        if record.state != "completed":
            at = record.finish_s if record.finish_s is not None else record.arrival_s
            trace.mark(pid, tid, "failed", at, reason=record.failure_reason)
        for transfer in sorted((e for e in events if e["kind"] == "kv_transfer"), key=_start):
            lane = trace.thread(pid, f"{label} KV to {transfer['instance']}")
            trace.span(
                pid,
                lane,
                f"KV {transfer.get('source') or '?'} → {transfer['instance']}",
                transfer["start_s"],
                transfer["end_s"],
                genuine_bytes=transfer.get("genuine_bytes"),
            )


def _fault_tracks(trace: Trace, run: SystemRun) -> None:
    faults = run.summary.get("faults") or {}
    rows, origin = faults.get("timeline") or [], faults.get("replay_start_s")
    if not rows or origin is None:  # none, or a run written before the timeline had its 0
        return
    pid = trace.process(f"{run.system}: faults")
    for row in rows:
        tid = trace.thread(pid, row["instance"])
        trace.mark(pid, tid, row["what"], origin + row["at_s"], detail=row["detail"])


def _start(event: dict[str, Any]) -> float:
    return event["start_s"]


def perfetto_trace(runs: list[SystemRun]) -> dict[str, Any]:
    trace = Trace()
    for run in runs:
        _instance_tracks(trace, run)
        _request_tracks(trace, run)
        _fault_tracks(trace, run)
    return {
        "traceEvents": trace.events,
        "displayTimeUnit": "ms",
        "otherData": {"source": "pddemu export --format perfetto", "time": "modelled"},
    }
