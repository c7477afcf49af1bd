"""The replay's progress line: its time left is the later of the last arrival and the requests
left at the rate they have finished so far."""

from __future__ import annotations

import time

import pytest

from pddemu.replay import Progress
from pddemu.runtime.clock import ModelledClock


def test_eta_waits_for_the_last_arrival_then_follows_the_rate() -> None:
    now = time.monotonic()
    clock = ModelledClock.fixed(now, 4.0)
    progress = Progress("pdd", 10, clock, last_arrival_s=40.0)  # 10 wall seconds after epoch
    progress._started = now - 2.0
    progress.done = 5  # 2.5 requests per wall second: 2 s for the other 5
    assert progress.eta_s(now) == pytest.approx(10.0, abs=1e-3)
    progress.last_arrival_s = 0.0
    assert progress.eta_s(now) == pytest.approx(2.0)
    progress.failed, progress.done = 1, 0  # failed requests are finished too
    assert progress.eta_s(now) == pytest.approx(18.0)


def test_the_line_shows_rate_and_eta(capsys: pytest.CaptureFixture[str]) -> None:
    clock = ModelledClock.fixed(time.monotonic(), 1.0)
    progress = Progress("naive", 4, clock)
    progress.done = 1
    progress.show()
    line = capsys.readouterr().err
    assert "1/4 done" in line and "req/s wall" in line and "ETA" in line
