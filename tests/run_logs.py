"""What a failed emulation test leaves behind: CI keeps only its console output, so the failure
report itself names a kept copy of each run directory the test used and shows, for every role's
log, its warnings and errors and its last lines.

A run directory is recorded (`record_run`) when an emulation starts to use it, and belongs to
what was being set up or run then: a test, or a fixture of a wider scope (a module's emulation,
its runs shared by its tests). A test's runs are its own and those of the fixtures it uses. The
copy is made when the test fails, before a later test can add to the same logs. The hooks are
pytest's; the project's conftest takes them in.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

KEEP_ENV = "PDDEMU_KEEP_FAILED_RUNS"  # where kept copies go (default: the temp dir's)
SECTION = "emulation run logs"
TAIL_LINES = 12
FLAGGED_LINES = 10  # the last warnings and errors of a log, beyond its tail
LINE_CHARS = 300
# a role's log line: "<date> <time> <instance> <LEVEL> <message>" (pddemu.roles.__main__)
FLAGGED = re.compile(r"^\S+ \S+ \S+ (WARNING|ERROR|CRITICAL) |^Traceback ")


@dataclass(frozen=True)
class _Run:
    path: Path
    test: str  # the test being set up or run when it was recorded, if no fixture was
    fixture: tuple[str, str] | None  # else the fixture's name and the node of its scope


_runs: list[_Run] = []
_test = ""  # the test being set up or run
_fixtures: list[tuple[str, str]] = []  # the fixtures being set up, innermost last
_reported = pytest.StashKey[bool]()  # its failure already carries the logs


def record_run(path: Path) -> None:
    """An emulation uses `path` as its run directory (logs/<system>/<instance>.log|.err)."""
    _runs.append(_Run(Path(path), _test, _fixtures[-1] if _fixtures else None))


def runs_of(nodeid: str, fixtures: list[str]) -> list[Path]:
    """The run directories of test `nodeid`, which uses `fixtures`: its own and those its
    fixtures recorded (in their scope: a module fixture set up again in another module records
    that module's); outermost only, a run inside another being in its copy."""

    def ours(run: _Run) -> bool:
        if run.fixture is None:
            return run.test == nodeid
        name, scope = run.fixture
        return name in fixtures and nodeid.startswith(scope)

    paths = list(dict.fromkeys(run.path for run in _runs if ours(run)))
    return [p for p in paths if not any(p != q and p.is_relative_to(q) for q in paths)]


def keep(paths: list[Path], nodeid: str) -> Path:
    """Copy the run directories somewhere nothing later overwrites or rotates away."""
    root = Path(os.environ.get(KEEP_ENV) or Path(tempfile.gettempdir()) / "pddemu-failed-runs")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid)[-120:]
    kept = root / f"{time.strftime('%Y%m%dT%H%M%S')}-{name}"
    for i, path in enumerate(paths):
        if path.is_dir():
            shutil.copytree(path, kept / f"{i}-{path.name}", dirs_exist_ok=True)
    return kept


def log_tails(path: Path) -> str:
    """Every role log under `path`: its flagged lines (warnings, errors, tracebacks) and its
    last lines; an instance's stderr (.err): its last lines."""
    parts = []
    for log in sorted(path.rglob("*.log")) + sorted(path.rglob("*.err")):
        lines = log.read_text(errors="replace").splitlines()
        if not lines:
            continue
        header = f"--- {log.relative_to(path)} ({len(lines)} lines)"
        body = []
        if log.suffix == ".log":
            flagged = [line for line in lines if FLAGGED.match(line)]
            if flagged:
                body.append(f"  {len(flagged)} warnings/errors, the last {FLAGGED_LINES}:")
                body += [f"  ! {line[:LINE_CHARS]}" for line in flagged[-FLAGGED_LINES:]]
        body.append(f"  last {min(TAIL_LINES, len(lines))} lines:")
        body += [f"  | {line[:LINE_CHARS]}" for line in lines[-TAIL_LINES:]]
        parts.append("\n".join([header, *body]))
    return "\n".join(parts)


def failure_report(nodeid: str, fixtures: list[str]) -> str | None:
    paths = runs_of(nodeid, fixtures)
    if not paths:
        return None
    kept = keep(paths, nodeid)
    lines = [f"kept copy of the run directories: {kept}"]
    for path in paths:
        lines += [f"== {path}", log_tails(path) or "(no role logs)"]
    return "\n".join(lines)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _test
    _test = item.nodeid


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    scope = "" if fixturedef.scope == "session" else request.node.nodeid
    if fixturedef.scope != "function":  # a function's fixture's runs are its test's
        _fixtures.append((fixturedef.argname, scope))
        try:
            yield
        finally:
            _fixtures.pop()
    else:
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.failed and not item.stash.get(_reported, False):
        item.stash[_reported] = True
        text = failure_report(item.nodeid, list(getattr(item, "fixturenames", [])))
        if text:
            report.sections.append((SECTION, text))
