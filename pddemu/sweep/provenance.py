"""What a point ran on: the code (commit, modified or not), the pddemu version, the host and
its load average before and after, recorded per point where the point runs.

A sweep can be resumed on other code: sweep.json's sweep-level `code` is the latest run's, so
only the points' own records say which code made which point. `code_versions` gathers them
and `mixed_code_note` says so where a figure or table mixes points of different code;
`stray_commits` names the recorded commits the checkout's history does not hold.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
from collections import Counter
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

UNRECORDED = "unrecorded"  # no code recorded: a point from before points did, or an older Ray node
SHORT_COMMIT = 10
# What a point's emulation reads from the checkout: two commits with these alike ran the same code
CODE_PATHS = ("pddemu", "netem", "configs", "traces", "pyproject.toml")


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


def _git(where: Path, *args: str, stdin: bytes | None = None) -> bytes | None:
    ran = subprocess.run(["git", "-C", str(where), *args], input=stdin, capture_output=True)
    return ran.stdout if ran.returncode == 0 else None


def stray_commits(commits: Iterable[str], here: Path | None = None) -> list[str]:
    """The recorded `commits` the history of the checkout holding `here` (this pddemu's by
    default) does not reach, each as "label (why)": not an object of the repository, or a
    commit off its history (a sweep run from a branch records the commit before its rebase),
    then naming the commit of the history with the same code (CODE_PATHS), where there is one.
    Nothing outside git."""
    repo = here or Path(__file__).resolve().parent
    if _git(repo, "rev-parse", "HEAD") is None:
        return []
    notes = []
    for commit in dict.fromkeys(commits):
        if _git(repo, "merge-base", "--is-ancestor", commit, "HEAD") is not None:
            continue
        label = commit[:SHORT_COMMIT]
        if _git(repo, "cat-file", "-e", f"{commit}^{{commit}}") is None:
            notes.append(f"{label} (not a commit of this repository)")
            continue
        same = _same_code_in_history(repo, commit)
        notes.append(
            f"{label} (not in this history; "
            + (f"the same code as {same[:SHORT_COMMIT]})" if same else "its code is in none of it)")
        )
    return notes


def _same_code_in_history(repo: Path, commit: str) -> str | None:
    """The latest commit HEAD reaches that brought CODE_PATHS to their state in `commit`."""
    listed = _git(repo, "rev-list", "HEAD", "--", *(f":(top){path}" for path in CODE_PATHS))
    candidates = listed.decode().split() if listed else []
    objects = [f"{c}:{path}" for c in [commit, *candidates] for path in CODE_PATHS]
    found = _git(
        repo,
        "cat-file",
        "--batch-check=%(objectname)",
        stdin="".join(f"{o}\n" for o in objects).encode(),
    )
    if found is None:
        return None
    names = ["-" if n.endswith(" missing") else n for n in found.decode().splitlines()]
    width = len(CODE_PATHS)
    trees = [tuple(names[i : i + width]) for i in range(0, len(names), width)]
    return next(
        (c for c, tree in zip(candidates, trees[1:], strict=True) if tree == trees[0]), None
    )


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
