"""Strategy options, one row each: what values an option takes, its default, and how each place that runs a plan
spells it: torch (the runtime's DDP or FSDP wrapper, or how the plan applies it), Lightning and Fabric (the
strategy's constructor), Accelerate (a kwargs handler or plugin field, and its `accelerate launch` flag) and
DeepSpeed's config (a path in it), or why that place cannot express it.

The checker (`option_checks`), the runtime's wrappers and every adapter (`mapping.frameworks`) loop over these
rows: a new option is one record field and one row, and it reaches every framework or is refused by name there.
A downstream rule set adds rows by value (`Rules.extend(options=...)`); their values travel in the record's
`extra`. Nothing here names an option anywhere else.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Final, Literal, TypeAlias, get_args

import attrs

from trainplan.rules.job import MAX_WORLD_SIZE
from trainplan.rules.mesh import LIGHTNING_SIZES
from trainplan.rules.mesh import MESH_DIMENSIONS as MESH_RULES
from trainplan.rules.messages import RefusalId
from trainplan.rules.strategies import OPTION_TYPES
from trainplan.spec.frozen import freeze_nested_maps
from trainplan.spec.names import (
    CONTEXT_PARALLEL_BALANCERS,
    CONTEXT_PARALLEL_ROTATES,
    GROUP_BACKENDS,
    MESH_DIMENSIONS,
    PIPELINE_SCHEDULES,
    MeshDimension,
    StrategyFamily,
)
from trainplan.spec.options import (
    DEEPSPEED_STAGES,
    OFFLOAD_DEVICES,
    SHARDING_STRATEGIES,
    DDPOptions,
    DeepSpeedOptions,
    FSDPOptions,
    ModelParallelOptions,
    StrategyOptions,
    backend_option,
)

OptionTarget: TypeAlias = Literal["torch", "lightning", "accelerate", "deepspeed_config"]
"""Where a plan's options go: torch's own objects (the runtime), Lightning/Fabric's strategy, Accelerate's kwargs
handlers and plugins, and DeepSpeed's config."""

OPTION_TARGETS: Final[tuple[OptionTarget, ...]] = get_args(OptionTarget)

Encoding: TypeAlias = Literal["plain", "timedelta", "ShardingStrategy", "CPUOffload", "DeviceMesh"]
"""How an effect turns a plain value into the object its target takes: as it is; seconds as a `timedelta`; a name
as torch's `ShardingStrategy`; a flag as torch's `CPUOffload(offload_params=...)`; a (nodes, processes) shape as
a 2-D `DeviceMesh` (replicate × shard)."""

AccelerateHandler: TypeAlias = Literal[
    "DistributedDataParallelKwargs",
    "InitProcessGroupKwargs",
    "FullyShardedDataParallelPlugin",
    "DeepSpeedPlugin",
    "TorchContextParallelConfig",
]
"""Accelerate's objects that take options: its kwargs handlers and plugins, by class name."""

NodeLayout: TypeAlias = tuple[int, int]
"""(nodes, processes per node): what a written value may depend on besides the options."""

Writer: TypeAlias = Callable[[Mapping[str, object], NodeLayout], object]
"""The value a keyword gets, from every option's value (by name) and the plan's layout; `OMIT` leaves it out."""


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


OMIT: Final = _Omit()
"""What a writer returns to leave its keyword out (the target's own default holds)."""

NVME_PATH: Final = "/local_nvme"
"""Where DeepSpeed offloads to NVMe when the options do not say (Lightning's default too)."""

DEEPSPEED_NO_OFFLOAD: Final = "none"
"""DeepSpeed's (and `accelerate launch`'s) offload device for a part that stays on the accelerator."""

MAX_PROCESS_GROUP_TIMEOUT: Final[int] = (2**31 - 1) // 1000
"""Seconds: a process-group timeout travels as int32 milliseconds."""


# --------------------------------------------------------------------------------------------------
# What values an option takes


@attrs.frozen
class TrueOrFalse:
    """True or False."""


@attrs.frozen
class OneOf:
    """One of `values` (a bool is not a number here: `True` is not stage 1)."""

    values: tuple[object, ...]
    reason: str  # why another value cannot be


@attrs.frozen(kw_only=True)
class WholeNumber:
    """A whole number from `minimum` to `maximum`."""

    minimum: int
    maximum: int
    above: str  # why not above the maximum
    fix: str
    optional: bool = False  # None is taken too (the option's own default stands for a number the plan works out)


