"""Split the long README into the documentation site's pages, moving each section's text verbatim.

    python tools/split_readme.py [--source FILE]     # default source: the README as on main (git show main:README.md)

The pages are written from the templates in `tools/pages/` (`README.md` → README.md, every other `NAME.md` →
docs/NAME.md). A template is Markdown with directive lines:

- `@readme HEADING`: the README section under that heading (`##` or `###`), heading and text, up to the next
  heading of any level, moved as it is;
- `@readme ## HEADING`: the same, its heading written at that level (and its sub-headings shifted alike);
- `@readme HEADING | N`: part N of a section that `SPLITS` cuts in parts (part 1 keeps the heading; part N > 1 is
  the text from its cut on, without a heading);
- `@readme intro`: the text before the README's first `##` heading, title excluded (the pitch: the README and
  the site's home page both open with it).

Every part of every section must be used exactly once, so nothing is lost or copied twice: a section added to the
README since these templates were written stops the script, naming it. After the move, the generated blocks (the
compatibility matrix, the policy sentences) are written again from the rules, the few words that pointed
elsewhere in the one long README are said again for where the text now lives (`EDITS`), and a link to a heading
(`](#...)`) that now lives on another page points to that page.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "tools" / "pages"
DOCS = ROOT / "docs"

# A section cut in parts: its heading → the text each part after the first starts with.
SPLITS: dict[str, tuple[str, ...]] = {
    "Quickstart: the library": ("Errors are typed and carry their fields",),
    "Quickstart: the command line": ("`--assume` takes",),
    "How a request is resolved": ("mpirun and mpiexec start their daemons",),
    "Scaling out: one script, every launcher": ("- **Inside a started job, `auto` adopts the job.**",),
}

# Words that pointed elsewhere in the one long README, said again for where the text now lives: (page, old, new).
EDITS: tuple[tuple[str, str, str], ...] = (
    (
        "README.md",
        "# the compatibility tables below, from the rule data",
        "# the compatibility tables, from the rule data",
    ),
    ("README.md", "# a copy-paste block for bug reports (below)", "# a copy-paste block for bug reports"),
    (
        "README.md",
        "What-if facts come from `--assume` (below) and",
        "What-if facts come from `--assume` (every fact it takes: docs/cli.md) and",
    ),
    (
        "README.md",
        "Every block in this README runs as shown on a CPU-only machine:",
        "Every block in this README and on the documentation's pages runs as shown on a CPU-only machine:",
    ),
    ("mesh.md", "This block is run by the README\ntest:", "This block is run by the documentation's\ntest:"),
    # The README's earlier blocks imported trainplan; the page's first block does.
    ("memory.md", "```python\nllama_7b = ", "```python\nimport trainplan as tp\n\nllama_7b = "),
)

HEADING = re.compile(r"^(?P<hashes>#{2,6}) (?P<title>.+?)\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
DIRECTIVE = re.compile(r"^@readme (?:(?P<level>#{1,6}) )?(?P<name>.+?)(?: \| (?P<part>\d+))?\s*$")
ANCHOR_LINK = re.compile(r"\]\(#(?P<anchor>[^)\s]+)\)")


@dataclass(frozen=True)
class Section:
    title: str
    level: int
    lines: tuple[str, ...]  # the heading line first


def sections(text: str) -> tuple[list[str], dict[str, Section]]:
    """The intro (before the first `##`, the `# title` line excluded) and every section by its heading's text."""
    intro: list[str] = []
    found: dict[str, Section] = {}
    current: list[str] | None = None
    title, level = "", 0
    in_fence = False

    def close() -> None:
        if current is not None:
            if title in found:
                raise SystemExit(f"split_readme: two README sections are called {title!r}")
            found[title] = Section(title, level, tuple(current))

    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        match = None if in_fence else HEADING.match(line)
        if match:
            close()
            current, title, level = [line], match["title"], len(match["hashes"])
        elif current is None:
            intro.append(line)
        else:
            current.append(line)
    close()
    if intro and intro[0].startswith("# "):
        intro = intro[1:]
    return intro, found


def parts(section: Section) -> list[list[str]]:
    """A section cut where SPLITS says: part 1 with the heading, the others without."""
    cuts = SPLITS.get(section.title, ())
    pieces: list[list[str]] = [[]]
    remaining = list(cuts)
    for line in section.lines:
        if remaining and line.startswith(remaining[0]):
            remaining.pop(0)
            pieces.append([])
        pieces[-1].append(line)
    if remaining:
        raise SystemExit(f"split_readme: section {section.title!r} no longer has a line starting {remaining[0]!r}")
    return pieces


def shifted(lines: list[str], level: int | None, own_level: int) -> list[str]:
    """The lines with every heading (outside fences) moved by the same number of levels."""
    if level is None or level == own_level:
        return lines
    delta = level - own_level
    out: list[str] = []
    in_fence = False
    for line in lines:
        if FENCE.match(line):
            in_fence = not in_fence
        match = None if in_fence else HEADING.match(line)
        out.append("#" * max(1, len(match["hashes"]) + delta) + " " + match["title"] if match else line)
    return out


