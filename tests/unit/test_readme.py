"""The README stays true: its compatibility tables are exactly what `trainplan matrix` prints."""

from __future__ import annotations

from pathlib import Path

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
