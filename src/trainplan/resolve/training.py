"""From plan to loop, the decisions (pure): the precision recipe, the wrapper, DeepSpeed's config, and the
arguments other frameworks take (Lightning and Fabric, Hugging Face Accelerate and `accelerate launch`).

The effects' runtime and adapters turn these into torch objects and framework objects; nothing here imports
torch or a framework, so every mapping is tested from plans alone.
"""

from __future__ import annotations

from typing import Literal

import attrs

from trainplan.spec.errors import Incompatible
from trainplan.spec.options import DDPOptions, DeepSpeedOptions, FSDPOptions
from trainplan.spec.plan import Plan
from trainplan.spec.tables import (
    DEFAULT_PROCESS_GROUP_TIMEOUT,
    FAMILY_RECIPES,
    PRECISION_RECIPES,
    RULES,
    FamilyRecipe,
    PrecisionRecipe,
    lookup,
)


def _refusal(rule_id: str, values: dict[str, object], **fields: object) -> Incompatible:
    rule = lookup(RULES, rule_id, name="RULES")
    return Incompatible(
        values=values,
        rule=rule.id,
        reason=rule.reason.format(**values, **fields),
        fix=rule.fix.format(**values, **fields),
    )


def precision_recipe(plan: Plan) -> PrecisionRecipe:
    """How the plan's precision runs: autocast dtype (mixed), parameter dtype (true), loss scaling."""
    return lookup(PRECISION_RECIPES, plan.precision, name="PRECISION_RECIPES")


def family_recipe(plan: Plan) -> FamilyRecipe:
    """How the plan's strategy family wraps a model, and which Lightning strategy and Accelerate flags match it."""
    return lookup(FAMILY_RECIPES, plan.strategy.family, name="FAMILY_RECIPES")


def needs_grad_scaler(plan: Plan) -> bool:
    """fp16 AMP on CUDA scales the loss (float16 gradients underflow otherwise); nothing else does."""
    return plan.accelerator in precision_recipe(plan).grad_scaler_on


def deepspeed_config(
    plan: Plan, *, micro_batch_size: int = 1, gradient_accumulation_steps: int = 1
) -> dict[str, object]:
    """The DeepSpeed config for the plan's `DeepSpeedOptions` and precision, ready for `deepspeed.initialize`."""
    options = plan.strategy.options
    if not isinstance(options, DeepSpeedOptions):
        raise _refusal("deepspeed-config", {"strategy": plan.strategy.name})
    counts: tuple[tuple[str, object], ...] = (
        ("micro_batch_size", micro_batch_size),
        ("gradient_accumulation_steps", gradient_accumulation_steps),
    )
    for name, value in counts:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _refusal("deepspeed-count", {name: value}, name=name)
    zero: dict[str, object] = {"stage": options.stage}
    if options.offload_optimizer:
        zero["offload_optimizer"] = {"device": options.offload_device, "pin_memory": True}
    if options.offload_parameters:
        zero["offload_param"] = {"device": options.offload_device, "pin_memory": True}
    recipe = precision_recipe(plan)
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "zero_optimization": zero,
        "fp16": {"enabled": recipe.autocast_dtype == "float16" or recipe.parameter_dtype == "float16"},
        "bf16": {"enabled": recipe.autocast_dtype == "bfloat16" or recipe.parameter_dtype == "bfloat16"},
    }


# --------------------------------------------------------------------------------------------------
# Lightning and Fabric


@attrs.frozen(kw_only=True)
class LightningStrategy:
    """A Lightning/Fabric strategy to build: its class name and constructor arguments (plain values)."""

    class_name: str
    arguments: dict[str, object]


@attrs.frozen(kw_only=True)
class LightningArguments:
    """What `Trainer(...)` / `Fabric(...)` take for this plan; the strategy still to be built as an object."""

    accelerator: str
    devices: list[int] | int
    num_nodes: int
    precision: str
    strategy: LightningStrategy
    sync_batchnorm: bool


_LIGHTNING_ACCELERATORS = {"cpu": "cpu", "cuda": "cuda", "mps": "mps", "xla": "tpu"}