@attrs.frozen
class ParallelDegree:
    """A whole number of ranks from 1 to torch's rank limit, or "auto" (and None: not used, where `optional`; -1,
    read as "auto", where `minus_one_is_auto`)."""

    optional: bool = False
    maximum: int = MAX_WORLD_SIZE
    minus_one_is_auto: bool = False
    takes_auto: bool = True  # False: a degree that cannot take what the others leave (ep borrows, it adds nothing)


OptionCheck: TypeAlias = TrueOrFalse | OneOf | WholeNumber | ParallelDegree


# --------------------------------------------------------------------------------------------------
# How a target spells it


@attrs.frozen
class Keyword:
    """A keyword argument of the target's object (torch's wrapper, Lightning's strategy), or a dotted path in
    DeepSpeed's config."""

    key: str
    write: Writer | None = None  # the value written there; None: the option's own value
    encoding: Encoding = "plain"


@attrs.frozen
class HandlerField:
    """A field of one of Accelerate's kwargs handlers or plugins, and the `accelerate launch` flag that carries the
    same value (None: none)."""

    handler: AccelerateHandler
    key: str
    write: Writer | None = None  # the value written there; None: the option's own value
    flag: str | None = None


@attrs.frozen
class ProcessGroupTimeout:
    """The option is the process group's timeout: applied where the group is made (torch: joining the world;
    Accelerate: `InitProcessGroupKwargs(timeout=...)`). A family has one at most."""


@attrs.frozen
class ThroughMesh:
    """The option is a degree of the plan's device mesh (`plan.mesh`, resolved from every degree): each target takes
    the mesh as the mesh's rows say (`rt.mesh`, Lightning's sizes, Accelerate's `ParallelismConfig`); `ep` is the
    expert mesh's (`rt.expert_mesh`)."""

    dimension: MeshDimension | Literal["ep"]


@attrs.frozen
class ThroughMeshGroups:
    """The option says how the groups along one dimension of the plan's device mesh run, beside its degree: their
    backend (`plan.mesh.backends`, which the runtime passes to `init_device_mesh(..., backend_override=...)`), or for
    `cp` torch's context-parallel rotate method and load balancer (`plan.mesh.context_parallel`, which
    `rt.context_parallel` applies)."""

    dimension: MeshDimension


@attrs.frozen
class ThroughPipeline:
    """The option is part of the plan's pipeline (`plan.mesh.pipeline`, checked against the schedule's row): the
    runtime's `rt.pipeline` hands it to torch's `torch.distributed.pipelining` schedule."""


@attrs.frozen
class Carried:
    """The option is written inside the spellings of the options `by` (DeepSpeed's offload device, inside each
    offload block): it takes effect where one of them is on."""

    by: tuple[str, ...]


@attrs.frozen
class Refused:
    """The target cannot express the option: an adapter refuses a plan whose value is not the default, by name,
    with this reason."""

    reason: str


Spelling: TypeAlias = (
    tuple[Keyword, ...]
    | tuple[HandlerField, ...]
    | ProcessGroupTimeout
    | ThroughMesh
    | ThroughMeshGroups
    | ThroughPipeline
    | Carried
    | Refused
    | None
)
"""How a target spells an option (keywords: Accelerate's are handler fields); None: the family never runs there.
Each target has its own kinds (`SPELLING_KINDS`; `OptionRow`'s fields say them to a type checker too)."""


SPELLING_KINDS: Final[Mapping[OptionTarget, tuple[type, ...]]] = {
    "torch": (Keyword, ProcessGroupTimeout, ThroughMesh, ThroughMeshGroups, ThroughPipeline, Carried, Refused),
    "lightning": (Keyword, ThroughMesh, Carried, Refused),
    "accelerate": (HandlerField, ProcessGroupTimeout, ThroughMesh, Carried, Refused),
    "deepspeed_config": (Keyword, Carried, Refused),
}
"""How each target may spell an option: its first kind in a tuple of them (at least one), or one of the others."""


@attrs.frozen(kw_only=True)
class Needs:
    """Values other options must hold when this one is not at its default, and the refusal (a rule id of
    `RULES`, filled with those options' values) when they do not."""

    values: Mapping[str, object]
    refusal: RefusalId

    __attrs_post_init__ = freeze_nested_maps  # nested maps read-only: nobody changes a rule in place


