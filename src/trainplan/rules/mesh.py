"""Device meshes (strategy `model_parallel`): the dimensions in the mesh's fixed order, where each may grow, and
Lightning's size arguments; and the check of a layout against these rows (`layout_violations`)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Final, Literal

import attrs

from trainplan.rules.messages import RefusalId
from trainplan.rules.precision import BACKENDS
from trainplan.spec.frozen import freeze_nested_maps
from trainplan.spec.mesh import ContextParallelLayout, MeshLayout, PipelineLayout
from trainplan.spec.names import (
    GROUP_BACKENDS,
    AcceleratorKey,
    BackendKey,
    BackendName,
    ExpertDimension,
    GroupBackend,
    MeshDimension,
    MeshName,
    PipelineSchedule,
    PrecisionKey,
)
from trainplan.spec.names import MESH_DIMENSIONS as MESH_DIMENSION_NAMES


@attrs.frozen(kw_only=True)
class MeshDimensionRule:
    name: MeshDimension
    title: str  # what its groups are called in messages and drawings
    description: str
    splits_data: bool  # ranks along it read different batches (the sampler's replicas); the others read the same
    # Where its groups belong (neither is a refusal: peers plan either way; a layout that breaks one runs, slowly, and
    # is planned with a warning that gives the numbers, `host_spans`; a degree written 'auto' never takes such a value):
    inside_node: bool  # its groups stay inside one node: the degree (times the inner ones) divides a node's processes
    stage_aligned: bool  # each block of ranks it cuts the world into holds whole nodes, or a node holds whole blocks
    accelerators: frozenset[AcceleratorKey]  # where a degree above 1 runs
    why_not: Mapping[AcceleratorKey, str]
    precisions_refused: Mapping[PrecisionKey, str]  # precisions a degree above 1 cannot run with, and why
    instead: Mapping[PrecisionKey, PrecisionKey]  # what to suggest for each refused precision
    lightning_size: str | None  # the ModelParallelStrategy size this degree multiplies into; None: Lightning has none
    accelerate_size: str | None  # Accelerate's ParallelismConfig field; None: Accelerate has none
    accelerate_why_not: str = (
        ""  # why Accelerate cannot run a degree above 1 of it beside FSDP2 although it has a field
    )
    minus_one_is_auto: bool = False  # -1 is read as "auto" (with a note), as torchtitan's ParallelDims reads it
    # What crosses hosts when its groups (inside_node) or stages (stage_aligned) span them, for the warning: a
    # template of the group's numbers ({degree}, {crossing} ring links, {passes} = degree - 1, {all_reduce}: a ring
    # all-reduce's bytes per link, 2·(degree - 1)/degree of the tensor).
    across_hosts: str = ""

    __attrs_post_init__ = freeze_nested_maps  # nested maps read-only: nobody changes a rule in place


_MESH_ACCELERATORS: Final[frozenset[AcceleratorKey]] = frozenset({"cpu", "cuda"})

# torch's DTensor reduces GradScaler's found_inf over the placements of the first gradient only: with a replicated
# gradient first and a sharded one holding the inf, one rank of a tp (or cp) group skips the step and another takes it.
_SCALER_ACROSS_PLACEMENTS: Final = (
    "torch's GradScaler reduces its overflow check over the placements of the first DTensor gradient only, so with "
    "replicated and sharded gradients the ranks of one group can disagree on skipping a step"
)

MESH_DIMENSIONS: Final[Mapping[MeshDimension, MeshDimensionRule]] = {
    rule.name: rule
    for rule in (
        MeshDimensionRule(
            name="pp",
            title="pipeline",
            description="pipeline stages: the model's layers split in order, activations passed stage to stage",
            splits_data=False,
            inside_node=False,
            # The outermost dimension, so the pipeline crosses nodes: a stage never straddles a node boundary.
            stage_aligned=True,
            accelerators=_MESH_ACCELERATORS,
            why_not={},
            precisions_refused={
                # torch.distributed.pipelining runs backward inside the schedule, stage by stage.
                "16-mixed": (
                    "a pipeline schedule runs backward itself, stage by stage, so a GradScaler finds overflow in one "
                    "stage's gradients only and the stages would skip different steps"
                ),
            },
            instead={"16-mixed": "bf16-mixed"},
            lightning_size=None,
            accelerate_size=None,
            across_hosts="the groups inside a straddling stage (its FSDP all-gathers and reduce-scatters, every "
            "step) cross hosts too, not only the pipeline's activations between stages",
        ),
        MeshDimensionRule(
            name="dp_replicate",
            title="data-parallel replica",
            description="data-parallel replicas: whole (or, with dp_shard, sharded) copies of the model, gradients "
            "all-reduced",
            splits_data=True,
            inside_node=False,
            stage_aligned=False,
            accelerators=_MESH_ACCELERATORS,
            why_not={},
            precisions_refused={},
            instead={},
            lightning_size="data_parallel_size",
            accelerate_size="dp_replicate_size",
        ),
        MeshDimensionRule(
            name="dp_shard",
            title="data-parallel shard",
            description="data-parallel shards: FSDP2 shards parameters, gradients and optimizer state",
            splits_data=True,
            inside_node=False,
            stage_aligned=False,
            accelerators=_MESH_ACCELERATORS,
            why_not={},
            precisions_refused={},
            instead={},
            lightning_size="data_parallel_size",
            accelerate_size="dp_shard_size",
            # torchtitan's ParallelDims: "dp_shard must -1 or >=1", -1 taking world // (the other degrees).
            minus_one_is_auto=True,
        ),
        MeshDimensionRule(
            name="cp",
            title="context-parallel",
            description="context parallelism: each sequence split over the ranks, attention computed as a ring",
            splits_data=False,
            # Ring attention passes key/value blocks every layer: it needs the node's links.
            inside_node=True,
            stage_aligned=False,
            # torch's context_parallel swaps in ring variants of the CUDA SDPA kernels (flash, efficient, cuDNN).
            accelerators=frozenset({"cuda"}),
            why_not={
                "cpu": "torch's context parallelism rewrites the CUDA attention kernels (flash, memory-efficient, "
                "cuDNN); the CPU attention kernel has no ring variant",
            },
            precisions_refused={
                "64-true": "context parallelism runs attention through the flash, memory-efficient and cuDNN kernels, "
                "none of which computes in float64",
                "16-mixed": _SCALER_ACROSS_PLACEMENTS,
            },
            instead={"64-true": "32-true", "16-mixed": "bf16-mixed"},
            lightning_size=None,
            accelerate_size="cp_size",
            across_hosts="ring attention passes each layer's key/value blocks {passes} time(s) around the ring, over "
            "its {crossing} cross-host link(s) too, so every layer waits on the inter-node link",
        ),
        MeshDimensionRule(
            name="sp",
            title="sequence-parallel",
            description="sequence parallelism (DeepSpeed Ulysses, Accelerate's sp_size): each sequence split over the "
            "ranks, swapped for a split of the attention heads by an all-to-all before and after every attention",
            # The ranks of an sp group read the same batch and each keeps a slice of its sequence.
            splits_data=False,
            # Two all-to-alls of the activations around every attention layer: the node's links.
            inside_node=True,
            stage_aligned=False,
            # all_to_all_single runs over NCCL and over gloo, and the attention in between is the model's own kernel.
            accelerators=_MESH_ACCELERATORS,
            why_not={},
            # Parameters are replicated over the sp ranks (no DTensor placements), so GradScaler's check is whole.
            precisions_refused={},
            instead={},
            lightning_size=None,
            accelerate_size="sp_size",
            # accelerate 1.16: sp_size > 1 runs in its DeepSpeed engine only (UlyssesSPAttentionHF), and its
            # ParallelismConfig builds no device mesh then (build_device_mesh returns None).
            accelerate_why_not="Accelerate runs sp_size only inside its DeepSpeed engine (sp_backend='deepspeed': "
            "DeepSpeed's Ulysses makes its own groups and ParallelismConfig builds no device mesh), and a "
            "model_parallel plan runs FSDP2 over the mesh there",
            across_hosts="Ulysses sends {passes}/{degree} of each rank's activations to the other ranks of its group "
            "in the all-to-alls before and after every attention layer, over the {crossing} cross-host link(s) too, "
            "so every attention waits on the inter-node link",
        ),
        MeshDimensionRule(
            name="tp",
            title="tensor-parallel",
            description="tensor parallelism: each layer's weights split over the ranks, reduced inside every layer",
            splits_data=False,
            # Tensor parallelism reduces inside every layer: the innermost dimension, on the node's own links.
            inside_node=True,
            stage_aligned=False,
            accelerators=_MESH_ACCELERATORS,
            why_not={},
            precisions_refused={"16-mixed": _SCALER_ACROSS_PLACEMENTS},
            instead={"16-mixed": "bf16-mixed"},
            lightning_size="tensor_parallel_size",
            accelerate_size="tp_size",
            across_hosts="tensor parallelism all-reduces activations inside every layer, and a ring all-reduce over "
            "{degree} ranks sends {all_reduce}× each activation's bytes over every link, its {crossing} cross-host "
            "link(s) too, so every layer waits on the inter-node link",
        ),
    )
}
"""The mesh's dimensions in its fixed order, outermost first (the order of `names.MeshDimension`)."""


