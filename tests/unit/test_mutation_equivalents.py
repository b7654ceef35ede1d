"""The equivalent mutants `make mutate` leaves out of its score (tests/mutation_equivalents.txt) are well formed, and
each still names the mutant it was written for: mutmut numbers a function's mutants in order, so an edit of the
function renumbers them, and a line that no longer matches would leave a real survivor out of the score."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.mutation import (
    EQUIVALENTS,
    PACKAGES,
    ROOT,
    Equivalent,
    Score,
    pattern,
    read_equivalents,
    sample,
    sample_line,
    score,
    wilson_interval,
)

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


def test_a_sample_is_the_same_for_the_same_seed_and_names_in_any_order() -> None:
    names = [f"trainplan.resolve.a.x_f__mutmut_{number}" for number in range(1, 101)]
    drawn = sample(names, 10, seed=7)
    assert drawn == sample(list(reversed(names)), 10, seed=7) == sample([*names, *names], 10, seed=7)
    assert len(set(drawn)) == 10 and set(drawn) <= set(names) and drawn == sorted(drawn)
    assert sample(names, 10, seed=8) != drawn
    assert sample(names, 500, seed=7) == sorted(names)
    with pytest.raises(SystemExit, match="at least one"):
        sample(names, 0, seed=7)


def test_a_sample_draws_every_mutant_alike() -> None:
    names = [f"m{number}" for number in range(10)]
    counts = dict.fromkeys(names, 0)
    for seed in range(2000):
        for name in sample(names, 3, seed):
            counts[name] += 1
    # each is drawn with probability 3/10: 600 of 2000 expected, and 5 standard deviations (about 100) allowed
    assert all(500 < count < 700 for count in counts.values()), counts


def test_the_wilson_interval_matches_its_published_values() -> None:
    # Newcombe (1998), table I: 81 of 263 gives 0.2553-0.3662; 15 of 148 gives 0.0624-0.1605
    for (successes, trials), (low, high) in {(81, 263): (0.2553, 0.3662), (15, 148): (0.0624, 0.1605)}.items():
        found = wilson_interval(successes, trials)
        assert found == pytest.approx((low, high), abs=5e-5)
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=5e-5)
    low, high = wilson_interval(10, 10)
    assert (low, high) == pytest.approx((0.7225, 1.0), abs=5e-5)
    for bad in ((3, 2), (-1, 2), (0, 0)):
        with pytest.raises(ValueError):
            wilson_interval(*bad)


def test_the_sample_line_gives_the_score_and_its_interval() -> None:
    result = Score(killed=135, survivors=tuple(f"m{number}" for number in range(10)), equivalent=5, not_run=0)
    assert sample_line(result, 150, 10638, seed=1) == (
        "mutation score 93.1%: 135 of 145 mutants killed, 10 survived, 5 equivalent left out; "
        "95% Wilson interval 87.8-96.2% (a seeded sample of 150 of 10638 mutants, seed 1)"
    )


def test_mutmut_runs_no_test_that_reads_the_tree_outside_tests_and_src() -> None:
    """mutmut runs the tests in mutants/, which holds tests/, pyproject.toml and the trampolined src/ only: a test of
    its selection that reads the README, the docs, tools/, the benchmarks or the source's own text fails there, and
    one failure in mutmut's stats run stops every `make mutate` ("failed to collect stats. runner returned 1")."""
    mutmut_section = (ROOT / "pyproject.toml").read_text().partition("[tool.mutmut]")[2].partition("\n[")[0]
    ignored = set(re.findall(r'"--ignore=([^"]+)"', mutmut_section))
    reaches = re.compile(
        r'^(from|import) (tools|benchmarks)\b|README\.md|mkdocs\.yml|ROOT / "(src|docs|benchmarks|tools)"', re.M
    )
    selected = [path for folder in ("unit", "property") for path in sorted((ROOT / "tests" / folder).glob("test_*.py"))]
    readers = {str(path.relative_to(ROOT)) for path in selected if reaches.search(path.read_text())}
    assert readers and readers <= ignored, f"add to [tool.mutmut] pytest_add_cli_args: {sorted(readers - ignored)}"
