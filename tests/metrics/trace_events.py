"""What a Chrome / Perfetto trace-event JSON file must be for the viewers to open it whole.

The schema is the Trace Event Format's JSON Object Format (the format's definition document,
which Perfetto's JSON importer follows) for the event kinds pddemu writes and their required
fields; `check_opens` adds the rule the importer enforces beyond the schema: the complete
events ("X") of one thread nest perfectly (two either do not overlap or one contains the
other), or Perfetto drops the misplaced ones.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import jsonschema

ROUNDING_US = 1e-3  # times are written in microseconds to 3 decimals

_TIMED = {"ts": {"type": "number"}}
EVENT = {
    "type": "object",
    "required": ["ph", "name", "pid"],
    "properties": {
        "ph": {"enum": ["X", "i", "I", "C", "M", "B", "E", "b", "e", "n", "s", "t", "f"]},
        "name": {"type": "string"},
        "cat": {"type": "string"},
        "pid": {"type": "integer"},
        "tid": {"type": "integer"},
        **_TIMED,
        "dur": {"type": "number", "minimum": 0},
        "args": {"type": "object"},
    },
    "allOf": [
        {
            "if": {"properties": {"ph": {"const": "X"}}},
            "then": {"required": ["ts", "dur", "tid"]},
        },
        {
            "if": {"properties": {"ph": {"enum": ["i", "I"]}}},
            "then": {
                "required": ["ts", "s"],
                "properties": {"s": {"enum": ["g", "p", "t"]}},
                "if": {"properties": {"s": {"const": "t"}}},
                "then": {"required": ["tid"]},
            },
        },
        {
            "if": {"properties": {"ph": {"const": "C"}}},
            "then": {
                "required": ["ts", "args"],
                "properties": {
                    "args": {"additionalProperties": {"type": "number"}, "minProperties": 1}
                },
            },
        },
        {
            "if": {"properties": {"ph": {"const": "M"}}},
            "then": {
                "required": ["args"],
                "properties": {
                    "name": {
                        "enum": [
                            "process_name",
                            "process_labels",
                            "process_sort_index",
                            "thread_name",
                            "thread_sort_index",
                        ]
                    }
                },
            },
        },
    ],
}
TRACE = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "traceEvents": {"type": "array", "items": EVENT},
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "otherData": {"type": "object"},
    },
}


def check_opens(trace: dict[str, Any]) -> None:
    """Fail unless `trace` is valid trace-event JSON whose slices nest on every thread, and
    every thread holding an event has a name."""
    jsonschema.validate(trace, TRACE)
    events = trace["traceEvents"]
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for event in events:
        if event["ph"] == "X":
            slices[(event["pid"], event["tid"])].append((event["ts"], event["ts"] + event["dur"]))
    assert set(slices) <= named, set(slices) - named
    for thread, spans in slices.items():
        open_ends: list[float] = []  # the ends of the slices enclosing the present one
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= start + ROUNDING_US:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + ROUNDING_US, (thread, start, end)
            open_ends.append(end)
