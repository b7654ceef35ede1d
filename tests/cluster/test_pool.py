"""The cluster suite's pool leaves nothing behind: a scenario that raises, or one still running when the session is
interrupted, has what it started stopped (an MPI rank of the clusters page's jobs was once left running). Runs
without the engines: the commands are plain processes."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster import harness


@pytest.fixture
def registered() -> Iterator[Callable[[str, Callable[[harness.Job], harness.Run]], None]]:
    names: list[str] = []

    def register(name: str, run: Callable[[harness.Job], harness.Run]) -> None:
        harness.SCENARIOS[name] = harness.Scenario(name, run)
        names.append(name)

    yield register
    for name in names:
        del harness.SCENARIOS[name]


def _sleeper(job: harness.Job, started: threading.Event, marks: list[str]) -> None:
    marks.append(job.mark)
    job.spawn(["sleep", "300"])
    started.set()


def _marked_once_started(mark: str) -> list[int]:
    """The marked processes, once the command has exec'd (a child not yet past exec carries its parent's environment,
    without the mark): polled, bounded."""
    deadline = time.monotonic() + 60.0
    while not (found := harness.marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid, _ in found]


def test_a_scenario_that_raises_has_its_commands_stopped(
    tmp_path: Path, registered: Callable[[str, Callable[[harness.Job], harness.Run]], None]
) -> None:
    started, marks = threading.Event(), list[str]()

    def run(job: harness.Job) -> harness.Run:
        _sleeper(job, started, marks)
        raise RuntimeError("the scenario broke after starting its command")

    registered("pool-test-raises", run)
    pool = harness.Pool(["pool-test-raises"], tmp_path, workers=1)
    try:
        with pytest.raises(RuntimeError, match="broke"):
            pool.result("pool-test-raises", timeout=60)
        assert harness.marked_processes(marks[0]) == []
    finally:
        pool.close(interrupted=True)
        harness._signal_all([pid for pid, _ in harness.marked_processes(marks[0])], signal.SIGKILL)


def test_closing_an_interrupted_pool_stops_the_commands_of_its_running_scenarios(
    tmp_path: Path, registered: Callable[[str, Callable[[harness.Job], harness.Run]], None]
) -> None:
    started, marks = threading.Event(), list[str]()

    def run(job: harness.Job) -> harness.Run:
        _sleeper(job, started, marks)
        job.wait(300)
        return job.finish()

    registered("pool-test-sleeps", run)
    pool = harness.Pool(["pool-test-sleeps"], tmp_path, workers=1)
    try:
        assert started.wait(60)
        (pid,) = _marked_once_started(marks[0])
        pool.close(interrupted=True)  # what the session fixture does after Ctrl-C
        assert harness.marked_processes(marks[0]) == []
        assert not [thread for thread in pool._threads if thread.is_alive()]
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        pool.close(interrupted=True)  # a failed assertion above leaves nothing running either
        harness._signal_all([pid for pid, _ in harness.marked_processes(marks[0])], signal.SIGKILL)
