"""A plain env:// script that knows nothing of trainplan: it joins torchrun's world and prints its size."""

from __future__ import annotations

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"WORLD {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
