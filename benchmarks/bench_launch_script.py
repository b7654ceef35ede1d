"""`trainplan launch` beside `torchrun`: a script's start → first all_reduce → exit, 2 and 4 CPU workers.

Both run the same plain env:// script through torch's elastic engine on one node (c10d rendezvous on a port
the system picks). torchrun starts one interpreter per worker, each importing torch; `trainplan launch` forks
its workers from a forkserver that imported torch once, while the launcher imported it too, and adds the probe
and the plan, the rank-prefixed output tailed from the engine's log files, and the reaping of every descendant.
Alternated runs, the median of each; bytecode is written (PYTHONDONTWRITEBYTECODE unset, one warm-up run each),
as after a `pip install`. The CPU seconds of each whole process tree are reported beside the wall time: on a
shared machine they move less.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Row, human

RUNS = 5
WORKERS = (2, 4)
SCRIPT = """\
import torch
from torch import distributed

distributed.init_process_group("gloo")
value = torch.ones(1)
distributed.all_reduce(value)
print("sum", value.item())
distributed.destroy_process_group()
"""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _seconds(command: list[str], cwd: str, environment: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run (CPU: the whole tree the command waited for)."""
    cpu = _children_cpu()
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, capture_output=True, env=environment)
    return time.perf_counter() - start, _children_cpu() - cpu


def run() -> list[Row]:
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "train.py"
        script.write_text(SCRIPT)
        for workers in WORKERS:
            ours_command = [sys.executable, "-m", "trainplan.cli", "launch", "--quiet", "--accelerator", "cpu"]
            ours_command += ["--devices", str(workers), str(script)]
            theirs_command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(workers)]
            theirs_command.append(str(script))
            _seconds(ours_command, scratch, environment)  # warm: bytecode written, files in the page cache
            _seconds(theirs_command, scratch, environment)
            ours: list[tuple[float, float]] = []
            theirs: list[tuple[float, float]] = []
            for _ in range(RUNS):
                ours.append(_seconds(ours_command, scratch, environment))
                theirs.append(_seconds(theirs_command, scratch, environment))
            mine, anchor = (statistics.median(wall for wall, _ in runs) for runs in (ours, theirs))
            my_cpu, their_cpu = (statistics.median(cpu for _, cpu in runs) for runs in (ours, theirs))
            rows.append(
                Row(
                    f"trainplan launch script.py → first all_reduce → exit, {workers} workers (wall)",
                    human(mine),
                    human(anchor),
                    f"torchrun --nproc-per-node {workers} script.py",
                    anchor / mine,
                    "≥ 1.5×",
                )
            )
            rows.append(
                Row(
                    f"the same, CPU seconds of the whole process tree, {workers} workers",
                    human(my_cpu),
                    human(their_cpu),
                    f"torchrun --nproc-per-node {workers} script.py",
                    their_cpu / my_cpu,
                    "—",
                )
            )
    return rows


if __name__ == "__main__":
    from benchmarks.common import table

    print(table(run()))
