"""The door's count of chunks written later than their tokens' modelled times."""

from __future__ import annotations

from pddemu.roles.openai_api import LATE_WRITE_S, WriteTiming


def test_only_writes_beyond_the_grain_are_late_and_each_request_keeps_its_own() -> None:
    timing = WriteTiming()
    first = {"late_writes": 0, "max_late_s": 0.0}
    second = {"late_writes": 0, "max_late_s": 0.0}
    timing.wrote(first, 0.0)
    timing.wrote(first, LATE_WRITE_S)  # at the grain: on time
    timing.wrote(first, LATE_WRITE_S + 0.010)
    timing.wrote(second, 0.030)
    assert (first["late_writes"], second["late_writes"]) == (1, 1)
    assert (first["max_late_s"], second["max_late_s"]) == (LATE_WRITE_S + 0.010, 0.030)
    totals = timing.as_dict()
    assert totals["chunks_written"] == 4 and totals["late_writes"] == 2
    assert totals["max_late_s"] == 0.030
    assert abs(totals["late_total_s"] - (LATE_WRITE_S + 0.040)) < 1e-12
