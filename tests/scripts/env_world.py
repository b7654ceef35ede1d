"""A plain env:// script: torch.distributed reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT itself.

It then asks trainplan what it sees inside the job (the launcher must be recognised, not repeated).
"""

from __future__ import annotations

import json

import torch
from torch import distributed

distributed.init_process_group("gloo")
value = torch.tensor([float(distributed.get_rank() + 1)])
distributed.all_reduce(value)

import trainplan as tp  # noqa: E402  (after the plain part on purpose: it needs nothing of trainplan)

plan = tp.resolve()
report = {
    "rank": distributed.get_rank(),
    "sum": float(value.item()),
    "plan": {
        "world_size": plan.world_size,
        "num_nodes": plan.num_nodes,
        "launcher": plan.launcher,
        "cluster": plan.cluster.kind,
    },
}
print("REPORT " + json.dumps(report), flush=True)
distributed.destroy_process_group()
