"""A request record as a dict (what the frontend sends the replayer at each request's end)."""

from __future__ import annotations

import dataclasses

from pddemu.metrics.records import RequestRecord


def test_a_records_dict_is_asdicts_with_its_own_token_times() -> None:
    record = RequestRecord(
        "r1", "pdd", 1.5, 96, 3000, token_times_s=[0.1 * i for i in range(3000)], md_tokens=7
    )
    record.handoff_mode = "catch_up"
    as_dict = record.to_dict()
    assert as_dict == dataclasses.asdict(record)
    assert list(as_dict) == [f.name for f in dataclasses.fields(RequestRecord)]
    as_dict["token_times_s"].append(99.0)
    assert len(record.token_times_s) == 3000
    assert RequestRecord(**record.to_dict()) == record
