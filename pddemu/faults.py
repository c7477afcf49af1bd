"""Instance faults on the scenario's timeline: kill, pause (for a while), resume and restart,
each at a modelled time from the replay's start (the timeline's time 0, as for link events).

In a faults file or `[faults] events`, an instance fault is a word of a timeline line:

    12     kill=MD0
    20     pause=RLD0,3s        # SIGSTOP, SIGCONT 3 modelled seconds later
    30     restart=MD0
    40     pause=P1  45 resume=P1   (two lines: `40 pause=P1` and `45 resume=P1`)

`inject` carries them out on a deployment at their times; an event naming an instance the
system does not have (RLD0 in naive) is skipped and reported as such.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from netem.units import UnitError, parse_duration

ACTIONS = ("kill", "pause", "resume", "restart")
INSTANCE = re.compile(r"(P|RLD|MD|D)[0-9]+")  # the frontend is the run's own, not a target


class FaultError(ValueError):
    """An instance fault that cannot be understood."""


@dataclass(frozen=True)
class InstanceFault:
    at_s: float  # modelled seconds from the replay's start
    action: str  # kill | pause | resume | restart
    instance: str  # e.g. "MD0"
    duration_s: float | None = None  # a pause's length (modelled), None: until a resume

    def to_dict(self) -> dict[str, Any]:
        return {
            "at_s": self.at_s,
            "action": self.action,
            "instance": self.instance,
            "duration_s": self.duration_s,
        }


def is_instance_word(word: str) -> bool:
    return word.partition("=")[0] in ACTIONS


def parse_instance_word(at_s: float, word: str) -> InstanceFault:
    """`kill=MD0`, `pause=MD0,3s`, `resume=MD0`, `restart=MD0`."""
    action, _, value = word.partition("=")
    name, _, duration = value.partition(",")
    if not INSTANCE.fullmatch(name):
        raise FaultError(f"{word!r}: name an instance (P, RLD, MD or D and its number: MD0)")
    length = None
    if duration:
        if action != "pause":
            raise FaultError(f"{word!r}: only a pause takes a duration")
        try:
            length = parse_duration(duration)
        except UnitError as error:
            raise FaultError(f"{word!r}: {error}") from None
        if not (math.isfinite(length) and length > 0):
            raise FaultError(f"{word!r}: a pause lasts a positive time")
    return InstanceFault(at_s, action, name, length)


def split_faults(text: str, source: str) -> tuple[tuple[InstanceFault, ...], str]:
    """A faults file's instance faults, and the rest of it (its link events, in netem's
    schedule syntax) as text whose lines keep their numbers. Instance faults happen once: a
    file holding any cannot `repeat`."""
    faults: list[InstanceFault] = []
    rest: list[str] = []
    repeats = False
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        links = [word for word in words[1:] if not is_instance_word(word)]
        repeats = repeats or links == ["repeat"]
        try:
            for word in words[1:]:
                if is_instance_word(word):
                    faults.append(parse_instance_word(_time(words[0]), word))
            if faults and repeats:
                raise FaultError("a timeline with instance faults cannot repeat")
        except (FaultError, UnitError) as error:
            raise FaultError(f"{source}:{number}: {error}") from None
        rest.append(" ".join([words[0], *links]) if links else "")
    return tuple(faults), "\n".join(rest)


def _time(text: str) -> float:
    try:
        at = float(text)
    except ValueError:
        at = parse_duration(text)
    if not (math.isfinite(at) and at >= 0):
        raise FaultError(f"a time must be finite and not negative, got {text!r}")
    return at


async def inject(
    faults: tuple[InstanceFault, ...],
    deployment: Any,
    now: Callable[[], float],
    sleep_until: Callable[[float], Any],
    start_s: float,
) -> list[str]:
    """Carry out `faults` on `deployment` at modelled `start_s + at_s` each (a pause with a
    duration also resumes); returns what was skipped and why."""
    steps: list[tuple[float, str, str]] = []
    skipped: list[str] = []
    for fault in faults:
        if fault.instance not in deployment.specs:
            skipped.append(f"{fault.action}={fault.instance}: no such instance in this system")
            continue
        steps.append((fault.at_s, fault.action, fault.instance))
        if fault.action == "pause" and fault.duration_s is not None:
            steps.append((fault.at_s + fault.duration_s, "resume", fault.instance))
    for at, action, name in sorted(steps, key=lambda step: step[0]):
        await sleep_until(start_s + at)
        when = now()
        if action == "kill":
            deployment.kill(name, when)
        elif action == "pause":
            deployment.pause(name, when)
        elif action == "resume":
            deployment.resume(name, when)
        else:
            await deployment.restart(name, when)
    return skipped
