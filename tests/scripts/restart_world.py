"""A world whose rank 1 fails in the first attempt only: under `--max-restarts 1` the second attempt succeeds.

It reports the attempt (TORCHELASTIC_RESTART_COUNT, set by torch's elastic agent) and a real all_reduce.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch import distributed

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if attempt == 0 and os.environ["RANK"] == "1":
    print("rank 1 fails in attempt 0", flush=True)
    sys.exit(3)
if attempt == 0:
    # Rank 0 waits to be stopped before it meets anyone, so attempt 0 leaves nothing in the engine's store
    # (once, under a loaded machine, a rank 0 stopped inside init_process_group left the next attempt waiting).
    time.sleep(120)
distributed.init_process_group("gloo")
value = torch.tensor([float(distributed.get_rank() + 1)])
distributed.all_reduce(value)
print(f"attempt {attempt} rank {distributed.get_rank()} sum {value.item()}", flush=True)
distributed.destroy_process_group()
