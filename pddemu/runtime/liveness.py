"""Which instances are alive, as the router sees them, judged in modelled time.

Every instance tells the router it is alive every `heartbeat_period_s` (modelled); anything
else it sends counts as well. The router's view of an instance has three states:

- up: heard from within `suspect_after_s`;
- suspect: silent longer than that: out of routing for new requests (reversible: it is back the
  moment it is heard from again);
- down: its connection to the router closed (the process died: the kernel closes its sockets,
  so a kill is known without any timing), or silent longer than `down_after_s`: its requests
  are failed over.

Silence is only held against an instance when the router could have heard it: the check must
run on time (a router woken late, its own loop having been busy, judges nobody that round),
and some other instance must have been heard meanwhile (a host too loaded to run anyone's
loop blames no one). A paused process is therefore told from a slow machine by construction,
not by a threshold tuned to this host.

An instance not heard from yet is not judged while the deployment starts (it may still be
starting). A router restarted into a running deployment has no such excuse for its peers:
they were all running before it, so one it has not heard from counts as silent since the
router's own start (`unheard_since`), or a peer paused or cut off then would stay routable for
good.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

UP, SUSPECT, DOWN = "up", "suspect", "down"


@dataclass
class Change:
    """A state change of one instance, at a modelled time."""

    instance: str
    state: str  # up | suspect | down
    at_s: float
    reason: str


@dataclass
class Liveness:
    names: list[str]
    suspect_after_s: float
    down_after_s: float
    last: dict[str, float] = field(default_factory=dict)  # modelled time last heard from
    state: dict[str, str] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)  # down because its connection ended, not silent
    # modelled time from which an instance not heard from yet counts as silent (a restarted
    # router's start); None: not judged until heard from (every instance may still be starting)
    unheard_since: float | None = None
    # checks run, those woken late (judging nobody), and instances left unjudged by a check
    # because every other instance was silent too
    checks: dict[str, int] = field(default_factory=lambda: {"run": 0, "late": 0, "all_silent": 0})

    def __post_init__(self) -> None:
        if not 0 < self.suspect_after_s <= self.down_after_s:
            raise ValueError("need 0 < suspect_after_s <= down_after_s")
        for name in self.names:
            self.state.setdefault(name, UP)

    def heard(self, name: str, now: float) -> Change | None:
        """Anything from `name`: it is alive (again, if it was not)."""
        if name not in self.state:
            return None
        self.last[name] = max(self.last.get(name, now), now)
        self.gone.discard(name)
        if self.state[name] == UP:
            return None
        self.state[name] = UP
        return Change(name, UP, now, "heard from again")

    def lost(self, name: str, now: float, reason: str) -> Change | None:
        """Its connection closed: down at once."""
        if name in self.state:
            self.gone.add(name)
        if self.state.get(name, DOWN) == DOWN:
            return None
        self.state[name] = DOWN
        return Change(name, DOWN, now, reason)

    def check(self, now: float, on_time: bool) -> list[Change]:
        """Judge silences at `now`; `on_time` says the check itself was not late."""
        self.checks["run"] += 1
        if not on_time:
            self.checks["late"] += 1
            return []
        changes = []
        for name in self.names:
            heard_at = self.silent_since(name)
            if heard_at is None or self.state[name] == DOWN:
                continue
            silent = now - heard_at
            others = [
                since
                for o in self.names
                if o != name
                and self.state[o] != DOWN
                and (since := self.silent_since(o)) is not None
            ]
            if others and max(others) < now - self.suspect_after_s:
                self.checks["all_silent"] += 1
                continue
            if silent > self.down_after_s:
                self.state[name] = DOWN
                changes.append(Change(name, DOWN, now, f"silent for {silent:.2f} s"))
            elif silent > self.suspect_after_s and self.state[name] == UP:
                self.state[name] = SUSPECT
                changes.append(Change(name, SUSPECT, now, f"silent for {silent:.2f} s"))
        return changes

    def silent_since(self, name: str) -> float | None:
        """The modelled time from which `name`'s silence counts (None: it is not judged)."""
        return self.last.get(name, self.unheard_since)

    def view(self, now: float) -> dict[str, Any]:
        """The router's view at `now`: each instance's state and the modelled time it was last
        heard from (None: never, so not judged), and how many checks judged nobody and why."""
        return {
            "now_s": now,
            "instances": {
                name: {"state": self.state[name], "heard_at_s": self.last.get(name)}
                for name in self.names
            },
            "checks": dict(self.checks),
        }

    def routable(self, name: str) -> bool:
        return self.state.get(name) == UP

    def down(self, name: str) -> bool:
        return self.state.get(name) == DOWN
