"""A plain env:// worker for emitted jobs run for real: it joins the world torchrun made, all-reduces its rank + 1,
and says which CPUs it may run on (`os.sched_getaffinity`) and on which SLURM node. With EMITTED_EXIT_NODE set, the
workers of that node (SLURM_NODEID) then exit with EMITTED_EXIT_CODE (default 7): a node that fails.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import distributed

distributed.init_process_group("gloo")
value = torch.tensor([float(distributed.get_rank() + 1)])
distributed.all_reduce(value)
report = {
    "rank": distributed.get_rank(),
    "world_size": distributed.get_world_size(),
    "sum": float(value.item()),
    "cpus": sorted(os.sched_getaffinity(0)),
    "node": os.environ.get("SLURMD_NODENAME"),
    "job_name": os.environ.get("SLURM_JOB_NAME"),
}
print("REPORT " + json.dumps(report), flush=True)
distributed.destroy_process_group()
if os.environ.get("EMITTED_EXIT_NODE") == os.environ.get("SLURM_NODEID", "0"):
    sys.exit(int(os.environ.get("EMITTED_EXIT_CODE", "7")))
