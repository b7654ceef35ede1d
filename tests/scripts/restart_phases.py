"""A plain env:// world whose rank 1 fails (exit 3) in the first attempt only, at the moment RESTART_PHASE names:
`start-up` (at once, while rank 0 is inside init_process_group), `mid-run` (after one all_reduce, while rank 0
waits in the next) or `end` (after destroy_process_group). The second attempt runs to the end and each rank says
RECOVERED with the reduced value (4.0: two all_reduces of ones over two ranks). Run by
`benchmarks/bench_restarts.py` and `tests/processes/test_restarts.py`."""

from __future__ import annotations

import os
import sys

import torch
from torch import distributed

phase = os.environ["RESTART_PHASE"]
first = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
failing = first and os.environ["RANK"] == "1"
if failing and phase == "start-up":
    sys.exit(3)
distributed.init_process_group("gloo")
value = torch.ones(1)
distributed.all_reduce(value)
if failing and phase == "mid-run":
    sys.exit(3)
distributed.all_reduce(value)
distributed.destroy_process_group()
if failing and phase == "end":
    sys.exit(3)
if not first:
    print("RECOVERED", os.environ["RANK"], value.item(), flush=True)
