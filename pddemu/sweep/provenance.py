"""What a point ran on: the code (commit, modified or not), the pddemu version, the host and
its load average before and after, recorded per point where the point runs.

A sweep can be resumed on other code: sweep.json's sweep-level `code` is the latest run's, so
only the points' own records say which code made which point. `code_versions` gathers them
and `mixed_code_note` says so where a figure or table mixes points of different code.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

UNRECORDED = "unrecorded"  # a point finished before points recorded their own code
SHORT_COMMIT = 10


def code_version() -> dict[str, Any] | None:
    """The code of the pddemu checkout running here (see `checkout_version`)."""
    return checkout_version(Path(__file__).resolve().parent)


def checkout_version(here: Path) -> dict[str, Any] | None:
    """The commit of the git checkout holding `here`, whether tracked files differ from it
    and, if they do, a digest of the difference (two modified trees on one commit are not the
    same code); None outside git. The difference is git's plumbing patch (`diff-index`: binary
    changes in full, none of the user's diff settings such as prefixes, colour, algorithm or
    external tools), so one change gives one digest on any machine and any two changes differ;
    `dirty` is None when git could not say."""
    try:
        commit = _git(here, "rev-parse", "HEAD")
        if commit is None:
            return None
        diff = _git(here, "diff-index", "-p", "--binary", "HEAD")
    except OSError:
        return None
    if diff is None:
        return {"commit": commit.decode().strip(), "dirty": None}
    version: dict[str, Any] = {"commit": commit.decode().strip(), "dirty": bool(diff.strip())}
    if version["dirty"]:
        version["diff_sha256"] = hashlib.sha256(diff).hexdigest()
    return version


def _git(where: Path, *args: str) -> bytes | None:
    ran = subprocess.run(["git", "-C", str(where), *args], capture_output=True)
    return ran.stdout if ran.returncode == 0 else None


def pddemu_version() -> str | None:
    try:
        return metadata.version("pddemu")
    except metadata.PackageNotFoundError:
        return None


def host_load() -> list[float]:
    """The load average over 1, 5 and 15 minutes."""
    return [round(value, 2) for value in os.getloadavg()]


def before_point() -> dict[str, Any]:
    """Recorded as a point starts: the code its `pddemu emulate` imports, and the load."""
    return {
        "code": code_version(),
        "pddemu_version": pddemu_version(),
        "host": socket.gethostname(),
        "cpus": len(os.sched_getaffinity(0)),
        "load_before": host_load(),
    }


def after_point(before: dict[str, Any]) -> dict[str, Any]:
    return {**before, "load_after": host_load()}


def code_label(code: dict[str, Any] | None) -> str:
    """A commit as tables print it: short, with its modification's digest when modified."""
    if not code or not code.get("commit"):
        return "unknown"
    label = code["commit"][:SHORT_COMMIT]
    if code.get("dirty", False) is None:
        label += "+modified:unknown"  # git could not compare the checkout with its commit
    elif code.get("dirty"):
        label += f"+modified:{(code.get('diff_sha256') or '?')[:8]}"
    return label


def point_code(entry: dict[str, Any]) -> str:
    """The code label of a sweep.json entry's point, or UNRECORDED."""
    provenance = entry["point"].get("provenance")
    return UNRECORDED if provenance is None else code_label(provenance.get("code"))


def code_versions(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The code versions the finished points ran on, each with its number of points, in the
    order they first appear."""
    counts = Counter(point_code(e) for e in entries if e["point"]["status"] == "done")
    return [{"code": label, "points": n} for label, n in counts.items()]


def mixed_code_note(entries: list[dict[str, Any]]) -> str | None:
    """A sentence when the finished points among `entries` ran on more than one code version
    (or some did not record theirs); None when they all ran on one."""
    versions = code_versions(entries)
    if len(versions) < 2:
        return None
    parts = ", ".join(
        f"{v['code']} ({v['points']} point{'s' if v['points'] != 1 else ''})" for v in versions
    )
    return f"points ran on {len(versions)} code versions: {parts}"
