"""Importing mahimahi delivery traces: capacity per bin, stalls, loops, errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from netem.direction import Direction
from netem.mahimahi import binned_rates, read_trace, schedule_text
from netem.schedule import Cursor, apply_step, parse_schedule
from netem.spec import LinkSpec, SpecError


def test_each_opportunity_is_1500_bytes_of_its_bin() -> None:
    # opportunities at 1, 2, 2 and 5 ms fall in the first 5 ms bin, the one at 10 in the second
    assert binned_rates([1, 2, 2, 5, 10], 5, 10) == [4 * 12000 * 200, 12000 * 200]
    assert binned_rates([3, 10], 5, 30) == [12000 * 200, 12000 * 200] * 3  # loops


def test_a_gap_in_the_trace_stalls_the_link() -> None:
    text = schedule_text([1, 30], [1, 30], bin_ms=10)
    schedule = parse_schedule(text)
    rates = [(s.at_s, a.changes["rate_bps"]) for s in schedule.steps for a in s.actions]
    assert rates[:2] == [(0.0, 1_200_000.0), (0.0, 1_200_000.0)]
    assert (0.01, 0.0) in rates and (0.02, 1_200_000.0) in rates
    assert schedule.period_s == 0.03


def test_different_periods_cover_the_longer_trace_without_repeating() -> None:
    schedule = parse_schedule(schedule_text([10], [20], bin_ms=10))
    assert schedule.period_s is None and schedule.steps[-1].at_s < 0.02


def test_a_saturated_link_delivers_the_trace_per_bin() -> None:
    """Replayed on a fake clock with a queue that never empties: bytes leaving per 100 ms are
    the trace's, 1500 per opportunity."""
    trace = sorted([1 + (i * 7919) % 997 for i in range(700)] + [1000])
    schedule = parse_schedule(schedule_text(trace, trace, bin_ms=10))
    direction = Direction(LinkSpec(rate_bps=1e6, limit_bytes=10**8), seed=0)
    for _ in range(3000):
        direction.push(b"x" * 1500, 0.0)
    cursor = Cursor(schedule, 0.0)
    delivered = []
    for due, step in cursor.due(2.0):
        delivered += direction.release(due)
        apply_step(step, due, {"wan": {"a2b": direction, "b2a": direction}})
    delivered += direction.release(2.0)
    for window in range(20):
        start, end = window * 0.1, (window + 1) * 0.1
        got = sum(len(p) for p, t in delivered if start < t <= end + 1e-9)
        times_ms = [k * 1000 + t for k in (0, 1) for t in trace]
        expected = 1500 * sum(1 for t in times_ms if start * 1000 < t <= end * 1000)
        assert got == pytest.approx(expected, abs=1500), window


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("5\nx\n", ":2: expected a whole number"),
        ("5\n3\n", "must not decrease"),
        ("0\n", "above 0"),
    ],
)
def test_bad_traces_are_refused_with_the_line(tmp_path, text: str, needle: str) -> None:
    path = tmp_path / "bad.up"
    path.write_text(text)
    with pytest.raises(SpecError, match=needle):
        read_trace(path)


def test_the_cli_writes_a_schedule_netem_reads(tmp_path) -> None:
    up, down, out = tmp_path / "t.up", tmp_path / "t.down", tmp_path / "t.schedule"
    up.write_text("\n".join(str(t) for t in range(1, 101)) + "\n")
    down.write_text("50\n100\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "netem.cli",
            "trace",
            "import",
            "mahimahi",
            str(up),
            str(down),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    schedule = parse_schedule(out.read_text())
    first = {a.direction: a.changes["rate_bps"] for a in schedule.steps[0].actions}
    assert first == {"a2b": 12e6, "b2a": 0.0} and schedule.period_s == 0.1
    # b2a: one opportunity in the 10 ms bins ending at 50 and 100 ms, nothing between
    assert [s.at_s for s in schedule.steps] == [0.0, 0.04, 0.05, 0.09]
