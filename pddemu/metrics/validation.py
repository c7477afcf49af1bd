"""Checks that records and instance reports are consistent before anything is computed.

A summary of inconsistent records (a completed request without a first token, a hit larger
than the prompt, tokens that go back in time) would print a plausible but wrong figure; the
checks turn such records into a `MetricsError` that names the request and the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pddemu.metrics.errors import MetricsError
from pddemu.metrics.records import (
    END_STATES,
    HANDOFF_MODES,
    HANDOFF_PAYLOADS,
    PIPELINES,
    InstanceReport,
    RequestRecord,
)

_COUNTERS = (
    "retries",
    "failovers",
    "output_tokens",
    "expected_output_tokens",
    "handoff_rounds",
    "rld_tokens",
    "md_tokens",
    "p_hit_tokens",
    "wan_bytes",
    "wan_bytes_without_drc",
    "wan_bytes_genuine",
    "wan_bytes_cancelled",
    "duplicate_tokens",
    "dropped_stale_tokens",
    "gap_tokens",
)


def check_records(system: str, records: Sequence[RequestRecord]) -> None:
    """Raise `MetricsError` on the first record that breaks an invariant of records.py."""
    seen: set[str] = set()
    for record in records:
        where = f"request {record.request_id!r} of system {system!r}"
        if record.request_id in seen:
            raise MetricsError(f"{where}: request id appears twice")
        seen.add(record.request_id)
        if record.system != system:
            raise MetricsError(f"{where}: record says system {record.system!r}")
        _check_record(record, where)


def _check_record(record: RequestRecord, where: str) -> None:
    if record.state not in END_STATES:
        raise MetricsError(f"{where}: state {record.state!r} is not one of {END_STATES}")
    if record.pipeline and record.pipeline not in PIPELINES:
        raise MetricsError(f"{where}: pipeline {record.pipeline!r} is not one of {PIPELINES}")
    if record.handoff_mode is not None and record.handoff_mode not in HANDOFF_MODES:
        raise MetricsError(f"{where}: handoff_mode {record.handoff_mode!r} not in {HANDOFF_MODES}")
    if record.handoff_payload is not None and record.handoff_payload not in HANDOFF_PAYLOADS:
        raise MetricsError(
            f"{where}: handoff_payload {record.handoff_payload!r} not in {HANDOFF_PAYLOADS}"
        )
    if record.input_tokens < 1:
        raise MetricsError(f"{where}: input_tokens must be at least 1, got {record.input_tokens}")
    for name in _COUNTERS:
        if getattr(record, name) < 0:
            raise MetricsError(f"{where}: {name} is negative ({getattr(record, name)})")
    for name, hit in (
        ("p_hit_tokens", record.p_hit_tokens),
        ("md_hit_tokens", record.md_hit_tokens),
    ):
        if hit is not None and not 0 <= hit <= record.input_tokens:
            raise MetricsError(
                f"{where}: {name} = {hit} outside [0, input_tokens = {record.input_tokens}]"
            )
    if record.handoff_stall_s is not None and not record.handoff_stall_s >= 0:
        raise MetricsError(f"{where}: handoff_stall_s is {record.handoff_stall_s}")
    _check_times(record, where)


def _check_times(record: RequestRecord, where: str) -> None:
    stamps = {"arrival_s": record.arrival_s, "first_token_s": record.first_token_s}
    stamps["finish_s"] = record.finish_s
    for name, value in stamps.items():
        if value is not None and not math.isfinite(value):
            raise MetricsError(f"{where}: {name} is {value}")
    if record.state == "completed":
        if record.first_token_s is None or record.finish_s is None:
            raise MetricsError(f"{where}: completed without first_token_s and finish_s")
        if record.output_tokens < 1:
            raise MetricsError(f"{where}: completed with no output token")
    if record.first_token_s is not None and record.first_token_s < record.arrival_s:
        raise MetricsError(f"{where}: first token at {record.first_token_s} before arrival")
    if record.finish_s is not None:
        start = record.arrival_s if record.first_token_s is None else record.first_token_s
        if record.finish_s < start:
            raise MetricsError(f"{where}: finish at {record.finish_s} before {start}")
    times = record.token_times_s
    if times and len(times) != record.output_tokens:
        raise MetricsError(
            f"{where}: {len(times)} token times for {record.output_tokens} output tokens"
        )
    if not all(math.isfinite(t) for t in times):
        raise MetricsError(f"{where}: a token time is not finite")
    if times and times[0] < record.arrival_s:
        raise MetricsError(f"{where}: first token time {times[0]} before arrival")
    if any(b < a for a, b in zip(times, times[1:], strict=False)):
        raise MetricsError(f"{where}: token times go back in time")


def check_instances(instances: Iterable[InstanceReport]) -> None:
    names: set[str] = set()
    for instance in instances:
        where = f"instance {instance.name!r}"
        if instance.name in names:
            raise MetricsError(f"{where}: name appears twice")
        names.add(instance.name)
        if not (math.isfinite(instance.price_per_hour) and instance.price_per_hour >= 0):
            raise MetricsError(f"{where}: price_per_hour is {instance.price_per_hour}")
        if not all(math.isfinite(lag) for lag in instance.lag_samples_s):
            raise MetricsError(f"{where}: a lag sample is not finite")
