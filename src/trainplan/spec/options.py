"""Strategy options: the typed way to pass what a strategy takes beyond its name.

Each family that takes options has one frozen record. Registered names such as
`ddp_find_unused_parameters_true` or `deepspeed_stage_3_offload` are presets of these records
(see `rules.STRATEGIES`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal, TypeAlias, TypeVar, get_args

import attrs

from trainplan.spec.names import MESH_DIMENSIONS, MeshDimension

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
SHARDING_STRATEGIES: Final[tuple[ShardingStrategy, ...]] = get_args(ShardingStrategy)
OFFLOAD_DEVICES: Final[tuple[OffloadDevice, ...]] = get_args(OffloadDevice)
DEEPSPEED_STAGES: Final[tuple[DeepSpeedStage, ...]] = get_args(DeepSpeedStage)


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


Degree: TypeAlias = int | Literal["auto"]
"""A parallel degree: how many ranks a mesh dimension spans, or `"auto"`: what the other degrees leave."""


@_remember_given
@attrs.frozen(kw_only=True)
class ModelParallelOptions:
    """The parallel degrees of an N-D device mesh (strategy `model_parallel`): FSDP2 data parallelism (replicas ×
    shards) combined with context, tensor and pipeline parallelism, as torchtitan's `ParallelDims` spells them.

    The degrees multiply to the world size. At most one is `"auto"` and takes what the others leave; by default
    `dp_shard` does (FSDP over every process), and it yields to a degree written `"auto"` explicitly. The mesh's
    dimensions are always `pp, dp_replicate, dp_shard, cp, tp`, outermost first (see `names.MeshDimension`).

    Lightning's spelling (`ModelParallelStrategy(data_parallel_size=..., tensor_parallel_size=...)`) is accepted
    in `data_parallel_size` and `tensor_parallel_size` and mapped to `dp_shard` and `tp` with a note; it cannot be
    mixed with the degrees above.
    """

    pp: Degree = 1
    """Pipeline stages (the outermost dimension: stages hold whole nodes, or a node whole stages)."""
    dp_replicate: Degree = 1
    """Data-parallel replicas: each holds the whole model (DDP), or a sharded copy of it with `dp_shard` (HSDP)."""
    dp_shard: Degree = "auto"
    """Data-parallel shards: FSDP2 shards parameters, gradients and optimizer state over them."""
    cp: Degree = 1
    """Context parallelism: the sequence is split over these ranks (ring attention; CUDA only)."""
    tp: Degree = 1
    """Tensor parallelism: each layer's weights are split over these ranks (the innermost dimension, inside a
    node)."""
    data_parallel_size: Degree | None = None
    """Lightning's spelling of the data-parallel size (→ `dp_shard`); None: not used."""
    tensor_parallel_size: Degree | None = None
    """Lightning's spelling of the tensor-parallel size (→ `tp`); None: not used."""
    timeout_seconds: int = 1800
    """Seconds a collective waits for its peers (the process group's timeout)."""
    given: frozenset[str] = _given_field()
    """The options written explicitly (not part of the value: equal records compare equal)."""

    @property
    def degrees(self) -> dict[MeshDimension, Degree]:
        """The five degrees in the mesh's fixed order (`pp`, `dp_replicate`, `dp_shard`, `cp`, `tp`)."""
        return {name: getattr(self, name) for name in MESH_DIMENSIONS}


StrategyOptions: TypeAlias = DDPOptions | FSDPOptions | DeepSpeedOptions | ModelParallelOptions
"""Any strategy's options record."""
