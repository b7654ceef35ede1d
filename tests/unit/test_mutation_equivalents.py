"""The equivalent mutants `make mutate` leaves out of its score (tests/mutation_equivalents.txt) are well formed, and
each still names the mutant it was written for: mutmut numbers a function's mutants in order, so an edit of the
function renumbers them, and a line that no longer matches would leave a real survivor out of the score."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mutation import EQUIVALENTS, PACKAGES, ROOT, Equivalent, Score, pattern, read_equivalents, score

mutmut = pytest.importorskip("mutmut")


def _source_of(name: str) -> Path:
    """The file a mutant name's module is in (`trainplan.resolve.steps.backend.x_f__mutmut_1` → its .py)."""
    parts = name.split(".")
    for end in range(len(parts) - 1, 1, -1):
        path = ROOT / "src" / Path(*parts[:end]).with_suffix(".py")
        if path.is_file():
            return path
    raise AssertionError(f"{name}: no module of src/ holds it")


def _added_line(name: str, path: Path, code: str) -> str:
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    diff = get_diff_for_mutant(name, source=code, path=path)
    added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert added, f"{name}: mutmut writes no such mutant"
    return added[0]


def test_every_equivalent_still_names_its_mutant(monkeypatch: pytest.MonkeyPatch) -> None:
    from mutmut.mutation.file_mutation import mutate_file_contents

    monkeypatch.chdir(ROOT)  # mutmut reads its configuration from the working directory
    entries = read_equivalents(EQUIVALENTS.read_text())
    by_file: dict[Path, list[Equivalent]] = {}
    for entry in entries:
        by_file.setdefault(_source_of(entry.name), []).append(entry)
    for path, listed in by_file.items():
        relative = path.relative_to(ROOT)
        assert relative.parts[:2] == ("src", "trainplan") and relative.parts[2] in PACKAGES, relative
        mutated = mutate_file_contents(str(relative), path.read_text())
        module = ".".join(relative.with_suffix("").parts[1:])
        names = {f"{module}.{local}" for local in mutated.mutant_names}
        for entry in listed:
            assert entry.name in names, f"{entry.name}: mutmut no longer writes it (renumbered? run make mutate)"
            assert _added_line(entry.name, relative, mutated.code) == entry.line, entry


def test_a_malformed_or_repeated_line_is_refused() -> None:
    good = "trainplan.resolve.x_f__mutmut_1 | return a >= b | a and b are never equal here"
    assert read_equivalents(f"# a comment\n\n{good}\n") == [
        Equivalent("trainplan.resolve.x_f__mutmut_1", "return a >= b", "a and b are never equal here")
    ]
    for bad in ("trainplan.resolve.x_f__mutmut_1 | return a >= b", "x_f | line | why", f"{good}\n{good}"):
        with pytest.raises(ValueError):
            read_equivalents(bad)


def test_the_score_leaves_out_equivalents_and_counts_what_has_not_run() -> None:
    found = [
        ("trainplan.resolve.a.x_f__mutmut_1", 1),
        ("trainplan.resolve.a.x_f__mutmut_2", 0),
        ("trainplan.resolve.a.x_f__mutmut_3", 0),
        ("trainplan.resolve.a.x_f__mutmut_4", 33),
        ("trainplan.resolve.a.x_f__mutmut_5", None),
        ("trainplan.resolve.a.x_f__mutmut_6", 36),
        ("trainplan.rules.b.x_g__mutmut_1", 0),
    ]
    result = score(found, [pattern("resolve/a")], {"trainplan.resolve.a.x_f__mutmut_3"})
    assert result == Score(
        killed=2,
        survivors=("trainplan.resolve.a.x_f__mutmut_2", "trainplan.resolve.a.x_f__mutmut_4"),
        equivalent=1,
        not_run=1,
    )
    assert result.line() == (
        "mutation score 50.0%: 2 of 4 mutants killed, 2 survived, 1 equivalent left out; 1 not run yet"
    )
    with pytest.raises(SystemExit):
        pattern("effects/launching")
