"""The documentation site stays true: it builds with MkDocs with warnings as errors, every example on every page
(docs/*.md) runs as shown on a CPU-only machine (the README's rules, `tests/readme_examples.py`), its generated
parts are what they are generated from (the compatibility matrix and the policy sentences from the rules, the CLI
reference from the parser), and every public name has its entry in the API reference."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import yaml
from sybil import Document, Example

from tests.downstream_rules import RULES as DOWNSTREAM_RULES
from tests.readme_examples import ELSEWHERE, Session, parse
from tools import cli_reference, readme_sections
from trainplan import BUILTIN_RULES, Rules
from trainplan.render.matrix import render_matrix, render_policies

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
SESSIONS = {page: Session(elsewhere=ELSEWHERE, name=f"docs/{page.name}") for page in PAGES}
DOCUMENTS = {page: parse(page, SESSIONS[page]) for page in PAGES}
# The README's file blocks (train.py, slurm.env...) are the pages' too: the pages are read with it.
README = parse(ROOT / "README.md", Session(elsewhere=ELSEWHERE))


def _copied_lines(page: Path) -> set[int]:
    """The lines of `page` that copy a README section (`tools/readme_sections.py`): the README's own examples, run
    by tests/unit/test_readme.py, and checked equal to it below, so not run a second time here."""
    text = page.read_text()
    lines: set[int] = set()
    for body in readme_sections.copies(text).values():
        first = text[: text.index(body)].count("\n") + 1
        lines |= set(range(first, first + body.count("\n") + 1))
    return lines


EXAMPLES = [(page, example) for page in PAGES for example in DOCUMENTS[page] if example.line not in _copied_lines(page)]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], None]:
    """Prepares a page's session (its scratch folder, every document's files in it) the first time it is asked."""
    done: set[Path] = set()

    def prepare(page: Path) -> None:
        if page not in done:
            shared: list[Document] = [README, *(DOCUMENTS[other] for other in PAGES if other != page)]
            SESSIONS[page].prepare(DOCUMENTS[page], tmp_path_factory.mktemp(page.stem), shared)
            done.add(page)

    return prepare


@pytest.mark.parametrize(
    ("page", "example"), EXAMPLES, ids=[f"{page.stem}-line-{example.line}" for page, example in EXAMPLES]
)
def test_the_page_example_runs_as_shown(prepared: Callable[[Path], None], page: Path, example: Example) -> None:
    prepared(page)
    example.evaluate()


def test_the_pages_have_examples_of_every_kind() -> None:
    languages = [example.parsed.language for _, example in EXAMPLES if hasattr(example.parsed, "language")]
    assert languages.count("python") >= 10 and languages.count("sh") >= 15 and languages.count("pycon") >= 1


# --------------------------------------------------------------------------------------------------
# The site itself.


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    """`make docs`'s build (MkDocs, Material, mkdocstrings), strict: a broken link or anchor, a missing snippet, a
    page outside the navigation or a docstring mkdocstrings cannot read fails it."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "WARNING" not in output, output[-5000:]
    site = tmp_path / "site"
    assert (site / "benchmarks" / "figures" / "metric_compute.svg").is_file(), "the benchmark figures are served"
    benchmarks = (site / "benchmarks" / "index.html").read_text()
    assert benchmarks.count("<table>") == 1 and "anchor / trainplan" in benchmarks, "make bench's table, included"
    api = (site / "api" / "index.html").read_text()
    assert 'id="trainplan.Request"' in api and 'id="trainplan.launch"' in api, "the API reference is rendered"
    assert "The plan for <code>request</code> (default: everything" in api, "tp.resolve, the function, has its entry"
    assert api.count("&gt;&gt;&gt; ") >= 7, "tp.resolve's and tp.check's examples are shown as sessions"
    started = (site / "getting-started" / "index.html").read_text()
    assert "Quickstart: the library" in started, "the getting-started page includes the README's quickstarts"


def test_the_navigation_lists_every_page_once() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(entries: list[object]) -> list[str]:
        found: list[str] = []
        for entry in entries:
            assert isinstance(entry, dict)
            for value in entry.values():
                found += pages(value) if isinstance(value, list) else [str(value)]
        return found

    listed = pages(config["nav"])
    assert sorted(listed) == sorted(page.name for page in PAGES) and len(set(listed)) == len(listed)


def test_the_api_reference_has_every_public_name() -> None:
    import trainplan

    text = (DOCS / "api.md").read_text()
    listed = set(re.findall(r"^(?:::: |<!-- api: )trainplan\.(\w+)(?: -->)?$", text, flags=re.MULTILINE))
    public = set(trainplan.__all__) - {"__version__"}
    assert listed == public, f"missing: {sorted(public - listed)}; not public: {sorted(listed - public)}"


