"""What the kernel's /proc says about CPU time: a process's own (`/proc/<pid>/stat`) and what
the hypervisor took from each CPU (`/proc/stat`'s steal column). One reader of each, shared by
the network benchmark and the emulator's run accounting."""

from __future__ import annotations

import os
import re
from pathlib import Path


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user and system, all threads) process `pid` has used, or None if it is
    gone: fields 14 and 15 of /proc/<pid>/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def steal_s(stat: str | None = None) -> list[float]:
    """Seconds each CPU has been taken away by the hypervisor (`/proc/stat`'s steal column): in
    a virtual machine no priority inside it keeps a process on time through a spell of steal,
    so a measurement records how much there was while it ran."""
    text = stat if stat is not None else Path("/proc/stat").read_text()
    rows = [line.split() for line in text.splitlines() if re.match(r"cpu\d+ ", line)]
    return [int(row[8]) / os.sysconf("SC_CLK_TCK") if len(row) > 8 else 0.0 for row in rows]


def steal_between(before: list[float], after: list[float]) -> list[float] | None:
    """Each CPU's steal seconds between two readings of `steal_s`, rounded to 10 ms (the
    counters' tick); None if the host's CPUs came or went in between (a CPU brought online
    mid-run has no reading before it): the figure is unknown, the run's results are not."""
    if len(before) != len(after):
        return None
    return [round(b - a, 2) for a, b in zip(before, after, strict=True)]
