"""Settings every test shares.

Hypothesis keeps no example database here: an example it finds that fails is printed (with the blob that replays
it) and must be written into the test as an `@example`, so that a failure found once on one machine never hides in
a local `.hypothesis/` folder, replayed on every later run there and never on CI's fresh clone (the way
`trainplan launch -1 ''` once made the command-line fuzz test fail on a clean tree).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

SUMMARY_KEY = "trainplan_summary"
"""Where a pytest-xdist worker leaves the lines its session summary would print (the cluster suite's times): the
controller prints them."""

_from_workers: list[str] = []

settings.register_profile("trainplan", database=None, print_blob=True)
# `make mutate` (tests/mutation.py) runs the same tests many times in one process under mutmut: the same examples
# every time (a mutant's verdict repeats), no deadline (a mutant may be slow), and no complaint that a test class's
# method ran from more than one instance (mutmut collects and runs the suite more than once).
settings.register_profile(
    "mutation",
    parent=settings.get_profile("trainplan"),
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.differing_executors],
)
settings.load_profile("mutation" if os.environ.get("TRAINPLAN_MUTATION") else "trainplan")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    for line in getattr(node, "workeroutput", {}).get(SUMMARY_KEY, []):
        if line not in _from_workers:
            _from_workers.append(line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _from_workers:
        terminalreporter.write_line(line, yellow="skipped" in line)