@attrs.frozen(kw_only=True)
class OptionRow:
    """One strategy option of one family."""

    family: StrategyFamily
    name: str
    default: object
    check: TrueOrFalse | OneOf | WholeNumber | ParallelDegree
    torch: (
        tuple[Keyword, ...]
        | ProcessGroupTimeout
        | ThroughMesh
        | ThroughMeshGroups
        | ThroughPipeline
        | Carried
        | Refused
        | None
    )
    """The runtime's torch wrapper (DDP's, FSDP's keywords), or how the plan applies it."""
    lightning: tuple[Keyword, ...] | ThroughMesh | Carried | Refused | None
    """The Lightning/Fabric strategy's constructor keywords."""
    accelerate: tuple[HandlerField, ...] | ProcessGroupTimeout | ThroughMesh | Carried | Refused | None
    """Accelerate's kwargs handler or plugin fields (and `accelerate launch` flags)."""
    deepspeed_config: tuple[Keyword, ...] | Carried | Refused | None
    """Dotted paths in DeepSpeed's config."""
    needs: Needs | None = None


def spellings(
    row: OptionRow,
) -> dict[
    OptionTarget,
    tuple[Keyword, ...]
    | tuple[HandlerField, ...]
    | ProcessGroupTimeout
    | ThroughMesh
    | ThroughMeshGroups
    | ThroughPipeline
    | Carried
    | Refused
    | None,
]:
    """Each target's spelling of the row's option, in `OPTION_TARGETS`' order."""
    return {
        "torch": row.torch,
        "lightning": row.lightning,
        "accelerate": row.accelerate,
        "deepspeed_config": row.deepspeed_config,
    }


OPTION_TARGETS_OF: Final[Mapping[StrategyFamily, frozenset[OptionTarget]]] = {
    # DDP and FSDP wrap with torch's classes; a mesh is torch's DeviceMesh. DeepSpeed wraps the model itself, from its
    # config (`rt.wrap` refuses it and points to `rt.deepspeed_config`).
    "ddp": frozenset({"torch", "lightning", "accelerate"}),
    "fsdp": frozenset({"torch", "lightning", "accelerate"}),
    "deepspeed": frozenset({"deepspeed_config", "lightning", "accelerate"}),
    "model_parallel": frozenset({"torch", "lightning", "accelerate"}),
}
"""Where each family's options go: a row says how each of these spells it (or why it cannot), and None for the
others."""


# --------------------------------------------------------------------------------------------------
# The rows


_FAMILY_OF: Final[Mapping[type[StrategyOptions], StrategyFamily]] = {
    record: family for family, record in OPTION_TYPES.items()
}


def _row(
    record: type[StrategyOptions],
    name: str,
    check: TrueOrFalse | OneOf | WholeNumber | ParallelDegree,
    *,
    torch: tuple[Keyword, ...]
    | ProcessGroupTimeout
    | ThroughMesh
    | ThroughMeshGroups
    | ThroughPipeline
    | Carried
    | Refused
    | None = None,
    lightning: tuple[Keyword, ...] | ThroughMesh | Carried | Refused | None = None,
    accelerate: tuple[HandlerField, ...] | ProcessGroupTimeout | ThroughMesh | Carried | Refused | None = None,
    deepspeed_config: tuple[Keyword, ...] | Carried | Refused | None = None,
    needs: Needs | None = None,
) -> OptionRow:
    """The row of a record's field: its default is the field's."""
    return OptionRow(
        family=_FAMILY_OF[record],
        name=name,
        default=attrs.fields_dict(record)[name].default,
        check=check,
        torch=torch,
        lightning=lightning,
        accelerate=accelerate,
        deepspeed_config=deepspeed_config,
        needs=needs,
    )


def _ddp_flag(name: str, write: Writer | None = None) -> OptionRow:
    """A DDP flag that torch's DistributedDataParallel, Lightning's DDPStrategy (which passes it on to DDP) and
    Accelerate's DistributedDataParallelKwargs all take under its own name."""
    same, handler = (Keyword(name, write=write),), (HandlerField("DistributedDataParallelKwargs", name, write=write),)
    return _row(DDPOptions, name, TrueOrFalse(), torch=same, lightning=same, accelerate=handler)


