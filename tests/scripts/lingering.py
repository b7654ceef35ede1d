"""A worker (for `tp.launch` or `trainplan launch`) that starts what a real training script might leave behind, says
READY with its pid, then does what `LINGER` says.

- `LINGER=sleep` (default): a child in its own process group, one in a session of its own, then sleep 120 s;
- `LINGER=stubborn`: a grandchild in a session of its own that ignores SIGTERM, SIGINT and SIGHUP, then exit 0;
- `LINGER=respawn`: a grandchild that, on SIGTERM, forks a replacement in a new session and exits; then exit 0;
- `LINGER=print`: print 200,000 lines (for a reader that goes away), then return 1;
- `LINGER=quick`: say READY and return 0 (the launch ends by itself);
- `LINGER=sides`: what `sleep` starts, and two that only their ancestry ties to the launch, each in a session of its
  own with an empty environment: an `os.fork` child, and a subprocess holding a descriptor of the worker's
  (`pass_fds`); then sleep 120 s.

Every process it starts inherits the environment, and with it the test's marker variable (`LINGER_MARK`), which the
test looks for in /proc afterwards; the two of `sides` carry it on their command line instead.

As a `tp.launch` caller: `python lingering.py STRATEGY [no-forkserver] [then-wait]` says LAUNCH, then launches
(`no-forkserver`: as on a platform without one, so that spawn starts fresh interpreters itself; `then-wait`: once the
launch has returned, say DONE and sleep 120 s, with what the launch keeps for the next one still there).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

_SLEEP = "import time; time.sleep(120)"
_STUBBORN = (
    "import signal, time\n"
    "for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
    "    signal.signal(number, signal.SIG_IGN)\n"
    "time.sleep(120)\n"
)
_RESPAWN = (
    "import os, signal, time\n"
    "def again(*_):\n"
    "    if os.fork() == 0:\n"
    "        os.setsid()\n"
    "        return\n"
    "    os._exit(0)\n"
    "signal.signal(signal.SIGTERM, again)\n"
    "deadline = time.monotonic() + 120\n"
    "while time.monotonic() < deadline:\n"
    "    time.sleep(0.1)\n"
)


def work(how: str | None = None) -> int:
    how = how or os.environ.get("LINGER", "sleep")
    if how == "print":
        for line in range(200_000):
            print("line", line)
        return 1
    if how == "quick":
        print("READY", os.getpid(), flush=True)
        return 0
    if how in ("sleep", "sides"):
        subprocess.Popen([sys.executable, "-c", _SLEEP])
        subprocess.Popen([sys.executable, "-c", _SLEEP], start_new_session=True)
        if how == "sides":
            _sides()
    else:
        subprocess.Popen([sys.executable, "-c", _STUBBORN if how == "stubborn" else _RESPAWN], start_new_session=True)
    print("READY", os.getpid(), flush=True)
    if how in ("sleep", "sides"):
        time.sleep(120)
    return 1


def _sides() -> None:
    tag = "LINGER_MARK=" + os.environ["LINGER_MARK"]
    read_end, write_end = os.pipe()
    if os.fork() == 0:
        os.setsid()
        os.execve(sys.executable, [sys.executable, "-c", _SLEEP, tag], {})
    subprocess.Popen([sys.executable, "-c", _SLEEP, tag], env={}, pass_fds=(write_end,), start_new_session=True)
    os.close(read_end)


if __name__ == "__main__":
    if len(sys.argv) > 1:  # a tp.launch caller: `python lingering.py STRATEGY [no-forkserver]`
        import multiprocessing

        import trainplan as tp

        if "no-forkserver" in sys.argv[2:]:
            multiprocessing.get_all_start_methods = lambda: ["fork", "spawn"]

        environment = tp.Environment(cpu_count=4, start_methods=("fork", "spawn", "forkserver"))
        request = tp.Request.from_config({"accelerator": "cpu", "devices": 2, "strategy": sys.argv[1]})
        plan = tp.resolve(request, environment)
        print("LAUNCH", flush=True)
        print(tp.launch(plan, work), file=sys.stderr, flush=True)
        if "then-wait" in sys.argv[2:]:
            print("DONE", flush=True)
            time.sleep(120)
    else:  # a trainplan launch worker
        work()
