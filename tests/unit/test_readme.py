"""The README stays true and short: every Python block and every shell line in it runs as shown on a CPU-only
machine (Sybil, with the rules in `tests/readme_examples.py`), the blocks that other tests run are still theirs, and
it keeps to the pitch, the install, one quickstart per entry point and the links (the rest is the documentation
site's, docs/*.md, checked by `tests/unit/test_docs.py`)."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sybil import Example

from tests.readme_examples import ELSEWHERE, Session, parse

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

SESSION = Session(elsewhere=ELSEWHERE)
DOCUMENT = parse(README, SESSION)
EXAMPLES = list(DOCUMENT)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    SESSION.prepare(DOCUMENT, tmp_path_factory.mktemp("readme"))
    yield SESSION


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"line-{example.line}" for example in EXAMPLES])
def test_the_readme_example_runs_as_shown(session: Session, example: Example) -> None:
    example.evaluate()


def test_the_readme_has_examples_of_both_kinds() -> None:
    languages = [example.parsed.language for example in EXAMPLES if hasattr(example.parsed, "language")]
    assert languages.count("python") >= 2 and languages.count("sh") >= 4


def test_readme_starts_with_the_two_commands() -> None:
    head = "\n".join(README.read_text().splitlines()[:10])
    assert "make demo" in head and "make test" in head


def test_the_readme_stays_short_and_links_every_page() -> None:
    """The pitch, the install, one quickstart per entry point and the links: the reference lives on the site."""
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    pages = sorted(path.name for path in (ROOT / "docs").glob("*.md") if path.name != "index.md")
    unlinked = [page for page in pages if f"(docs/{page})" not in text]
    assert not unlinked, f"the README's Documentation list lacks {unlinked}"


# --------------------------------------------------------------------------------------------------
# The runner itself: a wrong README fails it.

BROKEN = {
    "a wrong output": ("```python\n1 + 1\n# 3\n```\n", "shown 3, got 2"),
    "a failing script": ("<!-- file: boom.py -->\n```python\nraise SystemExit(3)\n```\n", "python boom.py exited 3"),
    "a missing print": ("<!-- file: quiet.py -->\n```python\nprint('a')  # b\n```\n", "never printed 'b'"),
    "a guard outside a file": ("```python\nif __name__ == '__main__':\n    pass\n```\n", "is a script"),
    "a failing command": ("```sh\ntrainplan plan --accelerator gpux\n```\n", "exited 2, BROKEN.md says 0"),
    "a wrong exit code": ("```sh\ntrainplan matrix   # exits 2\n```\n", "exited 0, BROKEN.md says 2"),
    "a line never printed": ("```sh\n$ trainplan matrix\n| `ddp` | nonsense |\n```\n", "never printed '| `ddp`"),
    "an unknown fence": ("```bash\ntrainplan matrix\n```\n", "a ```bash block is never run"),
    "a wrong session": ("```pycon\n>>> 1 + 1\n3\n```\n", "Expected:\n    3\nGot:\n    2"),
    "a stale run-elsewhere": ("<!-- elsewhere:gone -->\n```sh\ntrainplan matrix\n```\n", "no longer runs this"),
}


@pytest.mark.parametrize(("markdown", "complaint"), BROKEN.values(), ids=BROKEN.keys())
def test_the_runner_fails_a_wrong_readme(tmp_path: Path, markdown: str, complaint: str) -> None:
    document_path = tmp_path / "BROKEN.md"
    document_path.write_text(markdown)
    session = Session(elsewhere={"elsewhere:gone": (document_path, "a text this file lacks")}, name="BROKEN.md")
    document = parse(document_path, session)
    session.prepare(document, tmp_path)
    (example,) = list(document)
    with pytest.raises(AssertionError, match=re.escape(complaint)):
        example.evaluate()


def test_the_runner_passes_what_it_should(tmp_path: Path) -> None:
    markdown = textwrap.dedent(
        """
        <!-- file: hello.py -->
        ```python
        print("hello", 2 + 2)  # hello 4
        ```

        ```python
        import trainplan as tp
        tp.Request.from_config({"devices": "0,2"}).devices
        # (0, 2)
        "x" * 50
        # 'xxx...xxx'
        ```

        ```sh
        $ trainplan matrix
        | strategy | family | launcher | ... |
        ...
        $ trainplan plan --accelerator gpux     # exits 2
        trainplan: error: ... Did you mean accelerator='gpu'? ...
        $ python hello.py
        hello 4
        $ make demo
        this line is never checked: make is not run
        ```

        ```pycon
        >>> answer = 41
        ```

        ```python
        answer + 1  # a session's names are the document's
        # 42
        ```

        ```text
        not code
        ```
        """
    )
    document_path = tmp_path / "GOOD.md"
    document_path.write_text(markdown)
    session = Session(elsewhere={})
    document = parse(document_path, session)
    session.prepare(document, tmp_path)
    for example in document:
        example.evaluate()
    assert (session.outputs_checked, session.commands_run) == (8, 3)
