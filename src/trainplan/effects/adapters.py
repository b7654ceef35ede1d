"""Adapters: a plan handed to PyTorch Lightning, Lightning Fabric or Hugging Face Accelerate, nothing lost.

    trainer = pytorch_lightning.Trainer(**trainplan.lightning_trainer_arguments(plan), max_epochs=3)
    fabric = lightning_fabric.Fabric(**trainplan.fabric_arguments(plan))
    accelerator = accelerate.Accelerator(**trainplan.accelerator_arguments(plan))

The mapping is decided in `mapping.frameworks` (pure, tested from plans alone); this module imports the
framework only when its adapter is called, and builds the framework's own objects from that mapping: a real
strategy object carrying the plan's options (DDP's flags and timeout, FSDP's sharding and offload,
DeepSpeed's stage and offload), Accelerate's kwargs handlers. A framework that is not installed is a
`MissingExtra` naming what to install.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from types import ModuleType
from typing import Any

from trainplan.effects.extras import MissingExtra, is_missing, require_torch
from trainplan.effects.option_objects import built
from trainplan.effects.rules_loading import rules_of
from trainplan.effects.runtime import Blocks, checkpoint_blocks
from trainplan.mapping.frameworks import (
    LightningArguments,
    accelerate_arguments,
    accelerate_mesh_refusal,
    block_classes,
    framework_sync_batchnorm,
    lightning_arguments,
)
from trainplan.mapping.frameworks import accelerate_launch_flags as _launch_flags
from trainplan.resolve.refusal import incompatible
from trainplan.rules import lookup
from trainplan.spec.errors import TrainplanError
from trainplan.spec.plan import Plan


def _framework(module: str, install: str) -> ModuleType:
    require_torch(f"The adapter for {module.partition('.')[0]}")  # every framework runs on torch
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if is_missing(error, module.partition(".")[0]):
            raise MissingExtra(framework=module, install=install) from error
        raise  # installed, but broken inside: its own error says why


def _strategy(
    plan: Plan,
    mapped: LightningArguments,
    strategies: ModuleType,
    parallelize: Callable[..., Any] | None = None,
) -> object:
    """The Lightning/Fabric strategy object for the plan, built in `strategies` (either framework's) from its
    mapping; Fabric's ModelParallelStrategy also takes the function that applies the mesh (`parallelize`)."""
    arguments = built(mapped.strategy.arguments, plan.device_type)
    if parallelize is not None:
        arguments["parallelize_fn"] = parallelize
    if mapped.strategy.class_name == "SingleDeviceStrategy":
        import torch

        arguments["device"] = torch.device(plan.device_for(0))
    if mapped.strategy.registered_name is not None:  # torch_xla's strategies: the framework builds them by name
        return mapped.strategy.registered_name
    cls = getattr(strategies, mapped.strategy.class_name)
    package = lookup(rules_of(plan).families, plan.strategy.family, name="FAMILIES").requires_package
    if package is not None and importlib.util.find_spec(package) is None:  # DeepSpeedStrategy imports deepspeed
        raise MissingExtra(framework=f"{package} (for Lightning's {mapped.strategy.class_name})", install=package)
    return cls(**arguments)


def _arguments(
    plan: Plan, mapped: LightningArguments, strategies: ModuleType, parallelize: Callable[..., Any] | None = None
) -> dict[str, Any]:
    return {
        "accelerator": mapped.accelerator,
        "devices": mapped.devices,
        "num_nodes": mapped.num_nodes,
        "precision": mapped.precision,
        "strategy": _strategy(plan, mapped, strategies, parallelize),
    }


def _checkpointing_first(parallelize: Callable[..., Any], blocks: Blocks | None) -> Callable[..., Any]:
    """`parallelize`, with the model's blocks checkpointed before it runs (`checkpoint_blocks`: every name kept, so
    the function's tensor-parallel plan still finds its layers)."""

    def checkpointed_then_parallelized(model: Any, device_mesh: Any) -> Any:
        checkpoint_blocks(model, blocks)
        return parallelize(model, device_mesh)

    return checkpointed_then_parallelized


def lightning_trainer_arguments(
    plan: Plan, *, blocks: type | tuple[type, ...] | None = None, checkpointed: bool = False
) -> dict[str, Any]:
    """`pytorch_lightning.Trainer(**...)` arguments for the plan, with a real strategy object. A strategy only
    Fabric registers (`xla_fsdp`) is `Incompatible` here, with the Trainer's nearest one.

    `blocks`, the classes of the model's repeated blocks (a transformer's layer class), become FSDP's units and,
    where the plan's memory choice recomputes activations, its `activation_checkpointing_policy`. A strategy that
    has no such setting (DDP's, DeepSpeed's) is refused by name (`framework-checkpointing`) unless you checkpointed
    the blocks yourself (`trainplan.checkpoint_blocks(model)`) and say so: `checkpointed=True`."""
    mapped = lightning_arguments(  # refuses before the framework is imported
        plan, "trainer", rules_of(plan), blocks=block_classes(blocks), checkpointed=checkpointed
    )
    strategies = _framework("pytorch_lightning.strategies", "pytorch-lightning")
    arguments = _arguments(plan, mapped, strategies)
    arguments["sync_batchnorm"] = mapped.sync_batchnorm
    return arguments


def fabric_arguments(
    plan: Plan,
    *,
    parallelize: Callable[..., Any] | None = None,
    blocks: Blocks | None = None,
    checkpointed: bool = False,
) -> dict[str, Any]:
    """`lightning_fabric.Fabric(**...)` arguments for the plan, with a real strategy object. A device mesh
    (`model_parallel`) becomes Fabric's ModelParallelStrategy, which applies it through `parallelize(model,
    device_mesh)`.

    The plan's memory choice reaches Fabric: FSDP takes `blocks` (their classes) as its units and, where the plan
    recomputes activations, as its `activation_checkpointing_policy`; under a mesh, the blocks (`blocks`, any
    `Blocks`, by default `repeated_layers(model)`) are checkpointed before `parallelize` runs. A strategy without
    such a setting is refused by name unless `checkpointed=True` (you ran `trainplan.checkpoint_blocks(model)`)."""
    framework_sync_batchnorm(plan, "Fabric")
    if plan.mesh is None and parallelize is not None:
        raise TrainplanError(
            f"fabric_arguments(parallelize=...) applies a device mesh, and strategy {plan.strategy.name!r} has none: "
            "use strategy='model_parallel', or leave parallelize out"
        )
    if plan.mesh is not None and parallelize is None:
        raise incompatible("fabric-parallelize", {"strategy": plan.strategy.name})
    classes = () if plan.mesh is not None else block_classes(blocks)  # a mesh's blocks are found in the model
    mapped = lightning_arguments(  # refuses before the framework is imported
        plan, "fabric", rules_of(plan), blocks=classes, checkpointed=checkpointed
    )
    if parallelize is not None and mapped.checkpoint_in_parallelize:
        parallelize = _checkpointing_first(parallelize, blocks)
    return _arguments(plan, mapped, _framework("lightning_fabric.strategies", "lightning-fabric"), parallelize)


def accelerator_arguments(
    plan: Plan, *, blocks: type | tuple[type, ...] | None = None, checkpointed: bool = False
) -> dict[str, Any]:
    """`accelerate.Accelerator(**...)` arguments for the plan: cpu, mixed_precision, and kwargs handlers with the
    DDP options and the process group's backend and timeout.

    `blocks`, the classes of the model's repeated blocks, become the FSDP plugin's units (transformer_based_wrap)
    and, where the plan's memory choice recomputes activations, its `activation_checkpointing`. A plan without an FSDP
    plugin is refused by name (`framework-checkpointing`) unless `checkpointed=True` (you ran
    `trainplan.checkpoint_blocks(model)`)."""
    framework_sync_batchnorm(plan, "Accelerate")
    rules = rules_of(plan)
    refusal = accelerate_mesh_refusal(plan, rules)
    if refusal is not None:
        raise refusal
    mapped = accelerate_arguments(  # refuses before the framework is imported
        plan, rules, blocks=block_classes(blocks), checkpointed=checkpointed
    )
    utils = _framework("accelerate.utils", "accelerate")
    handlers: list[object] = []
    if plan.process_group_backend is not None:  # one process creates no group: no handler, no stray default
        handlers.append(utils.InitProcessGroupKwargs(**built(mapped.process_group, plan.device_type)))
    if mapped.ddp:
        handlers.append(utils.DistributedDataParallelKwargs(**mapped.ddp))
    # Accelerator's keyword arguments (its `cpu=` is a flag of its own, not a decision on trainplan's "cpu").
    arguments: dict[str, Any] = dict(cpu=mapped.cpu, mixed_precision=mapped.mixed_precision, kwargs_handlers=handlers)
    if mapped.fsdp is not None:
        arguments["fsdp_plugin"] = utils.FullyShardedDataParallelPlugin(**mapped.fsdp)
    if mapped.parallelism is not None:
        arguments["parallelism_config"] = accelerate_parallelism_config(plan)
    if mapped.deepspeed is not None:
        arguments["deepspeed_plugin"] = utils.DeepSpeedPlugin(**mapped.deepspeed)
    return arguments


def accelerate_parallelism_config(plan: Plan) -> Any:
    """Accelerate's `ParallelismConfig` with the sizes of the plan's device mesh (Accelerate 1.15 has one:
    dp_replicate, dp_shard, tp and cp; no pipeline), and context parallelism's rotate method as its `cp_handler`.
    Its `build_device_mesh(device_type)` gives Accelerate's own mesh over the same ranks."""
    mapped = accelerate_arguments(plan, rules_of(plan))
    sizes = mapped.parallelism
    if sizes is None:
        raise TrainplanError(
            f"strategy {plan.strategy.name!r} has no device mesh, so there is no ParallelismConfig to build: resolve a "
            "plan with strategy='model_parallel'"
        )
    module = _framework("accelerate.parallelism_config", "accelerate")
    if sizes.get("tp_size", 1) > 1 and importlib.util.find_spec("transformers") is None:
        # Accelerate applies tensor parallelism through a transformers model's tp_plan (TorchTensorParallelConfig).
        raise MissingExtra(framework="transformers (for Accelerate's tensor parallelism)", install="transformers")
    if mapped.context_parallel is not None:  # the rotate method: Accelerate's cp_comm_strategy
        utils = _framework("accelerate.utils", "accelerate")
        handler = utils.TorchContextParallelConfig(**mapped.context_parallel)
        return module.ParallelismConfig(**sizes, cp_handler=handler)
    return module.ParallelismConfig(**sizes)


def accelerate_launch_flags(plan: Plan) -> list[str]:
    """The `accelerate launch` flags that start this plan's processes (pure; needs no Accelerate)."""
    return _launch_flags(plan, rules_of(plan))


__all__ = [
    "MissingExtra",
    "accelerate_launch_flags",
    "accelerate_parallelism_config",
    "accelerator_arguments",
    "fabric_arguments",
    "lightning_trainer_arguments",
]