def slug(title: str) -> str:
    """The anchor GitHub and MkDocs both give a heading (code spans and punctuation dropped, spaces to hyphens)."""
    text = re.sub(r"[`*_]", "", title).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[-\s]+", "-", text)


def fill(template: str, intro: list[str], found: dict[str, Section], used: set[tuple[str, int]]) -> str:
    out: list[str] = []
    for line in template.splitlines():
        match = DIRECTIVE.match(line)
        if not match:
            out.append(line)
            continue
        name = match["name"]
        if name == "intro":
            key, lines = ("intro", 1), list(intro)
        else:
            if name not in found:
                raise SystemExit(f"split_readme: the README has no section {name!r} (a template names it)")
            section = found[name]
            number = int(match["part"] or 1)
            pieces = parts(section)
            if not 1 <= number <= len(pieces):
                raise SystemExit(f"split_readme: section {name!r} has {len(pieces)} part(s), not {number}")
            key = (name, number)
            lines = shifted(pieces[number - 1], len(match["level"]) if match["level"] else None, section.level)
        if key in used and key != ("intro", 1):  # the pitch opens both the README and the site's home page
            raise SystemExit(f"split_readme: {key[0]!r} part {key[1]} is placed twice")
        used.add(key)
        while lines and not lines[-1].strip():
            lines.pop()
        out.extend(lines)
    return "\n".join(out).rstrip() + "\n"


def regenerate(text: str) -> str:
    """The generated blocks written again from the rules, as the tests compare them."""
    sys.path.insert(0, str(ROOT / "src"))
    from trainplan.render.matrix import render_matrix, render_policies

    for name, render in (("matrix", render_matrix), ("policies", render_policies)):
        start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
        if start in text:
            head, rest = text.split(start, 1)
            text = head + start + render().strip() + "\n" + rest[rest.index(end) :]
    return text


def relink(pages: dict[Path, str]) -> dict[Path, str]:
    """`](#anchor)` to a heading on another page becomes a link to that page."""
    anchors: dict[str, Path] = {}
    for path, text in pages.items():
        in_fence = False
        for line in text.splitlines():
            if FENCE.match(line):
                in_fence = not in_fence
            match = None if in_fence else re.match(r"^#{1,6} (.+?)\s*$", line)
            if match:
                anchors.setdefault(slug(match[1]), path)
    out: dict[Path, str] = {}
    for path, text in pages.items():

        def link(match: re.Match[str], path: Path = path) -> str:
            anchor = match["anchor"]
            target = anchors.get(anchor)
            if target is None:
                raise SystemExit(f"split_readme: {path.name} links to #{anchor}, a heading no page has")
            if target == path:
                return match[0]
            if path.parent == target.parent:
                return f"]({target.name}#{anchor})"
            return f"]({target.relative_to(path.parent).as_posix()}#{anchor})"

        out[path] = ANCHOR_LINK.sub(link, text)
    return out


def split(source: str, templates: Mapping[str, str], edits: Iterable[tuple[str, str, str]] = EDITS) -> dict[Path, str]:
    """Every page's text, by its path under the repository (README.md, docs/NAME.md), from the whole README and
    the templates by their names; SystemExit names what does not fit."""
    intro, found = sections(source)
    used: set[tuple[str, int]] = set()
    pages: dict[Path, str] = {}
    for name, template in sorted(templates.items()):
        pages[_target(name)] = regenerate(fill(template, intro, found, used))
    wanted = {("intro", 1)} | {(name, n) for name, section in found.items() for n in range(1, len(parts(section)) + 1)}
    missing = sorted(wanted - used)
    if missing:
        raise SystemExit(
            "split_readme: README text placed on no page: "
            + ", ".join(f"{name!r} part {n}" for name, n in missing)
            + " (add an @readme line to a template in tools/pages/)"
        )
    for name, old, new in edits:
        if pages[_target(name)].count(old) != 1:
            raise SystemExit(f"split_readme: {name} no longer says {old!r} once (EDITS in tools/split_readme.py)")
        pages[_target(name)] = pages[_target(name)].replace(old, new)
    return relink(pages)


def _target(template_name: str) -> Path:
    return Path("README.md") if template_name == "README.md" else Path("docs") / template_name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=None, help="the whole README (default: main's README.md)")
    arguments = parser.parse_args(argv)
    if arguments.source is not None:
        source = arguments.source.read_text()
    else:
        source = subprocess.run(
            ["git", "show", "main:README.md"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    pages = split(source, {template.name: template.read_text() for template in TEMPLATES.glob("*.md")})
    DOCS.mkdir(exist_ok=True)
    for path, text in pages.items():
        (ROOT / path).write_text(text)
    readme_lines = len(pages[Path("README.md")].splitlines())
    print(f"split_readme: wrote README.md ({readme_lines} lines) and {len(pages) - 1} pages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
