"""Timed changes of a run's links: a schedule file, and the clock-free cursor that replays it.

One step a line, `<time> word ...`, '#' comments; `<time>` is seconds from the schedule's
start (a bare number, or a duration such as `1500ms`). Each word is `[LINK.][DIR.]key=value`:
LINK is `wan` (default) or `intra` (the intra-DC path a<->a2), DIR is `a2b` or `b2a` (default:
both directions); keys are the link fields (rate, qdisc, delay, jitter, dist, loss, limit,
reorder) and `link=down|up`, which takes the link out (everything sent on it, queued or in
flight is lost) and brings it back. An optional last line `<time> repeat` starts it over with
that period.

    0     rate=100mbit delay=20ms
    10    a2b.rate=10mbit b2a.loss=gemodel:1%,30%
    20    link=down
    25    link=up intra.link=down
    27    intra.link=up
    60    repeat

The shaper applies each step at its exact time; where time 0 lies is up to whoever starts it
(`netem up --schedule`: when the link is ready; `pddemu emulate`: when the replay starts).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netem.spec import (
    FIELD_PARSERS,
    LinkSpec,
    SpecError,
    changes_from_dict,
    changes_to_dict,
    parse_fields,
)
from netem.units import UnitError, parse_duration

if TYPE_CHECKING:
    from netem.direction import Direction

LINKS = ("wan", "intra")
DIRECTIONS = ("a2b", "b2a")
STATE_KEY = "link"  # link=down|up; in an Action's changes it is {"up": bool}


@dataclass(frozen=True)
class Action:
    """What one step does to one link: LinkSpec fields to replace, and/or its state."""

    link: str  # wan | intra
    direction: str  # a2b | b2a | both
    changes: dict[str, Any]  # LinkSpec fields; "up": bool to take it down or up

    def directions(self) -> tuple[str, ...]:
        return DIRECTIONS if self.direction == "both" else (self.direction,)

    @property
    def spec_changes(self) -> dict[str, Any]:
        return {k: v for k, v in self.changes.items() if k != "up"}

    @property
    def up(self) -> bool | None:
        return self.changes.get("up")


@dataclass(frozen=True)
class Step:
    at_s: float
    actions: tuple[Action, ...]


@dataclass(frozen=True)
class Schedule:
    steps: tuple[Step, ...]
    period_s: float | None = None  # None: the last step holds for ever

    def validate(self) -> Schedule:
        if not self.steps:
            raise SpecError("a schedule needs at least one step")
        last = -1.0
        for step in self.steps:
            check_step(step, last)
            last = step.at_s
        if self.period_s is not None and not (
            math.isfinite(self.period_s) and self.period_s > last
        ):
            raise SpecError(
                f"schedule period {self.period_s:g} s must be finite and come after the last "
                f"step ({last:g} s)"
            )
        return self

    def links(self) -> set[str]:
        """The links the schedule touches (they must be served by the userspace shaper)."""
        return {action.link for step in self.steps for action in step.actions}

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": [
                {
                    "at_s": step.at_s,
                    "actions": [
                        {
                            "link": a.link,
                            "direction": a.direction,
                            "changes": changes_to_dict(a.changes),
                        }
                        for a in step.actions
                    ],
                }
                for step in self.steps
            ],
            "period_s": self.period_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Schedule:
        steps = tuple(
            Step(
                float(step["at_s"]),
                tuple(
                    Action(a["link"], a["direction"], changes_from_dict(a["changes"]))
                    for a in step["actions"]
                ),
            )
            for step in data["steps"]
        )
        return cls(steps, data.get("period_s")).validate()


def check_step(step: Step, previous_at: float) -> None:
    """A step's time follows the previous one's, and its actions are valid link changes."""
    if not (math.isfinite(step.at_s) and step.at_s >= 0):
        raise SpecError(f"schedule times must be finite and not negative, got {step.at_s}")
    if step.at_s <= previous_at:
        raise SpecError(f"schedule times must increase: {step.at_s:g} s after {previous_at:g} s")
    for action in step.actions:
        if action.link not in LINKS:
            raise SpecError(f"unknown link {action.link!r}: use wan or intra")
        if action.direction not in (*DIRECTIONS, "both"):
            raise SpecError(f"unknown direction {action.direction!r}: use a2b or b2a")
        if "mtu" in action.changes:
            raise SpecError("a schedule cannot change the mtu of a running link")
        LinkSpec().with_changes(**action.spec_changes)


class Cursor:
    """Where a running schedule is: which step is due next, at what absolute time.

    Clock-free: `next_time()` says when the next step is due; `due(now)` yields every step due
    at or before `now` with its own due time (a late caller still applies each at its time).
    """

    def __init__(self, schedule: Schedule, start: float) -> None:
        self.schedule = schedule
        self.cycle_start = start
        self.index = 0

    def next_time(self) -> float:
        steps = self.schedule.steps
        if self.index < len(steps):
            return self.cycle_start + steps[self.index].at_s
        period = self.schedule.period_s
        return math.inf if period is None else self.cycle_start + period + steps[0].at_s

    def due(self, now: float) -> Iterator[tuple[float, Step]]:
        while (at := self.next_time()) <= now:
            if self.index >= len(self.schedule.steps):  # a new pass of a repeating schedule
                self.cycle_start += self.schedule.period_s or 0.0
                self.index = 0
            step = self.schedule.steps[self.index]
            self.index += 1
            yield at, step


def apply_step(step: Step, at: float, links: Mapping[str, Mapping[str, Direction]]) -> None:
    """Apply a step at time `at` to the directions it names (everything due before `at` has
    been released by the caller)."""
    for action in step.actions:
        for name in action.directions():
            direction = links[action.link][name]
            if action.spec_changes:
                direction.apply(direction.spec.with_changes(**action.spec_changes), at)
            if action.up is not None:
                direction.set_up(action.up)


def _time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return parse_duration(text)


def _target(key: str) -> tuple[str, str, str]:
    """'intra.a2b.rate' -> ('intra', 'a2b', 'rate'); defaults: wan, both."""
    *scope, field = key.split(".")
    link, direction = "wan", "both"
    for part in scope:
        if part in LINKS and link == "wan" and direction == "both":
            link = part
        elif part in DIRECTIONS and direction == "both":
            direction = part
        else:
            raise UnitError(f"unknown target {key!r}: write [wan.|intra.][a2b.|b2a.]key=value")
    return link, direction, field


def _state(text: str) -> bool:
    if text in ("up", "down"):
        return text == "up"
    raise UnitError(f"link must be up or down, not {text!r}")


def parse_line(words: list[str]) -> tuple[Action, ...]:
    """The actions of one step's words, merged per target (link, direction)."""
    grouped: dict[tuple[str, str], dict[str, Any]] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise UnitError(f"expected key=value, got {word!r}")
        link, direction, field = _target(key)
        changes = grouped.setdefault((link, direction), {})
        if field == STATE_KEY:
            changes["up"] = _state(value)
        elif field in FIELD_PARSERS and field != "mtu":
            changes.update(parse_fields({field: value}))
        else:
            known = ", ".join([*(k for k in FIELD_PARSERS if k != "mtu"), STATE_KEY])
            raise UnitError(f"unknown key {field!r}: use one of {known}")
    return tuple(Action(link, direction, changes) for (link, direction), changes in grouped.items())


def parse_schedule(text: str, source: str = "<schedule>") -> Schedule:
    steps: list[Step] = []
    period: float | None = None
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            if period is not None:
                raise SpecError("nothing may follow the 'repeat' line")
            at = _time(words[0])
            if words[1:] == ["repeat"]:
                period = at
                continue
            if len(words) < 2:
                raise SpecError("a step needs at least one key=value after its time")
            step = Step(at, parse_line(words[1:]))
            check_step(step, steps[-1].at_s if steps else -1.0)
            steps.append(step)
        except (SpecError, ValueError) as exc:
            raise SpecError(f"{source}:{number}: {exc}") from None
    if not steps:
        raise SpecError(f"{source}: schedule has no steps")
    try:
        return Schedule(tuple(steps), period).validate()
    except SpecError as exc:
        raise SpecError(f"{source}: {exc}") from None


def load_schedule(path: str | Path) -> Schedule:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read schedule {path}: {exc.strerror}") from None
    return parse_schedule(text, str(path))
