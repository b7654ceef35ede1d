"""The getting-started page (docs/getting-started.md) carries the README's install notes and quickstarts as text, so
that it reads as plain Markdown too (on GitHub a snippet directive is a bare `--8<--` line). Each copy sits between
`<!-- README.md:NAME -->` and `<!-- end README.md:NAME -->`, from the README's `[start:NAME]`/`[end:NAME]` section.

    python tools/readme_sections.py        # rewrites the copies; tests/unit/test_docs.py fails when one differs
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGE = ROOT / "docs" / "getting-started.md"
_COPY = re.compile(
    r"(<!-- README\.md:(?P<name>[a-z-]+) .*?-->\n)(?P<body>.*?)(<!-- end README\.md:(?P=name) -->)", re.S
)


def readme_section(name: str, readme: str | None = None) -> str:
    """The README's section `name`: the text between its `[start:NAME]` and `[end:NAME]` markers."""
    text = README.read_text() if readme is None else readme
    start = f"<!-- --8<-- [start:{name}] -->\n"
    return text[text.index(start) + len(start) : text.index(f"<!-- --8<-- [end:{name}] -->")]


def copies(page: str | None = None) -> dict[str, str]:
    """The page's copies of README sections, by name, as they stand."""
    text = PAGE.read_text() if page is None else page
    return {match["name"]: match["body"] for match in _COPY.finditer(text)}


def render(page: str | None = None, readme: str | None = None) -> str:
    """The page with every copy replaced by the README's section as it is now."""
    text = PAGE.read_text() if page is None else page
    return _COPY.sub(lambda match: match[1] + readme_section(match["name"], readme) + match[4], text)


def main() -> int:
    PAGE.write_text(render())
    print(f"readme_sections: wrote {PAGE.relative_to(ROOT)} ({', '.join(copies())})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
