"""`trainplan launch` beside `torchrun`: a script's start → first all_reduce → exit, 2 CPU workers.

Both run the same plain env:// script through torch's elastic engine on one node (c10d rendezvous on a port
the system picks); `trainplan launch` adds the probe and the plan, the rank-prefixed output tailed from the
engine's log files, and the reaping of every descendant. Alternated runs, the median of each.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Row, human

RUNS = 5
SCRIPT = """\
import torch
from torch import distributed

distributed.init_process_group("gloo")
value = torch.ones(1)
distributed.all_reduce(value)
print("sum", value.item())
distributed.destroy_process_group()
"""


def _seconds(command: list[str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def run() -> list[Row]:
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "train.py"
        script.write_text(SCRIPT)
        ours_command = [sys.executable, "-m", "trainplan.cli", "launch", "--quiet", "--accelerator", "cpu"]
        ours_command += ["--devices", "2", str(script)]
        theirs_command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)]
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(RUNS):
            ours.append(_seconds(ours_command, scratch))
            theirs.append(_seconds(theirs_command, scratch))
    mine, anchor = statistics.median(ours), statistics.median(theirs)
    return [
        Row(
            "trainplan launch script.py → first all_reduce → exit, 2 workers",
            human(mine),
            human(anchor),
            "torchrun --nproc-per-node 2 script.py",
            anchor / mine,
            "≥ 0.91× (within 1.1×)",
        )
    ]


if __name__ == "__main__":
    from benchmarks.common import table

    print(table(run()))
