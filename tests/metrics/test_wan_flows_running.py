"""A long served run judges the WAN's flows round after round from the windows the shaper
counted since the last (`pddemu.metrics.wan_flows.RunningFlows`, `netem.flow_count.FlowCount.
since`): the verdict and every figure must be the ones the whole record gives at each round,
with the shaper keeping only the windows since the last round, and a round whose answer was
lost taking nothing away from the next. On counts fed the same packets side by side, one read
whole, one followed."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from netem.flow_count import FlowCount
from netem.shaper import Shaper
from netem.spec import LinkSpec
from pddemu.metrics.wan_flows import RunningFlows, starved_run, wan_flows_summary
from tests.netem.test_delivery_record import FakeLink, one_link_config
from tests.netem.test_flow_count import segment

WIDTH = 0.1
RATE, MTU = 3.2e6, 1000  # 40 packets a window: 10 bulk flows get 4 each, 11 under 4
ORIGINS = {"a2b": 10.0, "b2a": 10.003}  # each direction's count is made at its own instant


class Traffic:
    """The same packets into several sets of counts: bursts of 1-15 bulk flows with drops,
    calm spells and idle gaps, an arrival every 20 ms while it goes on."""

    def __init__(self, seed: int, *counts: dict[str, FlowCount]) -> None:
        self.draw = random.Random(seed)
        self.counts = counts
        self.dropped = {"a2b": 0, "b2a": 0}
        self.now = 10.01

    def until(self, end: float) -> None:
        while self.now < end:
            for direction in ORIGINS:
                flows = self.draw.choice([0, 0, 1, 3, 9, 10, 11, 12, 15])
                self.dropped[direction] += self.draw.choice([0, 0, 0, 1, 4])
                packets = [segment(port, data=960) for port in range(flows) for _ in range(5)]
                for count in self.counts:
                    count[direction].count(packets, self.now, self.dropped[direction], RATE, MTU)
            self.now += self.draw.choice([0.02, 0.02, 0.02, 0.35, 1.3])


def counts() -> dict[str, FlowCount]:
    return {d: FlowCount(WIDTH, origin) for d, origin in ORIGINS.items()}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_followed_round_by_round_the_figures_are_the_whole_records(seed: int) -> None:
    start = 10.35  # mid-window: the replay's windows begin at the next
    draw = random.Random(seed)
    whole, followed = counts(), counts()
    traffic = Traffic(seed, whole, followed)
    running = RunningFlows(start, 42.0)
    end = 10.0
    for _ in range(40):  # rounds, each after some windows of traffic
        end += draw.uniform(0.05, 4.0)
        traffic.until(end)
        at = traffic.now + draw.uniform(0.0, 0.3)  # read before the next arrival
        expected = wan_flows_summary(
            {d: c.to_dict(RATE, MTU) for d, c in whole.items()}, start, at, 42.0
        )
        since = dict(running.cursors)
        if draw.random() < 0.2:  # a round whose answer never arrives
            for d, count in followed.items():
                count.since(since.get(d, 0), RATE, MTU)
        records = {d: c.since(since.get(d, 0), RATE, MTU) for d, c in followed.items()}
        assert running.summary(records, at) == expected
        assert starved_run(running.summary(records, at)) is starved_run(expected)
    for d, count in followed.items():  # the windows kept: from what the last round asked on
        assert min(count.flows, default=since[d]) >= since[d]
        assert len(count.flows) < len(whole[d].flows) / 10


def test_a_starved_burst_is_judged_the_same_either_way() -> None:
    """Two seconds of 12 flows losing packets in a quiet minute: starved both ways, with the
    same figures; the record the shaper keeps is the last round's windows."""
    whole, followed = counts(), counts()
    running = RunningFlows(10.0, 40.0)
    dropped = 0
    for window in range(600):
        now = 10.005 + window * WIDTH
        burst = 100 <= window < 120
        dropped += 2 if burst else 0
        flows = 12 if burst else 2
        packets = [segment(port, data=960) for port in range(flows) for _ in range(5)]
        for count in (whole, followed):
            count["a2b"].count(packets, now, dropped, RATE, MTU)
        if window % 50 == 49:  # a round every 5 s
            since = dict(running.cursors)
            records = {d: c.since(since.get(d, 0), RATE, MTU) for d, c in followed.items()}
            summary = running.summary(records, now + 0.01)
    whole_records = {d: c.to_dict(RATE, MTU) for d, c in whole.items()}
    assert summary == wan_flows_summary(whole_records, 10.0, now + 0.01, 40.0)
    assert summary["starved_s"] == pytest.approx(2.0) and starved_run(summary)
    assert summary["directions"]["a2b"]["windows_active"] == 600
    assert len(followed["a2b"].flows) <= 50  # b2a never had data: nothing kept


