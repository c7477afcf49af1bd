"""The flow record's benchmark (`pddemu.bench.flow_record`) on a short run: its rounds, whole
and incremental, give the same figures, starved windows among them, and the incremental one
answers only the windows since the last round."""

from __future__ import annotations

import pytest

from pddemu.bench import flow_record


def test_whole_and_incremental_rounds_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flow_record, "QUICK_HOURS", 0.05)  # 2,250 windows of 80 ms
    result = flow_record.run(quick=True)
    assert result["windows"] == 2250
    assert result["targets"]["the same figures whole and incremental"]
    assert result["starved_share"] > 0  # one window of 200 starved
    assert result["incremental"]["reply_bytes"] < result["whole"]["reply_bytes"] / 10
