"""A caller whose workers ignore SIGTERM and SIGINT (a preemption handler): for the second-Ctrl-C test.

Usage: python stubborn_workers.py PIDFILE (library|cli-inner)
"""

from __future__ import annotations

import os
import signal
import sys
import time

import trainplan as tp


def stubborn(pid_file: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(pid_file, "a") as pids:
        pids.write(f"{os.getpid()}\n")
    time.sleep(120)


if __name__ == "__main__":
    if sys.argv[2] == "cli-inner":
        stubborn(sys.argv[1])
    else:
        plan = tp.resolve(tp.Request(accelerator="cpu", devices=2, strategy="ddp_fork"))
        tp.launch_with(plan, stubborn, args=(sys.argv[1],), grace_period=30)
