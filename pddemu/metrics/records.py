"""What the emulator records for every request: a handful of timestamps and counters.

All times are modelled seconds since the start of the run (the emulator may run k times
faster than modelled time; see the scale model). Token counts are modelled tokens: with a
token scale of 1/G, each genuine output token after the first stands for G modelled tokens,
and `token_times_s` holds one time per modelled token.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

PIPELINES = ("P-MD", "P-RLD-MD", "RLD-only", "P-D")  # P-D: a baseline's plain prefill -> decode
END_STATES = ("completed", "failed")
HANDOFF_MODES = ("one_shot", "catch_up")
HANDOFF_PAYLOADS = ("extend", "kv_delta")


@dataclass
class RequestRecord:
    request_id: str
    system: str  # pdd | naive | indc
    arrival_s: float
    input_tokens: int
    expected_output_tokens: int
    state: str = "failed"  # completed | failed; every request ends in one of them
    failure_reason: str = ""
    first_token_s: float | None = None
    finish_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)  # one per delivered modelled token
    output_tokens: int = 0  # modelled tokens delivered to the user
    pipeline: str = ""  # one of PIPELINES
    handoff_mode: str | None = None  # one_shot | catch_up, when a handoff happened
    handoff_payload: str | None = None  # extend | kv_delta
    handoff_position: int | None = None  # modelled output position where MD took over
    handoff_switch: int | None = None  # the position the relay's final part named for it
    handoff_gap_s: float | None = None  # between the relay's last delivered token and MD's first
    handoff_stall_s: float | None = None  # the user-visible stall: that gap minus the request's
    # TPOT (0 when the gap is within it)
    handoff_started_s: float | None = None  # the relay sent its first handoff part
    handoff_resumed_s: float | None = None  # MD produced its first streamed token
    handoff_rounds: int = 0  # catch-up parts sent (1 for one-shot)
    rld_tokens: int = 0  # modelled output tokens the user got from the relay decode
    md_tokens: int = 0  # ... from the main decode (or the baseline's decode instance)
    p_hit_tokens: int = 0  # modelled prompt tokens found in P's prefix cache
    md_hit_tokens: int | None = None  # ... in MD's radix cache (None: never reached MD)
    wan_bytes: int = 0  # modelled bytes this request sent across the WAN
    wan_bytes_without_drc: int = 0  # what they would have been with no decode-side cache
    wan_bytes_genuine: int = 0  # bytes really sent on the emulated WAN
    wan_bytes_cancelled: int = 0  # modelled bytes not sent because the anomaly filter acted
    anomaly_filtered: bool = False  # routed RLD-only, or its WAN transfer cut off mid-way
    predicted_output_tokens: float | None = None  # the router's prediction (pdd)
    routed_s: float | None = None  # when its last leg was routed (P starts sending its KV)
    kv_first_chunk_s: float | None = None  # when the decode side (MD, D) had the first KV chunk
    kv_arrived_s: float | None = None  # when the decode side (MD, D) had its KV, last byte
    token_mismatch: bool = False  # the user's tokens differ from the single-process reference
    duplicate_tokens: int = 0  # positions delivered twice to the frontend (dropped there)
    dropped_stale_tokens: int = 0  # tokens from an abandoned leg or a relieved instance (an
    # instance streaming after the stream was taken from it), dropped by the frontend
    gap_tokens: int = 0  # positions received but held back behind a missing one when the request
    # ended (a failed request's diagnosis; a completed request has none)
    retries: int = 0  # times it was routed again from the start (an instance lost before its
    # first token)
    failovers: int = 0  # times its stream moved to another instance (the one it was on lost)
    failover_path: str = ""  # what was done, when, e.g. "31.20 s: MD0 lost: moved to MD1 ..."
    unmatched: bool = False  # routed with no decode-side hit: its answer to the match was late

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_s is None:
            return None
        return self.first_token_s - self.arrival_s

    @property
    def e2el_s(self) -> float | None:
        if self.finish_s is None:
            return None
        return self.finish_s - self.arrival_s

    @property
    def handoff_latency_s(self) -> float | None:
        """MD's side of a handoff: from the relay's first part to MD's first streamed token."""
        if self.handoff_started_s is None or self.handoff_resumed_s is None:
            return None
        return self.handoff_resumed_s - self.handoff_started_s

    @property
    def tpot_s(self) -> float | None:
        """vLLM's definition: (E2EL - TTFT) / (output tokens - 1); None for one token."""
        if self.e2el_s is None or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        """Its fields, as `dataclasses.asdict` gives them (the token times a copy), without
        asdict's deep copy of each time: thousands of them took the frontend's loop about
        10 ms at each request's end, while the next message waited."""
        record = {name: getattr(self, name) for name in _RECORD_FIELDS}
        record["token_times_s"] = list(self.token_times_s)
        return record


_RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))


@dataclass
class InstanceReport:
    """What an instance reports at the end of a run (for lag, utilisation and cost)."""

    name: str  # e.g. "P0", "RLD0", "MD1"
    role: str  # P | RLD | MD | D
    chip: str  # chip profile name
    chips: int  # chips in this instance
    price_per_hour: float  # of the whole instance
    lag_samples_s: list[float] = field(default_factory=list)  # modelled-time overrun per step
    steps: int = 0
    busy_s: float = 0.0  # modelled seconds spent in steps
    tokens_generated: int = 0  # modelled output tokens produced (decode roles)
    prefill_tokens: int = 0  # modelled prompt tokens computed (P)
    kv_peak_over_capacity_tokens: int = 0  # decode roles: most KV reserved beyond capacity
