"""Nothing outlives its launcher, however the launcher dies: a watcher in a process of its own.

A launcher that is killed outright (`kill -9`, the OOM killer, a scheduler's hard stop) runs no code: no `finally`,
no handler. So every launch starts a small watcher first: a separate interpreter (`python -I -S`, the standard
library only, in a session of its own so that the launcher's terminal and process group signals never reach it)
that holds the reading end of a pipe whose only writing end is the launcher's. The launcher tells it each worker
it starts (pid and start time) and each temporary directory before making it, and, when it ends by itself, says
goodbye. When the launcher is gone without a goodbye (the pipe closes; or its pidfd says so, should a process it
forked on the side still hold a copy of the pipe), the watcher at once

- stops (SIGSTOP), then kills (SIGKILL), every worker it was told of, every member of the process group each one
  leads, every process whose environment carries this launch's mark (`LIFELINE_VARIABLE`: what an engine such as
  torch's elastic agent started, which names no pid), and every descendant of all of these, wherever its
  environment or process group went (stopped first, none of them can fork, exit or hand a child to init while the
  rest are found);
- sweeps again every 50 ms until it has found nothing for `QUIET_PERIOD` seconds, and for at most `WATCH_LIMIT`;
- removes the launch's temporary directories (the log directory of `trainplan launch`, multiprocessing's own).

Workers the launcher forks or spawns itself also die with it through `PR_SET_PDEATHSIG` (`die_with_parent`), and a
forked child of the launcher closes its copies of the pipe (`os.register_at_fork`). What escapes: a descendant
whose parent died before the watcher looked (a daemon that double-forked) and that cleared its environment too.

Linux (the watcher reads `/proc`); elsewhere a launch starts no watcher and behaves as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

LIFELINE_VARIABLE = "TRAINPLAN_LIFELINE"
"""The mark of one launch, in the environment of each of its workers (and so of their descendants)."""

WATCH_LIMIT = 5.0
"""The most seconds the watcher goes on finding and killing what is left after the launcher died."""

QUIET_PERIOD = 1.0
"""Seconds of finding nothing after which the watcher stops looking (and removes the temporary directories)."""

_OPEN_LIFELINES: set[int] = set()
"""The writing ends of this process's lifelines: a forked worker closes them at once (a copy held by a worker would
keep its own watcher from ever seeing the launcher die)."""

_PR_SET_PDEATHSIG = 1

_WATCHER = r"""
import os, select, shutil, signal, sys, time
for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGPIPE", "SIGTSTP"):
    if hasattr(signal, name):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
launcher = int(sys.argv[1])
mark = (sys.argv[2] + "=" + sys.argv[3]).encode()
limit, quiet = float(sys.argv[4]), float(sys.argv[5])
cleanup = sys.argv[6:]
watched = {}
pending = b""
goodbye = False

def take(chunk):
    global pending, goodbye
    pending += chunk
    *lines, pending = pending.split(b"\n")
    for line in lines:
        if line == b"bye":
            goodbye = True
        elif line.startswith(b"rm "):
            cleanup.append(os.fsdecode(line[3:]))
        elif line:
            pid, start = line.split()
            watched[int(pid)] = start

# The launcher is gone when the pipe closes, or, should a copy of its end live on in a process it forked, when its
# pidfd says so (without pidfds: when this process's parent, the launcher, changes).
try:
    pidfd = os.pidfd_open(launcher)
except (AttributeError, OSError):
    pidfd = None
poller = select.poll()
poller.register(0, select.POLLIN)
if pidfd is not None:
    poller.register(pidfd, select.POLLIN)
gone = os.getppid() != launcher
while not gone and not goodbye:
    try:
        events = poller.poll(500)
    except InterruptedError:
        continue
    for descriptor, _ in events:
        if descriptor != 0:
            gone = True
            continue
        try:
            chunk = os.read(0, 65536)
        except InterruptedError:
            continue
        except OSError:
            chunk = b""
        if chunk:
            take(chunk)
        else:
            gone = True
    gone = gone or os.getppid() != launcher
os.set_blocking(0, False)
while not goodbye:  # what the launcher wrote before it died
    try:
        chunk = os.read(0, 65536)
    except OSError:
        break
    if not chunk:
        break
    take(chunk)
if goodbye:
    sys.exit(0)

me = os.getpid()

def processes():
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/" + entry + "/stat", "rb") as file:
                fields = file.read().rsplit(b")", 1)[1].split()
            found[int(entry)] = (fields[0], int(fields[1]), int(fields[2]), fields[19])  # state, ppid, pgid, start
        except (OSError, IndexError, ValueError):
            continue
    return found

