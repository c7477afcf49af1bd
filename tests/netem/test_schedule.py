"""Schedules: the file format, the cursor on a fake clock, and steps applied to directions."""

from __future__ import annotations

import math

import pytest

from netem.direction import Direction
from netem.schedule import Cursor, Schedule, apply_step, load_schedule, parse_schedule
from netem.spec import LinkSpec, LossModel, SpecError


def test_schedule_file(tmp_path) -> None:
    path = tmp_path / "wan.schedule"
    path.write_text(
        "# drop then recover\n0 rate=100mbit delay=20ms\n10 rate=10mbit\n15 rate=100mbit\n"
        "20 link=down\n20.5 link=up qdisc=fq\n30 repeat\n"
    )
    schedule = load_schedule(path)
    assert [s.at_s for s in schedule.steps] == [0, 10, 15, 20, 20.5]
    (action,) = schedule.steps[1].actions
    assert (action.link, action.direction, action.changes) == ("wan", "both", {"rate_bps": 10e6})
    assert schedule.steps[3].actions[0].up is False
    assert schedule.steps[4].actions[0].changes == {"up": True, "qdisc": "fq"}
    assert schedule.period_s == 30 and schedule.links() == {"wan"}


def test_targets_name_a_link_and_a_direction() -> None:
    schedule = parse_schedule(
        "1500ms a2b.rate=10mbit b2a.loss=gemodel:1%,30% intra.link=down wan.b2a.delay=5ms\n"
    )
    step = schedule.steps[0]
    assert step.at_s == 1.5
    actions = {(a.link, a.direction): a.changes for a in step.actions}
    assert actions[("wan", "a2b")] == {"rate_bps": 10e6}
    assert actions[("wan", "b2a")]["loss"] == LossModel("gilbert-elliott", 0.01, 0.3)
    assert actions[("wan", "b2a")]["delay_s"] == 0.005  # merged with the line's other b2a word
    assert actions[("intra", "both")] == {"up": False}
    assert schedule.links() == {"wan", "intra"}


def test_schedule_survives_its_json_form() -> None:
    schedule = parse_schedule("0 loss=gemodel:1%,10% rate=0\n2 a2b.link=down\n3 repeat\n")
    assert Schedule.from_dict(schedule.to_dict()) == schedule


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("0 rate=1mbit\n0 rate=2mbit\n", "must increase"),
        ("nan rate=1mbit\n", "finite"),
        ("-1 rate=1mbit\n", "not negative"),
        ("0 rate=1mbit\ninf repeat\n", "finite"),
        ("0 rate=fast\n", ":1: rate"),
        ("zero rate=1mbit\n", ":1:"),
        ("0 rate=1mbit\n5 repeat\n6 rate=1mbit\n", "nothing may follow"),
        ("# empty\n", "no steps"),
        ("0 link=sideways\n", "up or down"),
        ("0 mtu=9000\n", "unknown key 'mtu'"),
        ("0 c2d.rate=1mbit\n", "unknown target"),
        ("0 qdisc=red\n", "unknown qdisc"),
        ("5\n", "at least one key=value"),
    ],
)
def test_bad_schedules(tmp_path, text: str, needle: str) -> None:
    path = tmp_path / "bad.schedule"
    path.write_text(text)
    with pytest.raises(SpecError, match=needle):
        load_schedule(path)


def test_cursor_yields_each_step_at_its_own_time_and_repeats() -> None:
    cursor = Cursor(parse_schedule("0 delay=10ms\n1 delay=50ms\n2 repeat\n"), start=100.0)
    assert cursor.next_time() == 100.0
    assert [at for at, _ in cursor.due(103.5)] == [100.0, 101.0, 102.0, 103.0]
    assert cursor.next_time() == 104.0


def test_a_schedule_without_repeat_holds_its_last_step() -> None:
    cursor = Cursor(parse_schedule("1 rate=1mbit\n"), start=0.0)
    assert len(list(cursor.due(50.0))) == 1 and cursor.next_time() == math.inf


def test_an_outage_loses_what_is_sent_or_in_flight_during_it() -> None:
    direction = Direction(LinkSpec(delay_s=0.020), seed=0)
    sent = [i * 0.01 for i in range(1000)]  # 10 s of a packet every 10 ms
    schedule = parse_schedule("2 a2b.link=down\n7 a2b.link=up\n")
    cursor = Cursor(schedule, 0.0)
    delivered = []
    for at in [*sent, 20.0]:
        for due, step in cursor.due(at):
            delivered += direction.release(due)
            apply_step(step, due, {"wan": {"a2b": direction}})
        delivered += direction.release(at)
        if at < 20.0:
            direction.push(round(at * 100).to_bytes(4, "big"), at)
    got = {int.from_bytes(p, "big") for p, _ in delivered}
    lost = sorted(set(range(1000)) - got)
    # in flight at 2 s (sent after 1.98 s) and sent before 7 s are lost
    assert lost == list(range(lost[0], 700)) and lost[0] in (198, 199)


def test_a_rate_step_applies_after_what_was_due_before_it() -> None:
    direction = Direction(LinkSpec(rate_bps=1e6), seed=0)
    cursor = Cursor(parse_schedule("0.005 rate=2mbit\n"), 0.0)
    direction.push(b"x" * 1250, 0.0)  # 10 ms at 1 Mbit/s; half sent when the rate doubles
    out = []
    for due, step in cursor.due(1.0):
        out += direction.release(due)
        apply_step(step, due, {"wan": {"a2b": direction, "b2a": direction}})
    out += direction.release(1.0)
    assert [t for _, t in out] == pytest.approx([0.0075])
