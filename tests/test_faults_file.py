"""A faults file: instance faults picked out of a timeline, link events left in order."""

from __future__ import annotations

import asyncio

import pytest

from pddemu.deployment import DeploymentError
from pddemu.faults import FaultError, InstanceFault, inject, split_faults

TEXT = """# a scenario's faults
10    link=down
15    link=up kill=MD0
20s   pause=RLD0,3s   # SIGSTOP for 3 modelled seconds
30    restart=MD0 a2b.rate=1gbit
"""


def test_instance_faults_are_split_from_link_events_keeping_line_numbers() -> None:
    faults, rest = split_faults(TEXT, "f.txt")
    assert faults == (
        InstanceFault(15.0, "kill", "MD0"),
        InstanceFault(20.0, "pause", "RLD0", 3.0),
        InstanceFault(30.0, "restart", "MD0"),
    )
    assert rest.splitlines() == ["", "10 link=down", "15 link=up", "", "30 a2b.rate=1gbit"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5 kill=FE0", r"f.txt:1: 'kill=FE0': name an instance"),
        ("5 kill=MD0,3s", r"f.txt:1: 'kill=MD0,3s': only a pause takes a duration"),
        ("5 pause=MD0,0s", r"f.txt:1: 'pause=MD0,0s': a pause lasts a positive time"),
        ("-1 kill=MD0", r"f.txt:1: a time must be finite and not negative"),
        ("5 kill=MD0\n60 repeat", r"f.txt:2: a timeline with instance faults cannot repeat"),
    ],
)
def test_a_bad_fault_is_one_line_naming_file_line_and_reason(text: str, message: str) -> None:
    with pytest.raises(FaultError, match=message):
        split_faults(text, "f.txt")


def test_a_faults_files_link_events_join_the_wans_on_one_timeline(tmp_path) -> None:
    from netem.spec import SpecError
    from pddemu.timeline import Timeline

    wan = tmp_path / "wan.txt"
    wan.write_text("10 link=down\n12 link=up\n")
    faults = tmp_path / "faults.txt"
    faults.write_text(TEXT)
    timeline = Timeline.load(wan, faults)
    assert [step.at_s for step in timeline.link_events.steps] == [10.0, 12.0, 15.0, 30.0]
    (down, wan_down), *_ = [step.actions for step in timeline.link_events.steps]
    assert down.up is False and wan_down.up is False  # both files' link=down at 10 s
    assert [fault.at_s for fault in timeline.instance_faults] == [15.0, 20.0, 30.0]
    wan.write_text("10 link=down\n12 link=up\n20 repeat\n")
    with pytest.raises(SpecError, match="cannot join a \\[wan\\] schedule that repeats"):
        Timeline.load(wan, faults)


class RefusingDeployment:
    """Stands in for a Deployment: it knows P0 and MD0, refuses to resume one not paused (as
    the real one does: SIGCONT to a running instance could land inside its own clock write),
    and refuses to pause MD0 (a thread that would not stop)."""

    specs = {"P0": None, "MD0": None}

    def __init__(self) -> None:
        self.paused: set[str] = set()
        self.done: list[str] = []

    def pause(self, name: str, when: float) -> None:
        if name == "MD0":
            raise DeploymentError("MD0 not paused: process 7 did not stop within 5 s")
        self.paused.add(name)
        self.done.append(f"pause={name}")

    def resume(self, name: str, when: float) -> None:
        if name not in self.paused:
            raise DeploymentError(f"{name} is not paused")
        self.paused.discard(name)
        self.done.append(f"resume={name}")


def test_a_fault_the_deployment_refuses_is_skipped_with_its_reason_and_the_rest_go_on() -> None:
    faults = (
        InstanceFault(1.0, "resume", "P0"),  # never paused
        InstanceFault(2.0, "pause", "MD0", 1.0),  # does not stop: its resume is refused too
        InstanceFault(4.0, "pause", "P0", 1.0),
    )
    deployment, skipped = RefusingDeployment(), []

    async def no_wait(at: float) -> None:
        return None

    asyncio.run(inject(faults, deployment, lambda: 0.0, no_wait, 0.0, skipped))
    assert deployment.done == ["pause=P0", "resume=P0"]
    assert skipped == [
        "resume=P0 at 1 s: P0 is not paused",
        "pause=MD0 at 2 s: MD0 not paused: process 7 did not stop within 5 s",
        "resume=MD0 at 3 s: MD0 is not paused",
    ]