def _unless(name: str, default: object, values: Mapping[str, object], layout: NodeLayout) -> object:
    """The option's value, left out at `default` (where the targets' own default is the same)."""
    return OMIT if values[name] == default else values[name]


_TIMEOUT: Final = WholeNumber(
    minimum=1,
    maximum=MAX_PROCESS_GROUP_TIMEOUT,
    above=f"torch.distributed counts it in int32 milliseconds: at most {MAX_PROCESS_GROUP_TIMEOUT}",
    fix="Write a timeout in seconds up to about 24 days, e.g. timeout_seconds=1800",
)


def _timeout(record: type[StrategyOptions]) -> OptionRow:
    # Lightning's strategies take it as `timeout` (a timedelta); torch and Accelerate make the group with it.
    return _row(
        record,
        "timeout_seconds",
        _TIMEOUT,
        torch=ProcessGroupTimeout(),
        lightning=(Keyword("timeout", encoding="timedelta"),),
        accelerate=ProcessGroupTimeout(),
    )


def _hybrid_mesh(values: Mapping[str, object], layout: NodeLayout) -> object:
    # HYBRID_SHARD replicates across nodes and shards within one: a (nodes × processes per node) device mesh.
    return layout if values["sharding_strategy"] == "HYBRID_SHARD" else OMIT


def _offload_block(switch: str, values: Mapping[str, object], layout: NodeLayout) -> object:
    """DeepSpeed's offload block (`offload_optimizer`, `offload_param`) where the option `switch` is on."""
    if values[switch] is not True:
        return OMIT
    nvme = values["offload_device"] == "nvme"
    return {"device": values["offload_device"], "pin_memory": True, **({"nvme_path": NVME_PATH} if nvme else {})}


def _offload_device(switch: str, off: object, values: Mapping[str, object], layout: NodeLayout) -> object:
    """The offload device where the option `switch` is on, else `off`."""
    return values["offload_device"] if values[switch] is True else off


def _nvme_path(values: Mapping[str, object], layout: NodeLayout) -> object:
    return NVME_PATH if values["offload_device"] == "nvme" else OMIT


_OFFLOADS: Final = ("offload_optimizer", "offload_parameters")

