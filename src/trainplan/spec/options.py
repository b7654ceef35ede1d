"""Strategy options: the typed way to pass what a strategy takes beyond its name.

Each family that takes options has one frozen record. Registered names such as
`ddp_find_unused_parameters_true` or `deepspeed_stage_3_offload` are presets of these records
(see `tables.STRATEGIES`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeAlias, TypeVar

import attrs

_Options = TypeVar("_Options")


def _remember_given(cls: type[_Options]) -> type[_Options]:
    """Record which options the caller wrote (`given`), so that a preset strategy name (whose own fields would
    otherwise win over defaults) can tell an explicit `stage=2` from a `stage` left at its default of 2."""
    generated: Callable[..., None] = cls.__init__

    def __init__(self: Any, **options: Any) -> None:
        generated(self, **options)
        object.__setattr__(self, "given", frozenset(options))

    __init__.__doc__ = generated.__doc__
    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


def _given_field() -> Any:
    return attrs.field(factory=frozenset, init=False, eq=False, repr=False)


ShardingStrategy: TypeAlias = Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]
OffloadDevice: TypeAlias = Literal["cpu", "nvme"]
DeepSpeedStage: TypeAlias = Literal[0, 1, 2, 3]


@_remember_given
@attrs.frozen(kw_only=True)
class DDPOptions:
    """Options of the DDP family (ddp, ddp_spawn, ddp_fork, ddp_notebook)."""

    find_unused_parameters: bool = False
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    timeout_seconds: int = 1800
    given: frozenset[str] = _given_field()
    """The options written explicitly (not part of the value: equal records compare equal)."""


@_remember_given
@attrs.frozen(kw_only=True)
class FSDPOptions:
    """Options of Fully Sharded Data Parallel."""

    cpu_offload: bool = False
    sharding_strategy: ShardingStrategy = "FULL_SHARD"
    given: frozenset[str] = _given_field()
    """The options written explicitly (not part of the value: equal records compare equal)."""


@_remember_given
@attrs.frozen(kw_only=True)
class DeepSpeedOptions:
    """Options of DeepSpeed ZeRO. Parameter offload exists only at stage 3."""

    stage: DeepSpeedStage = 2
    offload_optimizer: bool = False
    offload_parameters: bool = False
    offload_device: OffloadDevice = "cpu"
    given: frozenset[str] = _given_field()
    """The options written explicitly (not part of the value: equal records compare equal)."""


StrategyOptions: TypeAlias = DDPOptions | FSDPOptions | DeepSpeedOptions
"""Any strategy's options record."""

OPTION_TYPES: dict[str, type[DDPOptions] | type[FSDPOptions] | type[DeepSpeedOptions]] = {
    "ddp": DDPOptions,
    "fsdp": FSDPOptions,
    "deepspeed": DeepSpeedOptions,
}
"""Which options record each family takes; families not listed take none."""
