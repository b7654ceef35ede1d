"""One training step of a small decoder in a real gloo world, its peak per rank measured by torch's MemTracker on
real tensors (tests/processes/test_memory_world.py compares it with the prediction)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker

from tests.llama_like import small

BATCH = (2, 128)
"""Samples per rank × tokens per sample."""


def _wrapped(layout: str, checkpointing: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    model = small(checkpointing)
    if layout == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if layout == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.layers:
            fully_shard(block)
        fully_shard(model)
    return model


def peaks(configurations: list[tuple[str, bool]]) -> list[int]:
    """This rank's peak bytes under each (layout, checkpointing), one after the other in one world."""
    return [peak(layout, checkpointing)["Total"] for layout, checkpointing in configurations]


def peak(layout: str, checkpointing: bool) -> dict[str, int]:
    """This rank's peak bytes of one training step (the second, once the optimizer's states exist), by category."""
    model = _wrapped(layout, checkpointing)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    tokens = torch.randint(0, 8000, BATCH)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        for step in range(2):
            model(tokens).float().sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            if step == 0:
                tracker.reset_mod_stats()
        snapshot = tracker.get_tracker_snapshot("peak")
    if dist.is_initialized():
        dist.barrier()
    return {str(getattr(kind, "name", kind)): count for device in snapshot.values() for kind, count in device.items()}
