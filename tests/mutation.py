"""`make mutate`: mutation testing of the resolver and the rules (src/trainplan/resolve, src/trainplan/rules).

mutmut (its configuration: `[tool.mutmut]` in pyproject.toml) writes each single-point mutant of those packages
into `mutants/` and runs, for each, only the fast tests (unit and property) that call the function it changed,
from a fork server, stopping at the first failure. A mutant no test fails is a rule no test pins.

    python -m tests.mutation run [SHARD ...]     mutate and test SHARD (a path under src/trainplan, as
                                                 `resolve/steps` or `rules/coherence`; none: all of both)
    python -m tests.mutation score [SHARD ...]   the score of what has been run, and the survivors
    python -m tests.mutation sample N --seed S   mutate and test a seeded random sample of N of all the mutants
                                                 of both packages; print its score with a Wilson 95% interval

The score is killed / (killed + survived + untested), where a timeout counts as killed (mutmut's rule) and the
equivalent mutants listed in tests/mutation_equivalents.txt are left out: a mutant is equivalent when no input
can tell it from the original, and each line says why. Mutants not run yet are counted apart, so a score over
part of the shards says so. `make mutate` is not part of `make test`: over both packages it runs for hours on two
cores, so it runs in shards (`make mutate MUTANTS=resolve/steps`), whose results mutmut keeps in `mutants/`, or as
a sample (`make mutate-sample N=150 SEED=1`): the same seed and source give the same mutants, and the interval says
how far the whole score may be from the sample's. Leave src/ as it is while mutmut writes the mutants (minutes on
a shared machine): it tells a stale mutant file by modification times alone, and one written from a source read
before a change (a rebase in the middle) is kept as current, so the tests run against the old code and fail.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("resolve", "rules")
"""What `make mutate` mutates, under src/trainplan (pyproject's `only_mutate` says the same)."""
EQUIVALENTS = ROOT / "tests" / "mutation_equivalents.txt"
RESULTS = ROOT / "mutants" / "src" / "trainplan"

KILLED = frozenset({1, 3, 24, -24, 36, 37, 152, 255, -9, -11})
"""mutmut's exit codes for a mutant some test failed on (a test's failure, pytest's internal error, a timeout, a
type error, a crash)."""
SURVIVED = 0
UNTESTED = frozenset({5, 33})
"""No test calls the function the mutant changed: it survives, and says so."""


@dataclass(frozen=True)
class Equivalent:
    """One line of tests/mutation_equivalents.txt: `NAME | LINE | WHY`, LINE being the line as the mutant writes
    it (so that a mutant renumbered by an edit of its function no longer matches)."""

    name: str
    line: str
    why: str


def read_equivalents(text: str) -> list[Equivalent]:
    """The entries of an equivalents file; a malformed line is a ValueError naming it."""
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        name, sep, rest = raw.partition(" | ")
        line, sep2, why = rest.rpartition(" | ")
        if not (sep and sep2 and name.strip() and line.strip() and why.strip()):
            raise ValueError(f"line {number}: expected 'NAME | MUTATED LINE | WHY', got {raw!r}")
        if "__mutmut_" not in name or not name.startswith("trainplan."):
            raise ValueError(f"line {number}: {name!r} is not a mutmut mutant of trainplan")
        entries.append(Equivalent(name.strip(), line.strip(), why.strip()))
    names = [entry.name for entry in entries]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"listed twice: {twice}")
    return entries


def pattern(shard: str) -> str:
    """mutmut's glob for the mutants of SHARD (`resolve/steps` → `trainplan.resolve.steps.*`)."""
    dotted = shard.strip("/").removesuffix(".py").replace("/", ".")
    if dotted.split(".")[0] not in PACKAGES:
        raise SystemExit(f"make mutate: {shard!r} is not under {' or '.join(PACKAGES)} (src/trainplan/...)")
    return f"trainplan.{dotted}.*"


def results() -> Iterator[tuple[str, int | None]]:
    """Every mutant mutmut has written, with its exit code (None: not run yet)."""
    for meta in sorted(RESULTS.rglob("*.py.meta")):
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        yield from codes.items()


@dataclass(frozen=True)
class Score:
    killed: int
    survivors: tuple[str, ...]
    equivalent: int
    not_run: int

    @property
    def counted(self) -> int:
        return self.killed + len(self.survivors)

    def line(self) -> str:
        if not self.counted:
            return f"no mutant run yet ({self.not_run} written)"
        percent = 100 * self.killed / self.counted
        rest = f"; {self.not_run} not run yet" if self.not_run else ""
        return (
            f"mutation score {percent:.1f}%: {self.killed} of {self.counted} mutants killed, "
            f"{len(self.survivors)} survived, {self.equivalent} equivalent left out{rest}"
        )


def score(found: Iterable[tuple[str, int | None]], patterns: Sequence[str], equivalent: set[str]) -> Score:
    killed, survivors, left_out, not_run = 0, [], 0, 0
    for name, code in found:
        if not any(fnmatch(name, each) for each in patterns):
            continue
        if name in equivalent:
            left_out += 1
        elif code is None:
            not_run += 1
        elif code in KILLED:
            killed += 1
        elif code == SURVIVED or code in UNTESTED:
            survivors.append(name)
        else:  # mutmut's "suspicious" or "interrupted": not a verdict
            not_run += 1
    return Score(killed, tuple(sorted(survivors)), left_out, not_run)


