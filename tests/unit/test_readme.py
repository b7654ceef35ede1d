"""The README stays true: its compatibility tables are exactly what `trainplan matrix` prints."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from trainplan.resolve.matrix import render_matrix

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_matrix_is_generated_from_the_rules() -> None:
    text = README.read_text()
    start = text.index("<!-- matrix:start -->\n") + len("<!-- matrix:start -->\n")
    end = text.index("<!-- matrix:end -->")
    assert text[start:end].strip() == render_matrix().strip(), "regenerate with: trainplan matrix"


def test_readme_starts_with_the_two_commands() -> None:
    head = "\n".join(README.read_text().splitlines()[:10])
    assert "make demo" in head and "make test" in head


def test_readme_lists_every_deliberate_difference() -> None:
    from trainplan.spec.tables import DIFFERENCES

    text = README.read_text()
    for key, reason in DIFFERENCES.items():
        assert f"- **{key}:** {reason}" in text, f"README lacks the difference {key!r}"


def test_the_readmes_emitted_jobs_are_what_trainplan_prints(capsys: pytest.CaptureFixture[str]) -> None:
    from trainplan.cli import main

    text = README.read_text()
    block = text[text.index("### Emitted jobs") :]
    block = block[block.index("```sh\n") + len("```sh\n") : block.index("\n```", block.index("```sh\n"))]
    printed: list[str] = []
    for line in block.splitlines():
        if line.startswith("$ trainplan "):
            assert main(shlex.split(line.removeprefix("$ trainplan "))) == 0
            printed += capsys.readouterr().out.splitlines()
        elif line != "...":
            assert line in printed, f"the README shows {line!r}, which trainplan does not print"


def test_the_readme_loop_is_the_tested_script() -> None:
    text = README.read_text()
    block = text[text.index("<!-- loop:start -->") : text.index("<!-- loop:end -->")]
    code = block[block.index("```python\n") + len("```python\n") : block.rindex("```")]
    script = (README.parent / "tests" / "scripts" / "readme_loop.py").read_text()
    assert script == code, "the README's loop and tests/scripts/readme_loop.py differ"
    assert len([line for line in code.splitlines() if line.strip()]) <= 25


def test_the_readmes_parallel_layout_example_runs_as_shown() -> None:
    import doctest

    text = README.read_text()
    block = text[text.index("<!-- mesh:start -->") : text.index("<!-- mesh:end -->")]
    code = block[block.index("```pycon\n") + len("```pycon\n") : block.rindex("```")]
    test = doctest.DocTestParser().get_doctest(code, {}, "README parallel layouts", str(README), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    failures: list[str] = []
    runner.run(test, out=failures.append)
    assert runner.failures == 0 and test.examples, "".join(failures)
