"""Nothing outlives its launcher, however it dies: `kill -9` of `trainplan launch` or of a `tp.launch` caller on
each launcher, a hang-up or repeated SIGTERM while `trainplan launch` reaps, a grandchild that re-spawns itself,
Ctrl-C in the first second, and a reader that goes away (the same on every launcher: the run goes on).

Every process a test starts carries a marker variable; afterwards /proc is searched for it (and any survivor is
killed, so that a failing test leaves nothing either)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import alive, child_environment

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "scripts" / "lingering.py")
TRAINPLAN = [sys.executable, "-c", "import sys; from _trainplan_entry import main; sys.exit(main())"]


def _marked(mark: str) -> list[int]:
    found = []
    needle = f"LINGER_MARK={mark}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environment = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in environment.split(b"\0") and alive(int(entry)):
            found.append(int(entry))
    return found


def _gone_within(mark: str, seconds: float) -> list[int]:
    """The marked processes still alive after `seconds` (killed then, so that nothing is left either way)."""
    deadline = time.monotonic() + seconds
    left = _marked(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _marked(mark)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


def _start(command: list[str], mark: str, tmp: Path, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=child_environment(LINGER_MARK=mark, TMPDIR=str(tmp), **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C reaches the child as it would from a terminal (a background job's SIGINT would be ignored).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509  # the test runs no threads
        start_new_session=True,
    )


def _wait_ready(process: subprocess.Popen[str], count: int, timeout: float = 120.0) -> list[str]:
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while sum("READY" in line for line in lines) < count:
        assert time.monotonic() < deadline, f"no {count} READY lines: {lines}"
        line = process.stdout.readline()
        assert line, f"the launcher ended first: {lines}"
        lines.append(line)
    return lines


def _launch(tmp: Path, mark: str, *flags: str, linger: str = "sleep") -> subprocess.Popen[str]:
    command = [*TRAINPLAN, "launch", "--accelerator", "cpu", "--devices", "2", *flags, SCRIPT]
    return _start(command, mark, tmp, LINGER=linger)


@pytest.mark.parametrize("strategy", ["ddp_fork", "ddp_spawn", "ddp"])
def test_kill_9_of_a_launch_caller_leaves_nothing(strategy: str, tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    caller = _start([sys.executable, SCRIPT, strategy], mark, tmp_path)
    _wait_ready(caller, 2)
    caller.kill()
    caller.wait(10)
    assert _gone_within(mark, 5.0) == [], "workers or their children outlived the killed caller"
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A TMPDIR short enough for the forkserver's socket under it (AF_UNIX paths: 108 bytes): pytest's own tmp_path,
    under xdist, is too long, and spawn then starts its workers unserved."""
    path = Path(tempfile.mkdtemp(prefix="tpl-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp_fork", "ddp_spawn-unserved"])