def marked(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as file:
            return mark in file.read().split(b"\0")
    except OSError:
        return False

groups = set()  # the process groups of the workers (each leads its own): every member goes with them
victims = set()  # (pid, start time) of every process found so far
checked = set()  # (pid, start time) whose environment was read already (it changes only at exec)

def find():
    table = processes()
    found = {pid for pid, start in watched.items() if pid in table and table[pid][3] == start}
    groups.update(pid for pid in found if table[pid][2] == pid)
    for pid, (state, parent, group, start) in table.items():
        if (pid, start) in victims or group in groups:
            found.add(pid)
        elif (pid, start) not in checked:
            checked.add((pid, start))
            if marked(pid):
                found.add(pid)
    children = {}
    for pid, (state, parent, group, start) in table.items():
        children.setdefault(parent, []).append(pid)
    stack = list(found)
    while stack:  # every descendant, wherever its environment or process group went
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    found.discard(me)
    victims.update((pid, table[pid][3]) for pid in found)
    return {pid for pid in found if table[pid][0] not in (b"Z", b"X")}

def send(pids, number):
    for pid in pids:
        try:
            os.kill(pid, number)
        except OSError:
            pass

deadline = time.monotonic() + limit
calm = time.monotonic() + quiet
while time.monotonic() < deadline:
    stopped = set()
    for _ in range(20):  # stopped first, so that none forks, exits or reparents a child while the rest are found
        fresh = find() - stopped
        if not fresh:
            break
        send(fresh, signal.SIGSTOP)
        stopped |= fresh
    if stopped:
        send(stopped, signal.SIGKILL)
        calm = time.monotonic() + quiet
    elif time.monotonic() > calm:
        break
    time.sleep(0.05)
for path in cleanup:
    shutil.rmtree(path, ignore_errors=True)
"""


def _start_time(pid: int) -> str | None:
    """The process's start time since boot (clock ticks, /proc/PID/stat field 22): with the pid, its identity."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return None


class Lifeline:
    """One launch's watcher (see the module's documentation). `variables` go into every worker's environment;
    `watch(pid)` tells it a worker (or a helper process the launch started, such as a forkserver), `remove(path)` a
    temporary directory; `release()` says goodbye when the launch ends by itself. A context manager releases on exit.

    The watcher is started with `posix_spawn` (no fork of this process, no pipe waited on for the child's exec):
    another thread forking workers at that moment can neither hold up the start nor keep its pipe open."""

    def __init__(self, *, cleanup: Sequence[str] = ()) -> None:
        self.mark = uuid.uuid4().hex
        self._pipe: int | None = None
        self._pid: int | None = None
        if not sys.platform.startswith("linux") or not Path("/proc/self/stat").exists():
            return
        environment = {key: value for key, value in os.environ.items() if key != LIFELINE_VARIABLE}
        read_end, write_end = os.pipe()
        _OPEN_LIFELINES.add(write_end)  # at once: a worker forked from now on closes its copy
        arguments = [sys.executable, "-I", "-S", "-c", _WATCHER, str(os.getpid()), LIFELINE_VARIABLE, self.mark]
        arguments += [str(WATCH_LIMIT), str(QUIET_PERIOD)]
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                self._pid = os.posix_spawn(
                    sys.executable,
                    [*arguments, *cleanup],
                    environment,
                    file_actions=[
                        (os.POSIX_SPAWN_DUP2, read_end, 0),
                        (os.POSIX_SPAWN_DUP2, devnull, 1),
                        (os.POSIX_SPAWN_DUP2, devnull, 2),
                    ],
                    setsid=True,  # a session of its own: the launcher's terminal and group signals never reach it
                )
            finally:
                os.close(devnull)
        except OSError:
            _OPEN_LIFELINES.discard(write_end)
            os.close(write_end)
            return  # no watcher: the launch goes on as it would without one
        finally:
            os.close(read_end)
        self._pipe = write_end

    @property
    def variables(self) -> dict[str, str]:
        """The mark each worker of the launch carries in its environment."""
        return {LIFELINE_VARIABLE: self.mark} if self._pipe is not None else {}

    def watch(self, pid: int | None) -> None:
        """Tell the watcher of a process to kill if the launcher dies (its process group too, if it leads one)."""
        start = None if pid is None or pid <= 0 else _start_time(pid)
        if start is not None:
            self._send(f"{pid} {start}\n")

    def remove(self, path: str | None) -> None:
        """Tell the watcher of a directory to remove if the launcher dies (a temporary one the launch made)."""
        if path and "\n" not in path:
            self._send(f"rm {path}\n")

    def temporary_directory(self, prefix: str) -> str:
        """Make a new private directory in the temporary folder, told to the watcher before it exists: if the
        launcher dies at any moment after this returns, or while it runs, the directory goes too."""
        while True:
            path = os.path.join(tempfile.gettempdir(), prefix + secrets.token_hex(6))
            self.remove(path)
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                continue
            return path

    def release(self) -> None:
        """The launch ended by itself: the watcher leaves without killing anything."""
        pipe, self._pipe = self._pipe, None
        if pipe is None:
            return
        self._send_to(pipe, "bye\n")
        _OPEN_LIFELINES.discard(pipe)
        with contextlib.suppress(OSError):
            os.close(pipe)
        if self._pid is not None:  # it leaves at once: reap it (bounded), so that no zombie stays behind
            deadline = time.monotonic() + 5.0
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(self._pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
                    time.sleep(0.005)

    def _send(self, line: str) -> None:
        if self._pipe is not None:
            self._send_to(self._pipe, line)

    @staticmethod
    def _send_to(pipe: int, line: str) -> None:
        with contextlib.suppress(OSError):
            os.write(pipe, line.encode())

    def __enter__(self) -> Lifeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def close_inherited_lifelines() -> None:
    """In a forked child: close the copies of the launcher's lifelines (only the launcher may hold them open)."""
    for descriptor in tuple(_OPEN_LIFELINES):
        with contextlib.suppress(OSError):
            os.close(descriptor)
    _OPEN_LIFELINES.clear()


# Every child this process forks, a worker or not (a process the caller forks on the side, say), closes them.
os.register_at_fork(after_in_child=close_inherited_lifelines)


def die_with_parent(parent: int) -> None:
    """In a worker the launcher (`parent`) started itself: have the kernel SIGKILL this process when the launcher
    dies (`PR_SET_PDEATHSIG`, Linux), and end now if it has died already (before the request was made). Elsewhere,
    or where prctl cannot be reached, nothing: the watcher still kills it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


__all__ = [
    "LIFELINE_VARIABLE",
    "QUIET_PERIOD",
    "WATCH_LIMIT",
    "Lifeline",
    "close_inherited_lifelines",
    "die_with_parent",
]