def test_the_docstring_examples_in_the_api_reference_run() -> None:
    """Every public name's docstring examples (`>>> ` sessions, shown on the API page) run as written."""
    import doctest

    import trainplan

    finder, ran = doctest.DocTestFinder(recurse=False), []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for name in sorted(set(trainplan.__all__) - {"__version__"}):
        for test in finder.find(getattr(trainplan, name), name=f"trainplan.{name}", globs={}):
            if test.examples:
                ran.append(name)
                runner.run(test)
    assert {"resolve", "check"} <= set(ran), ran
    assert runner.summarize(verbose=False).failed == 0, "a docstring example printed otherwise (doctest's report above)"


def test_the_getting_started_page_carries_the_readme_sections_as_they_are() -> None:
    """The page reads as plain Markdown (GitHub shows a snippet directive as a bare `--8<--` line): its quickstarts
    are copies of the README's sections, kept equal here."""
    text = (DOCS / "getting-started.md").read_text()
    assert "--8<--" not in text
    found = readme_sections.copies(text)
    assert list(found) == ["install", "quickstart-library", "quickstart-cli", "quickstart-launchers"]
    for name, body in found.items():
        assert body == readme_sections.readme_section(name), f"{name}: regenerate with python tools/readme_sections.py"
    assert "## Quickstart: the library" in text and "```python" in text
    stale = text.replace("## Install", "## Installing", 1)
    assert readme_sections.render(stale) == text  # the tool restores a copy that drifted


def test_the_cli_reference_is_generated_from_the_parser() -> None:
    text = (DOCS / "cli-reference.md").read_text()
    assert text == cli_reference.render(), "regenerate with: python tools/cli_reference.py"
    from trainplan.cli import COMMAND_HELP

    for name, (_, examples) in COMMAND_HELP.items():
        assert f"## trainplan {name}\n" in text and all(example in text for example in examples)


# --------------------------------------------------------------------------------------------------
# The generated and checked parts of the pages.


def _block(page: str, name: str) -> str:
    text = (DOCS / page).read_text()
    start = text.index(f"<!-- {name}:start -->\n") + len(f"<!-- {name}:start -->\n")
    return text[start : text.index(f"<!-- {name}:end -->")]


def test_the_matrix_is_generated_from_the_rules() -> None:
    assert _block("compatibility.md", "matrix").strip() == render_matrix().strip(), "regenerate with: trainplan matrix"


def test_the_policies_are_generated_from_the_rules() -> None:
    """ "How a request is resolved" states the rows' policies in words (the accelerators' order, the `auto` rows, the
    default backends, the precision fallbacks, the clusters' detection order): a row changed without the page
    fails here."""
    regenerate = "regenerate with: python -c 'from trainplan.render.matrix import render_policies as r; print(r())'"
    assert _block("concepts.md", "policies").strip() == render_policies().strip(), regenerate


def test_the_policy_sentences_follow_the_rows() -> None:
    def words(rules: Rules) -> str:
        return " ".join(render_policies(rules).split())

    fp16 = BUILTIN_RULES.precisions["16-mixed"]
    no_fallback = BUILTIN_RULES.extend(precisions=[attrs.evolve(fp16, fallback={}, fallback_why={})])
    assert "`16-mixed` on CPU falls back to `bf16-mixed`" in words(BUILTIN_RULES)
    assert "falls back" not in words(no_fallback)
    added = words(DOWNSTREAM_RULES)  # a downstream accelerator, first by its priority, with its own backend
    assert "(`auto`: NPU > XLA > CUDA" in added and "NPU → hccl" in added


def test_the_migration_page_lists_every_deliberate_difference() -> None:
    from trainplan.rules import DIFFERENCES

    text = (DOCS / "migrating.md").read_text()
    for key, reason in DIFFERENCES.items():
        assert f"- **{key}:** {reason}" in text, f"docs/migrating.md lacks the difference {key!r}"
    # And the other way: the page's list holds nothing that is not one of them.
    start = text.index("`rules.DIFFERENCES`; a test keeps this list identical):")
    end = text.find("\n## ", start)
    section = text[start : end if end != -1 else len(text)]
    listed = re.findall(r"^- \*\*([^*]+):\*\* ", section, flags=re.MULTILINE)
    assert listed == list(DIFFERENCES), "the page lists a difference DIFFERENCES lacks (or another order)"


def test_the_documented_loop_is_the_tested_script() -> None:
    text = (DOCS / "runtime.md").read_text()
    block = text[text.index("<!-- loop:start -->") : text.index("<!-- loop:end -->")]
    code = block[block.index("```python\n") + len("```python\n") : block.rindex("```")]
    script = (ROOT / "tests" / "scripts" / "readme_loop.py").read_text()
    assert script == code, "docs/runtime.md's loop and tests/scripts/readme_loop.py differ"
    assert len([line for line in code.splitlines() if line.strip()]) <= 25


def test_the_documented_parallelize_is_the_tested_one() -> None:
    text = (DOCS / "mesh.md").read_text()
    block = text[text.index("<!-- mesh:parallelize -->") :]
    code = block[block.index("```python\n") + len("```python\n") : block.index("```\n", block.index("```python\n") + 3)]
    assert code in (ROOT / "tests" / "scripts" / "mesh_world.py").read_text()
