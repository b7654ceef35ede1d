"""`kill -9` of a launcher at a random moment leaves nothing behind: no process and no temporary file, within
`BOUND` seconds, for a `tp.launch` caller on every launcher (fork; spawn as it is where no forkserver runs; spawn
served by a forkserver; subprocess) and for `trainplan launch`.

Each case is killed twice: once at a random moment of its first 1.5 s (importing, resolving) and once at a random
moment of the 1.5 s after it says it launches (the lifeline and the forkserver starting, workers being forked or
spawned, workers starting what they leave behind). Each worker starts, besides children in its process group and in
a session of their own, two processes that only their ancestry ties to the launch (`LINGER=sides` in
`tests/scripts/lingering.py`: an empty environment, a session of their own). What is searched for afterwards: every
process whose environment or command line carries the test's marker, and every process in the killed launcher's
session or process group; the launch's temporary directory (`TMPDIR`) must be empty. Survivors are killed, so that a
failing test leaves nothing either.

And the watcher sees the launcher die even while another process holds a copy of its end of the pipe (a launcher's
side process that inherited it): it watches the launcher's pidfd, not only the pipe."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers import alive, child_environment

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "scripts" / "lingering.py")
TRAINPLAN = [sys.executable, "-c", "import sys; from _trainplan_entry import main; sys.exit(main())"]
BOUND = 5.0
"""Seconds after the kill within which nothing may be left (the README's bound)."""
WINDOW = 1.5
"""The random moment of the kill is within this many seconds of the start, or of the launch."""

CALLERS = {
    "fork": [sys.executable, SCRIPT, "ddp_fork"],
    "spawn": [sys.executable, SCRIPT, "ddp_spawn", "no-forkserver"],
    "spawn+forkserver": [sys.executable, SCRIPT, "ddp_spawn"],
    "subprocess": [sys.executable, SCRIPT, "ddp"],
    "trainplan launch": [*TRAINPLAN, "launch", "--accelerator", "cpu", "--devices", "2", SCRIPT],
}


def _stat(pid: str) -> tuple[int, int] | None:
    """(process group, session) of a running process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[2]), int(fields[3])


def _left(mark: str, launcher: int) -> list[int]:
    """Every live process with the marker in its environment or command line, or in the launcher's group or
    session."""
    needle = f"LINGER_MARK={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            words = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            words += Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ids = _stat(entry)
        if (needle in words or (ids is not None and launcher in ids)) and alive(int(entry)):
            found.append(int(entry))
    return found


def _start(command: list[str], mark: str, tmp: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=child_environment(LINGER_MARK=mark, LINGER="sides", TMPDIR=str(tmp)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # trainplan launch says it launches there
        text=True,
        start_new_session=True,
    )


def _wait_for_line(process: subprocess.Popen[str], word: str, timeout: float = 120.0) -> bool:
    """Read until a line with `word` (True), or the end of the output (False)."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            return False
        if word in line:
            return True
    raise AssertionError(f"no {word!r} line within {timeout} s")


def _nothing_left(mark: str, launcher: int, tmp: Path, killed_at: float) -> tuple[list[int], list[str]]:
    """What is still there `BOUND` seconds after the kill: processes (then killed) and temporary files."""
    deadline = killed_at + BOUND
    while (_left(mark, launcher) or any(tmp.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.1)
    processes = _left(mark, launcher)
    for pid in processes:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return processes, sorted(path.name for path in tmp.iterdir())


@pytest.mark.parametrize("moment", ["start", "launch"])
@pytest.mark.parametrize("launcher", list(CALLERS))
def test_kill_9_at_a_random_moment_leaves_nothing(launcher: str, moment: str, tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    delay = random.uniform(0.0, WINDOW)
    process = _start(CALLERS[launcher], mark, tmp_path)
    word = "trainplan:" if launcher == "trainplan launch" else "LAUNCH"
    if moment == "launch" and not _wait_for_line(process, word):
        pytest.fail(f"{launcher} ended before it launched")
    time.sleep(delay)
    process.kill()
    killed_at = time.monotonic()
    process.wait(30)
    processes, files = _nothing_left(mark, process.pid, tmp_path, killed_at)
    when = f"killed {delay:.2f} s after its {moment}"
    assert processes == [], f"{launcher}, {when}: processes left after {BOUND} s"
    assert files == [], f"{launcher}, {when}: temporary files left after {BOUND} s"


_HOLDER = """
import os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from trainplan.effects.lifeline import Lifeline
lifeline = Lifeline()
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
worker = subprocess.Popen(sleep, env={**os.environ, **lifeline.variables})
lifeline.watch(worker.pid)
holder = subprocess.Popen(sleep, pass_fds=(lifeline._pipe,), env={}, start_new_session=True)
print(worker.pid, holder.pid, flush=True)
time.sleep(120)
"""


def test_the_launcher_death_is_seen_while_another_process_holds_its_pipe() -> None:
    caller = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(ROOT / "src")],
        env=child_environment(),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert caller.stdout is not None
    worker, holder = (int(word) for word in caller.stdout.readline().split())
    try:
        assert alive(worker)
        caller.kill()
        caller.wait(30)
        deadline = time.monotonic() + BOUND
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(worker), "the watcher waited for a pipe that another process kept open"
        assert alive(holder)  # not the launch's: left alone
    finally:
        for pid in (worker, holder):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
