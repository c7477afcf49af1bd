"""The help text's layout: command descriptions are their modules' docstrings, written at the
code's 100 columns, and `--help` is read on a terminal of 80.

`HelpFormatter` fills a description's prose to the terminal's width as argparse fills option
help, and keeps what is laid out by hand: a paragraph's text is filled again, a list item
(`- ` with continuation lines indented by two) is filled under its dash, and any other
indented line (a command line, an example) is kept as written, so it must fit by itself.
"""

from __future__ import annotations

import argparse
import textwrap

ITEM = "- "
ITEM_INDENT = " " * len(ITEM)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs reflowed to the help's width (see the module's docstring)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(f"{indent}{line}".rstrip() + "\n" for line in reflow(text, width))


def reflow(text: str, width: int) -> list[str]:
    """`text`'s lines with its paragraphs and list items filled to `width` columns."""
    out: list[str] = []
    words: list[str] = []  # the paragraph or list item being gathered
    in_item = False

    def flush() -> None:
        nonlocal words, in_item
        if words:
            lead = ITEM_INDENT if in_item else ""
            filled = textwrap.wrap(
                " ".join(words), width - len(lead), break_long_words=False, break_on_hyphens=False
            ) or [""]  # an item with no words (a bare dash) is still a line
            first, *rest = filled
            out.append((ITEM if in_item else "") + first)
            out.extend(lead + line for line in rest)
        words, in_item = [], False

    for line in text.splitlines():
        if not line.strip():
            flush()
            out.append("")
        elif line.startswith(ITEM):
            flush()
            words, in_item = [line[len(ITEM) :].strip()], True
        elif in_item and line.startswith(ITEM_INDENT) and not line.startswith(ITEM_INDENT + " "):
            words.append(line.strip())
        elif line[0].isspace():
            flush()
            out.append(line)
        else:
            if in_item:
                flush()
            words.append(line.strip())
    flush()
    return out
