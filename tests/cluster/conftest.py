"""The cluster suite's engines and scenarios (see tests/cluster/test_real_engines.py).

- Engines absent (no SLURM, Open MPI or MPICH commands here): every `cluster` test is skipped with one reason, and
  the session's summary says how many and why. With TRAINPLAN_REQUIRE_ENGINES=1 (CI) their absence fails instead.
- Engines installed: the session reuses a running SLURM (`engines.sh status` says ready), or starts it with
  `engines.sh start` and stops it at the end, only then (other users may share the daemons).
- The scenarios the selected tests read run in a `Pool`, a few at a time, from the first test on; each test waits
  for its own.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import harness
from tests.conftest import SUMMARY_KEY

REQUIRE_VARIABLE = "TRAINPLAN_REQUIRE_ENGINES"
WORKERS = int(os.environ.get("TRAINPLAN_CLUSTER_WORKERS", "3"))
"""How many scenarios run at once (the machine's CPUs are the limit; most of a scenario is importing torch)."""

_state: dict[str, object] = {}


def _required() -> bool:
    return os.environ.get(REQUIRE_VARIABLE) == "1"


def _absent_reason(missing: list[str]) -> str:
    return (
        f"the real cluster engines are not installed (missing: {', '.join(missing)}); "
        "`sudo tests/cluster/engines.sh install` installs SLURM, Open MPI and MPICH "
        f"({REQUIRE_VARIABLE}=1 makes their absence a failure)"
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "scenario(name): the real-engine scenario a cluster test reads")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cluster = [item for item in items if item.get_closest_marker("cluster") is not None]
    _state["selected"] = len(cluster)
    missing = harness.missing_engines()
    if not cluster or not missing or _required():
        return
    reason = _absent_reason(missing)
    skip = pytest.mark.skip(reason=reason)
    for item in cluster:
        item.add_marker(skip)
    _state["skipped"] = (len(cluster), reason)


def _summary() -> list[str]:
    """What the session's summary says of the cluster suite: skipped tests and why, or the scenarios' times."""
    lines: list[str] = []
    skipped = _state.get("skipped")
    if isinstance(skipped, tuple):
        count, reason = skipped
        lines.append(f"cluster suite: {count} test(s) skipped: {reason}")
    pool = _state.get("pool")
    if isinstance(pool, harness.Pool) and pool.times:
        slowest = sorted(pool.times.items(), key=lambda item: -item[1][1])
        listed = ", ".join(f"{name} {seconds:.0f}s" for name, (_, seconds) in slowest)
        retried = {name: run.notes.get("attempts") for name, run in pool.done.items() if isinstance(run, harness.Run)}
        retried = {name: attempts for name, attempts in retried.items() if attempts != 1}
        lines.append(
            f"cluster suite: {len(pool.times)} scenario(s), {WORKERS} at a time, {pool.wall:.0f} s wall "
            f"(session fixture to last scenario: {float(str(_state.get('engines_seconds', 0))) + pool.wall:.0f} s); "
            f"each: {listed}"
        )
        if retried:
            lines.append(f"cluster suite: started again after SLURM could not lay out a step's tasks: {retried}")
    return lines


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Under pytest-xdist the suite (one file) runs in one worker: its summary travels to the controller,
    # which prints it (tests/conftest.py).
    output = getattr(session.config, "workeroutput", None)
    if isinstance(output, dict):
        output[SUMMARY_KEY] = [*output.get(SUMMARY_KEY, []), *_summary()]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _summary():
        terminalreporter.write_line(line, yellow="skipped" in line)


@pytest.fixture(scope="session")
def engines() -> Iterator[None]:
    """SLURM running (reused, or started here and stopped at the end), Open MPI and MPICH installed."""
    begun = time.monotonic()
    missing = harness.missing_engines()
    if missing:
        pytest.fail(f"{REQUIRE_VARIABLE}=1, but {_absent_reason(missing)}", pytrace=False)
    status = subprocess.run([str(harness.ENGINES), "status"], capture_output=True, text=True, timeout=60, check=False)
    started = False
    if status.returncode != 0:
        if os.geteuid() != 0:
            message = (
                "SLURM is installed but not running, and starting it needs root: `sudo tests/cluster/engines.sh start`"
            )
            if _required():
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        start = subprocess.run(
            [str(harness.ENGINES), "start"], capture_output=True, text=True, timeout=300, check=False
        )
        if start.returncode != 0:
            pytest.fail(f"tests/cluster/engines.sh start failed ({start.returncode}):\n{start.stderr}", pytrace=False)
        started = start.stdout.strip().endswith("started")
    _state["engines_seconds"] = time.monotonic() - begun
    try:
        yield
    finally:
        if started:
            subprocess.run([str(harness.ENGINES), "stop"], capture_output=True, timeout=120, check=False)


@pytest.fixture(scope="session")
def scenarios(request: pytest.FixtureRequest, engines: None) -> Iterator[harness.Pool]:
    """The pool that runs the scenarios of the selected cluster tests, in their order."""
    names: list[str] = []
    for item in request.session.items:
        marker = item.get_closest_marker("scenario")
        if marker is not None and item.get_closest_marker("skip") is None:
            names.extend(str(name) for name in marker.args)
    kept = os.environ.get("TRAINPLAN_CLUSTER_DIR")  # keep the jobs' folders (records, outputs) to read afterwards
    with tempfile.TemporaryDirectory(prefix="trainplan-cluster-") as folder:
        base = Path(kept) if kept else Path(folder)
        base.mkdir(parents=True, exist_ok=True)
        pool = harness.Pool(names, base, workers=WORKERS)
        _state["pool"] = pool
        try:
            yield pool
        finally:
            pool.close(interrupted=request.session.exitstatus == pytest.ExitCode.INTERRUPTED)
