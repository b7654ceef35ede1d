"""In each worker of a CPU world over gloo: the plan's device mesh, built by trainplan's runtime, as torch's own
`DeviceMesh` reports it (this rank's coordinates and the members of each of its groups) beside the plan's
arithmetic; and, where the mesh has tensor parallelism, one training step of a small model parallelized over it."""

from __future__ import annotations

import warnings

import torch
from torch import distributed
from torch.distributed.device_mesh import DeviceMesh

import trainplan as tp

warnings.filterwarnings("ignore")

SAMPLES = 8


def data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return torch.randn(SAMPLES, 8, generator=generator), torch.randn(SAMPLES, 1, generator=generator)


def model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def parallelize(module: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    """Tensor parallelism over the mesh's tp dimension (column-, then row-wise), then FSDP2 over its shards."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(module, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(module, mesh=mesh["dp_shard"])
    return module


def _members(mesh: DeviceMesh, name: str | None = None) -> list[int]:
    return list(distributed.get_process_group_ranks(mesh.get_group(name)))


def report() -> dict[str, object]:
    with tp.runtime() as rt:
        mesh = rt.mesh
        names = list(mesh.mesh_dim_names or ())
        layout = rt.plan.mesh
        coordinates = rt.plan.mesh_coordinates
        groups = rt.plan.mesh_groups
        assert layout is not None and coordinates is not None and groups is not None
        result: dict[str, object] = {
            "rank": rt.rank,
            "names": names,
            "shape": list(mesh.shape),
            "coordinate": list(mesh.get_coordinate() or ()),
            "groups": {name: _members(mesh, name) for name in names},
            "plan_coordinate": list(coordinates.values()),
            "plan_groups": {name: list(members) for name, members in groups.items()},
            "data_parallel": [rt.data_parallel_rank, rt.data_parallel_size],
            "data_parallel_group": _members(rt.data_parallel_mesh),
            "fsdp_mesh": [list(rt.fsdp_mesh.mesh_dim_names or ()), rt.fsdp_mesh.mesh.flatten().tolist()],
            "sampler": list(iter(rt.sampler(range(SAMPLES), shuffle=False))),
        }
        if layout.size("tp") > 1:
            inputs, targets = data()
            net = rt.wrap(model(), parallelize=parallelize)
            optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
            indices = list(iter(rt.sampler(range(SAMPLES), shuffle=False)))
            loss = torch.nn.functional.mse_loss(net(inputs[indices]), targets[indices])
            rt.step(loss, optimizer)
            full: dict[str, list[float]] = {}
            for name, parameter in net.named_parameters():
                value = parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter
                full[name] = value.detach().flatten().tolist()
            result["loss"] = loss.item()
            result["parameters"] = full
        else:
            try:
                rt.wrap(model())
            except tp.NotWrappable as error:
                result["wrap_refused"] = str(error)
    return result
