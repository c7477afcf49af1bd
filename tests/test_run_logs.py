"""A failed emulation test's report carries its own run's logs and names a kept copy of them
(tests/run_logs.py): checked on an inner pytest session whose tests fake a run directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

INNER = """
import pytest
from tests.run_logs import record_run


def role_logs(path, name, text):
    logs = path / "logs" / "pdd"
    logs.mkdir(parents=True)
    (logs / f"{name}.log").write_text(text)
    (logs / f"{name}.err").write_text("Traceback (most recent call last):\\nValueError: boom\\n")
    record_run(path)
    return path


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    return role_logs(tmp_path_factory.mktemp("fixture"), "P0", "made by the module fixture\\n")


def test_first_passes(deployed, tmp_path):
    role_logs(tmp_path / "run1", "MD0", "first run line\\n")


def test_second_fails(tmp_path):
    lines = [f"2026-12-02 07:00:{i:02d},000 MD0 INFO step {i}" for i in range(40)]
    lines[5] = "2026-12-02 07:00:05,000 MD0 WARNING MD0: connection from P0 broke"
    role_logs(tmp_path / "run2", "MD0", "\\n".join(lines) + "\\n")
    assert False, "the request timed out"


def test_third_fails_on_the_fixtures_run(deployed):
    assert False


def test_fourth_fails_without_a_run():
    assert False
"""


def test_a_failed_test_reports_its_runs_logs_and_keeps_a_copy(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    keep = tmp_path / "kept"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PDDEMU_KEEP_FAILED_RUNS": str(keep)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_inner.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout
    assert "3 failed, 1 passed" in out, out
    parts = re.split(r"\n_{3,} (test_\w+) _{3,}\n", out.split("short test summary")[0])
    reports = dict(zip(parts[1::2], parts[2::2], strict=True))
    assert set(reports) == {
        "test_second_fails",
        "test_third_fails_on_the_fixtures_run",
        "test_fourth_fails_without_a_run",
    }, out
    # the failing test's own run: its warning, its last lines and its stderr, no other run's
    second = reports["test_second_fails"]
    assert "MD0: connection from P0 broke" in second
    assert "MD0 INFO step 39" in second and "MD0 INFO step 27" not in second
    assert "ValueError: boom" in second
    assert "first run line" not in out and "made by the module fixture" not in second
    (kept,) = re.findall(r"kept copy of the run directories: (\S+)", second)
    assert Path(kept).is_relative_to(keep)
    (copied,) = Path(kept).glob("0-run2/logs/pdd/MD0.log")
    assert "step 39" in copied.read_text()
    # a module fixture's run, for a later test that uses it; nothing for a test without a run
    assert "made by the module fixture" in reports["test_third_fails_on_the_fixtures_run"]
    assert "emulation run logs" not in reports["test_fourth_fails_without_a_run"]
