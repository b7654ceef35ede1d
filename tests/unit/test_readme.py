"""The README stays true: every Python block and every shell line in it runs as shown on a CPU-only machine
(Sybil, with the rules in `tests/readme_examples.py`), its compatibility tables are what `trainplan matrix`
prints, its policy sentences are what the rows say, and the blocks that other tests run are still theirs."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from sybil import Example

from tests.downstream_rules import RULES as DOWNSTREAM_RULES
from tests.readme_examples import Session, parse
from trainplan import BUILTIN_RULES, Rules
from trainplan.render.matrix import render_matrix, render_policies

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

SESSION = Session(
    elsewhere={
        # The same script under torchrun, trainplan launch and tp.launch, each rank's line checked.
        "scaling-out:script": (
            ROOT / "tests/processes/test_one_world.py",
            '_readme_block("<!-- scaling-out:script -->")',
        ),
        "scaling-out:commands": (
            ROOT / "tests/processes/test_one_world.py",
            '_readme_block("<!-- scaling-out:commands -->")',
        ),
        # The loop is tests/scripts/readme_loop.py (test_the_readme_loop_is_the_tested_script), run in one and two
        # processes there.
        "loop:start": (ROOT / "tests/processes/test_runtime_world.py", "readme_loop.train"),
        # The parallelize function is tests/scripts/mesh_world.py's (test_the_readme_parallelize_is_the_tested_one),
        # run in 4 processes by tests/processes/test_mesh_world.py.
        "mesh:parallelize": (ROOT / "tests/unit/test_readme.py", "def test_the_readme_parallelize_is_the_tested_one"),
    }
)
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
    assert languages.count("python") >= 8 and languages.count("sh") >= 10


def test_readme_matrix_is_generated_from_the_rules() -> None:
    text = README.read_text()
    start = text.index("<!-- matrix:start -->\n") + len("<!-- matrix:start -->\n")
    end = text.index("<!-- matrix:end -->")
    assert text[start:end].strip() == render_matrix().strip(), "regenerate with: trainplan matrix"


def _block(name: str) -> str:
    text = README.read_text()
    start = text.index(f"<!-- {name}:start -->\n") + len(f"<!-- {name}:start -->\n")
    return text[start : text.index(f"<!-- {name}:end -->")]


def test_readme_policies_are_generated_from_the_rules() -> None:
    """ "How a request is resolved" states the rows' policies in words (the accelerators' order, the `auto` rows, the
    default backends, the precision fallbacks, the clusters' detection order): a row changed without the README
    fails here."""
    regenerate = "regenerate with: python -c 'from trainplan.render.matrix import render_policies as r; print(r())'"
    assert _block("policies").strip() == render_policies().strip(), regenerate


def test_the_policy_sentences_follow_the_rows() -> None:
    def words(rules: Rules) -> str:
        return " ".join(render_policies(rules).split())

    fp16 = BUILTIN_RULES.precisions["16-mixed"]
    no_fallback = BUILTIN_RULES.extend(precisions=[attrs.evolve(fp16, fallback={}, fallback_why={})])
    assert "`16-mixed` on CPU falls back to `bf16-mixed`" in words(BUILTIN_RULES)
    assert "falls back" not in words(no_fallback)
    added = words(DOWNSTREAM_RULES)  # a downstream accelerator, first by its priority, with its own backend
    assert "(`auto`: NPU > XLA > CUDA" in added and "NPU → hccl" in added


def test_readme_starts_with_the_two_commands() -> None:
    head = "\n".join(README.read_text().splitlines()[:10])
    assert "make demo" in head and "make test" in head


def test_readme_lists_every_deliberate_difference() -> None:
    from trainplan.rules import DIFFERENCES

    text = README.read_text()
    for key, reason in DIFFERENCES.items():
        assert f"- **{key}:** {reason}" in text, f"README lacks the difference {key!r}"
    # And the other way: the README's list holds nothing that is not one of them.
    start = text.index("`rules.DIFFERENCES`; a test keeps this list identical):")
    section = text[start : text.index("\n## ", start)]
    listed = re.findall(r"^- \*\*([^*]+):\*\* ", section, flags=re.MULTILINE)
    assert listed == list(DIFFERENCES), "the README lists a difference DIFFERENCES lacks (or another order)"


def test_the_readme_loop_is_the_tested_script() -> None:
    text = README.read_text()
    block = text[text.index("<!-- loop:start -->") : text.index("<!-- loop:end -->")]
    code = block[block.index("```python\n") + len("```python\n") : block.rindex("```")]
    script = (ROOT / "tests" / "scripts" / "readme_loop.py").read_text()
    assert script == code, "the README's loop and tests/scripts/readme_loop.py differ"
    assert len([line for line in code.splitlines() if line.strip()]) <= 25


# --------------------------------------------------------------------------------------------------
# The runner itself: a wrong README fails it.

BROKEN = {
    "a wrong output": ("```python\n1 + 1\n# 3\n```\n", "shown 3, got 2"),
    "a failing script": ("<!-- file: boom.py -->\n```python\nraise SystemExit(3)\n```\n", "python boom.py exited 3"),
    "a missing print": ("<!-- file: quiet.py -->\n```python\nprint('a')  # b\n```\n", "never printed 'b'"),
    "a guard outside a file": ("```python\nif __name__ == '__main__':\n    pass\n```\n", "is a script"),
    "a failing command": ("```sh\ntrainplan plan --accelerator gpux\n```\n", "exited 2, the README says 0"),
    "a wrong exit code": ("```sh\ntrainplan matrix   # exits 2\n```\n", "exited 0, the README says 2"),
    "a line never printed": ("```sh\n$ trainplan matrix\n| `ddp` | nonsense |\n```\n", "never printed '| `ddp`"),
    "an unknown fence": ("```bash\ntrainplan matrix\n```\n", "a ```bash block is never run"),
    "a wrong session": ("```pycon\n>>> 1 + 1\n3\n```\n", "Expected:\n    3\nGot:\n    2"),
    "a stale run-elsewhere": ("<!-- elsewhere:gone -->\n```sh\ntrainplan matrix\n```\n", "no longer runs this"),
}


@pytest.mark.parametrize(("markdown", "complaint"), BROKEN.values(), ids=BROKEN.keys())
def test_the_runner_fails_a_wrong_readme(tmp_path: Path, markdown: str, complaint: str) -> None:
    document_path = tmp_path / "BROKEN.md"
    document_path.write_text(markdown)
    session = Session(elsewhere={"elsewhere:gone": (document_path, "a text this file lacks")})
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
    assert (session.outputs_checked, session.commands_run) == (6, 3)


def test_the_readme_parallelize_is_the_tested_one() -> None:
    text = README.read_text()
    block = text[text.index("<!-- mesh:parallelize -->") :]
    code = block[block.index("```python\n") + len("```python\n") : block.index("```\n", block.index("```python\n") + 3)]
    assert code in (ROOT / "tests" / "scripts" / "mesh_world.py").read_text()