def sample(names: Sequence[str], size: int, seed: int) -> list[str]:
    """`size` of `names` drawn at random without replacement, the same for the same names and seed (in any order),
    sorted; all of them when there are no more."""
    if size < 1:
        raise SystemExit(f"make mutate-sample: N={size}: the sample needs at least one mutant")
    population = sorted(set(names))
    return sorted(random.Random(seed).sample(population, min(size, len(population))))


Z_95 = 1.959963984540054
"""The standard normal quantile of 0.975: a two-sided 95% interval."""


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a proportion `successes / trials` (as fractions): unlike the normal
    approximation it stays inside [0, 1] and is not empty at 0 or `trials` successes."""
    if not 0 <= successes <= trials or trials < 1:
        raise ValueError(f"a proportion of {successes} in {trials} trials has no interval")
    p = successes / trials
    square = z * z
    centre = (p + square / (2 * trials)) / (1 + square / trials)
    half = z * math.sqrt(p * (1 - p) / trials + square / (4 * trials * trials)) / (1 + square / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def sample_line(result: Score, drawn: int, total: int, seed: int) -> str:
    """The sample's score, with the interval the whole score lies in at 95% confidence."""
    if not result.counted:
        return f"sample of {drawn} (seed {seed}): {result.line()}"
    low, high = wilson_interval(result.killed, result.counted)
    return (
        f"{result.line()}; 95% Wilson interval {100 * low:.1f}-{100 * high:.1f}% "
        f"(a seeded sample of {drawn} of {total} mutants, seed {seed})"
    )


def refresh_copies() -> None:
    """mutmut copies src/ into mutants/ once and re-mutates only the files it mutates: drop the copies of the other
    files that src/ has changed since, and any copy a stopped run left empty, so that the next run writes them
    again."""
    for copy in (ROOT / "mutants" / "src").rglob("*.py"):
        source = ROOT / copy.relative_to(ROOT / "mutants")
        if source.exists() and copy.stat().st_size == 0 < source.stat().st_size:  # a run stopped while writing it
            copy.unlink()
            copy.with_name(copy.name + ".meta").unlink(missing_ok=True)
            continue
        package = source.relative_to(ROOT / "src").parts[1:2]
        if package and package[0] in PACKAGES:
            continue
        if not source.exists() or source.stat().st_mtime != copy.stat().st_mtime:
            copy.unlink()


def run_mutmut(names: Sequence[str], children: int) -> None:
    """`mutmut run` over `names` (mutants, or globs of them), in the repository."""
    # TRAINPLAN_MUTATION: Hypothesis's mutation profile (tests/conftest.py). One OpenMP thread: the fork server
    # imports the tests, and a test module that computes with torch as it loads starts OpenMP's thread pool,
    # which a forked worker then waits on forever.
    environment = dict(os.environ, TRAINPLAN_MUTATION="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    refresh_copies()
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(children), *names]
    shown = command if len(names) <= 4 else [*command[:6], f"... ({len(names)} mutants)"]
    print("+", " ".join(shown), flush=True)
    subprocess.run(command, cwd=ROOT, env=environment, check=False)


GENERATE = """
import os, mutmut.__main__ as m
m.set_mutant_under_test("mutant_generation")
os.makedirs("mutants", exist_ok=True)
m.copy_src_dir(); m.copy_also_copy_files(); m.setup_source_paths(); m.store_lines_covered_by_tests()
m.create_mutants({children})
"""
"""The first step of `mutmut run` alone (mutmut 3's own functions, in its order): write every mutant into mutants/,
and its name into the .meta files `results` reads, without testing any. `mutmut run` then finds them written."""


def generate(children: int) -> list[str]:
    """Every mutant of resolve/ and rules/, by the names `mutmut run` takes, as mutmut writes them into mutants/:
    one pass of its mutator, which `mutmut run` then finds done."""
    refresh_copies()
    command = [sys.executable, "-c", GENERATE.format(children=children)]
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return sorted(name for name, _ in results())


def run_sample(words: Sequence[str], seed: int, children: int) -> int:
    """`sample N`: test a seeded sample of N mutants of resolve/ and rules/ and print its score and interval."""
    if len(words) != 1 or not words[0].isdigit():
        raise SystemExit(f"make mutate-sample: expected one count N, got {' '.join(words) or 'nothing'}")
    everything = generate(children)
    drawn = sample(everything, int(words[0]), seed)
    print(f"sampled {len(drawn)} of {len(everything)} mutants (seed {seed})", flush=True)
    run_mutmut(drawn, children)
    equivalent = {entry.name for entry in read_equivalents(EQUIVALENTS.read_text())}
    chosen = set(drawn)
    result = score(((name, code) for name, code in results() if name in chosen), ["*"], equivalent)
    for name in result.survivors:
        print(f"survived: {name}   (python -m mutmut show {name})")
    print(sample_line(result, len(drawn), len(everything), seed))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("run", "score", "sample"))
    parser.add_argument(
        "shards", nargs="*", help="paths under src/trainplan, e.g. resolve/steps (default: all); sample: N"
    )
    parser.add_argument("--children", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--seed", type=int, default=1, help="sample: the random seed (default 1)")
    arguments = parser.parse_args(argv)
    if arguments.command == "sample":
        return run_sample(arguments.shards, arguments.seed, arguments.children)
    patterns = [pattern(shard) for shard in arguments.shards or PACKAGES]
    if arguments.command == "run":
        run_mutmut(patterns, arguments.children)
    equivalent = {entry.name for entry in read_equivalents(EQUIVALENTS.read_text())}
    result = score(results(), patterns, equivalent)
    for name in result.survivors:
        print(f"survived: {name}   (python -m mutmut show {name})")
    print(result.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