BUILTIN_OPTIONS: Final[tuple[OptionRow, ...]] = (
    _ddp_flag("find_unused_parameters"),
    _ddp_flag("static_graph"),
    _ddp_flag("gradient_as_bucket_view"),
    # torch 2.13 deprecates broadcast_buffers (a FutureWarning whenever it is passed): written only when False.
    _ddp_flag("broadcast_buffers", write=functools.partial(_unless, "broadcast_buffers", True)),
    _timeout(DDPOptions),
    _row(
        FSDPOptions,
        "sharding_strategy",
        OneOf(SHARDING_STRATEGIES, "it is not an FSDP sharding strategy"),
        torch=(
            Keyword("sharding_strategy", encoding="ShardingStrategy"),
            Keyword("device_mesh", write=_hybrid_mesh, encoding="DeviceMesh"),
        ),
        lightning=(Keyword("sharding_strategy"), Keyword("device_mesh", write=_hybrid_mesh)),
        # Accelerate (1.6 on) takes FSDP1's sharding strategy as reshard_after_forward (sharding_strategy warns).
        accelerate=(
            HandlerField(
                "FullyShardedDataParallelPlugin", "reshard_after_forward", flag="--fsdp_reshard_after_forward"
            ),
        ),
    ),
    _row(
        FSDPOptions,
        "cpu_offload",
        TrueOrFalse(),
        torch=(Keyword("cpu_offload", encoding="CPUOffload"),),
        lightning=(Keyword("cpu_offload"),),
        accelerate=(HandlerField("FullyShardedDataParallelPlugin", "cpu_offload", flag="--fsdp_offload_params"),),
    ),
    _row(
        DeepSpeedOptions,
        "stage",
        OneOf(DEEPSPEED_STAGES, "ZeRO has stages 0 to 3"),
        deepspeed_config=(Keyword("zero_optimization.stage"),),
        lightning=(Keyword("stage"),),
        accelerate=(HandlerField("DeepSpeedPlugin", "zero_stage", flag="--zero_stage"),),
    ),
    _row(
        DeepSpeedOptions,
        "offload_optimizer",
        TrueOrFalse(),
        deepspeed_config=(
            Keyword(
                "zero_optimization.offload_optimizer", write=functools.partial(_offload_block, "offload_optimizer")
            ),
        ),
        lightning=(Keyword("offload_optimizer"),),
        accelerate=(
            HandlerField(
                "DeepSpeedPlugin",
                "offload_optimizer_device",
                write=functools.partial(_offload_device, "offload_optimizer", DEEPSPEED_NO_OFFLOAD),
                flag="--offload_optimizer_device",
            ),
        ),
    ),
    _row(
        DeepSpeedOptions,
        "offload_parameters",
        TrueOrFalse(),
        deepspeed_config=(
            Keyword("zero_optimization.offload_param", write=functools.partial(_offload_block, "offload_parameters")),
        ),
        lightning=(
            Keyword("offload_parameters"),
            Keyword("remote_device", write=functools.partial(_offload_device, "offload_parameters", None)),
        ),
        accelerate=(
            HandlerField(
                "DeepSpeedPlugin",
                "offload_param_device",
                write=functools.partial(_offload_device, "offload_parameters", DEEPSPEED_NO_OFFLOAD),
                flag="--offload_param_device",
            ),
        ),
        # DeepSpeed offloads parameters only at ZeRO stage 3.
        needs=Needs(values={"stage": 3}, refusal="deepspeed-offload-stage"),
    ),
    _row(
        DeepSpeedOptions,
        "offload_device",
        OneOf(OFFLOAD_DEVICES, "DeepSpeed offloads to 'cpu' or 'nvme'"),
        deepspeed_config=Carried(_OFFLOADS),
        lightning=(
            Keyword("offload_params_device"),
            Keyword("offload_optimizer_device"),
            Keyword("nvme_path", write=_nvme_path),
        ),
        accelerate=Carried(_OFFLOADS),
    ),
    *(
        _row(
            ModelParallelOptions,
            name,
            ParallelDegree(minus_one_is_auto=MESH_RULES[name].minus_one_is_auto),
            torch=ThroughMesh(name),
            lightning=ThroughMesh(name),
            accelerate=ThroughMesh(name),
        )
        for name in MESH_DIMENSIONS
    ),
    _row(
        ModelParallelOptions,
        "ep",
        # ep borrows ranks the dense degrees count, so it has no rest to take: a number, never 'auto'.
        ParallelDegree(takes_auto=False),
        torch=ThroughMesh("ep"),
        # Neither framework's mesh has an expert dimension (Lightning: data_parallel × tensor_parallel; Accelerate
        # 1.16's ParallelismConfig: dp_replicate, dp_shard, tp, cp, sp).
        lightning=Refused(
            "Lightning's ModelParallelStrategy builds a 2-D mesh (data_parallel × tensor_parallel) with no expert "
            "dimension; run the plan's meshes through trainplan.runtime (rt.expert_mesh)"
        ),
        accelerate=Refused(
            "Accelerate's ParallelismConfig has no expert-parallel size (dp_replicate, dp_shard, tp, cp, sp); run "
            "the plan's meshes through trainplan.runtime (rt.expert_mesh)"
        ),
    ),
    *(
        _row(
            ModelParallelOptions,
            name,
            check,
            torch=ThroughPipeline(),
            # Neither framework runs pipeline stages: Lightning's mesh is data_parallel × tensor_parallel, and
            # Accelerate's ParallelismConfig has no pp.
            lightning=Refused(
                "Lightning's ModelParallelStrategy has no pipeline dimension; run the plan's pipeline through "
                "trainplan.runtime (rt.pipeline)"
            ),
            accelerate=Refused(
                "Accelerate's ParallelismConfig has no pipeline dimension; run the plan's pipeline through "
                "trainplan.runtime (rt.pipeline)"
            ),
        )
        for name, check in (
            (
                "pp_microbatches",
                WholeNumber(
                    minimum=1,
                    maximum=MAX_WORLD_SIZE,
                    above="more microbatches than torch's rank limit are not a pipeline",
                    fix="Write e.g. pp_microbatches=8, or leave it unset (one per stage)",
                    optional=True,
                ),
            ),
            (
                "pp_virtual_stages",
                WholeNumber(
                    minimum=1,
                    maximum=MAX_WORLD_SIZE,
                    above="more stages per rank than torch's rank limit are not a pipeline",
                    fix="Write e.g. pp_virtual_stages=2 for an interleaved schedule",
                    optional=True,
                ),
            ),
            ("pp_schedule", OneOf(PIPELINE_SCHEDULES, "the pipeline schedules of torch.distributed.pipelining")),
        )
    ),
    # Context parallelism's options, for cp above 1 (`resolve.mesh` refuses them at cp=1): the runtime applies them
    # around torch's context_parallel (`rt.context_parallel`). Lightning has no context-parallel dimension at all.
    _row(
        ModelParallelOptions,
        "cp_rotate_method",
        OneOf(
            CONTEXT_PARALLEL_ROTATES, "torch's context parallelism rotates key/value shards by all-gather or all-to-all"
        ),
        torch=ThroughMeshGroups("cp"),
        lightning=Refused(
            "Lightning's ModelParallelStrategy has no context-parallel dimension; run the plan's mesh through "
            "trainplan.runtime (rt.context_parallel)"
        ),
        # accelerate 1.16: ParallelismConfig(cp_handler=TorchContextParallelConfig(cp_comm_strategy=...)), which its
        # _prepare_cp hands to torch's set_rotate_method; `accelerate launch --parallelism_config_cp_comm_strategy`.
        accelerate=(
            HandlerField(
                "TorchContextParallelConfig",
                "cp_comm_strategy",
                write=functools.partial(_unless, "cp_rotate_method", "allgather"),
                flag="--parallelism_config_cp_comm_strategy",
            ),
        ),
    ),
    _row(
        ModelParallelOptions,
        "cp_load_balancer",
        OneOf(CONTEXT_PARALLEL_BALANCERS, "torch's context_parallel splits sequences head-tail or not at all"),
        torch=ThroughMeshGroups("cp"),
        lightning=Refused(
            "Lightning's ModelParallelStrategy has no context-parallel dimension; run the plan's mesh through "
            "trainplan.runtime (rt.context_parallel)"
        ),
        # accelerate 1.16's _prepare_cp calls context_parallel(mesh=...) and never sets torch's enable_load_balance.
        accelerate=Refused(
            "Accelerate's context parallelism always runs torch's default head-tail load balancer (no setting turns "
            "it off); run the plan's mesh through trainplan.runtime (rt.context_parallel)"
        ),
    ),
    *(
        _row(
            ModelParallelOptions,
            backend_option(name),
            OneOf(
                (None, *GROUP_BACKENDS),
                "a mesh dimension's groups run over NCCL or gloo (the backends torch's FSDP2 and DTensor are built "
                "on), or None: the world's",
            ),
            torch=ThroughMeshGroups(name),
            # Both build their mesh with init_device_mesh and no backend_override (lightning_fabric 2.6's
            # _setup_device_mesh, accelerate 1.16's ParallelismConfig.build_device_mesh).
            lightning=Refused(
                "Lightning's ModelParallelStrategy builds its mesh with init_device_mesh and no backend_override, so "
                "every group runs over the world's backend; run the plan's mesh through trainplan.runtime (rt.mesh)"
            ),
            accelerate=Refused(
                "Accelerate's ParallelismConfig builds its mesh with init_device_mesh and no backend_override, so "
                "every group runs over the world's backend; run the plan's mesh through trainplan.runtime (rt.mesh)"
            ),
        )
        for name in MESH_DIMENSIONS
    ),
    # Lightning's spelling of two degrees, read as them (`resolve.mesh`); the plan holds the degrees only.
    *(
        _row(
            ModelParallelOptions,
            size.argument,
            ParallelDegree(optional=True),
            torch=ThroughMesh(size.dimension),
            lightning=ThroughMesh(size.dimension),
            accelerate=ThroughMesh(size.dimension),
        )
        for size in LIGHTNING_SIZES
    ),
    _timeout(ModelParallelOptions),
)
"""trainplan's own options, family by family."""


def options_by_family(rows: Iterable[OptionRow]) -> Mapping[StrategyFamily, tuple[OptionRow, ...]]:
    """The rows grouped by family, in order: the rule set's table (`Rules.options`)."""
    grouped: dict[StrategyFamily, tuple[OptionRow, ...]] = {}
    for row in rows:
        grouped[row.family] = (*grouped.get(row.family, ()), row)
    return grouped


OPTIONS: Final[Mapping[StrategyFamily, tuple[OptionRow, ...]]] = options_by_family(BUILTIN_OPTIONS)
"""Each family's option rows (`Rules.options`); a family without a row takes no options."""
