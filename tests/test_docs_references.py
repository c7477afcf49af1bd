"""Every file, link and section the README, the docs and the configs point at exists in the
project, and every section the code cites."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    ROOT / "traces" / "README.md",
    ROOT / "tests" / "workload" / "data" / "README.md",
    *sorted((ROOT / "configs").glob("*.toml")),
    *sorted((ROOT / "experiments").glob("*.toml")),
]
SOURCES = sorted(
    path for top in ("pddemu", "netem", "tests") for path in (ROOT / top).rglob("*.py")
)
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
MARKDOWN_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
# `docs/architecture.md`, "One clock" (or 'One clock'): a page and a section of it, by title
SECTION_REFERENCE = re.compile(
    r"`?((?:docs/[\w-]+|README)\.md)`?,\s*((?:[\"'][^\"'\n]+[\"'](?:,\s*|\s+and\s+)?)+)"
)
# The same in the code, where a bare README is the project's (docs/traces.md cites other
# projects' READMEs that way).
CODE_SECTION_REFERENCE = re.compile(
    r"`?(docs/[\w-]+\.md|README(?:\.md)?)`?,\s*((?:[\"'][^\"'\n]+[\"'](?:,\s*|\s+and\s+)?)+)"
)
# A line break inside a citation, with the next line's indent and comment mark: a space.
LINE_BREAK = re.compile(r"\n[ \t]*(?:#[ \t]*)?")
QUOTED = re.compile(r"[\"']([^\"'\n]+)[\"']")


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def references(page: Path) -> list[str]:
    found = []
    for match in REFERENCE.finditer(page.read_text()):
        token = (match.group(1) or match.group(2)).rstrip(".,:;)")
        if any(mark in token for mark in "<>*{}$|"):
            continue  # a placeholder or pattern, not a path
        if token.startswith(PROJECT_DIRS) or token in TOP_FILES:
            found.append(token.split("#")[0].split(":")[0])
    return found


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def section_titles(page: Path) -> list[str]:
    """The titles a page's sections go by: its headings and its bold paragraph leads."""
    text = page.read_text()
    headings = re.findall(r"^#+\s+(.+)$", text, re.M)
    leads = re.findall(r"^\*\*([^*\n]+)\*\*", text, re.M)
    return headings + leads


def plain(title: str) -> str:
    return re.sub(r"[`*\"'.,:\s]+", " ", title).strip().lower()


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_referenced_project_file_exists(page: Path) -> None:
    missing = [ref for ref in references(page) if not (ROOT / ref).exists()]
    assert not missing, f"{page_id(page)} points at {missing}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_link_resolves(page: Path) -> None:
    """A relative link names a file beside the page, and an anchor a heading of its target."""
    broken = []
    for match in MARKDOWN_LINK.finditer(page.read_text()):
        link = match.group(1)
        if re.match(r"[a-z]+:", link):
            continue  # http(s), mailto: outside the project, not checked offline
        path, _, fragment = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(link)
        elif fragment and fragment not in {anchor(h) for h in section_titles(target)}:
            broken.append(link)
    assert not broken, f"{page_id(page)} links to {broken}"


def missing_sections(text: str, pattern: re.Pattern[str] = SECTION_REFERENCE) -> list[str]:
    """The sections `text` cites (`docs/x.md`, "Title") that are neither a heading nor a bold
    paragraph lead of their page."""
    missing = []
    for match in pattern.finditer(LINE_BREAK.sub(" ", text)):
        name = match.group(1)
        target = ROOT / (name if name.endswith(".md") else f"{name}.md")
        if not target.exists():
            continue  # reported by test_every_referenced_project_file_exists
        titles = [plain(title) for title in section_titles(target)]
        for cited in QUOTED.findall(match.group(2)):
            if not any(title.startswith(plain(cited)) for title in titles):
                missing.append(f'{name}, "{cited}"')
    return missing


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_cited_section_exists(page: Path) -> None:
    missing = missing_sections(page.read_text())
    assert not missing, f"{page_id(page)} cites sections that are not there: {missing}"


def test_every_section_cited_from_the_code_exists() -> None:
    """Docstrings and comments cite the README's and the docs' sections the same way."""
    missing = {
        page_id(path): found
        for path in SOURCES
        if (found := missing_sections(path.read_text(), CODE_SECTION_REFERENCE))
    }
    assert not missing, f"sources cite sections that are not there: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_page_points_outside_the_project(page: Path) -> None:
    """The design notes outside the repository are not the reader's: docs/pdd.md is; nor is
    the development machine's folder of public traces (`PDDEMU_PUBLIC_TRACES` names a
    reader's)."""
    text = page.read_text()
    for outside in ("PDD.md", "DESIGN.md", "docs/policies.md", "/work/shared"):
        assert outside not in text.replace("docs/pdd.md", ""), f"{page.name} cites {outside}"
