"""A point's child process imports the pddemu that started it, wherever the point runs: a
`pddemu` package in its working directory (another checkout) is not the one it runs."""

from __future__ import annotations

from pathlib import Path

from pddemu.sweep.grid import expand, parse_grid
from pddemu.sweep.runner import EMULATE_LOG, start_point


def test_the_child_does_not_import_a_pddemu_in_its_working_directory(tmp_path: Path) -> None:
    other = tmp_path / "checkout"
    (other / "pddemu" / "sweep").mkdir(parents=True)
    (other / "pddemu" / "__init__.py").write_text("")
    (other / "pddemu" / "sweep" / "__init__.py").write_text("")
    marker = tmp_path / "imported"
    (other / "pddemu" / "sweep" / "child.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('other checkout')\n"
    )
    (point,) = expand(None, [], parse_grid(["wan.delay=5ms"]), 1, ["pdd"])
    missing = tmp_path / "no-such-config.toml"  # this pddemu's emulate stops at once on it
    running = start_point(point, tmp_path / "out", config_path=missing, cwd=other)
    assert running.process.wait(timeout=60) != 0
    assert not marker.exists()
    assert "no-such-config.toml" in (tmp_path / "out" / EMULATE_LOG).read_text()
