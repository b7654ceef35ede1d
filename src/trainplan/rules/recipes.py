"""From plan to loop: how each precision and each strategy family becomes torch objects, and other frameworks' names
for the accelerators."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, TypeAlias

import attrs

from trainplan.spec.names import (
    AcceleratorKey,
    PrecisionKey,
    PrecisionName,
    StrategyFamily,
    StrategyName,
)

# arguments (read by `mapping.frameworks` and the effects' runtime and adapters).

DtypeName: TypeAlias = Literal["float64", "float32", "float16", "bfloat16"]
WrapperName: TypeAlias = Literal["move", "data_parallel", "ddp", "fsdp", "deepspeed", "mesh", "xla"]

LightningCheckpointing: TypeAlias = Literal["policy", "parallelize"]
"""How a Lightning strategy carries activation checkpointing of the model's blocks: its
`activation_checkpointing_policy` (the blocks' classes), or the function Fabric's ModelParallelStrategy applies the mesh
with (`parallelize_fn`)."""
AccelerateMixedPrecision: TypeAlias = Literal["no", "fp16", "bf16", "fp8"]
RecipeEngine: TypeAlias = Literal["torch", "transformer_engine"]
"""Who runs a precision: torch (autocast, parameter dtype) or NVIDIA's Transformer Engine."""


@attrs.frozen(kw_only=True)
class PrecisionRecipe:
    """What the runtime does with a precision (a downstream precision brings its own: `Rules.extend`)."""

    name: PrecisionKey
    autocast_dtype: DtypeName | None  # mixed precision: the dtype torch.autocast computes in; None: no autocast
    parameter_dtype: DtypeName  # the dtype the model's parameters are cast to
    grad_scaler_on: frozenset[AcceleratorKey]  # where the loss must be scaled (fp16 AMP on CUDA)
    accelerate: AccelerateMixedPrecision | None  # Accelerate's mixed_precision; None: Accelerate has no such mode
    engine: RecipeEngine


PRECISION_RECIPES: Final[Mapping[PrecisionKey, PrecisionRecipe]] = {
    recipe.name: recipe
    for recipe in (
        PrecisionRecipe(
            name="64-true",
            autocast_dtype=None,
            parameter_dtype="float64",
            grad_scaler_on=frozenset(),
            accelerate=None,
            engine="torch",
        ),
        PrecisionRecipe(
            name="32-true",
            autocast_dtype=None,
            parameter_dtype="float32",
            grad_scaler_on=frozenset(),
            accelerate="no",
            engine="torch",
        ),
        # float16 gradients underflow without loss scaling; CUDA AMP is where torch (and Lightning) scale.
        PrecisionRecipe(
            name="16-mixed",
            autocast_dtype="float16",
            parameter_dtype="float32",
            grad_scaler_on=frozenset({"cuda"}),
            accelerate="fp16",
            engine="torch",
        ),
        PrecisionRecipe(
            name="bf16-mixed",
            autocast_dtype="bfloat16",
            parameter_dtype="float32",
            grad_scaler_on=frozenset(),
            accelerate="bf16",
            engine="torch",
        ),
        PrecisionRecipe(
            name="16-true",
            autocast_dtype=None,
            parameter_dtype="float16",
            grad_scaler_on=frozenset(),
            accelerate=None,
            engine="torch",
        ),
        PrecisionRecipe(
            name="bf16-true",
            autocast_dtype=None,
            parameter_dtype="bfloat16",
            grad_scaler_on=frozenset(),
            accelerate=None,
            engine="torch",
        ),
        PrecisionRecipe(
            name="transformer-engine",
            autocast_dtype=None,
            parameter_dtype="bfloat16",
            grad_scaler_on=frozenset(),
            accelerate="fp8",
            engine="transformer_engine",
        ),
        PrecisionRecipe(
            name="transformer-engine-float16",
            autocast_dtype=None,
            parameter_dtype="float16",
            grad_scaler_on=frozenset(),
            accelerate="fp8",
            engine="transformer_engine",
        ),
    )
}


@attrs.frozen(kw_only=True)
class FamilyRecipe:
    family: StrategyFamily
    wrapper: WrapperName  # how the runtime places and wraps the model
    lightning_strategy: str | None  # the Lightning/Fabric strategy class built from the options; None: none
    accelerate_launch: tuple[str, ...]  # `accelerate launch` flags for this family (several processes)
    sharded_grad_scaler: bool = False  # each rank holds a shard: inf checks must agree across ranks
    lightning_precisions: frozenset[PrecisionName] | None = None  # what the Lightning strategy takes; None: any
    lightning_backend: bool = False  # the Lightning strategy takes `process_group_backend`
    accelerate_multi_gpu: bool = False  # several GPU processes run under `accelerate launch --multi_gpu`
    lightning_registered: StrategyName | None = None
    """The framework builds the strategy itself from this registered name (torch_xla's strategies need torch_xla
    to be constructed, so on a machine without it the adapter passes the name); None: the adapter builds it."""
    trainer_instead: StrategyName | None = None
    """None: Lightning's Trainer registers this family's strategy too. A name: only Fabric registers it, and the
    Trainer is refused with this strategy as the one it runs instead."""
    accelerate_why_not: str | None = None  # why Accelerate cannot run the family; None: it can
    accelerate_instead: StrategyName | None = None  # the strategy suggested to Accelerate where it cannot
    lightning_checkpointing: LightningCheckpointing | None = None
    """How the family's Lightning strategy checkpoints the model's blocks (`LightningCheckpointing`); None: it has no
    setting for it (DDP's, DeepSpeed's, XLA's), so a plan that recomputes activations is refused there by name."""


FAMILY_RECIPES: Final[Mapping[StrategyFamily, FamilyRecipe]] = {
    recipe.family: recipe
    for recipe in (
        FamilyRecipe(
            family="single_device", wrapper="move", lightning_strategy="SingleDeviceStrategy", accelerate_launch=()
        ),
        # Lightning 2.0 removed DataParallel; Accelerate has no counterpart either.
        FamilyRecipe(
            family="dp",
            wrapper="data_parallel",
            lightning_strategy=None,
            accelerate_launch=(),
            accelerate_why_not="Accelerate runs one process per device; it has no DataParallel mode",
            accelerate_instead="ddp",
        ),
        FamilyRecipe(
            family="ddp",
            wrapper="ddp",
            lightning_strategy="DDPStrategy",
            accelerate_launch=(),
            lightning_backend=True,
            accelerate_multi_gpu=True,
        ),
        FamilyRecipe(
            family="fsdp",
            wrapper="fsdp",
            lightning_strategy="FSDPStrategy",
            lightning_backend=True,
            accelerate_launch=("--use_fsdp",),
            sharded_grad_scaler=True,
            lightning_checkpointing="policy",  # FSDPStrategy(activation_checkpointing_policy={Block})
        ),
        FamilyRecipe(
            family="deepspeed",
            wrapper="deepspeed",
            lightning_strategy="DeepSpeedStrategy",
            accelerate_launch=("--use_deepspeed",),
        ),
        # The user's parallelize function applies the mesh (as Lightning's ModelParallelStrategy asks for one). fp16
        # AMP runs with data parallelism alone (tp and cp refuse 16-mixed, pp too), where every gradient is a DTensor
        # of the same placements, so torch's own GradScaler finds the same overflow on every rank.
        FamilyRecipe(
            family="model_parallel",
            wrapper="mesh",
            lightning_strategy="ModelParallelStrategy",
            # `accelerate launch` gets --use_parallelism_config only beside FSDP2 (mapping.frameworks decides).
            accelerate_launch=(),
            # Lightning's ModelParallelStrategy refuses the other precisions (its connector's own list).
            lightning_precisions=frozenset({"32-true", "bf16-mixed", "bf16-true", "16-true"}),
            lightning_backend=True,
            # Fabric's strategy calls parallelize_fn(model, mesh): the adapter checkpoints the blocks first. The
            # Trainer's applies the mesh in LightningModule.configure_model, out of the adapter's reach.
            lightning_checkpointing="parallelize",
        ),
        FamilyRecipe(
            family="xla",
            wrapper="xla",
            lightning_strategy="XLAStrategy",
            accelerate_launch=("--tpu",),
            lightning_registered="xla",
        ),
        FamilyRecipe(
            family="single_xla",
            wrapper="xla",
            lightning_strategy="SingleDeviceXLAStrategy",
            accelerate_launch=("--tpu",),
            lightning_registered="single_xla",
        ),
        # Fabric registers `xla_fsdp` (XLAFSDPStrategy, beside `xla` and `single_xla`); Lightning 2.6's Trainer
        # does not. Accelerate 1.x shards through torch FSDP on CUDA only: it has no XlaFullyShardedDataParallel.
        FamilyRecipe(
            family="xla_fsdp",
            wrapper="xla",
            lightning_strategy="XLAFSDPStrategy",
            accelerate_launch=("--tpu",),
            lightning_registered="xla_fsdp",
            trainer_instead="xla",
            accelerate_why_not="Accelerate has no XLA FSDP (its FSDP plugin is torch FSDP on CUDA devices)",
            accelerate_instead="xla",
        ),
    )
}

LightningDevices: TypeAlias = Literal["count", "indices", "one_index_or_count"]
"""How Lightning takes `devices` for an accelerator: a count, a list of indices, or one index as a list (else a
count)."""


@attrs.frozen(kw_only=True)
class FrameworkAccelerator:
    """How Lightning/Fabric and Hugging Face Accelerate spell an accelerator and its devices."""

    accelerator: AcceleratorKey
    lightning: str  # Lightning's accelerator name
    lightning_devices: LightningDevices  # how Lightning takes `devices`
    accelerate_cpu: bool  # Accelerate runs it as `Accelerator(cpu=True)` / `accelerate launch --cpu`
    accelerate_gpu_ids: bool  # `accelerate launch --gpu_ids` names its devices
    accelerate_processes: bool  # Accelerate starts several processes of it (and builds a ParallelismConfig mesh)


FRAMEWORK_ACCELERATORS: Final[Mapping[AcceleratorKey, FrameworkAccelerator]] = {
    row.accelerator: row
    for row in (
        # accelerate launch starts several CPU processes only through MPI; its mesh is for GPU runs only.
        FrameworkAccelerator(
            accelerator="cpu",
            lightning="cpu",
            lightning_devices="count",
            accelerate_cpu=True,
            accelerate_gpu_ids=False,
            accelerate_processes=False,
        ),
        FrameworkAccelerator(
            accelerator="cuda",
            lightning="cuda",
            lightning_devices="indices",  # GPU indices as a list
            accelerate_cpu=False,
            accelerate_gpu_ids=True,
            accelerate_processes=True,
        ),
        FrameworkAccelerator(
            accelerator="mps",
            lightning="mps",
            lightning_devices="count",
            accelerate_cpu=False,
            accelerate_gpu_ids=False,
            accelerate_processes=True,
        ),
        # Lightning takes XLA cores as a count (all of them) or a one-index list.
        FrameworkAccelerator(
            accelerator="xla",
            lightning="tpu",
            lightning_devices="one_index_or_count",
            accelerate_cpu=False,
            accelerate_gpu_ids=False,
            accelerate_processes=True,
        ),
    )
}
"""The frameworks' spelling of each accelerator (the adapters read it)."""
