"""In each worker of a 2-process CPU world over gloo: torch's context parallelism as the runtime starts it
(`TorchWrappers.context_parallel`, what `rt.context_parallel` calls with the plan's options) over a cp mesh of 2
built by hand. It reports the shard of a sequence of 8 tokens each rank holds inside, with and without the head-tail
load balancer, torch's rotate method inside and after, and the buffer after (whole again). SDPA's ring attention is
CUDA-only (the GPU script runs it); the sharding and the settings are the same on every device."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental._attention import _cp_options

from trainplan.effects.runtime import TorchWrappers
from trainplan.spec.names import ContextParallelRotate

SEQUENCE = 8


def report() -> dict[str, object]:
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
    found: dict[str, object] = {"before": [_cp_options.rotate_method.name, _cp_options.enable_load_balance]}
    cases: tuple[tuple[str, ContextParallelRotate, bool], ...] = (
        ("head_tail", "alltoall", True),
        ("none", "allgather", False),
    )
    for name, rotate, balance in cases:
        tokens = torch.arange(SEQUENCE, dtype=torch.float32).reshape(1, SEQUENCE)
        with TorchWrappers().context_parallel(mesh, (tokens,), (1,), (), rotate, balance):
            inside = {
                "shard": tokens.flatten().tolist(),
                "rotate": _cp_options.rotate_method.name,
                "load_balance": _cp_options.enable_load_balance,
            }
        found[name] = {**inside, "after": tokens.flatten().tolist()}
    found["after"] = [_cp_options.rotate_method.name, _cp_options.enable_load_balance]
    return found
