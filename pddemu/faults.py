"""Faults on the scenario's timeline, at modelled times from the replay's start (the
timeline's time 0, as for `[wan] schedule`'s link events, `pddemu.timeline`).

A faults file (`[faults] schedule`, `pddemu emulate --faults FILE`) is a timeline in netem's
schedule syntax whose lines may also hold instance faults:

    12     kill=MD0             # SIGKILL
    20     pause=RLD0,3s        # SIGSTOP, SIGCONT 3 modelled seconds later
    23     pause=P1             # SIGSTOP until a resume
    25     resume=P1
    30     restart=MD0          # a fresh process (a killed one, or kill and start)
    40     link=down            # the WAN, both directions
    45     link=up a2b.rate=1gbit
    50     loss=gemodel:5%,30%  # Gilbert-Elliott bursts

Its link events join `[wan] schedule`'s on the emulated network; `inject` carries out the
instance faults on a deployment at their times. One naming an instance the system does not
have (RLD0 in naive), or due after the replay ended, is skipped and reported as such.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netem.schedule import Schedule, parse_schedule
from netem.spec import LossModel
from netem.units import UnitError, parse_duration
from pddemu.deployment import DeploymentError

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


def load_faults(path: str | Path) -> tuple[tuple[InstanceFault, ...], Schedule | None]:
    """A faults file's instance faults and its link events (None: it has none)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not a text file"
        raise FaultError(f"cannot read faults {path}: {reason}") from None
    faults, links = split_faults(text, str(path))
    if not any(line.strip() for line in links.splitlines()):
        return faults, None
    try:
        return faults, parse_schedule(links, str(path))
    except ValueError as error:
        raise FaultError(str(error)) from None


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
    skipped: list[str],
) -> None:
    """Carry out `faults` on `deployment` at modelled `start_s + at_s` each (a pause with a
    duration also resumes); what could not be done, and why, is added to `skipped` (also
    those still due when the task is cancelled: the replay ended first)."""
    steps: list[tuple[float, str, str]] = []
    for fault in faults:
        if fault.instance not in deployment.specs:
            skipped.append(f"{fault.action}={fault.instance}: no such instance in this system")
            continue
        steps.append((fault.at_s, fault.action, fault.instance))
        if fault.action == "pause" and fault.duration_s is not None:
            steps.append((fault.at_s + fault.duration_s, "resume", fault.instance))
    steps.sort(key=lambda step: step[0])
    done = 0
    try:
        for at, action, name in steps:
            await sleep_until(start_s + at)
            when = now()
            try:
                if action == "kill":
                    deployment.kill(name, when)
                elif action == "pause":
                    deployment.pause(name, when)
                elif action == "resume":
                    deployment.resume(name, when)
                else:
                    await deployment.restart(name, when)
            except DeploymentError as error:
                skipped.append(f"{action}={name} at {at:g} s: {error}")
            done += 1
    except asyncio.CancelledError:
        skipped += [f"{a}={n} at {t:g} s: the replay ended first" for t, a, n in steps[done:]]
        raise


def timeline_rows(
    links: Schedule | None,
    events: list[dict[str, Any]],
    router: dict[str, Any],
    start_s: float,
) -> list[dict[str, Any]]:
    """Every fault of a replay and its effect, in modelled seconds from the replay's start:
    the link events, what happened to instances (`events`, already from the start), the
    router's changes of view, and its failover actions (one row per instance and action, with
    how many requests)."""
    rows = []
    for step in links.steps if links is not None else ():
        for action in step.actions:
            changes = {k: v for k, v in action.changes.items() if k != "up"}
            state = action.changes.get("up")
            what = ([] if state is None else [f"link={'up' if state else 'down'}"]) + [
                _shown(key, value) for key, value in changes.items()
            ]
            where = action.link + ("" if action.direction == "both" else f".{action.direction}")
            rows.append(_row(step.at_s, where, " ".join(what), "scheduled"))
    for event in events:
        planned = "scheduled" if event["planned"] else "not planned"
        detail = f"{planned}: {event['detail']}" if event.get("detail") else planned
        rows.append(_row(event["at_s"], event["instance"], event["kind"], detail))
    for change in router.get("liveness", []):
        rows.append(
            _row(
                change["at_s"] - start_s,
                change["instance"],
                f"router: {change['state']}",
                change["reason"],
            )
        )
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for action in router.get("failovers", []):
        grouped.setdefault((action["instance"], action["action"]), []).append(action)
    for (instance, action), actions in grouped.items():
        count = len({a["request"] for a in actions})
        first = min(a["at_s"] for a in actions) - start_s
        rows.append(_row(first, instance, f"failover: {action}", f"{count} requests"))
    return sorted(rows, key=lambda row: row["at_s"])


def _shown(key: str, value: Any) -> str:
    """A link change as a faults file writes it (modelled units)."""
    if key == "rate_bps":
        return "rate=unlimited" if value is None else f"rate={value / 1e9:g}gbit"
    if key in ("delay_s", "jitter_s"):
        return f"{key[:-2]}={value * 1e3:g}ms"
    if key == "loss" and isinstance(value, LossModel):
        if value.kind == "gilbert-elliott":
            return f"loss=gemodel:{value.p:.4%},{value.r:.4%} (mean {value.mean_loss:.2%})"
        return f"loss={value.mean_loss:.2%}"
    return f"{key}={value}"


def _row(at_s: float, instance: str, what: str, detail: str) -> dict[str, Any]:
    return {"at_s": at_s, "instance": instance, "what": what, "detail": detail}
