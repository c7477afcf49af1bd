"""Workload traces: one record type, streaming readers per file format, their statistics, the
pdd-janfeb generator, and `load_workload`, the emulator's entry to all of them."""

from __future__ import annotations

from pddemu.workload.formats import FORMATS, detect_format, read_trace
from pddemu.workload.janfeb import PDD_JANFEB, GeneratedTrace, generate_pdd_janfeb
from pddemu.workload.janfeb_config import GeneratorError, PddJanFebConfig
from pddemu.workload.records import TraceError, TraceRequest
from pddemu.workload.replay_source import WorkloadError, WorkloadRequest, load_workload

__all__ = [
    "FORMATS",
    "PDD_JANFEB",
    "GeneratedTrace",
    "GeneratorError",
    "PddJanFebConfig",
    "TraceError",
    "TraceRequest",
    "WorkloadError",
    "WorkloadRequest",
    "detect_format",
    "generate_pdd_janfeb",
    "load_workload",
    "read_trace",
]
