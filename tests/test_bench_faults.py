"""The faults benchmark's scenarios are valid faults files, and its timings read the timeline."""

from __future__ import annotations

from pathlib import Path

import pytest

from pddemu.bench.faults import SCENARIOS, first_after
from pddemu.timeline import Timeline


@pytest.mark.parametrize("name", [name for name, text in SCENARIOS.items() if text])
def test_each_scenario_is_a_valid_faults_file(name: str, tmp_path: Path) -> None:
    path = tmp_path / "faults.txt"
    path.write_text(SCENARIOS[name])
    timeline = Timeline.load(None, path)
    assert timeline.instance_faults or timeline.link_events is not None


def test_detect_and_fail_over_are_the_first_rows_after_the_fault() -> None:
    rows = [
        {"at_s": 1.0, "what": "router: suspect"},  # before the fault: not its effect
        {"at_s": 4.0, "what": "killed"},
        {"at_s": 4.25, "what": "router: down"},
        {"at_s": 4.5, "what": "failover: moved to MD1"},
        {"at_s": 4.75, "what": "router: up"},
    ]
    assert first_after(rows, 4.0, "router:") == 0.25
    assert first_after(rows, 4.0, "failover:") == 0.5
    assert first_after(rows, 5.0, "failover:") is None
