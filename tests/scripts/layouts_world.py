"""In each worker of one 4-process CPU world over gloo (launched with dp_shard=2 × tp=2, ep=2): for that layout and
for dp_shard=4 with ep=4, the dense and expert meshes trainplan builds (`build_meshes`, as `rt` does) beside the
ones torch builds by hand with `init_device_mesh`, and beside the plan's arithmetic; the peers' names on `rt.mesh`;
a Lightning-style and a torchtitan-style parallelize function run unchanged; one step of a tiny mixture of 4
experts split over ep=4; one step of a 2-stage pipeline; and, with sp=2 × dp_shard=2, one step of an attention layer
whose sequence is split over sp (Ulysses); and dp_shard=2 × tp=2 with the tp groups' backend written (tp_group_backend),
beside init_device_mesh's backend_override."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import distributed
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

import trainplan as tp
from tests.scripts import mesh_world
from trainplan.effects.runtime import PipelineStages, TorchWrappers, build_meshes
from trainplan.rules import MESH_ALIASES
from trainplan.spec.mesh import MeshLayout

warnings.filterwarnings("ignore")

EXPERTS = 4
EXPERT = ("efsdp", "ep")
"""The expert mesh's own names (torchtitan's), which rt.mesh answers too."""
WIDTH = 8


def _members(mesh: DeviceMesh, name: str | None = None) -> list[int]:
    return list(distributed.get_process_group_ranks(mesh.get_group(name)))


def _meshes_report(layout: MeshLayout, built: dict[str, DeviceMesh], rank: int) -> dict[str, object]:
    dense, expert = built["mesh"], built["expert"]
    override: Any = dict(layout.backends) or None  # torch's type: a name and/or ProcessGroup Options
    by_hand = init_device_mesh("cpu", layout.shape, mesh_dim_names=layout.dimensions, backend_override=override)
    expert_by_hand = init_device_mesh("cpu", layout.expert.shape, mesh_dim_names=layout.expert.dimensions)
    return {
        "dense": {
            "coordinate": list(dense.get_coordinate() or ()),
            "by_hand": list(by_hand.get_coordinate() or ()),
            "plan": list(layout.coordinates(rank)),
            "groups": {name: _members(dense, name) for name in layout.dimensions},
            "groups_by_hand": {name: _members(by_hand, name) for name in layout.dimensions},
            "plan_groups": {name: list(layout.group(rank, name)) for name in layout.dimensions},
        },
        "expert": {
            "names": list(expert.mesh_dim_names or ()),
            "coordinate": list(expert.get_coordinate() or ()),
            "by_hand": list(expert_by_hand.get_coordinate() or ()),
            "plan": list(layout.expert.coordinates(rank)),
            "groups": {name: _members(expert, name) for name in layout.expert.dimensions},
            "groups_by_hand": {name: _members(expert_by_hand, name) for name in layout.expert.dimensions},
            "plan_groups": {name: list(layout.expert.group(rank, name)) for name in layout.expert.dimensions},
        },
        "aliases": {alias: _members(dense[alias]) for alias in MESH_ALIASES},
        "backends": {name: str(distributed.get_backend(dense.get_group(name))) for name in layout.dimensions},
        "alias_backends": {alias: str(distributed.get_backend(dense[alias].get_group())) for alias in MESH_ALIASES},
    }


def lightning_parallelize(module: torch.nn.Module, device_mesh: DeviceMesh) -> torch.nn.Module:
    """Written as for Lightning's ModelParallelStrategy: its mesh's names."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(module, device_mesh["tensor_parallel"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(module, mesh=device_mesh["data_parallel"])
    return module


def torchtitan_parallelize(module: torch.nn.Module, world_mesh: DeviceMesh) -> torch.nn.Module:
    """Written as torchtitan's parallelize functions index their mesh: tp, then FSDP over dp_shard_cp."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(module, world_mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(module, mesh=world_mesh["dp_shard_cp"])
    return module


def _step(rt: tp.Runtime, parallelize: object) -> dict[str, object]:
    inputs, targets = mesh_world.data()
    net = rt.wrap(mesh_world.model(), parallelize=parallelize)  # type: ignore[arg-type]
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    indices = list(iter(rt.sampler(range(mesh_world.SAMPLES), shuffle=False)))
    loss = torch.nn.functional.mse_loss(net(inputs[indices]), targets[indices])
    rt.step(loss, optimizer)
    full: dict[str, list[float]] = {}
    for name, parameter in net.named_parameters():
        value = parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter
        full[name] = value.detach().flatten().tolist()
    return {"loss": loss.item(), "parameters": full}


def moe_data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    return torch.randn(mesh_world.SAMPLES, WIDTH, generator=generator), torch.randn(
        mesh_world.SAMPLES, WIDTH, generator=generator
    )


def moe_parts() -> tuple[torch.nn.Linear, list[torch.nn.Linear]]:
    """A router and 4 experts, the same on every rank (a fixed seed)."""
    torch.manual_seed(5)
    return torch.nn.Linear(WIDTH, EXPERTS), [torch.nn.Linear(WIDTH, WIDTH) for _ in range(EXPERTS)]


def moe_output(router: torch.nn.Linear, experts: dict[int, torch.nn.Linear], tokens: torch.Tensor) -> torch.Tensor:
    """The experts' share of the output: each token's experts weighted by the router's softmax (dense routing)."""
    gates = torch.softmax(router(tokens), dim=-1)
    return sum((gates[:, [index]] * expert(tokens) for index, expert in experts.items()), torch.zeros_like(tokens))