@attrs.frozen(kw_only=True)
class ExpertDimensionRule:
    """A dimension of the expert mesh that is not the dense mesh's (`pp` and `dp_replicate` are shared). Neither
    Lightning's nor Accelerate's mesh has one (the `ep` option row refuses them by name)."""

    name: ExpertDimension
    title: str  # what its groups are called in drawings


EXPERT_REGION: Final[tuple[MeshDimension, ...]] = ("dp_shard", "cp", "sp", "tp")
"""The dense dimensions whose ranks the expert mesh regroups as `efsdp × ep` (torchtitan's "sparse region", with
`sp`, whose ranks hold the same parameters as `cp`'s do): ep is borrowed from them, so it divides their product and
adds nothing to the world size. The pipeline stages and the
replicas stay as they are: each stage holds its own experts, and each replica a whole copy of them."""

EXPERT_MESH: Final[Mapping[ExpertDimension, ExpertDimensionRule]] = {
    rule.name: rule
    for rule in (
        # The ranks of one expert-parallel position across the region: FSDP2 shards the experts' parameters over
        # them (dp_shard · cp · tp / ep of them; torchtitan keeps it even at size 1, for mixed precision).
        ExpertDimensionRule(name="efsdp", title="expert shard"),
        # Each rank holds 1/ep of the experts and tokens travel to their expert (all-to-all): neighbouring ranks.
        ExpertDimensionRule(name="ep", title="expert-parallel"),
    )
}
"""The expert mesh's own dimensions, outermost first (after the dense mesh's `pp` and `dp_replicate`)."""


