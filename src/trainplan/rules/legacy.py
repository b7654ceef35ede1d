"""Legacy flags (the deprecation bridge, `Request.from_legacy`): the old → new mapping as data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from trainplan.spec.frozen import freeze_nested_maps
from trainplan.spec.names import (
    STRATEGY_NAMES,
    AcceleratorFlag,
    PrecisionName,
    StrategyName,
)


@attrs.frozen(kw_only=True)
class LegacyStrategy:
    """What an old strategy name (given as `accelerator=`, `distributed_backend=`, `plugins=`, ...) becomes.

    `strategy` None means the strategy no longer exists and has no faithful modern counterpart:
    `from_legacy` then raises `Incompatible` with `reason` and `fix`.
    """

    strategy: StrategyName | None
    accelerator: AcceleratorFlag | None = None
    options: Mapping[str, object] = attrs.field(factory=dict)
    differs: str = ""  # what the modern strategy does differently, for the note
    reason: str = ""  # why there is no modern counterpart (strategy None)
    fix: str = ""

    __attrs_post_init__ = freeze_nested_maps  # nested maps read-only: nobody changes a rule in place


LEGACY_STRATEGIES: Final[Mapping[str, LegacyStrategy]] = {
    **{name: LegacyStrategy(strategy=name) for name in STRATEGY_NAMES},
    # Lightning 1.x spelled "DDP on CPU processes" as its own accelerator; the accelerator now says where.
    "ddp_cpu": LegacyStrategy(strategy="ddp", accelerator="cpu"),
    "ddp_spawn_cpu": LegacyStrategy(strategy="ddp_spawn", accelerator="cpu"),
    # fairscale's sharded DDP sharded optimizer state and gradients (ZeRO stage 2): FSDP's SHARD_GRAD_OP
    # is the same sharding in torch itself. Both needed CUDA.
    "ddp_sharded": LegacyStrategy(
        strategy="fsdp",
        options={"sharding_strategy": "SHARD_GRAD_OP"},
        differs="FSDP in torch replaces fairscale; SHARD_GRAD_OP shards optimizer state and gradients like it did",
    ),
    "ddp_sharded_spawn": LegacyStrategy(
        strategy="fsdp",
        options={"sharding_strategy": "SHARD_GRAD_OP"},
        differs=(
            "FSDP in torch replaces fairscale, with SHARD_GRAD_OP sharding; its workers are started by re-running "
            "the script instead of being spawned (FSDP has no spawn variant)"
        ),
    ),
    "ddp_fully_sharded": LegacyStrategy(
        strategy="fsdp", differs="fairscale's FullyShardedDataParallel is torch's FSDP now"
    ),
    "fsdp_native": LegacyStrategy(strategy="fsdp"),
    "fsdp_native_full_shard_offload": LegacyStrategy(strategy="fsdp_cpu_offload"),
    "tpu_spawn": LegacyStrategy(strategy="xla", accelerator="xla"),
    "single_tpu": LegacyStrategy(strategy="single_xla", accelerator="xla"),
    "ddp2": LegacyStrategy(
        strategy=None,
        reason=(
            "ddp2 (DataParallel inside each node, DDP across nodes) was removed in Lightning 1.7 and has no "
            "counterpart in torch today"
        ),
        fix="Use strategy='ddp' (one process per GPU on every node); it is faster than ddp2 was",
    ),
    "horovod": LegacyStrategy(
        strategy=None,
        reason="Horovod support was removed in Lightning 2.0, and horovodrun is not a launcher trainplan drives",
        fix="Use strategy='ddp' and start the job with torchrun (or `trainplan launch`) instead of horovodrun",
    ),
}
"""Old strategy names and what they become; every modern name maps to itself."""

LEGACY_PRECISION_PLUGINS: Final[Mapping[str, PrecisionName]] = {
    "native_amp": "16-mixed",
    "mixed_precision": "16-mixed",
    "double_precision": "64-true",
    "bf16_amp": "bf16-mixed",
}
"""Precision plugins once passed by name in `plugins=`."""

LEGACY_ACCELERATORS: Final[Mapping[str, AcceleratorFlag]] = {
    "cpu": "cpu",
    "gpu": "gpu",
    "cuda": "cuda",
    "tpu": "xla",
    "xla": "xla",
    "mps": "mps",
    "auto": "auto",
}
"""Accelerator names that kept their meaning; any other `accelerator=` value is looked up as a strategy."""

UNSUPPORTED_ACCELERATORS: Final[Mapping[str, str]] = {
    "ipu": "Graphcore IPUs",
    "hpu": "Habana Gaudi HPUs",
}
"""Hardware old configs may name that trainplan does not plan for."""


@attrs.frozen(kw_only=True)
class LegacyDeviceFlag:
    """An old per-hardware device flag (`gpus=`, `tpu_cores=`, `num_processes=`): what it implied."""

    accelerator: AcceleratorFlag  # the accelerator the flag implied
    why: str  # why devices= replaced it, for the note
    none_accelerator: AcceleratorFlag | None  # where to run when the flag asks for none of its devices (gpus=0)
    none_why: str = ""  # the note's reason for that


LEGACY_DEVICE_FLAGS: Final[Mapping[str, LegacyDeviceFlag]] = {
    "gpus": LegacyDeviceFlag(
        accelerator="gpu",
        why="devices= counts or lists devices of any accelerator; gpus= was removed in Lightning 2.0",
        # Lightning 1.x read gpus=0 (and [] or "0") as "train on the CPU".
        none_accelerator="cpu",
        none_why="gpus=0 meant no GPU; say where to run instead",
    ),
    "tpu_cores": LegacyDeviceFlag(
        accelerator="xla",
        why="TPUs run through the XLA accelerator, and devices= counts its cores",
        none_accelerator=None,
    ),
    "num_processes": LegacyDeviceFlag(
        accelerator="cpu", why="num_processes counted CPU processes; devices= does that now", none_accelerator=None
    ),
}
"""The old per-hardware device flags, in the order their claims are made."""

LEGACY_STRATEGY_FLAGS: Final[Mapping[str, str]] = {
    "accelerator": "`accelerator` names hardware now; the distribution strategy has its own flag",
    "distributed_backend": "distributed_backend was renamed strategy (and accelerator names hardware)",
    "training_type": "training_type was the RFC's interim name for strategy",
    "plugins": "strategies are no longer plugins",
    "strategy": "the strategy was renamed",
}
"""The flags that may carry an old strategy name, and why the strategy moved out of each (for the note)."""

LEGACY_CONFLICT_FIXES: Final[Mapping[str, str]] = {
    "accelerator": "write accelerator= once, with the hardware (cpu, gpu, cuda, mps, xla)",
    "devices": "write devices= once (it replaces gpus=, tpu_cores= and num_processes=)",
    "strategy": "write strategy= once (it replaces accelerator='ddp', distributed_backend=, training_type= and "
    "strategy plugins)",
    "precision": "write precision= once (it replaces precision plugins and amp_backend)",
    "metrics_store": "write metrics_store= once",
}
"""The fix when old and new flags disagree on a topic (other topics: "write <topic>= once")."""
