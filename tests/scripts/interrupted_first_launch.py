"""Interrupted (SIGINT) `delay` seconds into the first launch of a spawn plan: while the forkserver imports torch
and before it has sent back the workers' pids. Exits 130 once `launch` has stopped every worker."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import trainplan as tp


def sleep_long() -> None:
    time.sleep(120)


if __name__ == "__main__":
    delay = float(sys.argv[1])
    plan = tp.resolve(tp.Request(accelerator="cpu", strategy="ddp_spawn", devices=2), tp.Environment(cpu_count=2))
    threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        tp.launch(plan, sleep_long)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        raise SystemExit(130) from None
    raise SystemExit("the launch was never interrupted")