def test_kill_9_of_a_caller_between_launches_leaves_nothing(strategy: str, short_tmp: Path) -> None:
    """A spawn launch keeps its forkserver for the next one; a kill -9 of the caller after the launch returned left
    the server's socket directory (pymp-*) in TMPDIR. Unserved (no forkserver on the platform, or a TMPDIR too long
    for its socket), the directory spawn's resource tracker was given stayed too."""
    mark = uuid.uuid4().hex
    unserved = ["no-forkserver"] if strategy.endswith("-unserved") else []
    command = [sys.executable, SCRIPT, strategy.removesuffix("-unserved"), *unserved, "then-wait"]
    caller = _start(command, mark, short_tmp, LINGER="quick")
    assert caller.stdout is not None
    deadline = time.monotonic() + 120
    while "DONE" not in caller.stdout.readline():
        assert time.monotonic() < deadline and caller.poll() is None, "the launch did not return"
    caller.kill()
    caller.wait(10)
    assert _gone_within(mark, 5.0) == []
    deadline = time.monotonic() + 5.0
    while list(short_tmp.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(short_tmp.iterdir()) == []


def test_kill_9_of_trainplan_launch_leaves_nothing(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    launcher = _launch(tmp_path, mark)
    _wait_ready(launcher, 2)
    # The workers' log directory, and the directory of the forkserver's socket (the workers are forked from it).
    assert sorted(path.name[:17] for path in tmp_path.iterdir() if not path.name.startswith("pymp-")) == [
        "trainplan-launch-"
    ]
    launcher.kill()
    launcher.wait(10)
    assert _gone_within(mark, 5.0) == [], "workers or their children outlived the killed launcher"
    deadline = time.monotonic() + 5.0
    while list(tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(tmp_path.iterdir()) == [], "the log directory outlived the launcher"


@pytest.mark.parametrize(("number", "times", "code"), [(signal.SIGHUP, 1, 129), (signal.SIGTERM, 3, 143)])
def test_a_signal_while_reaping_still_reaps_and_cleans_up(
    number: signal.Signals, times: int, code: int, tmp_path: Path
) -> None:
    """The workers have exited, leaving grandchildren that ignore SIGTERM; a hang-up (or SIGTERM three times)
    during the 8 s grace period ends the command at once, with every grandchild killed and the directory gone."""
    mark = uuid.uuid4().hex
    launcher = _launch(tmp_path, mark, "--grace-period", "8", linger="stubborn")
    _wait_ready(launcher, 2)
    time.sleep(1.5)  # the workers have returned: the launcher is reaping what they left
    for _ in range(times):
        launcher.send_signal(number)
        time.sleep(0.02)
    begun = time.monotonic()
    assert launcher.wait(30) == code
    assert time.monotonic() - begun < 5.0
    assert _gone_within(mark, 2.0) == []
    assert list(tmp_path.iterdir()) == []


def test_a_grandchild_that_comes_back_after_sigterm_is_killed(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    launcher = _launch(tmp_path, mark, "--grace-period", "2", linger="respawn")
    begun = time.monotonic()
    output = launcher.communicate(timeout=120)[0]
    assert launcher.returncode == 0, output
    assert time.monotonic() - begun < 60  # not the 30 s settle loop on top
    assert _gone_within(mark, 2.0) == []


@pytest.mark.parametrize(("delay", "started"), [(0.1, "script"), (0.4, "script"), (1.0, "script"), (0.1, "-m")])
def test_ctrl_c_at_any_moment_is_one_line_and_130(delay: float, started: str, tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    command = [*TRAINPLAN, "launch"] if started == "script" else [sys.executable, "-m", "trainplan", "launch"]
    launcher = _start([*command, "--accelerator", "cpu", "--devices", "2", SCRIPT], mark, tmp_path, LINGER="sleep")
    seen = b"_trainplan_entry" if started == "script" else b"-m\0trainplan"
    deadline = time.monotonic() + 30
    # From the moment the command's interpreter runs (a signal before its exec would reach the forked test instead).
    while seen not in Path(f"/proc/{launcher.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.001)
    time.sleep(delay)  # still importing trainplan or torch
    launcher.send_signal(signal.SIGINT)
    output = launcher.communicate(timeout=60)[0]
    assert launcher.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert _gone_within(mark, 5.0) == []


def _forkserver_of(mark: str) -> int | None:
    """The pid of the launch's forkserver (its `python -c` names multiprocessing.forkserver), found by its mark."""
    for pid in _marked(mark):
        with contextlib.suppress(OSError):
            if b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    return None


@pytest.mark.parametrize("delay", [0.0, 0.4, 1.2])
def test_a_terminals_ctrl_c_while_the_forkserver_imports_torch_is_one_line_and_130(
    delay: float, short_tmp: Path
) -> None:
    """A terminal's Ctrl-C goes to the whole foreground process group, the forkserver included, which was still
    importing torch: it printed a KeyboardInterrupt traceback before the launcher's one line."""
    mark = uuid.uuid4().hex
    launcher = _launch(short_tmp, mark)
    deadline = time.monotonic() + 60
    while _forkserver_of(mark) is None:
        assert time.monotonic() < deadline and launcher.poll() is None, "no forkserver started"
        time.sleep(0.005)
    time.sleep(delay)  # torch's import takes the server a second or more
    os.killpg(launcher.pid, signal.SIGINT)
    output = launcher.communicate(timeout=60)[0]
    assert launcher.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert _gone_within(mark, 5.0) == []


@pytest.mark.parametrize("strategy", ["ddp_fork", "ddp_spawn", "ddp"])
@pytest.mark.parametrize("reader", ["head", "closed"])
def test_a_reader_that_goes_away_ends_no_launcher(strategy: str, reader: str, tmp_path: Path) -> None:
    """200,000 lines per worker to a `| head -1` or to a closed stdout: every launcher returns the workers' values
    (their output is dropped), as `trainplan launch` does."""
    mark = uuid.uuid4().hex
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import tests.scripts.lingering as w, trainplan as tp\n"
    code += (
        "environment = tp.Environment(cpu_count=4, start_methods=('fork', 'spawn', 'forkserver'))\n"
        f"plan = tp.resolve(tp.Request(accelerator='cpu', devices=2, strategy={strategy!r}), environment)\n"
        "print('RESULT', tp.launch(plan, w.work, 'print'), file=sys.stderr)\n"
    )
    shell = f"{sys.executable} -c {shlex.quote(code)}" + (" | head -1" if reader == "head" else " >&-")
    done = subprocess.run(
        ["bash", "-c", shell],
        cwd=ROOT,
        env=child_environment(LINGER_MARK=mark, TMPDIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "RESULT [1, 1]" in done.stderr, done.stderr[-2000:]
    assert _gone_within(mark, 5.0) == []
