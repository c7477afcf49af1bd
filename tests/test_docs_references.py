"""Every file the README, the docs and the configs point at exists in the project."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "configs").glob("*.toml")),
]
PROJECT_DIRS = (
    "docs/",
    "pddemu/",
    "configs/",
    "traces/",
    "tests/",
    "netem/",
    "bench/",
    "scripts/",
    "experiments/",
)
TOP_FILES = {"README.md", "LICENSE", "Makefile", "pyproject.toml"}
REFERENCE = re.compile(r"`([^`\s]+)`|\(([\w./-]+\.md)\)")


def references(page: Path) -> list[str]:
    found = []
    for match in REFERENCE.finditer(page.read_text()):
        token = (match.group(1) or match.group(2)).rstrip(".,:;)")
        if any(mark in token for mark in "<>*{}$|"):
            continue  # a placeholder or pattern, not a path
        if token.startswith(PROJECT_DIRS) or token in TOP_FILES:
            found.append(token.split("#")[0].split(":")[0])
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_referenced_project_file_exists(page: Path) -> None:
    missing = [ref for ref in references(page) if not (ROOT / ref).exists()]
    assert not missing, f"{page.relative_to(ROOT)} points at {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_points_outside_the_project(page: Path) -> None:
    """The design notes outside the repository are not the reader's: docs/pdd.md is."""
    text = page.read_text()
    for outside in ("PDD.md", "DESIGN.md", "docs/policies.md"):
        assert outside not in text.replace("docs/pdd.md", ""), f"{page.name} cites {outside}"