def _moe_step(expert_mesh: DeviceMesh, rank: int) -> dict[str, object]:
    """Experts split over the ep group (rank r holds EXPERTS/ep of them); tokens of the group gathered to every
    expert, outputs summed back (a dense all-to-all), each rank's loss on its own tokens; gradients reduced so they
    are the mean loss's over the whole batch."""
    from torch.distributed.nn.functional import all_reduce

    group = expert_mesh.get_group("ep")
    size, position = expert_mesh["ep"].size(), expert_mesh["ep"].get_local_rank()
    router, experts = moe_parts()
    local = {index: experts[index] for index in range(EXPERTS) if index * size // EXPERTS == position}
    inputs, targets = moe_data()
    per_rank = mesh_world.SAMPLES // size
    mine = slice(position * per_rank, (position + 1) * per_rank)
    gathered = [torch.empty(per_rank, WIDTH) for _ in range(size)]
    distributed.all_gather(gathered, inputs[mine].contiguous(), group=group)
    tokens = torch.cat(gathered)
    combined: torch.Tensor = all_reduce(moe_output(router, local, tokens), group=group)  # type: ignore[no-untyped-call]
    loss = torch.nn.functional.mse_loss(combined[mine], targets[mine])
    loss.backward()  # type: ignore[no-untyped-call]
    # The router is replicated: each rank holds its share of its gradient; the experts got every rank's tokens'.
    for parameter in router.parameters():
        assert parameter.grad is not None
        distributed.all_reduce(parameter.grad, group=group)
    grads = {
        f"router.{name}": (p.grad / size).flatten().tolist()
        for name, p in router.named_parameters()
        if p.grad is not None
    }
    for index, expert in local.items():
        for name, parameter in expert.named_parameters():
            assert parameter.grad is not None
            grads[f"experts.{index}.{name}"] = (parameter.grad / size).flatten().tolist()
    total = loss.detach().clone()
    distributed.all_reduce(total, group=group)
    return {"loss": (total / size).item(), "grads": grads, "experts": sorted(local)}


PIPELINE_MICROBATCHES = 4


def pipeline_layout() -> MeshLayout:
    """pp=2 × dp_shard=2 with 1F1B over 4 microbatches, as the planner plans it."""
    options = tp.ModelParallelOptions(pp=2, dp_shard=2, pp_schedule="1F1B", pp_microbatches=PIPELINE_MICROBATCHES)
    request = tp.Request(accelerator="cpu", devices=4, strategy="model_parallel", strategy_options=options)
    plan = tp.resolve(request, tp.Environment(cpu_count=4))
    assert plan.mesh is not None
    return plan.mesh


def stage_module(index: int) -> torch.nn.Module:
    """mesh_world's model cut in two stages: Linear + ReLU, then the last Linear."""
    layers = list(mesh_world.model().children())
    return torch.nn.Sequential(*layers[:2]) if index == 0 else torch.nn.Sequential(*layers[2:])


def _pipeline_step(layout: MeshLayout, built: dict[str, DeviceMesh], rank: int) -> dict[str, object]:
    """One step of the 2-stage model under torch's own schedule class, as `rt.pipeline` hands it out."""
    from torch.distributed.pipelining import PipelineStage

    stages = PipelineStages(layout, built["mesh"]["pp"].get_group(), rank)
    (index,) = stages.stage_indices
    module = stage_module(index)
    stage = PipelineStage(module, index, stages.num_stages, torch.device("cpu"), group=stages.group)
    schedule = stages.schedule_class(stage, n_microbatches=stages.microbatches, loss_fn=torch.nn.functional.mse_loss)
    shard = layout.coordinates(rank)[layout.dimensions.index("dp_shard")]
    inputs, targets = mesh_world.data()
    losses: list[torch.Tensor] = []
    if index == 0:
        schedule.step(inputs[shard::2])
    else:
        schedule.step(target=targets[shard::2], losses=losses)
    grads = {name: p.grad.flatten().tolist() for name, p in module.named_parameters() if p.grad is not None}
    return {
        "stage": index,
        "schedule": type(schedule).__name__,
        "pp_group": list(distributed.get_process_group_ranks(stages.group)),
        "loss": (sum(losses) / len(losses)).item() if losses else None,  # type: ignore[union-attr]
        "grads": grads,
    }


SEQUENCE, HEADS, BATCH = 8, 2, 4


def backends_layout() -> MeshLayout:
    """dp_shard=2 × tp=2 with the tensor-parallel groups' backend written (`tp_group_backend`), as planned."""
    options = tp.ModelParallelOptions(dp_shard=2, tp=2, tp_group_backend="gloo")
    request = tp.Request(accelerator="cpu", devices=4, strategy="model_parallel", strategy_options=options)
    plan = tp.resolve(request, tp.Environment(cpu_count=4))
    assert plan.mesh is not None and dict(plan.mesh.backends) == {"tp": "gloo"}
    return plan.mesh


def sequence_layout() -> MeshLayout:
    """sp=2 × dp_shard=2 (Ulysses sequence parallelism inside FSDP's shards), as the planner plans it."""
    options = tp.ModelParallelOptions(sp=2, dp_shard=2)
    request = tp.Request(accelerator="cpu", devices=4, strategy="model_parallel", strategy_options=options)
    plan = tp.resolve(request, tp.Environment(cpu_count=4))
    assert plan.mesh is not None
    return plan.mesh


def attention_parts() -> tuple[torch.nn.Linear, torch.nn.Linear]:
    """The q/k/v projection and the output projection of one attention layer, the same on every rank."""
    torch.manual_seed(13)
    return torch.nn.Linear(WIDTH, 3 * WIDTH), torch.nn.Linear(WIDTH, WIDTH)


def attention_data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(17)
    shape = (2 * BATCH, SEQUENCE, WIDTH)  # two data-parallel shards of BATCH sequences
    return torch.randn(*shape, generator=generator), torch.randn(*shape, generator=generator)


def attention(
    qkv: torch.nn.Linear,
    out: torch.nn.Linear,
    tokens: torch.Tensor,
    swap: Callable[[torch.Tensor, bool], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Multi-head self-attention over (batch, sequence, width); `swap(tensor, forward)` turns a sequence split into
    a head split and back (Ulysses), None on one process."""
    batch, length, _ = tokens.shape
    q, k, v = (part.reshape(batch, length, HEADS, WIDTH // HEADS) for part in qkv(tokens).chunk(3, dim=-1))
    if swap is not None:
        q, k, v = (swap(part, True) for part in (q, k, v))
    attended = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    attended = attended.transpose(1, 2)
    if swap is not None:
        attended = swap(attended, False)
    projected: torch.Tensor = out(attended.reshape(batch, attended.shape[1], WIDTH))
    return projected


def _ulysses_step(layout: MeshLayout, built: dict[str, DeviceMesh], rank: int) -> dict[str, object]:
    """One step of an attention layer with its sequence split over sp (DeepSpeed Ulysses): each rank projects its
    slice, an all-to-all over `built["mesh"]["sp"]` gives it the whole sequence for HEADS/sp heads, and a second one
    gives back its slice of every head; gradients averaged over the FSDP mesh trainplan builds (`dp_shard_sp`)."""
    from torch.distributed.nn.functional import all_to_all_single

    sp_mesh = built["mesh"]["sp"]
    group, size, position = sp_mesh.get_group(), sp_mesh.size(), sp_mesh.get_local_rank()
    shard = layout.coordinates(rank)[layout.dimensions.index("dp_shard")]

    def swap(part: torch.Tensor, forward: bool) -> torch.Tensor:
        batch = part.shape[0]
        if forward:  # (b, s/sp, h, d) -> (b, s, h/sp, d): send head chunk i to rank i, take its sequence slice
            chunks = part.reshape(batch, part.shape[1], size, HEADS // size, -1).permute(2, 0, 1, 3, 4).contiguous()
            got: torch.Tensor = all_to_all_single(torch.empty_like(chunks), chunks, group=group)  # type: ignore[no-untyped-call]
            return got.permute(1, 0, 2, 3, 4).reshape(batch, SEQUENCE, HEADS // size, -1)
        chunks = part.reshape(batch, size, SEQUENCE // size, HEADS // size, -1).permute(1, 0, 2, 3, 4).contiguous()
        back: torch.Tensor = all_to_all_single(torch.empty_like(chunks), chunks, group=group)  # type: ignore[no-untyped-call]
        return back.permute(1, 2, 0, 3, 4).reshape(batch, SEQUENCE // size, HEADS, -1)

    qkv, out = attention_parts()
    inputs, targets = attention_data()
    mine = slice(position * SEQUENCE // size, (position + 1) * SEQUENCE // size)
    batch = slice(shard * BATCH, (shard + 1) * BATCH)
    output = attention(qkv, out, inputs[batch, mine], swap)
    # This slice's share of the shard's mean squared error, times sp: FSDP's mean over dp_shard · sp ranks then
    # gives the gradient of the mean over the shards.
    share = ((output - targets[batch, mine]) ** 2).sum() / targets[batch].numel()
    (share * size).backward()  # type: ignore[no-untyped-call]
    sharded = built["sharded"]
    grads: dict[str, list[float]] = {}
    for prefix, module in (("qkv", qkv), ("out", out)):
        for name, parameter in module.named_parameters():
            assert parameter.grad is not None
            distributed.all_reduce(parameter.grad, group=sharded.get_group())
            grads[f"{prefix}.{name}"] = (parameter.grad / sharded.size()).flatten().tolist()
    loss = share.detach().clone()
    distributed.all_reduce(loss, group=group)
    return {
        "sp_group": list(distributed.get_process_group_ranks(group)),
        "fsdp_group": list(distributed.get_process_group_ranks(sharded.get_group())),
        "fsdp_names": list(sharded.mesh_dim_names or ()),
        "loss": loss.item(),
        "grads": grads,
    }


SHARDED_NAMES = ("fsdp", "dp_shard_cp", "data_parallel")
"""The peers' names their parallelize functions give fully_shard (torchtitan's, Lightning's)."""


def token_shard(shard: int, position: int) -> torch.Tensor:
    """The tokens one rank of sp=2 × dp_shard=2 feeds: its own for each (shard, position along sp)."""
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(10 * shard + position))


def _sharded_over_peer_names(layout: MeshLayout, built: dict[str, DeviceMesh], rank: int) -> dict[str, list[float]]:
    """A linear layer sharded with FSDP2 over each name of `SHARDED_NAMES`, each rank feeding its own tokens (the sp
    ranks of a shard other tokens of the same batch): the gradient each rank ends with."""
    from torch.distributed.fsdp import fully_shard

    coordinates = layout.coordinates(rank)
    shard, position = (coordinates[layout.dimensions.index(name)] for name in ("dp_shard", "sp"))
    grads: dict[str, list[float]] = {}
    for name in SHARDED_NAMES:
        torch.manual_seed(0)
        linear = torch.nn.Linear(4, 1, bias=False)
        fully_shard(linear, mesh=built["mesh"][name])
        linear(token_shard(shard, position)).sum().backward()
        gradient: Any = linear.weight.grad
        grads[name] = gradient.full_tensor().flatten().tolist()
    return grads


def report() -> dict[str, object]:
    with tp.runtime() as rt:
        layout = rt.plan.mesh
        assert layout is not None
        own = {"mesh": rt.mesh, "expert": rt.expert_mesh}
        result: dict[str, object] = {"rank": rt.rank, "own": _meshes_report(layout, own, rt.rank)}
        other = MeshLayout(shape=(1, 1, 4, 1, 1, 1), ep=4)
        built = build_meshes(TorchWrappers(), "cpu", other)
        result["dp_shard_4_ep_4"] = _meshes_report(other, built, rt.rank)
        result["peer_names"] = {name: rt.mesh[name].mesh.flatten().tolist() for name in MESH_ALIASES}
        result["expert_names"] = {name: [_members(rt.mesh[name]), _members(rt.expert_mesh[name])] for name in EXPERT}
        result["lightning"] = _step(rt, lightning_parallelize)
        result["torchtitan"] = _step(rt, torchtitan_parallelize)
        result["moe"] = _moe_step(built["expert"], rt.rank)
        staged = pipeline_layout()
        staged_meshes = build_meshes(TorchWrappers(), "cpu", staged)
        result["pp_2_dp_shard_2"] = _meshes_report(staged, staged_meshes, rt.rank)
        result["pipeline"] = _pipeline_step(staged, staged_meshes, rt.rank)
        result["own_pipeline"] = repr(rt.pipeline)
        sequence = sequence_layout()
        sequence_meshes = build_meshes(TorchWrappers(), "cpu", sequence)
        result["sp_2_dp_shard_2"] = _meshes_report(sequence, sequence_meshes, rt.rank)
        result["ulysses"] = _ulysses_step(sequence, sequence_meshes, rt.rank)
        result["sp_sharded_grads"] = _sharded_over_peer_names(sequence, sequence_meshes, rt.rank)
        overridden = backends_layout()
        overridden_meshes = build_meshes(TorchWrappers(), "cpu", overridden)
        value = torch.tensor(float(rt.rank + 1))
        distributed.all_reduce(value, group=overridden_meshes["mesh"].get_group("tp"))
        result["tp_over_gloo"] = {**_meshes_report(overridden, overridden_meshes, rt.rank), "tp_sum": value.item()}
    return result