@attrs.frozen(kw_only=True)
class PipelineScheduleRule:
    """One of torch's pipeline schedules (`torch.distributed.pipelining`), and what it asks of a layout."""

    name: PipelineSchedule
    stage_style: Literal["single", "loop", "v"]  # which stages a rank holds (torchtitan's stage_ids_this_rank)
    virtual_stages: tuple[int, int | None]  # the stages per rank it takes: at least, at most (None: no limit)
    why_virtual: str  # why, in a refusal
    microbatches: Literal["any", "at_least_stages", "multiple_of_rounds"]  # torch's check on their number
    why_microbatches: str


PIPELINE_SCHEDULE_RULES: Final[Mapping[PipelineSchedule, PipelineScheduleRule]] = {
    rule.name: rule
    for rule in (
        PipelineScheduleRule(
            name="1F1B",
            stage_style="single",
            virtual_stages=(1, 1),
            why_virtual="1F1B runs one stage per rank (torch's PipelineScheduleSingle)",
            microbatches="at_least_stages",
            # torch's Schedule1F1B: "Number of microbatches must be greater than or equal to the number of stages".
            why_microbatches="1F1B keeps every stage busy with one microbatch in flight each, so torch's "
            "Schedule1F1B needs at least as many microbatches as stages",
        ),
        PipelineScheduleRule(
            name="GPipe",
            stage_style="single",
            virtual_stages=(1, 1),
            why_virtual="GPipe runs one stage per rank (torch's PipelineScheduleSingle)",
            microbatches="any",
            why_microbatches="",
        ),
        PipelineScheduleRule(
            name="Interleaved1F1B",
            stage_style="loop",
            virtual_stages=(2, None),
            why_virtual="an interleaved schedule loops over several stages per rank (rank r holds r, r + pp, ...)",
            microbatches="multiple_of_rounds",
            why_microbatches="torch's ScheduleInterleaved1F1B runs microbatches in rounds of pp and needs their "
            "number to be a multiple of the rounds",
        ),
        PipelineScheduleRule(
            name="ZBVZeroBubble",
            stage_style="v",
            virtual_stages=(2, 2),
            why_virtual="torch's ScheduleZBVZeroBubble places exactly 2 stages per rank in a V (rank r holds r and "
            "2·pp - 1 - r)",
            microbatches="any",
            why_microbatches="",
        ),
        PipelineScheduleRule(
            name="InterleavedZeroBubble",
            stage_style="loop",
            virtual_stages=(2, None),
            why_virtual="an interleaved schedule loops over several stages per rank (rank r holds r, r + pp, ...)",
            microbatches="multiple_of_rounds",
            why_microbatches="torch's ScheduleInterleavedZeroBubble runs microbatches in rounds of pp and needs "
            "their number to be a multiple of the rounds",
        ),
    )
}
"""torch's pipeline schedules that trainplan plans, by name."""


