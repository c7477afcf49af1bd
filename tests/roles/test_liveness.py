"""The router's view of who is alive, on made-up modelled times: silence makes an instance
suspect then down, a closed connection makes it down at once, and a late check or a silent
host blames no one."""

from __future__ import annotations

import pytest

from pddemu.runtime.liveness import DOWN, SUSPECT, UP, Liveness


def view() -> Liveness:
    return Liveness(["P0", "MD0", "MD1"], suspect_after_s=0.5, down_after_s=2.0)


def beat(live: Liveness, names: list[str], start: float, end: float, period: float = 0.1) -> None:
    for i in range(round((end - start) / period) + 1):
        for name in names:
            live.heard(name, start + i * period)


def test_a_silent_instance_is_suspect_then_down_while_the_others_are_heard() -> None:
    live = view()
    beat(live, ["P0", "MD0", "MD1"], 0.0, 1.0)
    beat(live, ["P0", "MD1"], 1.1, 4.0)  # MD0 paused after 1.0
    states = {}
    for step in range(11, 41):
        now = step / 10
        for change in live.check(now, on_time=True):
            states.setdefault(change.state, now)
    assert states == {SUSPECT: pytest.approx(1.6), DOWN: pytest.approx(3.1)}
    assert not live.routable("MD0") and live.routable("MD1") and live.down("MD0")
    change = live.heard("MD0", 4.2)  # resumed
    assert change is not None and change.state == UP and live.routable("MD0")


def test_a_closed_connection_is_down_at_once_and_only_once() -> None:
    live = view()
    change = live.lost("MD1", 0.3, "connection closed")
    assert change is not None and change.state == DOWN and change.at_s == 0.3
    assert live.lost("MD1", 0.4, "again") is None


def test_a_late_check_judges_nobody() -> None:
    live = view()
    beat(live, ["P0", "MD0", "MD1"], 0.0, 1.0)
    assert live.check(5.0, on_time=False) == []
    assert all(live.routable(n) for n in ("P0", "MD0", "MD1"))


def test_when_nobody_was_heard_nobody_is_blamed() -> None:
    live = view()
    beat(live, ["P0", "MD0", "MD1"], 0.0, 1.0)
    assert live.check(4.0, on_time=True) == []  # the whole host stalled, not one instance
    live.heard("P0", 4.05)
    assert {c.instance for c in live.check(4.1, on_time=True)} == {"MD0", "MD1"}


def test_an_instance_not_heard_from_yet_is_not_judged() -> None:
    live = view()
    beat(live, ["P0", "MD0"], 0.0, 5.0)
    assert live.check(5.0, on_time=True) == [] and live.routable("MD1")


def test_suspect_must_not_exceed_down() -> None:
    with pytest.raises(ValueError, match="suspect_after_s"):
        Liveness(["P0"], suspect_after_s=3.0, down_after_s=2.0)


def test_gone_is_a_closed_connection_not_a_silence_and_ends_when_heard() -> None:
    live = view()
    beat(live, ["P0", "MD0", "MD1"], 0.0, 1.0)
    beat(live, ["P0", "MD1"], 1.1, 3.5)  # MD0 silent (a partition, a pause)
    for step in range(11, 36):
        live.check(step / 10, on_time=True)
    assert live.down("MD0") and "MD0" not in live.gone
    live.lost("MD1", 3.5, "its connection closed")
    assert live.gone == {"MD1"}
    live.heard("MD1", 4.0)  # restarted
    assert live.gone == set() and live.routable("MD1")


def test_the_view_says_who_was_never_heard_and_why_checks_judged_nobody() -> None:
    live = view()
    beat(live, ["P0", "MD1"], 0.0, 1.0)  # MD0 never heard: not judged, as the view shows
    live.check(1.0, on_time=False)
    live.check(3.0, on_time=True)  # everyone silent: the host stalled
    seen = live.view(3.0)
    assert seen["now_s"] == 3.0
    assert seen["instances"]["MD0"] == {"state": UP, "heard_at_s": None}
    assert seen["instances"]["P0"] == {"state": UP, "heard_at_s": pytest.approx(1.0)}
    assert seen["checks"] == {"run": 2, "late": 1, "all_silent": 2}


def test_a_restarted_router_judges_an_instance_it_never_heard_from_its_own_start() -> None:
    live = view()
    live.unheard_since = 1.0  # restarted at 1.0: P0 and MD1 heard, MD0 (paused) never
    beat(live, ["P0", "MD1"], 1.1, 4.0)
    states = {}
    for step in range(11, 41):
        for change in live.check(step / 10, on_time=True):
            states.setdefault((change.instance, change.state), step / 10)
    assert states == {("MD0", SUSPECT): pytest.approx(1.6), ("MD0", DOWN): pytest.approx(3.1)}
    assert live.view(4.0)["instances"]["MD0"]["heard_at_s"] is None  # still never heard


def test_a_restarted_router_that_hears_nobody_blames_nobody() -> None:
    live = view()
    live.unheard_since = 1.0
    assert live.check(4.0, on_time=True) == []  # the host stalled since the restart
    live.heard("P0", 4.05)
    assert {c.instance for c in live.check(4.1, on_time=True)} == {"MD0", "MD1"}
