"""Hand-built records with answers worked out by hand (see each record's comment).

System "pdd", five requests, SLO TTFT <= 1.5 s and TPOT <= 0.5 s:

| id | state     | arrival | token times           | TTFT | TPOT | E2EL | pipeline | meets SLO |
|----|-----------|---------|-----------------------|------|------|------|----------|-----------|
| r1 | completed | 0.0     | 1.0 1.1 1.2 1.3       | 1.0  | 0.1  | 1.3  | P-MD     | yes       |
| r2 | completed | 1.0     | 3.0 3.5 4.0 6.0       | 2.0  | 1.0  | 5.0  | P-RLD-MD | no (TTFT) |
| r3 | completed | 2.0     | 2.5                   | 0.5  | -    | 0.5  | RLD-only | yes       |
| r4 | failed    | 3.0     | -                     | -    | -    | -    | P-MD     | no        |
| r5 | completed | 4.0     | 5.0 5.2 5.4           | 1.0  | 0.2  | 1.4  | P-RLD-MD | yes       |

Duration 6.0 - 0.0 = 6 s, so goodput = 3 / 6 = 0.5 req/s; cost 10 + 5 + 12 = 27 per hour.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pddemu.metrics.records import InstanceReport, RequestRecord
from pddemu.metrics.summary import SLO

SAMPLE_SLO = SLO(ttft_s=1.5, tpot_s=0.5)
SAMPLE_SCALE = {"token_scale": 0.0625, "time_scale": 2.0, "byte_scale": 0.001}
SAMPLE_WAN_RATE = 8e6


def completed(
    request_id: str, arrival: float, times: list[float], system: str = "pdd", **changes: Any
) -> RequestRecord:
    """A completed request whose first token and finish are its first and last token times;
    `changes` sets other fields (an unknown name is a TypeError)."""
    record = RequestRecord(
        request_id=request_id,
        system=system,
        arrival_s=arrival,
        input_tokens=100,
        expected_output_tokens=len(times),
        state="completed",
        first_token_s=times[0],
        finish_s=times[-1],
        token_times_s=list(times),
        output_tokens=len(times),
    )
    return replace(record, **changes)


def sample_records() -> list[RequestRecord]:
    r1 = completed(
        "r1",
        0.0,
        [1.0, 1.1, 1.2, 1.3],
        pipeline="P-MD",
        md_tokens=4,
        p_hit_tokens=90,
        md_hit_tokens=95,
        wan_bytes=1000,
        wan_bytes_without_drc=10_000,
        wan_bytes_genuine=10,
    )
    r2 = completed(
        "r2",
        1.0,
        [3.0, 3.5, 4.0, 6.0],
        pipeline="P-RLD-MD",
        handoff_mode="one_shot",
        handoff_payload="extend",
        handoff_position=3,
        handoff_stall_s=2.0,
        handoff_rounds=1,
        rld_tokens=3,
        md_tokens=1,
        p_hit_tokens=0,
        md_hit_tokens=50,
        wan_bytes=20_000,
        wan_bytes_without_drc=40_000,
        wan_bytes_genuine=200,
        duplicate_tokens=2,
    )
    r3 = completed(
        "r3",
        2.0,
        [2.5],
        pipeline="RLD-only",
        rld_tokens=1,
        p_hit_tokens=99,
        anomaly_filtered=True,
        wan_bytes_cancelled=5000,
    )
    r4 = RequestRecord(
        request_id="r4",
        system="pdd",
        arrival_s=3.0,
        input_tokens=100,
        expected_output_tokens=8,
        state="failed",
        failure_reason="timeout",
        pipeline="P-MD",
        p_hit_tokens=100,
        wan_bytes=500,
        wan_bytes_without_drc=5000,
    )
    r5 = completed(
        "r5",
        4.0,
        [5.0, 5.2, 5.4],
        pipeline="P-RLD-MD",
        handoff_mode="catch_up",
        handoff_payload="extend",
        handoff_position=1,
        handoff_stall_s=0.2,
        handoff_rounds=3,
        rld_tokens=1,
        md_tokens=2,
        p_hit_tokens=95,
        md_hit_tokens=97,
        wan_bytes=3000,
        wan_bytes_without_drc=30_000,
        token_mismatch=True,
    )
    return [r1, r2, r3, r4, r5]


def sample_instances() -> list[InstanceReport]:
    return [
        InstanceReport("P0", "P", "A", 8, 10.0, lag_samples_s=[0.0, 0.01, 0.02], steps=3),
        InstanceReport("RLD0", "RLD", "A", 2, 5.0),
        InstanceReport("MD0", "MD", "B", 8, 12.0, lag_samples_s=[0.0, 0.5], steps=2),
    ]


def baseline_records(system: str, ttft: float) -> list[RequestRecord]:
    """Two P-D requests whose TTFTs are both `ttft` and whose tokens come 0.1 s apart."""
    return [
        completed(
            f"{system}{i}",
            float(i),
            [i + ttft, i + ttft + 0.1, i + ttft + 0.2],
            system=system,
            pipeline="P-D",
            md_tokens=3,
            p_hit_tokens=50,
            md_hit_tokens=50,
            wan_bytes=7000,
            wan_bytes_without_drc=7000,
        )
        for i in range(2)
    ]