def pipeline_violation(
    schedule: PipelineSchedule, pp: int, virtual_stages: int, microbatches: int
) -> tuple[RefusalId, str] | None:
    """The first rule of `schedule` this pipeline breaks (its refusal id and why), or None."""
    rule = PIPELINE_SCHEDULE_RULES[schedule]
    least, most = rule.virtual_stages
    if virtual_stages < least or (most is not None and virtual_stages > most):
        return "pipeline-virtual-stages", rule.why_virtual
    stages = pp * virtual_stages
    if rule.microbatches == "at_least_stages" and microbatches < stages:
        return "pipeline-microbatches", rule.why_microbatches
    rounds = max(1, microbatches // pp)
    if rule.microbatches == "multiple_of_rounds" and microbatches % rounds:
        return "pipeline-microbatches", rule.why_microbatches
    return None


def planned_pipeline(
    schedule: PipelineSchedule, pp: int, virtual_stages: int | None, microbatches: int | None
) -> PipelineLayout:
    """The pipeline record options plan (the resolver's and `Plan.from_dict`'s one derivation): the virtual stages
    the schedule takes at least (`PIPELINE_SCHEDULE_RULES`) and one microbatch per stage where they are unset."""
    virtual = PIPELINE_SCHEDULE_RULES[schedule].virtual_stages[0] if virtual_stages is None else virtual_stages
    return PipelineLayout(
        schedule=schedule, microbatches=pp * virtual if microbatches is None else microbatches, virtual_stages=virtual
    )


UNUSED_PIPELINE: Final = (
    "the model is not cut into pipeline stages, so no schedule runs and the option would never be used"
)
"""Why a pipeline option (schedule, microbatches, virtual stages) means nothing where `pp` is 1."""


def pipeline_option_violations(
    pp: int, schedule: PipelineSchedule, virtual_stages: int | None, microbatches: int | None
) -> Iterator[str]:
    """The pipeline options written (the schedule away from its default, microbatches or virtual stages given) where
    `pp` is 1 (no stages to schedule), as their option names; nothing where pp is above 1."""
    if pp > 1:
        return
    if schedule != PipelineLayout().schedule:
        yield "pp_schedule"
    if microbatches is not None:
        yield "pp_microbatches"
    if virtual_stages is not None:
        yield "pp_virtual_stages"


def stage_indices(schedule: PipelineSchedule, pp_rank: int, pp: int, virtual_stages: int) -> tuple[int, ...]:
    """The stages the rank at `pp_rank` of `pp` holds, as torch's schedules (and torchtitan's
    `stage_ids_this_rank`) place them: one stage (`single`), r, r + pp, ... (`loop`), or r and 2·pp - 1 - r (`v`)."""
    style = PIPELINE_SCHEDULE_RULES[schedule].stage_style
    if style == "v":
        return (pp_rank, 2 * pp - 1 - pp_rank)
    return tuple(pp_rank + index * pp for index in range(virtual_stages))


@attrs.frozen(kw_only=True)
class MeshExclusion:
    """Two dimensions that cannot both be above 1, and why."""

    dimensions: tuple[MeshDimension, MeshDimension]
    why: str


MESH_EXCLUSIONS: Final[tuple[MeshExclusion, ...]] = (
    MeshExclusion(
        dimensions=("cp", "sp"),
        # accelerate 1.16, ParallelismConfig.__post_init__: "Context Parallelism (CP) and Sequence Parallelism (SP)
        # are mutually exclusive".
        why="both split each sequence over their ranks (ring attention over cp, Ulysses' all-to-all over sp), so "
        "one attention would be split twice; Accelerate's ParallelismConfig refuses them together too",
    ),
)
"""Dimensions that exclude each other (the second is the one refused)."""


MESH_ALIASES: Final[Mapping[MeshName, tuple[MeshDimension, ...]]] = {
    # torchtitan's ParallelDims: `batch` for data loading, `fsdp` (and, before it, `dp_shard_cp`) for FSDP over the
    # shards and the context ranks, `loss` (and `dp_cp`) for the all-reduce of the loss over every data rank.
    # torchtitan has no sp; sp's ranks are folded in exactly where cp's are, for the same reason: they read the same
    # batch (so not `batch`) but other tokens of it, and hold the same parameters, so their gradients must be
    # reduced together (FSDP over dp_shard alone leaves the sp ranks of one shard with different gradients).
    # cp and sp exclude each other (MESH_EXCLUSIONS), so one of the two is always 1 here.
    "batch": ("dp_replicate", "dp_shard"),
    "fsdp": ("dp_shard", "cp", "sp"),
    "dp_shard_cp": ("dp_shard", "cp", "sp"),
    "loss": ("dp_replicate", "dp_shard", "cp", "sp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp", "sp"),
    # Lightning's ModelParallelStrategy: a 2-D mesh (data_parallel, tensor_parallel) that is the whole world, and its
    # parallelize functions give `data_parallel` to fully_shard: so it is every rank that holds the same parameters
    # (cp and sp included, as in torchtitan's `fsdp`, plus the replicas). Batches are read over `rt.sampler`
    # (trainplan's dp), never over this name.
    "data_parallel": ("dp_replicate", "dp_shard", "cp", "sp"),
    "tensor_parallel": ("tp",),
}
"""The names peers index their meshes by, as the dense dimensions they flatten (torch's `DeviceMesh._flatten`):
`rt.mesh[name]` answers each, so a parallelize function written for Lightning or torchtitan runs unchanged (and
`dp`, trainplan's own `rt.data_parallel_mesh`). The expert mesh's `efsdp` and `ep` are `rt.expert_mesh`'s
(torchtitan's sparse mesh holds them apart too), and `rt.mesh` answers them with the expert mesh's groups."""

MESH_BACKENDS: Final[Mapping[AcceleratorKey, BackendName]] = {"cuda": "nccl", "cpu": "gloo"}
"""The backend a device mesh runs over on each accelerator: the ones torch's FSDP2 and DTensor are built and tested
on (NCCL on CUDA; gloo on CPU, which also makes every layout testable without a GPU)."""

# The backends one dimension's groups may run over instead of the world's (`tp_group_backend="gloo"`, torch's
# `init_device_mesh(..., backend_override=...)`) are `names.GROUP_BACKENDS`, the mesh backends above (a test holds
# them equal), each only where its row in `rules.BACKENDS` runs (gloo on CPU and CUDA, NCCL on CUDA only). A
# ProcessGroup's `Options` object is not a value a plan can hold (it is torch's C++ object, and a plan is JSON), so
# only the backend is planned.

UNUSED_GROUPS: Final = (
    "a degree of 1 makes no {title} groups (each rank is alone along it, and no collective runs there), so the "
    "option would never be used"
)
"""Why an option about one dimension's groups (its backend, context parallelism's rotate method and load balancer)
means nothing where its degree is 1."""


CONTEXT_PARALLEL_OPTIONS: Final[Mapping[str, str]] = {
    "rotate_method": "cp_rotate_method",
    "load_balancer": "cp_load_balancer",
}
"""The fields of the plan's context-parallel record (`MeshLayout.context_parallel`) and the options that set them."""

UNUSED_CONTEXT_PARALLEL: Final = (
    "no sequence is split over context-parallel ranks, so torch's context parallelism never runs and the option "
    "would never be used"
)


def context_parallel_violations(cp: int, layout: ContextParallelLayout) -> Iterator[tuple[str, str]]:
    """The context-parallel options away from torch's defaults where `cp` is 1 (nothing to apply them to), as
    (field, option); nothing where cp is above 1."""
    if cp > 1:
        return
    default = ContextParallelLayout()
    for field, option in CONTEXT_PARALLEL_OPTIONS.items():
        if getattr(layout, field) != getattr(default, field):
            yield field, option


def group_backend_violations(
    degrees: Mapping[MeshDimension, int],
    backends: Mapping[MeshDimension, GroupBackend],
    *,
    accelerator: AcceleratorKey,
) -> Iterator[tuple[RefusalId, MeshDimension, str]]:
    """Each dimension's backend (`backends`) that cannot be: its degree is 1 (no groups), or the backend does not run
    on the accelerator (`rules.BACKENDS`' rows); as (rule, dimension, why), in the mesh's order."""
    for name in MESH_DIMENSION_NAMES:
        backend = backends.get(name)
        if backend is None:
            continue
        if degrees[name] == 1:
            yield "mesh-option-unused", name, UNUSED_GROUPS.format(title=MESH_DIMENSIONS[name].title)
            continue
        rule = BACKENDS[backend]
        if accelerator not in rule.accelerators:
            why = rule.why_not.get(accelerator, f"{backend} does not run on {accelerator!r}")
            yield "mesh-group-backend", name, why


def group_backend_choices(accelerator: AcceleratorKey) -> tuple[GroupBackend, ...]:
    """The backends a dimension's groups may run over on `accelerator`."""
    return tuple(name for name in GROUP_BACKENDS if accelerator in BACKENDS[name].accelerators)


def flattened_backend(
    dimensions: tuple[MeshDimension, ...], degrees: Mapping[MeshDimension, int], backends: Mapping[MeshDimension, str]
) -> str | None:
    """The backend of a mesh flattened from `dimensions` (a peer's name, `rt.mesh["tensor_parallel"]`): the one
    every dimension of it above 1 was given, so that a name for the same groups gets the same backend; None (the
    world's) where none was given or they differ (a flattened group spans them all, and no one backend was asked)."""
    given = {backends.get(name) for name in dimensions if degrees[name] > 1}
    return given.pop() if len(given) == 1 else None


@attrs.frozen(kw_only=True)
class LightningSize:
    """One of Lightning's `ModelParallelStrategy` sizes, read as a trainplan degree."""

    argument: str  # ModelParallelStrategy's argument (and ModelParallelOptions' field for Lightning's spelling)
    dimension: MeshDimension  # the degree it becomes
    mesh_name: str  # the name of its dimension in Lightning's own mesh
    auto: Literal["num_nodes", "processes_per_node"]  # what Lightning's "auto" takes when both sizes are "auto"


LIGHTNING_SIZES: Final[tuple[LightningSize, ...]] = (
    # Lightning applies FSDP2 over its data-parallel dimension, so it is trainplan's dp_shard.
    LightningSize(argument="data_parallel_size", dimension="dp_shard", mesh_name="data_parallel", auto="num_nodes"),
    LightningSize(
        argument="tensor_parallel_size", dimension="tp", mesh_name="tensor_parallel", auto="processes_per_node"
    ),
)
"""Lightning's spelling of a 2-D mesh (`ModelParallelStrategy(data_parallel_size=..., tensor_parallel_size=...)`)."""


# --------------------------------------------------------------------------------------------------
# A layout checked against the rows above: which rule it breaks (the resolver names the layout that fits; a plan read
# back refuses it).


def expert_region(degrees: Mapping[MeshDimension, int]) -> int:
    """How many ranks the expert mesh regroups (`dp_shard · cp · tp`): what `ep` must divide."""
    return math.prod(degrees[name] for name in EXPERT_REGION)


def data_parallel(layout: MeshLayout, rank: int) -> tuple[int, int]:
    """`rank`'s data-parallel replica and their number: which batches it reads (its sampler's rank and replicas).
    Ranks that differ only along tensor, context or pipeline dimensions read the same batches."""
    position = layout.coordinates(rank)
    index, count = 0, 1
    for dimension, coordinate, size in zip(layout.dimensions, position, layout.shape, strict=True):
        if MESH_DIMENSIONS[dimension].splits_data:
            index, count = index * size + coordinate, count * size
    return index, count


@attrs.frozen(kw_only=True)
class MeshViolation:
    """The first mesh rule a layout breaks: the rule's id, the dimension at fault (None: the whole layout), and the
    numbers that show it."""

    rule: RefusalId
    dimension: MeshDimension | None
    degree: int
    detail: str
    needed: int = 0  # mesh-inside-node: the processes one group needs on a node; mesh-pipeline-nodes: a stage's;
    # mesh-expert: the region ep must divide


def strides(degrees: Mapping[MeshDimension, int]) -> dict[MeshDimension, int]:
    """How far apart the members of a group along each dimension are (the product of the inner degrees)."""
    found: dict[MeshDimension, int] = {}
    inner = 1
    for name in reversed(MESH_DIMENSION_NAMES):
        found[name] = inner
        inner *= degrees[name]
    return found


def node_violations(degrees: Mapping[MeshDimension, int], processes_per_node: int) -> Iterator[MeshViolation]:
    """The dimensions that stay inside a node whose groups do not fit one: a group spans its degree times the
    inner degrees of neighbouring ranks, and that many must divide the node's processes. Innermost first."""
    apart = strides(degrees)
    for name in reversed(MESH_DIMENSION_NAMES):
        degree, rule = degrees[name], MESH_DIMENSIONS[name]
        if degree > 1 and rule.inside_node and processes_per_node % (degree * apart[name]):
            yield MeshViolation(
                rule="mesh-inside-node",
                dimension=name,
                degree=degree,
                needed=degree * apart[name],
                detail=f"{processes_per_node} processes per node",
            )


def layout_violations(
    degrees: Mapping[MeshDimension, int],
    *,
    num_nodes: int,
    processes_per_node: int,
    accelerator: AcceleratorKey,
    backend: BackendKey | None,
    precision: PrecisionKey,
    ep: int = 1,
) -> Iterator[MeshViolation]:
    """Every mesh rule `degrees` (and the expert degree `ep`) break on this world, in the order the rules are
    checked; nothing when it fits.

    The product is the world size; `ep` divides the expert region (`EXPERT_REGION`'s degrees multiplied); a degree
    above 1 runs only on its accelerators and precisions; the mesh's collectives run over the accelerator's mesh
    backend. Groups that span hosts, and stages that straddle them, are not refusals (`host_spans`).
    """
    world = num_nodes * processes_per_node
    product = math.prod(degrees.values())
    if product != world:
        yield MeshViolation(rule="mesh-product", dimension=None, degree=product, detail=f"world size {world}")
        return
    region = expert_region(degrees)
    if region % ep:
        yield MeshViolation(rule="mesh-expert", dimension=None, degree=ep, needed=region, detail="")
    for exclusion in MESH_EXCLUSIONS:
        first, second = exclusion.dimensions
        if degrees[first] > 1 and degrees[second] > 1:
            yield MeshViolation(rule="mesh-exclusive", dimension=second, degree=degrees[second], detail=exclusion.why)
    for name in MESH_DIMENSION_NAMES:
        degree, rule = degrees[name], MESH_DIMENSIONS[name]
        if degree > 1 and accelerator not in rule.accelerators:
            yield MeshViolation(
                rule="mesh-accelerator", dimension=name, degree=degree, detail=rule.why_not.get(accelerator, "")
            )
    allowed = MESH_BACKENDS.get(accelerator)
    if world > 1 and backend is not None and allowed is not None and backend != allowed:
        yield MeshViolation(rule="mesh-backend", dimension=None, degree=world, detail=allowed)
    for name in MESH_DIMENSION_NAMES:
        degree, rule = degrees[name], MESH_DIMENSIONS[name]
        if degree > 1 and precision in rule.precisions_refused:
            yield MeshViolation(
                rule="mesh-precision", dimension=name, degree=degree, detail=rule.precisions_refused[precision]
            )


def host_spans(
    degrees: Mapping[MeshDimension, int], *, num_nodes: int, processes_per_node: int
) -> Iterator[MeshViolation]:
    """Where a layout that works is slow, in the order the rows are read: a dimension that stays inside a node
    (`tp`, `cp`) whose groups do not fit one (innermost first), then a stage-aligned one (`pp`) whose stages hold
    neither whole nodes nor fit whole into one. Every peer (torchtitan, Accelerate, Lightning, torch's
    `init_device_mesh`) builds these layouts; the resolver plans them with a warning (`HostSpan`'s numbers) and never
    lets a degree written 'auto' take one."""
    yield from node_violations(degrees, processes_per_node)
    apart = strides(degrees)
    for name in MESH_DIMENSION_NAMES:
        degree, rule = degrees[name], MESH_DIMENSIONS[name]
        block = apart[name]
        if degree > 1 and rule.stage_aligned and block % processes_per_node and processes_per_node % block:
            yield MeshViolation(
                rule="mesh-pipeline-nodes",
                dimension=name,
                degree=degree,
                needed=block,
                detail=f"{num_nodes} nodes of {processes_per_node}",
            )


@attrs.frozen(kw_only=True)
class HostSpan:
    """The numbers of one dimension's groups across hosts: how many of its groups (or, for a stage-aligned
    dimension, its stages) reach more than one node, the most nodes one reaches, the first such group's ranks and
    nodes, and how many of that group's ring links (member i to member i + 1, the last back to the first: the ring
    NCCL and gloo all-reduce over, and ring attention passes blocks along) join ranks on different nodes."""

    groups: int  # the dimension's groups (stages) in the world
    spanning: int  # of them, those that reach more than one node
    most_nodes: int
    example: tuple[int, ...]  # the first spanning group's ranks
    example_nodes: tuple[int, ...]  # the nodes they sit on, each once, in order
    links: int  # ring links of the example group
    crossing: int  # of them, those that join two nodes


def host_span(layout: MeshLayout, dimension: MeshDimension, processes_per_node: int) -> HostSpan:
    """`dimension`'s groups across the nodes of `processes_per_node` ranks each (for a stage-aligned dimension, the
    blocks of ranks its stages hold: every rank of one coordinate along it)."""
    if MESH_DIMENSIONS[dimension].stage_aligned:
        block = layout.world_size // layout.size(dimension)
        groups = tuple(tuple(range(start, start + block)) for start in range(0, layout.world_size, block))
    else:
        groups = layout.groups(dimension)
    spanning = [group for group in groups if len({rank // processes_per_node for rank in group}) > 1]
    example = spanning[0] if spanning else groups[0]
    nodes = tuple(dict.fromkeys(rank // processes_per_node for rank in example))
    ring = list(zip(example, (*example[1:], example[0]), strict=True)) if len(example) > 1 else []
    return HostSpan(
        groups=len(groups),
        spanning=len(spanning),
        most_nodes=max(len({rank // processes_per_node for rank in group}) for group in groups),
        example=example,
        example_nodes=nodes,
        links=len(ring),
        crossing=sum(a // processes_per_node != b // processes_per_node for a, b in ring),
    )
