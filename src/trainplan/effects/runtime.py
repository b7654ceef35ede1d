"""The runtime of this process, from its plan: the torch objects a custom training loop needs.

    with trainplan.runtime() as rt:              # the job's plan, joined (tp.join): device bound, group up
        model = rt.wrap(model)                   # moved, cast for *-true, wrapped as the strategy says
        loader = DataLoader(data, batch_size=8, sampler=rt.sampler(data))
        for x, y in loader:
            with rt.autocast():                  # the plan's autocast (nothing for *-true precisions)
                loss = loss_fn(model(x.to(rt.device)), y.to(rt.device))
            rt.step(loss, optimizer)             # backward (scaled for fp16 AMP on CUDA), step, zero_grad
        store = rt.metric_store()

A `model_parallel` plan also gets its device mesh: `rt.mesh` is torch's `DeviceMesh`, built with
`init_device_mesh` and the plan's dimension names (`pp, dp_replicate, dp_shard, cp, sp, tp`) when the runtime starts
(every rank builds it: its groups are collectives); it answers the names Lightning and torchtitan index theirs by
too (`rt.mesh["tensor_parallel"]`, `rt.mesh["dp_shard_cp"]`, `rt.mesh["batch"]`, ...: `rules.MESH_ALIASES`).
`rt.submesh("tp")`, `rt.fsdp_mesh`, `rt.data_parallel_mesh` and `rt.expert_mesh` (`pp, dp_replicate, efsdp, ep`)
hand out the meshes a parallelize function needs; `rt.context_parallel(buffers, seq_dims)` runs torch's context
parallelism over the cp groups with the plan's rotate method and load balancer.

Every decision comes from the plan and `mapping.frameworks` (the precision recipe, the family's wrapper);
this module only builds the torch objects. The torch constructors sit behind `ModelWrappers`, a small seam
that tests replace to check the CUDA-only families (FSDP, DataParallel, DDP with device ids) without a GPU.
The process-level view is typed for a strict downstream loop: `rank`, `local_rank`, `world_size` are ints,
`device` is a `torch.device`.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from trainplan.effects.extras import require_torch
from trainplan.effects.metrics import MetricStore
from trainplan.effects.option_objects import built
from trainplan.effects.rules_loading import rules_of
from trainplan.effects.world import DeviceBinder, World, join
from trainplan.mapping.frameworks import (
    checkpointing_consequence,
    deepspeed_config,
    family_recipe,
    needs_checkpointing,
    needs_grad_scaler,
    option_keywords,
    precision_recipe,
)
from trainplan.rules import HOST_DEVICE, MESH_ALIASES, Rules
from trainplan.rules import MESH_DIMENSIONS as MESH_RULES
from trainplan.rules.mesh import data_parallel, flattened_backend, stage_indices
from trainplan.spec.errors import InvalidRequest, TrainplanError, a_kind
from trainplan.spec.mesh import MeshLayout
from trainplan.spec.names import MESH_DIMENSIONS, ContextParallelRotate, MeshDimension
from trainplan.spec.plan import Plan

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.utils.data.distributed import DistributedSampler

Blocks: TypeAlias = "type[torch.nn.Module] | tuple[type[torch.nn.Module], ...] | Callable[[torch.nn.Module], bool]"
"""Which modules of a model are its repeated blocks (a transformer's layers): a class, a tuple of classes, or a
function module -> bool. The outermost matches count (a match inside another is part of it)."""


class NotWrappable(TrainplanError, RuntimeError):
    """The plan's strategy or precision wraps models another way (DeepSpeed, XLA, Transformer Engine): the
    message says how."""


class ModelWrappers(Protocol):
    """How models are placed and wrapped. The default builds torch's own objects; tests pass fakes."""

    def place(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None) -> torch.nn.Module:
        """The model on `device`, its floating parameters cast to `dtype` when given."""

    def data_parallel(self, model: torch.nn.Module, device_ids: list[int]) -> torch.nn.Module:
        """`torch.nn.DataParallel` over the given visible CUDA indices."""

    def ddp(
        self, model: torch.nn.Module, device_ids: list[int] | None, keywords: Mapping[str, object]
    ) -> torch.nn.Module:
        """`DistributedDataParallel` with the plan's DDP options as its keyword arguments, `keywords` (each option
        as its row spells it for torch: `Runtime.wrapper_keywords`), and device_ids on an accelerator (None on
        CPU)."""

    def fsdp(self, model: torch.nn.Module, device: torch.device, keywords: Mapping[str, object]) -> torch.nn.Module:
        """torch's FSDP on `device` with the plan's FSDP options as its keyword arguments, `keywords` (its sharding
        strategy, CPU offload, and HYBRID_SHARD's 2-D mesh of (nodes, processes per node): replicated across nodes,
        sharded within one), each `Encoded` value built into torch's object first."""

    def sync_batchnorm(self, model: torch.nn.Module) -> torch.nn.Module:
        """BatchNorm layers converted to SyncBatchNorm."""

    def device_mesh(
        self, device_type: str, shape: tuple[int, ...], names: tuple[str, ...], backends: Mapping[str, str]
    ) -> DeviceMesh:
        """torch's `init_device_mesh(device_type, shape, mesh_dim_names=names, backend_override=backends)` over the
        default process group: the groups of a dimension in `backends` run over its backend, the others over the
        world's. A collective: every rank calls it, with the same shape."""

    def flatten(self, mesh: DeviceMesh, names: tuple[str, ...], name: str, backend: str | None) -> DeviceMesh:
        """The dimensions `names` of `mesh` as one dimension called `name` (a collective: it makes a group), its
        group over `backend` (None: the world's)."""

    def unflatten(self, mesh: DeviceMesh, shape: tuple[int, ...], names: tuple[str, ...]) -> DeviceMesh:
        """A 1-D `mesh` split into `names` of sizes `shape` (torch's `DeviceMesh._unflatten(0, ...)`, as torchtitan
        builds its meshes; a collective)."""

    def fully_shard(self, model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
        """FSDP2's `fully_shard(model, mesh=mesh)`: sharded over a 1-D mesh, or replicated × sharded over a 2-D one."""

    def context_parallel(
        self,
        mesh: DeviceMesh,
        buffers: tuple[torch.Tensor, ...],
        seq_dims: tuple[int, ...],
        no_restore: tuple[torch.Tensor, ...],
        rotate_method: ContextParallelRotate,
        load_balance: bool,
    ) -> AbstractContextManager[None]:
        """torch's `context_parallel(mesh, buffers=..., buffer_seq_dims=..., no_restore_buffers=...)` with its rotate
        method (`set_rotate_method`) and load balancing (`_cp_options.enable_load_balance`) set for the context and
        put back after it: inside, each buffer holds this rank's shard of its sequence and SDPA runs as ring
        attention over `mesh`."""


class TorchWrappers:
    """`ModelWrappers` with torch's own classes."""

    def place(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None) -> torch.nn.Module:
        return model.to(device=device, dtype=dtype) if dtype is not None else model.to(device=device)

    def data_parallel(self, model: torch.nn.Module, device_ids: list[int]) -> torch.nn.Module:
        import torch

        return torch.nn.DataParallel(model, device_ids=device_ids, output_device=device_ids[0])

    def ddp(
        self, model: torch.nn.Module, device_ids: list[int] | None, keywords: Mapping[str, object]
    ) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=device_ids, **built(keywords))

    def fsdp(self, model: torch.nn.Module, device: torch.device, keywords: Mapping[str, object]) -> torch.nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return FSDP(model, device_id=device, **built(keywords, device.type))

    def sync_batchnorm(self, model: torch.nn.Module) -> torch.nn.Module:
        import torch

        convert: Any = torch.nn.SyncBatchNorm.convert_sync_batchnorm  # untyped in torch
        converted: torch.nn.Module = convert(model)
        return converted

    def device_mesh(
        self, device_type: str, shape: tuple[int, ...], names: tuple[str, ...], backends: Mapping[str, str]
    ) -> DeviceMesh:
        from torch.distributed.device_mesh import init_device_mesh

        override: Any = dict(backends) or None  # torch's type: by index or name, a name and/or Options each
        return init_device_mesh(device_type, shape, mesh_dim_names=names, backend_override=override)

    def flatten(self, mesh: DeviceMesh, names: tuple[str, ...], name: str, backend: str | None) -> DeviceMesh:
        # torch 2.13 has no public name for it yet; torchtitan and Accelerate flatten their meshes the same way.
        return mesh[names]._flatten(name, backend_override=backend)

    def unflatten(self, mesh: DeviceMesh, shape: tuple[int, ...], names: tuple[str, ...]) -> DeviceMesh:
        unflattened = mesh._unflatten(0, shape, names)
        # Its new names (the expert mesh's efsdp and ep) answered by the root mesh too, as its flattened names are:
        # torch keeps those in the root's `_flatten_mapping` (what `_flatten` writes), and the unflattened mesh's
        # groups are already in the root's registry, so `rt.mesh["ep"]` is `rt.expert_mesh["ep"]`'s groups.
        root = unflattened._get_root_mesh()
        for name in names:
            if name not in (root.mesh_dim_names or ()) and name not in root._flatten_mapping:
                root._flatten_mapping[name] = unflattened[name]
        return unflattened

    @contextlib.contextmanager
    def context_parallel(
        self,
        mesh: DeviceMesh,
        buffers: tuple[torch.Tensor, ...],
        seq_dims: tuple[int, ...],
        no_restore: tuple[torch.Tensor, ...],
        rotate_method: ContextParallelRotate,
        load_balance: bool,
    ) -> Iterator[None]:
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

        # torch keeps both in one module-level record: set for this context, then put back as they were.
        rotate, balance = _cp_options.rotate_method, _cp_options.enable_load_balance
        set_rotate_method(rotate_method)
        _cp_options.enable_load_balance = load_balance
        try:
            with context_parallel(
                mesh, buffers=list(buffers), buffer_seq_dims=list(seq_dims), no_restore_buffers=set(no_restore)
            ):
                yield
        finally:
            _cp_options.rotate_method, _cp_options.enable_load_balance = rotate, balance

    def fully_shard(self, model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
        from torch.distributed.fsdp import fully_shard

        sharded: Any = fully_shard(model, mesh=mesh)  # the model itself, its class extended with FSDPModule
        return model if sharded is None else sharded


# -- the model's repeated blocks: activation checkpointing and sharding units ------------------------------


def repeated_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The model's repeated blocks, by name: the children of its longest `ModuleList` or `Sequential` of two or more
    modules of one class (a transformer's layers; the first such list on a tie); empty when it has none. What
    `rt.wrap` checkpoints and shards one unit each unless told otherwise (`blocks=`)."""
    import torch

    found: dict[str, torch.nn.Module] = {}
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            children = list(module.named_children())
            if len(children) >= 2 and len({type(child) for _, child in children}) == 1 and len(children) > len(found):
                found = {f"{name}.{child}" if name else child: layer for child, layer in children}
    return found


def find_blocks(model: torch.nn.Module, blocks: Blocks | None = None) -> dict[str, torch.nn.Module]:
    """The model's blocks, by name: `repeated_layers(model)` when `blocks` is None, else the outermost modules that
    are of the class(es) `blocks` names or that the function `blocks` says are (`Blocks`)."""
    if blocks is None:
        return repeated_layers(model)
    given: object = blocks
    classes = given if isinstance(given, tuple) else (given,)
    if isinstance(given, type) or (isinstance(given, tuple) and given and all(isinstance(c, type) for c in given)):
        chosen: Callable[[torch.nn.Module], bool] = lambda module: isinstance(module, classes)  # noqa: E731
    elif callable(given) and not isinstance(given, tuple):
        chosen = blocks  # type: ignore[assignment]  # a function module -> bool (narrowed above)
    else:
        raise NotWrappable(
            f"blocks= names the model's repeated blocks: a module class (blocks=MyBlock), a tuple of classes, or a "
            f"function module -> bool; not {given!r}"
        )
    found: dict[str, torch.nn.Module] = {}
    for name, module in model.named_modules():
        inside = any(name.startswith(f"{outer}.") for outer in found)
        if name and not inside and chosen(module):
            found[name] = module
    return found


def _checkpointed(module: torch.nn.Module) -> bool:
    """Whether `module` recomputes its activations already (torch's composable `checkpoint`, or a CheckpointWrapper
    that torch's `apply_activation_checkpointing` put there)."""
    from torch.distributed._composable.contract import _get_registry
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    return isinstance(module, CheckpointWrapper) or "checkpoint" in (_get_registry(module) or {})


def checkpoint_blocks(model: torch.nn.Module, blocks: Blocks | None = None) -> tuple[str, ...]:
    """Activation checkpointing on the model's blocks (`find_blocks`): each block keeps its input and recomputes its
    activations in the backward pass (torch's non-reentrant checkpoint). Returns the blocks' names; a block that
    recomputes already is left as it is, so calling it twice changes nothing.

    It uses torch's composable `checkpoint(module)`, which adds hooks and keeps every name (`model.layers.0.qkv` stays
    itself), not `apply_activation_checkpointing`, whose CheckpointWrapper renames each block's children
    (`layers.0._checkpoint_wrapped_module.qkv`): a tensor-parallel plan written for the model's names would skip them
    (torch's parallelize_module only warns). It composes with DDP, FSDP, FSDP2 and tensor parallelism applied after.

    Use it where a framework has no setting for it (Lightning's DDP strategy, DeepSpeed), then tell the adapter:
    `fabric_arguments(plan, checkpointed=True)`."""
    import torch

    given: object = model
    if not isinstance(given, torch.nn.Module):
        raise NotWrappable(f"checkpoint_blocks takes a torch.nn.Module, not {a_kind(given)}")
    found = find_blocks(model, blocks)
    if not found:
        raise NotWrappable(
            "The model has no repeated blocks to checkpoint"
            + (
                " (no ModuleList or Sequential of two or more layers of one class)"
                if blocks is None
                else f" (no module matches blocks={blocks!r})"
            )
            + ": pass them, blocks=MyBlock (a class, a tuple of classes, or a function module -> bool)"
        )
    return _checkpoint(model, found)


def _checkpoint(model: torch.nn.Module, found: Mapping[str, torch.nn.Module]) -> tuple[str, ...]:
    from torch.distributed._composable.checkpoint_activation import checkpoint

    for name, module in found.items():
        parent = model.get_submodule(name.rpartition(".")[0])
        if not (_checkpointed(module) or _checkpointed(parent)):  # a CheckpointWrapper's block is checkpointed
            checkpoint(module)
    return tuple(found)


def build_meshes(wrappers: ModelWrappers, device_type: str, layout: MeshLayout) -> dict[str, DeviceMesh]:
    """The meshes a runtime hands out for `layout`, built with torch's own `DeviceMesh` on every rank (a
    collective): "mesh", the dense mesh (`pp, dp_replicate, dp_shard, cp, sp, tp`, each dimension's groups over the
    backend the plan gives it, else the world's) answering the peers' names too
    (`rules.MESH_ALIASES`, each a `_flatten` of the dimensions it stands for, kept as "alias NAME"); "data_parallel"
    (`dp`), "sharded" (what
    FSDP2 takes) and "expert" (`pp, dp_replicate, efsdp, ep`, unflattened from the whole world as torchtitan does).
    Any process group of the world may build more than one layout's meshes (a test compares several in one world)."""
    sizes, backends = layout.sizes, layout.backends

    def flatten(dimensions: tuple[MeshDimension, ...], name: str) -> DeviceMesh:
        return wrappers.flatten(mesh, dimensions, name, flattened_backend(dimensions, sizes, backends))

    given: dict[str, str] = {name: backend for name, backend in backends.items()}
    mesh = wrappers.device_mesh(device_type, layout.shape, layout.dimensions, given)
    built = {"mesh": mesh, "data_parallel": flatten(("dp_replicate", "dp_shard"), "dp")}
    for alias, dimensions in MESH_ALIASES.items():
        built[f"alias {alias}"] = flatten(dimensions, alias)
    shard = "dp_shard"
    if layout.size("cp") > 1:  # context ranks shard parameters too
        shard = "dp_shard_cp"
    elif layout.size("sp") > 1:  # and sequence ranks (Ulysses): same parameters, other tokens (DeepSpeed: dp × sp)
        shard = "dp_shard_sp"
        built["alias dp_shard_sp"] = flatten(("dp_shard", "cp", "sp"), shard)
    built["sharded"] = mesh[("dp_replicate", shard)] if layout.size("dp_replicate") > 1 else mesh[shard]
    world = flatten(layout.dimensions, "world")
    built["expert"] = wrappers.unflatten(world, layout.expert.shape, layout.expert.dimensions)
    return built


class PipelineStages:
    """What torch's `torch.distributed.pipelining` needs for this rank's part of the plan's pipeline: the stages it
    holds (`stage_indices`, of `num_stages`), the pp process group, the schedule class (torch's own, by the plan's
    schedule name) and the microbatches a step splits into. Build each `PipelineStage(module, index, num_stages,
    device, group=stages.group)` and the schedule as `stages.schedule_class(stages, n_microbatches=...)`."""

    def __init__(self, layout: MeshLayout, pp_group: Any, rank: int) -> None:
        from torch.distributed.pipelining.schedules import get_schedule_class

        pipeline, pp = layout.pipeline, layout.size("pp")
        self.pp_rank: int = layout.coordinates(rank)[layout.dimensions.index("pp")]
        """This rank's place along the pipeline (its coordinate on `pp`)."""
        self.stage_indices: tuple[int, ...] = stage_indices(
            pipeline.schedule, self.pp_rank, pp, pipeline.virtual_stages
        )
        """The stages this rank holds, as the schedule places them."""
        self.num_stages: int = pp * pipeline.virtual_stages
        self.group: Any = pp_group
        """The pipeline's process group (`rt.submesh("pp").get_group()`)."""
        self.schedule_class: type = get_schedule_class(pipeline.schedule)
        """torch's schedule class (`Schedule1F1B`, `ScheduleGPipe`, ...)."""
        self.microbatches: int = pipeline.microbatches
        self.schedule_name = pipeline.schedule

    def __repr__(self) -> str:
        return (
            f"PipelineStages(schedule={self.schedule_name!r}, stage_indices={self.stage_indices}, "
            f"num_stages={self.num_stages}, microbatches={self.microbatches})"
        )


class Runtime:
    """This process's view of its plan, joined: its ranks, its device, and the torch objects of its loop."""

    def __init__(
        self, plan: Plan, world: World, *, wrappers: ModelWrappers | None = None, rules: Rules | None = None
    ) -> None:
        import torch

        self.plan = plan
        self.world = world
        self.rank: int = world.rank
        self.local_rank: int = world.local_rank
        self.world_size: int = world.world_size
        self.is_main: bool = world.rank == 0
        """Rank 0 (where to save checkpoints and print)."""
        self.device: torch.device = torch.device(world.device)
        self._wrappers: ModelWrappers = TorchWrappers() if wrappers is None else wrappers
        self._wrapped: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # what wrap took and gave: never twice
        self.rules: Rules = rules_of(plan) if rules is None else _same_rules(plan, rules)
        """The rule set the plan was made from: a downstream precision's recipe is one of its rows."""
        if plan.precision not in self.rules.precision_recipes:
            raise NotWrappable(
                f"precision={plan.precision!r} is a downstream rule set's, and its recipe (what the runtime does "
                "with it) is a row of that rule set: pass it, trainplan.runtime(plan, rules=RULES)"
            )
        recipe = precision_recipe(plan, self.rules)
        self.parameter_dtype: torch.dtype = getattr(torch, recipe.parameter_dtype)
        """The dtype `wrap` gives the model's parameters (float32 for mixed precisions)."""
        self.autocast_dtype: torch.dtype | None = (
            None if recipe.autocast_dtype is None else getattr(torch, recipe.autocast_dtype)
        )
        """The dtype `autocast()` computes in; None for the *-true precisions."""
        self.grad_scaler: torch.amp.GradScaler | None = None
        """A GradScaler where the plan needs one (fp16 AMP on CUDA; FSDP's sharded one under FSDP), else None;
        `step` uses it."""
        if needs_grad_scaler(plan, self.rules):
            if family_recipe(plan).sharded_grad_scaler:
                from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

                self.grad_scaler = ShardedGradScaler(self.device.type)
            else:
                self.grad_scaler = torch.amp.GradScaler(self.device.type)
        self.data_parallel_rank: int = self.rank
        """Which data-parallel replica this rank is: the batches it reads (ranks that differ only in tensor, context
        or pipeline coordinates read the same ones)."""
        self.data_parallel_size: int = self.world_size
        """How many data-parallel replicas read different batches."""
        self.checkpointing: tuple[str, ...] = ()
        """The blocks `wrap` applied activation checkpointing to, by name (empty: none): the plan's memory choice
        recomputes activations (`plan.memory.checkpointing`)."""
        self.sharding_units: tuple[str, ...] = ()
        """The blocks `wrap` sharded as units of their own, by name (FSDP's and FSDP2's: one layer gathered at a time,
        as the memory arithmetic counts); empty: the whole model is one unit, or nothing is sharded."""
        self._meshes: dict[str, DeviceMesh] = {}
        self._mesh_group = False
        if plan.mesh is not None:
            self.data_parallel_rank, self.data_parallel_size = data_parallel(plan.mesh, self.rank)
            self._build_meshes(plan.mesh)

    # -- the device mesh --------------------------------------------------------------------------------

    def _build_meshes(self, layout: MeshLayout) -> None:
        """Every mesh this runtime hands out, built now on every rank (making their groups is a collective)."""
        from torch import distributed
        from torch.distributed import HashStore  # type: ignore[attr-defined]  # re-exported at runtime

        if self.world_size == 1 and not distributed.is_initialized():
            # A world of one: joining made no process group (there is no one to meet), and a mesh needs one.
            distributed.init_process_group(self.plan.process_group_backend, store=HashStore(), rank=0, world_size=1)
            self._mesh_group = True
        self._meshes.update(build_meshes(self._wrappers, self.device.type, layout))

    @property
    def mesh(self) -> DeviceMesh:
        """The plan's device mesh: torch's `DeviceMesh` with the dimensions `pp, dp_replicate, dp_shard, cp, sp, tp` (in
        that order, sizes as the plan says; this rank's coordinates are `plan.mesh_coordinates`)."""
        return self._mesh("rt.mesh")

    def submesh(self, *dimensions: MeshDimension) -> DeviceMesh:
        """The mesh over some of its dimensions, in the mesh's order: `rt.submesh("tp")` for `parallelize_module`,
        `rt.submesh("pp")` for pipeline stages."""
        mesh = self._mesh("rt.submesh")
        unknown = [name for name in dimensions if name not in MESH_DIMENSIONS]
        if unknown or not dimensions:
            raise NotWrappable(
                f"rt.submesh takes dimensions of the mesh, {', '.join(map(repr, MESH_DIMENSIONS))}; "
                f"{unknown[0]!r} is not one of them"
                if unknown
                else "rt.submesh needs at least one dimension"
            )
        ordered = tuple(name for name in MESH_DIMENSIONS if name in dimensions)
        return mesh[ordered[0]] if len(ordered) == 1 else mesh[ordered]

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """The mesh FSDP2's `fully_shard` takes: the data-parallel shards (with the context-parallel ranks folded in
        as `dp_shard_cp` when `cp` > 1, the sequence-parallel ones as `dp_shard_sp` when `sp` > 1), and the replicas
        as an outer dimension when `dp_replicate` > 1 (HSDP)."""
        self._mesh("rt.fsdp_mesh")
        return self._meshes["sharded"]

    @property
    def data_parallel_mesh(self) -> DeviceMesh:
        """One dimension, `dp`, over the data-parallel replicas and shards: the ranks that read different batches
        (average a loss or a metric over its group, `rt.data_parallel_mesh.get_group()`)."""
        self._mesh("rt.data_parallel_mesh")
        return self._meshes["data_parallel"]

    @property
    def pipeline(self) -> PipelineStages:
        """This rank's part of the plan's pipeline (`PipelineStages`): its stage index or indices, the pp group
        and torch's schedule class."""
        mesh = self._mesh("rt.pipeline")
        assert self.plan.mesh is not None
        return PipelineStages(self.plan.mesh, mesh["pp"].get_group(), self.rank)

    def context_parallel(
        self,
        buffers: Sequence[torch.Tensor],
        seq_dims: Sequence[int],
        *,
        no_restore: Iterable[torch.Tensor] = (),
    ) -> AbstractContextManager[None]:
        """torch's context parallelism over the plan's `cp` groups, as a context: `with rt.context_parallel([inputs,
        targets], [1, 1]): loss = loss_fn(model(inputs), targets)`. Inside, each buffer (batch, labels, positions)
        holds this rank's shard of its sequence dimension (`seq_dims`, one per buffer) and SDPA runs as ring
        attention (CUDA kernels only), with the plan's rotate method and load balancer (`plan.mesh.context_parallel`);
        after it, the buffers are whole again (except `no_restore`) and torch's settings are as they were.

        The head-tail load balancer cuts each sequence into 2·cp chunks (no balancer: cp blocks): a sequence whose
        length they do not divide is refused (`NotWrappable`), where torch would silently split it unbalanced."""
        mesh = self._mesh("rt.context_parallel")
        layout = self.plan.mesh
        assert layout is not None  # a runtime with a mesh has the plan's
        cp, context = layout.size("cp"), layout.context_parallel
        if cp == 1:
            raise NotWrappable(
                "rt.context_parallel: the plan's cp is 1, so no sequence is split and there is nothing to run; plan "
                "cp=2 or more (ModelParallelOptions(cp=2), on CUDA)"
            )
        buffers, seq_dims = tuple(buffers), tuple(seq_dims)
        if not buffers or len(buffers) != len(seq_dims):
            raise NotWrappable(
                f"rt.context_parallel takes the buffers to split and one sequence dimension for each: {len(buffers)} "
                f"buffer(s) and {len(seq_dims)} dimension(s) given; write e.g. rt.context_parallel([inputs, targets], "
                "[1, 1])"
            )
        balance = context.load_balancer == "head_tail"
        chunks = 2 * cp if balance else cp
        length = buffers[0].shape[seq_dims[0]]
        if length % chunks:
            how = f"the head-tail load balancer cuts it into 2·cp = {chunks} chunks" if balance else f"cp={cp} blocks"
            raise NotWrappable(
                f"rt.context_parallel: the sequence has {length} tokens and {how}, which do not divide it (torch "
                f"would split it {'without balancing' if balance else 'unevenly'}); pad it to a multiple of {chunks}"
                + (", or plan cp_load_balancer='none'" if balance else "")
            )
        return self._wrappers.context_parallel(
            mesh["cp"], buffers, seq_dims, tuple(no_restore), context.rotate_method, balance
        )

    @property
    def expert_mesh(self) -> DeviceMesh:
        """The expert mesh, torchtitan's sparse mesh: `pp, dp_replicate, efsdp, ep` over the same ranks, the
        `dp_shard × cp × tp` ranks regrouped as `efsdp × ep` (`rt.expert_mesh["ep"]` splits the experts, the
        experts' FSDP2 shards over `rt.expert_mesh["efsdp"]`); this rank sits at `plan.mesh.expert.coordinates`."""
        self._mesh("rt.expert_mesh")
        return self._meshes["expert"]

    def _mesh(self, what: str) -> DeviceMesh:
        self._check_joined(what)
        if "mesh" not in self._meshes:
            raise NotWrappable(
                f"{what}: strategy {self.plan.strategy.name!r} has no device mesh. Resolve a plan with "
                "strategy='model_parallel' (its degrees in ModelParallelOptions) for one"
            )
        return self._meshes["mesh"]

    # -- the model ------------------------------------------------------------------------------------

    def wrap(
        self,
        model: torch.nn.Module,
        *,
        parallelize: Callable[[torch.nn.Module, DeviceMesh], torch.nn.Module] | None = None,
        blocks: Blocks | None = None,
    ) -> torch.nn.Module:
        """`model` placed on this process's device (cast for *-true precisions) and wrapped as the strategy says:
        one device: moved; dp: DataParallel; DDP family: DDP with the plan's options; FSDP: torch's FSDP.

        The plan's memory choice is carried out on the model's repeated blocks (`blocks`: a class, a tuple of
        classes or a function module -> bool; by default `repeated_layers(model)`, the longest ModuleList or
        Sequential of one class): where `plan.memory` recomputes activations, each block is checkpointed
        (`checkpoint_blocks`) before any wrapper or parallelize function sees the model, and FSDP and FSDP2 shard each
        block as a unit of its own, then the rest. A plan that needs checkpointing and a model without blocks is
        refused (`NotWrappable`, saying what to pass). `rt.checkpointing` and `rt.sharding_units` name what was done.

        A device mesh (`model_parallel`) is applied by `parallelize(model, rt.mesh)`, a function that knows the
        model's layers (as Lightning's ModelParallelStrategy takes one): it splits them for tensor parallelism
        (`parallelize_module` over `rt.submesh("tp")`), into pipeline stages, and shards them (`fully_shard` over
        `rt.fsdp_mesh`). With data parallelism alone no layer needs to be known: without a function, the model is
        sharded with FSDP2 over `rt.fsdp_mesh`."""
        self._check_joined("wrap")
        import torch

        given: object = model
        if not isinstance(given, torch.nn.Module):
            raise NotWrappable(f"rt.wrap takes a torch.nn.Module, not {a_kind(given)}: wrap the model, then call it")
        wrapper = _wrapper_of(given)
        if wrapper is not None or given in self._wrapped:
            what = f"already a {wrapper}" if wrapper is not None else "a model this runtime wrapped already"
            raise NotWrappable(
                f"rt.wrap takes the bare model once, and this one is {what}: a second wrapper would reduce every "
                "gradient twice. Wrap the model itself, once, and keep the module rt.wrap returns"
            )
        wrapped = self._wrap(given, parallelize, blocks)
        self._wrapped.update((given, wrapped))
        return wrapped

    def _blocks(self, model: torch.nn.Module, blocks: Blocks | None) -> dict[str, torch.nn.Module]:
        """The model's blocks, checkpointed where the plan's memory choice recomputes activations (before any
        wrapper: each block's hooks then run inside DDP, FSDP and a parallelize function's modules)."""
        found = find_blocks(model, blocks)
        if needs_checkpointing(self.plan):
            if not found:
                memory = self.plan.memory
                layout = memory.chosen if memory is not None else None
                raise NotWrappable(
                    f"The plan's layout {layout} fits only with activation checkpointing "
                    f"({checkpointing_consequence(self.plan)}), and the model has no repeated blocks to checkpoint"
                    + (
                        " (no ModuleList or Sequential of two or more layers of one class)"
                        if blocks is None
                        else f" (no module matches blocks={blocks!r})"
                    )
                    + ": pass them, rt.wrap(model, blocks=MyBlock) (a class, a tuple of classes, or a function "
                    "module -> bool)"
                )
            self.checkpointing = _checkpoint(model, found)
        return found

    def _wrap(
        self,
        model: torch.nn.Module,
        parallelize: Callable[[torch.nn.Module, DeviceMesh], torch.nn.Module] | None,
        blocks: Blocks | None,
    ) -> torch.nn.Module:
        recipe = family_recipe(self.plan)
        precision = precision_recipe(self.plan, self.rules)
        if precision.engine != "torch":
            raise NotWrappable(
                f"precision={self.plan.precision!r} runs through NVIDIA Transformer Engine: wrap the model's layers "
                "with transformer_engine.pytorch modules and run them under te.fp8_autocast; rt.wrap places "
                "torch models only"
            )
        dtype = self.parameter_dtype if self.autocast_dtype is None else None
        if recipe.wrapper == "xla":
            raise NotWrappable(
                "The plan runs on XLA: torch_xla places and wraps models itself (torch_xla.launch, "
                "xm.xla_device()); use the plan's precision there"
            )
        if recipe.wrapper == "deepspeed":
            raise NotWrappable(
                "DeepSpeed wraps the model together with its optimizer: call deepspeed.initialize(model=model, "
                "optimizer=optimizer, config=rt.deepspeed_config(micro_batch_size=...)) instead of rt.wrap"
                + (
                    ", after trainplan.checkpoint_blocks(model): the plan's layout fits only with activation "
                    f"checkpointing ({checkpointing_consequence(self.plan)})"
                    if needs_checkpointing(self.plan)
                    else ""
                )
            )
        if recipe.wrapper == "mesh":
            return self._wrap_mesh(model, dtype, parallelize, blocks)
        if parallelize is not None:
            raise NotWrappable(
                f"rt.wrap(parallelize=...) applies a device mesh, and strategy {self.plan.strategy.name!r} has none: "
                "use strategy='model_parallel', or wrap without it"
            )
        placed = self._wrappers.place(model, self.device, dtype)
        found = self._blocks(placed, blocks)
        if recipe.wrapper == "move":
            return placed
        if recipe.wrapper == "data_parallel":
            return self._wrappers.data_parallel(placed, list(self.plan.devices))
        if self.plan.request.sync_batchnorm is True and self.world_size > 1:
            placed = self._wrappers.sync_batchnorm(placed)
        if recipe.wrapper == "ddp":
            device_ids = None if self.device.type == HOST_DEVICE else [self.device.index or 0]
            return self._wrappers.ddp(placed, device_ids, self.wrapper_keywords())
        if recipe.wrapper == "fsdp":
            keywords = self.wrapper_keywords()
            if found:  # one unit per block: FSDP gathers one layer at a time, as the memory arithmetic counts
                keywords["auto_wrap_policy"] = _units_policy(found.values())
                self.sharding_units = tuple(found)
            return self._wrappers.fsdp(placed, self.device, keywords)
        raise NotWrappable(f"strategy {self.plan.strategy.name!r} has no torch wrapper")

    def wrapper_keywords(self) -> dict[str, object]:
        """The plan's options as the keyword arguments of its torch wrapper (DDP's, FSDP's): each option as its row
        in the plan's rule set spells it for torch (`rules.options`); an `Encoded` one is built by the wrapper (a
        sharding strategy, HYBRID_SHARD's device mesh: a collective, as `wrap` is)."""
        return option_keywords(self.plan, "torch", "torch's wrapper", self.rules)

    def _wrap_mesh(
        self,
        model: torch.nn.Module,
        dtype: torch.dtype | None,
        parallelize: Callable[[torch.nn.Module, DeviceMesh], torch.nn.Module] | None,
        blocks: Blocks | None,
    ) -> torch.nn.Module:
        layout = self.plan.mesh
        assert layout is not None  # a model_parallel plan always has its mesh (Plan.from_dict checks it)
        if self.plan.request.sync_batchnorm is True and self.world_size > 1:
            raise NotWrappable(
                "sync_batchnorm=True with a device mesh: batch statistics belong to the data-parallel ranks only. "
                "Convert the model inside your parallelize function: torch.nn.SyncBatchNorm.convert_sync_batchnorm("
                "model, process_group=rt.data_parallel_mesh.get_group())"
            )
        if parallelize is not None:
            if not callable(parallelize):
                raise NotWrappable(
                    f"rt.wrap(parallelize=...) takes a function fn(model, device_mesh) -> model, not a "
                    f"{type(parallelize).__name__}"
                )
            import torch

            self._blocks(model, blocks)  # checkpointed before the function: it keeps every name (checkpoint_blocks)
            parallel = parallelize(model, self.mesh)
            if not isinstance(parallel, torch.nn.Module):
                raise NotWrappable(
                    f"The parallelize function returned {a_kind(parallel)}, not the model: return the "
                    "torch.nn.Module it parallelized"
                )
            return self._wrappers.place(parallel, self.device, dtype)
        layered = [name for name in MESH_DIMENSIONS if layout.size(name) > 1 and not MESH_RULES[name].splits_data]
        if layered:
            spelled = ", ".join(f"{name}={layout.size(name)}" for name in layered)
            raise NotWrappable(
                f"The mesh has {spelled}: which layers to split or stage depends on the model. Pass a function that "
                "applies it, rt.wrap(model, parallelize=fn) with fn(model, device_mesh) -> model (e.g. "
                'parallelize_module(model, device_mesh["tp"], plan), then fully_shard(model, mesh=rt.fsdp_mesh))'
            )
        placed = self._wrappers.place(model, self.device, dtype)
        found = self._blocks(placed, blocks)
        for block in found.values():  # one unit per block, then the rest (the root), as torchtitan shards
            self._wrappers.fully_shard(block, self.fsdp_mesh)
        self.sharding_units = tuple(found)
        return self._wrappers.fully_shard(placed, self.fsdp_mesh)

    def deepspeed_config(self, *, micro_batch_size: int = 1, gradient_accumulation_steps: int = 1) -> dict[str, object]:
        """The DeepSpeed config for this plan (see `mapping.frameworks.deepspeed_config`)."""
        return deepspeed_config(
            self.plan,
            micro_batch_size=micro_batch_size,
            gradient_accumulation_steps=gradient_accumulation_steps,
            rules=self.rules,
        )

    # -- precision ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The plan's autocast (device type and dtype) for the forward pass; nothing for *-true precisions."""
        if self.autocast_dtype is None:
            yield
            return
        import torch

        with torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype):
            yield

    def step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """Backward, optimizer step and zero_grad; the loss scaled and unscaled where the plan needs it."""
        import torch

        given: object = loss
        if not isinstance(given, torch.Tensor) or given.numel() != 1 or not given.requires_grad:
            what = (
                type(given).__name__
                if not isinstance(given, torch.Tensor)
                else (
                    f"a tensor of shape {tuple(given.shape)}"
                    if given.numel() != 1
                    else "a tensor that does not require grad"
                )
            )
            raise NotWrappable(
                f"rt.step takes the scalar loss of this step, a tensor that requires grad; this is {what}. "
                "Compute it from the model's output (and reduce it to one number, e.g. .mean())"
            )
        if not (callable(getattr(optimizer, "step", None)) and callable(getattr(optimizer, "zero_grad", None))):
            raise NotWrappable(
                f"rt.step takes the optimizer to step, not {a_kind(optimizer)}: e.g. torch.optim.SGD(...)"
            )
        backward: Any  # Tensor.backward is untyped in torch
        if self.grad_scaler is None:
            backward = loss.backward
            backward()
            optimizer.step()
        else:
            backward = self.grad_scaler.scale(loss).backward
            backward()
            self.grad_scaler.step(optimizer)
            self.grad_scaler.update()
        optimizer.zero_grad(set_to_none=True)

    # -- data, synchronisation, metrics -----------------------------------------------------------------

    def sampler(
        self, dataset: Sized, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False
    ) -> DistributedSampler[Any]:
        """This rank's share of `dataset` (a DistributedSampler over the plan's data-parallel replicas: every rank of
        the world, or under a device mesh the ranks that read different batches; the whole of it for one process).
        Call `sampler.set_epoch(epoch)` each epoch when shuffling."""
        from torch.utils.data.distributed import DistributedSampler

        given: object = dataset
        if not isinstance(given, Sized):
            raise NotWrappable(
                f"rt.sampler takes a dataset with a length (a map-style Dataset), not {a_kind(given)}; "
                "an iterable dataset shards itself (torch.utils.data.get_worker_info, the rank)"
            )
        return DistributedSampler(
            dataset,  # type: ignore[arg-type]  # any sized dataset: DistributedSampler only takes len()
            num_replicas=self.data_parallel_size,
            rank=self.data_parallel_rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )

    def barrier(self) -> None:
        """Wait for every rank (nothing to wait for with one process)."""
        self._check_joined("barrier")
        if self.world_size > 1:
            from torch import distributed

            distributed.barrier()

    def metric_store(self) -> MetricStore:
        """A metric store for this plan, reduced over this world."""
        return MetricStore(self.plan)

    # -- leaving --------------------------------------------------------------------------------------

    def leave(self, *, wait_for_peers: bool = True) -> None:
        """Leave the world (destroys the process group if joining created it; see `World.leave`)."""
        self.world.leave(wait_for_peers=wait_for_peers)
        if self._mesh_group:
            self._mesh_group = False
            from torch import distributed

            if distributed.is_initialized():
                distributed.destroy_process_group()

    def _check_joined(self, what: str) -> None:
        if self.world.left:
            if self.plan.mesh is not None:
                # torch cannot make a mesh's groups again in this process once it has made subgroups (gloo's
                # connectFullMesh fails), so a second runtime is no way out for a mesh plan.
                raise NotWrappable(
                    f"rt.{what} after leaving the world: this runtime's process group and device mesh are gone, and "
                    "a mesh plan cannot build its mesh a second time in one process. Use one runtime per process: "
                    "open trainplan.runtime(plan) once and keep it open (the whole loop inside its `with` block)"
                )
            raise NotWrappable(
                f"rt.{what} after leaving the world: this runtime's process group is gone. Start a new one with "
                "trainplan.runtime(plan), and keep the loop inside its `with` block"
            )

    def __enter__(self) -> Runtime:
        self._check_joined("__enter__")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.leave(wait_for_peers=kind is None)

    def __repr__(self) -> str:
        return (
            f"Runtime(rank={self.rank}, world_size={self.world_size}, device={self.device}, "
            f"strategy={self.plan.strategy.name!r}, precision={self.plan.precision!r})"
        )


def _units_policy(blocks: Iterable[torch.nn.Module]) -> Any:
    """FSDP's `auto_wrap_policy` that makes each of `blocks` (these module objects) a unit of its own."""
    import functools

    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    units = {id(block) for block in blocks}
    return functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda module: id(module) in units)


def _wrapper_of(model: object) -> str | None:
    """The name of the torch wrapper `model` already is (DDP, DataParallel, FSDP, an FSDP2 module), or None."""
    import torch

    kinds: list[tuple[str, type]] = [
        ("DistributedDataParallel", torch.nn.parallel.DistributedDataParallel),
        ("DataParallel", torch.nn.DataParallel),
    ]
    with contextlib.suppress(ImportError):
        from torch.distributed.fsdp import FullyShardedDataParallel

        kinds.append(("FullyShardedDataParallel", FullyShardedDataParallel))
    with contextlib.suppress(ImportError):
        from torch.distributed.fsdp import FSDPModule  # torch >= 2.6

        kinds.append(("fully_shard (FSDP2) module", FSDPModule))
    return next((name for name, kind in kinds if isinstance(model, kind)), None)


def _same_rules(plan: Plan, rules: Rules) -> Rules:
    """`rules`, when the plan may have been made from it: as `Plan.from_dict` reads a plan, a rule set whose
    reference differs from the one the plan records is refused (its recipes are another rule set's)."""
    given: object = rules
    if not isinstance(given, Rules):
        raise InvalidRequest(
            field="rules",
            value=given,
            reason=f"the runtime takes a trainplan.Rules, not {a_kind(given)}",
            fix="Pass the rule set the plan was made from (trainplan.BUILTIN_RULES, or one built with extend), or "
            "leave rules out",
        )
    if not rules.may_have_made(plan.rules):
        raise InvalidRequest(
            field="rules",
            value=rules.reference,
            reason=f"the plan was made from the rule set {plan.rules!r}, and is run with "
            f"{rules.reference or 'another one'!r}: its precision recipe would be the other rule set's",
            fix="Run it with the rule set it names (or leave rules out: the plan's own is imported)",
        )
    return rules


def runtime(
    plan: Plan | None = None,
    *,
    wrappers: ModelWrappers | None = None,
    rules: Rules | None = None,
    devices: DeviceBinder | None = None,
) -> Runtime:
    """Join `plan`'s world (default: `trainplan.resolve()`, the plan of the job this process is in) and return
    this process's runtime. Use it as a context manager to leave the world at the end.

    `rules`: the rule set the plan was made from (default: the one the plan names, imported; trainplan's own for
    its plans). `devices` binds a downstream accelerator's device (see `trainplan.join`)."""
    require_torch("trainplan.runtime")  # its device, wrappers, autocast and sampler are torch's
    if plan is not None and not isinstance(plan, Plan):
        raise NotWrappable(f"runtime takes a trainplan.Plan, not {a_kind(plan)}: build one with trainplan.resolve()")
    if plan is None:
        import trainplan

        plan = trainplan.resolve()
    if rules is not None:
        _same_rules(plan, rules)  # before joining: a refused rule set leaves no process group behind
    return Runtime(plan, join(plan, devices=devices), wrappers=wrappers, rules=rules)


__all__ = [
    "Blocks",
    "ModelWrappers",
    "NotWrappable",
    "Runtime",
    "TorchWrappers",
    "checkpoint_blocks",
    "find_blocks",
    "repeated_layers",
    "runtime",
]
