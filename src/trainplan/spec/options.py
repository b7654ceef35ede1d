"""Strategy options: the typed way to pass what a strategy takes beyond its name.

Each family that takes options has one frozen record. Registered names such as
`ddp_find_unused_parameters_true` or `deepspeed_stage_3_offload` are presets of these records
(see `tables.STRATEGIES`).
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import attrs

ShardingStrategy: TypeAlias = Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]
OffloadDevice: TypeAlias = Literal["cpu", "nvme"]
DeepSpeedStage: TypeAlias = Literal[0, 1, 2, 3]


@attrs.frozen(kw_only=True)
class DDPOptions:
    """Options of the DDP family (ddp, ddp_spawn, ddp_fork, ddp_notebook)."""

    find_unused_parameters: bool = False
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    timeout_seconds: int = 1800


@attrs.frozen(kw_only=True)
class FSDPOptions:
    """Options of Fully Sharded Data Parallel."""

    cpu_offload: bool = False
    sharding_strategy: ShardingStrategy = "FULL_SHARD"


@attrs.frozen(kw_only=True)
class DeepSpeedOptions:
    """Options of DeepSpeed ZeRO. Parameter offload exists only at stage 3."""

    stage: DeepSpeedStage = 2
    offload_optimizer: bool = False
    offload_parameters: bool = False
    offload_device: OffloadDevice = "cpu"


StrategyOptions: TypeAlias = DDPOptions | FSDPOptions | DeepSpeedOptions
"""Any strategy's options record."""

OPTION_TYPES: dict[str, type[DDPOptions] | type[FSDPOptions] | type[DeepSpeedOptions]] = {
    "ddp": DDPOptions,
    "fsdp": FSDPOptions,
    "deepspeed": DeepSpeedOptions,
}
"""Which options record each family takes; families not listed take none."""
