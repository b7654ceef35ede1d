"""tools/split_readme.py moves README sections into pages verbatim, places every part of every section exactly once,
and points a link to a heading at the page that now holds it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tools.split_readme import sections, slug, split

SOURCE = textwrap.dedent(
    """\
    # project

    The pitch.

    ## Quickstart

    Run it:

    ```python
    # a comment, not a heading
    print(1)
    ```

    ## Reference

    See [the details](#the-details-of-it-all).

    ### The details: of it, `all`

    Details.
    """
)


def test_headings_inside_code_blocks_are_not_sections() -> None:
    intro, found = sections(SOURCE)
    assert intro == ["", "The pitch.", ""]
    assert list(found) == ["Quickstart", "Reference", "The details: of it, `all`"]
    assert "# a comment, not a heading" in found["Quickstart"].lines


def test_sections_move_verbatim_with_their_headings_shifted_and_links_pointed_at_their_page() -> None:
    pages = split(
        SOURCE,
        {
            "README.md": "# project\n@readme intro\n\n@readme Quickstart\n",
            "reference.md": "@readme # Reference\n\n@readme ## The details: of it, `all`\n",
        },
        edits=(),
    )
    readme, reference = pages[Path("README.md")], pages[Path("docs/reference.md")]
    assert (
        readme
        == "# project\n\nThe pitch.\n\n"
        + SOURCE[SOURCE.index("## Quickstart") : SOURCE.index("## Ref")].rstrip()
        + "\n"
    )
    assert reference.startswith("# Reference\n\nSee [the details](#the-details-of-it-all).\n\n## The details")
    assert slug("The details: of it, `all`") == "the-details-of-it-all"


def test_a_link_to_a_heading_on_another_page_names_that_page() -> None:
    pages = split(
        SOURCE,
        {
            "README.md": "@readme intro\n@readme Quickstart\n@readme Reference\n",
            "details.md": "@readme # The details: of it, `all`\n",
        },
        edits=(),
    )
    assert "See [the details](docs/details.md#the-details-of-it-all)." in pages[Path("README.md")]


def test_text_placed_nowhere_or_twice_stops_the_split() -> None:
    with pytest.raises(SystemExit, match="placed on no page: 'Reference' part 1"):
        split(SOURCE, {"README.md": "@readme intro\n@readme Quickstart\n@readme The details: of it, `all`\n"}, edits=())
    with pytest.raises(SystemExit, match="'Quickstart' part 1 is placed twice"):
        split(SOURCE, {"README.md": "@readme Quickstart\n", "again.md": "@readme Quickstart\n"}, edits=())
    with pytest.raises(SystemExit, match="has no section 'Gone'"):
        split(SOURCE, {"README.md": "@readme Gone\n"}, edits=())


def test_an_edit_that_no_longer_matches_stops_the_split() -> None:
    templates = {
        "README.md": "@readme intro\n@readme Quickstart\n@readme Reference\n@readme The details: of it, `all`\n"
    }
    with pytest.raises(SystemExit, match="no longer says 'the pitch, loudly' once"):
        split(SOURCE, templates, edits=[("README.md", "the pitch, loudly", "x")])
    edited = split(SOURCE, templates, edits=[("README.md", "The pitch.", "The pitch, said again.")])
    assert "The pitch, said again." in edited[Path("README.md")]
