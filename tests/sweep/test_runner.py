"""A point's processes import the pddemu that started them, wherever the point runs: a
`pddemu` package in its working directory (another checkout) is not the one they run, in the
child or in the `python -m` processes the emulation inside it starts (roles, shaper, ...)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pddemu.sweep import runner
from pddemu.sweep.grid import expand, parse_grid
from pddemu.sweep.runner import EMULATE_LOG, start_point


def other_checkout(tmp_path: Path) -> tuple[Path, Path]:
    """A directory holding another `pddemu` whose point child and roles entry point each leave
    a line in a marker file when imported; (the directory, the marker)."""
    other = tmp_path / "checkout"
    marker = tmp_path / "imported"
    for package in ("pddemu", "pddemu/sweep", "pddemu/roles"):
        (other / package).mkdir(parents=True, exist_ok=True)
        (other / package / "__init__.py").write_text("")
    for module in ("sweep/child.py", "roles/__main__.py", "roles/launcher.py"):
        (other / "pddemu" / module).write_text(
            f"with open({str(marker)!r}, 'a') as f:\n    f.write('other checkout {module}\\n')\n"
        )
    return other, marker


def test_the_child_does_not_import_a_pddemu_in_its_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other, marker = other_checkout(tmp_path)
    started: list[dict[str, Any]] = []
    popen = subprocess.Popen

    def recording_popen(*args: Any, **kwargs: Any) -> subprocess.Popen:
        if "pddemu.sweep.child" in args[0]:  # not the git calls of its provenance
            started.append(kwargs)
        return popen(*args, **kwargs)

    monkeypatch.setattr(runner.subprocess, "Popen", recording_popen)
    (point,) = expand(None, [], parse_grid(["wan.delay=5ms"]), 1, ["pdd"])
    missing = tmp_path / "no-such-config.toml"  # this pddemu's emulate stops at once on it
    running = start_point(point, tmp_path / "out", config_path=missing, cwd=other)
    assert running.process.wait(timeout=60) != 0
    assert not marker.exists()
    assert "no-such-config.toml" in (tmp_path / "out" / EMULATE_LOG).read_text()

    # What the emulation does next, in the child's environment and directory: start the
    # instances' launcher as pddemu.cli does, `python -m pddemu.roles.launcher`, and a role by
    # itself, `python -m pddemu.roles` (each with no -P of its own).
    (child,) = started
    for module in ("pddemu.roles.launcher", "pddemu.roles"):
        grandchild = (
            "import subprocess, sys; "
            f"subprocess.run([sys.executable, '-m', {module!r}], stdin=subprocess.DEVNULL)"
        )
        subprocess.run(
            [sys.executable, "-c", grandchild], env=child.get("env"), cwd=child["cwd"], check=True
        )
    assert not marker.exists(), marker.read_text()
