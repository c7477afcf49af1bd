"""The scenario's timeline: what happens at which modelled time of a replay.

Time 0 is when the replay starts (the instant its arrival times count from), not when the
network or the shaper came up, so the same file means the same thing for every system of a
run and at any `time_scale`. The timeline holds link events, read from `[wan] schedule` in
netem's schedule syntax (`netem.schedule`: `<seconds> [wan.|intra.][a2b.|b2a.]key=value`,
`link=down|up`, `<seconds> repeat`) with modelled times and modelled quantities (a rate of the
modelled WAN, modelled delays), and the faults file's (`[faults] schedule`, `pddemu emulate
--faults`): its link events join the WAN's, its instance faults (kill, pause, resume, restart,
`pddemu.faults`) are carried out on the deployment at their times.

The emulated network needs them in its own units: `link_schedule(scale)` divides times, delays
and jitters by the time scale and scales rates as the scale model scales the link itself
(docs/hardware.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from netem.schedule import Action, Schedule, Step, load_schedule
from netem.spec import SpecError
from pddemu.faults import InstanceFault, load_faults
from pddemu.scale import ScaleModel


@dataclass(frozen=True)
class Timeline:
    link_events: Schedule | None = None  # modelled seconds from the replay's start
    instance_faults: tuple[InstanceFault, ...] = ()  # likewise (pddemu.faults)

    @classmethod
    def load(cls, schedule: str | Path | None, faults: str | Path | None = None) -> Timeline:
        """The timeline of a scenario whose `[wan] schedule` is `schedule` and `[faults]
        schedule` is `faults` (None: none): the link events of both, merged, and the faults
        file's instance faults."""
        events = load_schedule(schedule) if schedule else None
        instance_faults: tuple[InstanceFault, ...] = ()
        if faults:
            instance_faults, fault_links = load_faults(faults)
            events = _merged(events, fault_links, str(faults))
        for step in events.steps if events is not None else ():
            for action in step.actions:
                if "limit_bytes" in action.changes:
                    raise SpecError(
                        f"{schedule}: at {step.at_s:g} s: a scenario's schedule cannot set the "
                        "queue limit (the emulated queue is sized from the link)"
                    )
        return cls(events, instance_faults)

    def link_schedule(self, scale: ScaleModel) -> Schedule | None:
        """The link events as the emulated network's schedule (wall seconds, emulated units)."""
        if self.link_events is None:
            return None
        steps = tuple(
            Step(
                scale.modelled_to_wall(step.at_s),
                tuple(replace(a, changes=_emulated(a.changes, scale)) for a in step.actions),
            )
            for step in self.link_events.steps
        )
        period = self.link_events.period_s
        return Schedule(
            steps, scale.modelled_to_wall(period) if period is not None else None
        ).validate()

    def links(self) -> set[str]:
        return self.link_events.links() if self.link_events is not None else set()


def _merged(first: Schedule | None, second: Schedule | None, source: str) -> Schedule | None:
    """Two schedules as one (steps at the same time joined); a repeating one stands alone."""
    if first is None or second is None:
        return first or second
    if first.period_s is not None or second.period_s is not None:
        raise SpecError(f"{source}: link events cannot join a [wan] schedule that repeats")
    actions: dict[float, list[Action]] = {}
    for step in (*first.steps, *second.steps):
        actions.setdefault(step.at_s, []).extend(step.actions)
    return Schedule(tuple(Step(at, tuple(actions[at])) for at in sorted(actions))).validate()


def _emulated(changes: dict[str, Any], scale: ScaleModel) -> dict[str, Any]:
    out = dict(changes)
    if out.get("rate_bps"):  # None (unlimited) and 0 (stalled) are the same at any scale
        out["rate_bps"] = out["rate_bps"] * scale.byte_scale * scale.time_scale
    for key in ("delay_s", "jitter_s"):
        if key in out:
            out[key] = scale.modelled_to_wall(out[key])
    return out
