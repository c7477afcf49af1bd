"""The scenario's timeline: what happens at which modelled time of a replay.

Time 0 is when the replay starts (the instant its arrival times count from), not when the
network or the shaper came up, so the same file means the same thing for every system of a
run and at any `time_scale`. Today the timeline holds link events, read from `[wan] schedule`
in netem's schedule syntax (`netem.schedule`: `<seconds> [wan.|intra.][a2b.|b2a.]key=value`,
`link=down|up`, `<seconds> repeat`) with modelled times and modelled quantities (a rate of the
modelled WAN, modelled delays). Other kinds of events (instance faults) join it with the same
time origin.

The emulated network needs them in its own units: `link_schedule(scale)` divides times, delays
and jitters by the time scale and scales rates as the scale model scales the link itself
(docs/hardware.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from netem.schedule import Schedule, Step, load_schedule
from netem.spec import SpecError
from pddemu.scale import ScaleModel


@dataclass(frozen=True)
class Timeline:
    link_events: Schedule | None = None  # modelled seconds from the replay's start

    @classmethod
    def load(cls, schedule: str | Path | None) -> Timeline:
        """The timeline of a scenario whose `[wan] schedule` is `schedule` (None: empty)."""
        if not schedule:
            return cls()
        events = load_schedule(schedule)
        for step in events.steps:
            for action in step.actions:
                if "limit_bytes" in action.changes:
                    raise SpecError(
                        f"{schedule}: at {step.at_s:g} s: a scenario's schedule cannot set the "
                        "queue limit (the emulated queue is sized from the link)"
                    )
        return cls(events)

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


def _emulated(changes: dict[str, Any], scale: ScaleModel) -> dict[str, Any]:
    out = dict(changes)
    if out.get("rate_bps"):  # None (unlimited) and 0 (stalled) are the same at any scale
        out["rate_bps"] = out["rate_bps"] * scale.byte_scale * scale.time_scale
    for key in ("delay_s", "jitter_s"):
        if key in out:
            out[key] = scale.modelled_to_wall(out[key])
    return out