def test_a_run_judged_from_before_the_counts_origin_asks_from_window_0() -> None:
    """serve's time 0 comes after the shaper's, but a reader from earlier must not ask the
    shaper for windows before its first (it refuses them)."""
    whole, followed = counts(), counts()
    Traffic(5, whole, followed).until(12.0)
    running = RunningFlows(0.0, 42.0)
    records = {d: c.since(0, RATE, MTU) for d, c in followed.items()}
    summary = running.summary(records, 12.5)
    assert min(running.cursors.values()) >= 0
    expected = {d: c.to_dict(RATE, MTU) for d, c in whole.items()}
    assert summary == wan_flows_summary(expected, 0.0, 12.5, 42.0)


def test_the_shapers_flows_op(tmp_path: Path) -> None:
    """`{"op": "flows", "since": {...}}` answers each direction's windows from its cursor on,
    forgets those before, and names bad input."""
    spec = LinkSpec(rate_bps=RATE, limit_bytes=100_000, qdisc="fifo")
    link = FakeLink()
    clock = [100.0]
    shaper = Shaper(
        one_link_config(spec, tmp_path, flow_window_s=WIDTH), link.open_end, now=lambda: clock[0]
    )

    def ask(request: dict) -> dict:
        return shaper._handle(json.dumps(request).encode())

    try:
        a2b = shaper.routes[0]
        for at in (100.01, 100.25, 100.52):  # windows 0, 2 and 5 (under way)
            link.far["a"].send(segment(1))
            clock[0] = at
            shaper.turn([a2b.source_fd], clock[0], early=0.0)
        answer = ask({"op": "flows", "since": {"a2b": 1}})
        assert answer["ok"]
        assert answer["flows"]["a2b"] == {
            "window_s": WIDTH,
            "origin": 100.0,
            "first": 2,
            "flows": [1, 0, 0, 1],
            "share_packets": [26.666, None, None, 26.666],  # 40,000 bytes in 1,500-byte packets
            "drops": [0, 0, 0, 0],
            "final": 5,
        }
        assert answer["flows"]["b2a"]["flows"] == [] and answer["flows"]["b2a"]["first"] == 0
        assert shaper.flow_counts()["wan"]["a2b"]["first"] == 2  # window 0 forgotten
        assert ask({"op": "flows", "since": {"a2b": 5}})["flows"]["a2b"]["flows"] == [1]
        for bad, error in [
            ({"since": {"up": 1}}, "since must map a2b and b2a to windows"),
            ({"since": [1]}, "since must map a2b and b2a to windows"),
            ({"since": {"a2b": -1}}, "a window is a number from 0, not -1"),
            ({"since": {"a2b": 1.5}}, "a window is a number from 0, not 1.5"),
            ({"link": "lan"}, "no link 'lan'; have wan"),
        ]:
            answer = ask({"op": "flows", **bad})
            assert not answer["ok"] and error in answer["error"]
    finally:
        shaper.control.close()
        link.close()


def test_a_shaper_that_counts_no_flows_says_so(tmp_path: Path) -> None:
    link = FakeLink()
    shaper = Shaper(one_link_config(LinkSpec(), tmp_path), link.open_end, now=lambda: 1.0)
    try:
        answer = shaper._handle(b'{"op": "flows"}')
        assert answer == {
            "ok": False,
            "error": "ValueError: this shaper counts no flows (no flow_window_s in its config)",
        }
    finally:
        shaper.control.close()
        link.close()


def test_a_round_whose_count_is_unread_judges_the_windows_taken_in_before() -> None:
    """A lost answer (the control socket timed out) leaves the verdict on the closed windows
    of earlier rounds, starved as they were, and says so: not null, which reads as not judged
    and lets a starved run read valid."""
    followed = counts()
    running = RunningFlows(10.0, 40.0)
    assert not starved_run(running.taken(10.5, "refused"))  # nothing taken in yet: no figures
    dropped = 0
    for window in range(300):
        now = 10.005 + window * WIDTH
        burst = 100 <= window < 120  # two seconds of 12 flows losing packets
        dropped += 2 if burst else 0
        flows = 12 if burst else 2
        packets = [segment(port, data=960) for port in range(flows) for _ in range(5)]
        followed["a2b"].count(packets, now, dropped, RATE, MTU)
        if window == 249:  # the last round read
            records = {
                d: c.since(running.cursors.get(d, 0), RATE, MTU) for d, c in followed.items()
            }
            read = running.summary(records, now + 0.01)
    unread = running.taken(now + 0.01, "timed out")
    assert starved_run(read) and starved_run(unread) and unread["unread"] == "timed out"
    assert unread["starved_s"] == read["starved_s"] == pytest.approx(2.0)
    assert unread["directions"]["a2b"]["windows_active"] == 249  # the closed ones of that round
    assert unread["window_s"] == WIDTH
