"""Nothing outlives its launcher, however the launcher dies: a watcher in a process of its own.

A launcher that is killed outright (`kill -9`, the OOM killer, a scheduler's hard stop) runs no code: no `finally`,
no handler. So every launch starts a small watcher first: a separate interpreter (`python -I -S`, the standard
library only, in a session of its own so that the launcher's terminal and process group signals never reach it)
that holds the reading end of a pipe whose only writing end is the launcher's. The launcher tells it each worker
it starts (pid and start time) and, when it ends by itself, says goodbye. When the pipe closes without a goodbye,
the launcher is gone, and within about a second the watcher

- kills every worker it was told of, with the process group each one leads (its children there with it);
- kills every process whose environment carries this launch's mark (`LIFELINE_VARIABLE`): the descendants that
  started sessions of their own, or were started through an engine (torch's elastic agent) that names no pid;
- removes the launch's temporary directories (the log directory of `trainplan launch`, multiprocessing's own);

and goes on killing until none is left, for at most `WATCH_LIMIT` seconds. A worker's descendant that clears its
environment and leaves its group is the one thing it cannot find.

Linux (the watcher reads `/proc`); elsewhere a launch starts no watcher and behaves as before.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

LIFELINE_VARIABLE = "TRAINPLAN_LIFELINE"
"""The mark of one launch, in the environment of each of its workers (and so of their descendants)."""

WATCH_LIMIT = 5.0
"""Seconds the watcher goes on finding and killing what is left after the launcher died."""

_OPEN_LIFELINES: set[int] = set()
"""The writing ends of this process's lifelines: a forked worker closes them at once (a copy held by a worker would
keep its own watcher from ever seeing the launcher die)."""

_WATCHER = r"""
import os, shutil, signal, sys, time
for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGPIPE", "SIGTSTP"):
    if hasattr(signal, name):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
mark = (sys.argv[1] + "=" + sys.argv[2]).encode()
limit = float(sys.argv[3])
cleanup = sys.argv[4:]
watched = {}
pending = b""
goodbye = False
while True:
    try:
        chunk = os.read(0, 65536)
    except InterruptedError:
        continue
    except OSError:
        break
    if not chunk:
        break
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
if goodbye:
    sys.exit(0)

def stat(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], fields[19]  # state, start time

def marked(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as file:
            return mark in file.read().split(b"\0")
    except OSError:
        return False

me = os.getpid()
deadline = time.monotonic() + limit
while True:
    victims = set()
    for pid, start in watched.items():
        found = stat(pid)
        if found is not None and found[1] == start and found[0] != b"Z":
            victims.add(pid)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me and marked(int(entry)):
            found = stat(int(entry))
            if found is not None and found[0] != b"Z":
                victims.add(int(entry))
    if not victims:
        break
    for pid in victims:
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if time.monotonic() > deadline:
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
        arguments = [sys.executable, "-I", "-S", "-c", _WATCHER, LIFELINE_VARIABLE, self.mark, str(WATCH_LIMIT)]
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
    """In a forked worker: close the copies of the launcher's lifelines (only the launcher may hold them open)."""
    for descriptor in tuple(_OPEN_LIFELINES):
        with contextlib.suppress(OSError):
            os.close(descriptor)
    _OPEN_LIFELINES.clear()


__all__ = ["LIFELINE_VARIABLE", "WATCH_LIMIT", "Lifeline", "close_inherited_lifelines"]
