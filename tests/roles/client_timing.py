"""A benchmark client's TTFT against the emulator's record of the same request, exactly.

Every process of the host reads one CLOCK_MONOTONIC (Python's time.monotonic and perf_counter,
AIPerf's perf_counter_ns), so the client's instants, the front door's (`door` in a streamed
response's record) and the emulator's modelled ones compare directly: the client sent before
the door received, the door wrote the first chunk before the client read it, and the emulator
admitted the request after the door received it and had the first token before the door wrote
it. So, request by request, the client's TTFT interval contains the door's, whose length is at
least the emulator's TTFT (modelled seconds / time_scale: modelled time never runs faster).
These hold by construction whatever the machine's load; the size of the difference is the
host's own delay (loopback, the clients' and door's event loops), measured, not assumed.
"""

from __future__ import annotations

import statistics
from typing import Any

ROUNDING_S = 1e-6  # float seconds of one clock read in two ways (ns integers, float seconds)


def outside_the_emulator_s(
    client_sent: float, client_first: float, record: dict[str, Any], time_scale: float
) -> tuple[float, float, float]:
    """Check the containment; return how much longer the client's TTFT is than the
    emulator's (wall seconds), in three parts: before the door received the request, in the
    frontend (the door's TTFT beyond the emulator's), after the door began writing."""
    door = record["door"]
    received, first_chunk = door["received_s"], door["first_chunk_s"]
    assert first_chunk is not None, record
    emulator_ttft = (record["first_token_s"] - record["arrival_s"]) / time_scale
    assert client_sent <= received + ROUNDING_S, (client_sent, door)
    assert first_chunk <= client_first + ROUNDING_S, (client_first, door)
    assert 0 < emulator_ttft <= first_chunk - received + ROUNDING_S, (emulator_ttft, door)
    in_frontend = (first_chunk - received) - emulator_ttft
    return received - client_sent, in_frontend, client_first - first_chunk


def where_the_difference_goes(client: str, parts: list[tuple[float, float, float]]) -> str:
    before, inside, after = (statistics.median(part) * 1e3 for part in zip(*parts, strict=True))
    return (
        f"{client}'s TTFT - the emulator's, medians: {before:.2f} ms before the door, "
        f"{inside:.2f} ms in the frontend, {after:.2f} ms after the door"
    )
