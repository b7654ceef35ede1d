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
    if layout == "tp2_fsdp":
        _tensor_parallel_fsdp(model, degree=2)
    return model


def _tensor_parallel_fsdp(model: torch.nn.Module, degree: int) -> None:
    """Megatron's split of each block (q/k/v and gate/up by column, the output projections by row), the embedding by
    vocabulary and the head by column (each rank's loss is its shard of the logits': the gradients are the whole
    loss's), then FSDP2 over the data-parallel ranks: the `tp{degree}_fsdp` layout row."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size() // degree, degree), mesh_dim_names=("dp_shard", "tp"))
    plan: dict[str, ColwiseParallel | RowwiseParallel] = {
        "embed": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(),
    }
    for index in range(len(model.layers)):  # type: ignore[arg-type]
        for name, style in (("qkv", ColwiseParallel), ("out", RowwiseParallel)):
            plan[f"layers.{index}.{name}"] = style()
        for name, style in (("gate_up", ColwiseParallel), ("down", RowwiseParallel)):
            plan[f"layers.{index}.{name}"] = style()
    parallelize_module(model, mesh["tp"], plan)  # type: ignore[arg-type]
    for block in model.layers:  # type: ignore[union-attr]
        fully_shard(block, mesh=mesh["dp_shard"])
    fully_shard(model, mesh=mesh["dp_shard"])


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
