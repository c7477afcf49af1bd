"""Workload traces: one record type, streaming readers per file format, and their statistics."""

from __future__ import annotations

from pddemu.workload.formats import FORMATS, detect_format, read_trace
from pddemu.workload.records import TraceError, TraceRequest

__all__ = ["FORMATS", "TraceError", "TraceRequest", "detect_format", "read_trace"]