def lightning_arguments(plan: Plan) -> LightningArguments:
    """The plan as Lightning Trainer / Fabric arguments, nothing lost: the strategy's options become the
    strategy object's arguments (DDP's flags and timeout, FSDP's sharding and offload, DeepSpeed's stage)."""
    recipe = family_recipe(plan)
    if recipe.lightning_strategy is None:
        raise _refusal("lightning-strategy", {"strategy": plan.strategy.name})
    arguments: dict[str, object] = {}
    options = plan.strategy.options
    if isinstance(options, DDPOptions):
        arguments.update(
            find_unused_parameters=options.find_unused_parameters,
            static_graph=options.static_graph,
            gradient_as_bucket_view=options.gradient_as_bucket_view,
            timeout_seconds=options.timeout_seconds,
        )
        start_method = {"spawn": "spawn", "fork": "fork"}.get(plan.launcher)
        if start_method is not None:
            arguments["start_method"] = start_method
    elif isinstance(options, FSDPOptions):
        arguments.update(sharding_strategy=options.sharding_strategy, cpu_offload=options.cpu_offload)
    elif isinstance(options, DeepSpeedOptions):
        arguments.update(
            stage=options.stage,
            offload_optimizer=options.offload_optimizer,
            offload_parameters=options.offload_parameters,
            remote_device=options.offload_device if options.offload_parameters else None,
            offload_params_device=options.offload_device,
            offload_optimizer_device=options.offload_device,
        )
    if plan.process_group_backend is not None and recipe.wrapper in ("ddp", "fsdp"):
        arguments["process_group_backend"] = plan.process_group_backend
    devices: list[int] | int = list(plan.devices) if plan.accelerator in ("cuda", "xla") else plan.processes_per_node
    return LightningArguments(
        accelerator=_LIGHTNING_ACCELERATORS[plan.accelerator],
        devices=devices,
        num_nodes=plan.num_nodes,
        precision=plan.precision,
        strategy=LightningStrategy(class_name=recipe.lightning_strategy, arguments=arguments),
        sync_batchnorm=plan.request.sync_batchnorm is True,
    )


# --------------------------------------------------------------------------------------------------
# Hugging Face Accelerate


@attrs.frozen(kw_only=True)
class AccelerateArguments:
    """What `Accelerator(...)` takes for this plan (its kwargs handlers as plain values) and the matching
    `accelerate launch` command-line flags."""

    cpu: bool
    mixed_precision: Literal["no", "fp16", "bf16", "fp8"]
    ddp: dict[str, object]  # DistributedDataParallelKwargs
    process_group: dict[str, object]  # InitProcessGroupKwargs (backend, timeout seconds)
    launch_flags: list[str]


def accelerate_arguments(plan: Plan) -> AccelerateArguments:
    """The plan as Accelerate's `Accelerator` arguments and `accelerate launch` flags."""
    recipe = precision_recipe(plan)
    if recipe.accelerate is None:
        raise _refusal("accelerate-precision", {"precision": plan.precision})
    if family_recipe(plan).wrapper == "data_parallel":
        raise _refusal("accelerate-strategy", {"strategy": plan.strategy.name})
    options = plan.strategy.options
    ddp: dict[str, object] = {}
    if isinstance(options, DDPOptions):
        ddp = {
            "find_unused_parameters": options.find_unused_parameters,
            "static_graph": options.static_graph,
            "gradient_as_bucket_view": options.gradient_as_bucket_view,
        }
    timeout = options.timeout_seconds if isinstance(options, DDPOptions) else DEFAULT_PROCESS_GROUP_TIMEOUT
    process_group: dict[str, object] = {"timeout_seconds": timeout}
    if plan.process_group_backend is not None:
        process_group["backend"] = plan.process_group_backend
    flags = ["--num_processes", str(plan.world_size), "--num_machines", str(plan.num_nodes)]
    flags += ["--mixed_precision", recipe.accelerate]
    if plan.accelerator == "cpu":
        flags.append("--cpu")
    elif plan.accelerator == "cuda":
        flags += ["--gpu_ids", ",".join(str(index) for index in plan.devices)]
        if plan.world_size > 1 and plan.strategy.family == "ddp":
            flags.append("--multi_gpu")
    flags += list(family_recipe(plan).accelerate_launch)
    if isinstance(options, DeepSpeedOptions):
        flags += ["--zero_stage", str(options.stage)]
    if plan.num_nodes > 1:
        flags += ["--machine_rank", str(plan.cluster.node_rank), "--main_process_ip", plan.cluster.main_address]
        if plan.cluster.main_port is not None:
            flags += ["--main_process_port", str(plan.cluster.main_port)]
    return AccelerateArguments(
        cpu=plan.accelerator == "cpu",
        mixed_precision=recipe.accelerate,
        ddp=ddp,
        process_group=process_group,
        launch_flags=flags,
    )


__all__ = [
    "AccelerateArguments",
    "LightningArguments",
    "LightningStrategy",
    "accelerate_arguments",
    "deepspeed_config",
    "family_recipe",
    "lightning_arguments",
    "needs_grad_scaler",
    "precision_recipe",
]
