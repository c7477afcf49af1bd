"""Help descriptions reflowed to the terminal: prose and list items filled, laid-out lines kept."""

from __future__ import annotations

from pddemu.help_format import reflow

TEXT = """\
`pddemu x`: a first paragraph written at a width
of its own, long enough to wrap.

    pddemu x --out DIR [--a-long-option VALUE] [--another-long-option VALUE]

Exit status:
- zero: every check passed and the
  item's second line joins it
- four: one did not
Prose after the list.
"""


def test_prose_and_list_items_are_filled_and_indented_lines_kept() -> None:
    assert reflow(TEXT, 30) == [
        "`pddemu x`: a first paragraph",
        "written at a width of its own,",
        "long enough to wrap.",
        "",
        "    pddemu x --out DIR [--a-long-option VALUE] [--another-long-option VALUE]",
        "",
        "Exit status:",
        "- zero: every check passed and",
        "  the item's second line joins",
        "  it",
        "- four: one did not",
        "Prose after the list.",
    ]


def test_words_are_not_split_at_hyphens_or_inside() -> None:
    assert reflow("Extend-Decode prefill/decode-disaggregated", 10) == [
        "Extend-Decode",
        "prefill/decode-disaggregated",
    ]


def test_a_list_item_with_no_words_is_kept_as_a_bare_dash() -> None:
    """Before, filling its no words (textwrap.wrap("") is []) raised ValueError."""
    assert reflow("- \nend", 40) == ["- ", "end"]
