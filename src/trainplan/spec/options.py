"""Strategy options: the typed way to pass what a strategy takes beyond its name.

Each family that takes options has one frozen record. Registered names such as
`ddp_find_unused_parameters_true` or `deepspeed_stage_3_offload` are presets of these records
(see `rules.STRATEGIES`). What each option means, its check and how every framework spells it are rows of the rule
set (`rules.OPTIONS`): a record holds values only.

Which options were written (`given`) is part of the value: `DDPOptions()` and `DDPOptions(find_unused_parameters=False)`
are different requests (a preset strategy name may take the first and refuses the second), so they compare unequal.
Options a downstream rule set adds to a family travel in `extra` (name → value), checked against its rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, Literal, TypeAlias, TypeVar, get_args

import attrs

from trainplan.spec.names import (
    MESH_DIMENSIONS,
    ContextParallelBalancer,
    ContextParallelRotate,
    GroupBackend,
    MeshDimension,
    PipelineSchedule,
)

_Options = TypeVar("_Options")


class OptionMap(Mapping[str, object]):
    """A read-only map of option names to values that compares and hashes by content (a record's `extra`)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, object] | None = None) -> None:
        self._items: dict[str, object] = dict(sorted((items or {}).items(), key=lambda item: str(item[0])))

    def __getitem__(self, key: str) -> object:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __eq__(self, other: object) -> bool:
        return dict(self._items) == dict(other) if isinstance(other, Mapping) else NotImplemented

    def __repr__(self) -> str:
        return repr(self._items)

    def __reduce__(self) -> tuple[type[OptionMap], tuple[dict[str, object]]]:
        return OptionMap, (self._items,)


def _option_map(value: Mapping[str, object]) -> Mapping[str, object]:
    """Converter of `extra`: a mapping becomes an `OptionMap`; anything else is kept, for the check to refuse by
    name."""
    given: object = value
    if isinstance(given, OptionMap) or not isinstance(given, Mapping):
        return value
    return OptionMap(value)


def _written(value: Iterable[str]) -> frozenset[str]:
    """Converter of `given`: names as a frozenset; anything else is kept, for the check to refuse by name."""
    given: object = value
    if isinstance(given, (set, frozenset, list, tuple)):
        return frozenset(value)
    return value  # type: ignore[return-value]  # not names: kept for the check to refuse


def _remember_given(cls: type[_Options]) -> type[_Options]:
    """Record which options the caller wrote (`given`): the keywords passed, and the names in `extra`. A record
    built with `given=` (as `attrs.evolve` builds one, and a plan read back) keeps the names it is told."""
    generated: Callable[..., None] = cls.__init__

    def __init__(self: Any, **options: Any) -> None:
        if "given" not in options:
            written = set(options) - {"extra"}
            extra: object = options.get("extra")
            if isinstance(extra, Mapping):
                written |= {str(name) for name in extra}
            options["given"] = frozenset(written)
        generated(self, **options)

    __init__.__doc__ = generated.__doc__
    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


def _options_repr(self: Any) -> str:
    """The record as the call that builds it: the options written or away from their default, `extra` when it
    holds any, and `given` where the options written are not just those shown (after a preset, say)."""
    defaults = _DEFAULTS[type(self)]
    shown = [name for name in defaults if name in self.given or getattr(self, name) != defaults[name]]
    parts = [f"{name}={getattr(self, name)!r}" for name in shown]
    if self.extra:
        parts.append(f"extra={dict(self.extra)!r}")
    if self.given != {*shown, *self.extra}:
        parts.append(f"given={sorted(self.given, key=str)!r}")
    return f"{type(self).__name__}({', '.join(parts)})"


def options_text(options: StrategyOptions) -> str:
    """The record for a person (`Plan.explain`): the options written or away from their default, and `extra`; never
    `given`, which is bookkeeping (the repr keeps it, to rebuild the value)."""
    defaults = _DEFAULTS[type(options)]
    shown = [name for name in defaults if name in options.given or getattr(options, name) != defaults[name]]
    parts = [f"{name}={getattr(options, name)!r}" for name in shown]
    parts.extend(f"{name}={value!r}" for name, value in options.extra.items())
    return f"{type(options).__name__}({', '.join(parts)})"


RECORD_FIELDS: Final[tuple[str, ...]] = ("extra", "given")
"""The fields every options record has beside its options: `extra` (a downstream rule set's options, by name) and
`given` (which options were written). Neither is an option: no row names them."""


ShardingStrategy: TypeAlias = Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]
OffloadDevice: TypeAlias = Literal["cpu", "nvme"]
DeepSpeedStage: TypeAlias = Literal[0, 1, 2, 3]
SHARDING_STRATEGIES: Final[tuple[ShardingStrategy, ...]] = get_args(ShardingStrategy)
OFFLOAD_DEVICES: Final[tuple[OffloadDevice, ...]] = get_args(OffloadDevice)
DEEPSPEED_STAGES: Final[tuple[DeepSpeedStage, ...]] = get_args(DeepSpeedStage)


@_remember_given
@attrs.frozen(kw_only=True, repr=False)
class DDPOptions:
    """Options of the DDP family (ddp, ddp_spawn, ddp_fork, ddp_notebook)."""

    find_unused_parameters: bool = False
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    broadcast_buffers: bool = True
    """Broadcast the buffers (batch-norm statistics) from rank 0 before each forward pass; False keeps them per rank."""
    timeout_seconds: int = 1800
    extra: Mapping[str, object] = attrs.field(factory=OptionMap, converter=_option_map)
    """Options a downstream rule set adds to the family (name → value), checked against its rows."""
    given: frozenset[str] = attrs.field(factory=frozenset, converter=_written)
    """The options written explicitly (part of the value: a preset may take a default left alone, not one written)."""

    __repr__ = _options_repr


@_remember_given
@attrs.frozen(kw_only=True, repr=False)
class FSDPOptions:
    """Options of Fully Sharded Data Parallel."""

    cpu_offload: bool = False
    sharding_strategy: ShardingStrategy = "FULL_SHARD"
    extra: Mapping[str, object] = attrs.field(factory=OptionMap, converter=_option_map)
    """Options a downstream rule set adds to the family (name → value), checked against its rows."""
    given: frozenset[str] = attrs.field(factory=frozenset, converter=_written)
    """The options written explicitly (part of the value: a preset may take a default left alone, not one written)."""

    __repr__ = _options_repr


@_remember_given
@attrs.frozen(kw_only=True, repr=False)
class DeepSpeedOptions:
    """Options of DeepSpeed ZeRO. Parameter offload exists only at stage 3."""

    stage: DeepSpeedStage = 2
    offload_optimizer: bool = False
    offload_parameters: bool = False
    offload_device: OffloadDevice = "cpu"
    extra: Mapping[str, object] = attrs.field(factory=OptionMap, converter=_option_map)
    """Options a downstream rule set adds to the family (name → value), checked against its rows."""
    given: frozenset[str] = attrs.field(factory=frozenset, converter=_written)
    """The options written explicitly (part of the value: a preset may take a default left alone, not one written)."""

    __repr__ = _options_repr


Degree: TypeAlias = int | Literal["auto"]
"""A parallel degree: how many ranks a mesh dimension spans, or `"auto"`: what the other degrees leave."""


@_remember_given
@attrs.frozen(kw_only=True, repr=False)
class ModelParallelOptions:
    """The parallel degrees of an N-D device mesh (strategy `model_parallel`): FSDP2 data parallelism (replicas ×
    shards) combined with context, sequence (Ulysses), tensor and pipeline parallelism, as torchtitan's
    `ParallelDims` (and Accelerate's `ParallelismConfig`, for `sp`) spell them.

    The degrees multiply to the world size. At most one is `"auto"` and takes what the others leave; by default
    `dp_shard` does (FSDP over every process), and it yields to a degree written `"auto"` explicitly. The mesh's
    dimensions are always `pp, dp_replicate, dp_shard, cp, sp, tp`, outermost first (see `names.MeshDimension`).
    `dp_shard=-1` is torchtitan's spelling of `"auto"`, read as it with a note. `ep` splits experts over ranks the
    dense degrees already count (torchtitan's semantics), so it is not a factor of the world size.

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
    sp: Degree = 1
    """Sequence parallelism (DeepSpeed Ulysses, Accelerate's `sp_size`): the sequence is split over these ranks and
    swapped for a split of the attention heads by an all-to-all around every attention; exclusive with `cp`."""
    tp: Degree = 1
    """Tensor parallelism: each layer's weights are split over these ranks (the innermost dimension, inside a
    node)."""
    ep: int = 1
    """Expert parallelism (torchtitan's `ep`): a mixture-of-experts layer's experts are split over this many ranks.
    It is borrowed from `dp_shard × cp × sp × tp`, not multiplied into the world: it divides that product, and the
    expert mesh (`pp × dp_replicate × efsdp × ep`) regroups those ranks, `efsdp` sharding the experts."""
    pp_microbatches: int | None = None
    """The microbatches one step splits into; None: one per stage (`pp × pp_virtual_stages`)."""
    pp_virtual_stages: int | None = None
    """The stages each pipeline rank holds: 1 for 1F1B and GPipe, 2 or more for the interleaved schedules, 2 for
    ZBVZeroBubble; None: the fewest the schedule takes."""
    pp_schedule: PipelineSchedule = "1F1B"
    """torch's pipeline schedule for the `pp` stages (`torch.distributed.pipelining`, by its own name)."""
    cp_rotate_method: ContextParallelRotate = "allgather"
    """How context parallelism passes key/value shards between the cp ranks (torch's `set_rotate_method`):
    "allgather" (torch's default) or "alltoall"; for cp above 1."""
    cp_load_balancer: ContextParallelBalancer = "head_tail"
    """How each sequence is split over the cp ranks (torch's `context_parallel`): "head_tail" (torch's default load
    balancer, even work under causal attention) or "none" (contiguous blocks); for cp above 1."""
    pp_group_backend: GroupBackend | None = None
    """The process-group backend of the `pp` groups (torch's `init_device_mesh(..., backend_override=...)`); None:
    the world's. The same for every dimension below: `<dimension>_group_backend`, for a degree above 1."""
    dp_replicate_group_backend: GroupBackend | None = None
    dp_shard_group_backend: GroupBackend | None = None
    cp_group_backend: GroupBackend | None = None
    sp_group_backend: GroupBackend | None = None
    tp_group_backend: GroupBackend | None = None
    data_parallel_size: Degree | None = None
    """Lightning's spelling of the data-parallel size (→ `dp_shard`); None: not used."""
    tensor_parallel_size: Degree | None = None
    """Lightning's spelling of the tensor-parallel size (→ `tp`); None: not used."""
    timeout_seconds: int = 1800
    """Seconds a collective waits for its peers (the process group's timeout)."""
    extra: Mapping[str, object] = attrs.field(factory=OptionMap, converter=_option_map)
    """Options a downstream rule set adds to the family (name → value), checked against its rows."""
    given: frozenset[str] = attrs.field(factory=frozenset, converter=_written)
    """The options written explicitly (part of the value: a preset may take a default left alone, not one written)."""

    __repr__ = _options_repr

    @property
    def degrees(self) -> dict[MeshDimension, Degree]:
        """The degrees in the mesh's fixed order (`pp`, `dp_replicate`, `dp_shard`, `cp`, `sp`, `tp`)."""
        return {name: getattr(self, name) for name in MESH_DIMENSIONS}

    @property
    def backends(self) -> dict[MeshDimension, GroupBackend]:
        """The backends written for the groups of some dimensions (`tp_group_backend="gloo"`: `{"tp": "gloo"}`), in the
        mesh's order; a dimension left out runs over the world's backend."""
        written = {name: getattr(self, backend_option(name)) for name in MESH_DIMENSIONS}
        return {name: backend for name, backend in written.items() if backend is not None}


def backend_option(dimension: MeshDimension) -> str:
    """The option that names the backend of `dimension`'s groups: `tp_group_backend` for `tp`."""
    return f"{dimension}_group_backend"


StrategyOptions: TypeAlias = DDPOptions | FSDPOptions | DeepSpeedOptions | ModelParallelOptions
"""Any strategy's options record."""


_Record = TypeVar("_Record", bound=StrategyOptions)

_FIELDS: Final[Mapping[type, frozenset[str]]] = {
    record: frozenset(field.name for field in attrs.fields(record)) - set(RECORD_FIELDS)
    for record in (DDPOptions, FSDPOptions, DeepSpeedOptions, ModelParallelOptions)
}


_FIELD_ORDER: Final[Mapping[type, tuple[str, ...]]] = {
    record: tuple(field.name for field in attrs.fields(record) if field.name in _FIELDS[record]) for record in _FIELDS
}

_DEFAULTS: Final[Mapping[type, Mapping[str, object]]] = {
    record: {name: attrs.fields_dict(record)[name].default for name in _FIELD_ORDER[record]} for record in _FIELDS
}


def option_fields(record: type[StrategyOptions]) -> tuple[str, ...]:
    """The options a record has fields for, in order (not `extra` nor `given`)."""
    return _FIELD_ORDER[record]


def option_value(options: StrategyOptions, name: str, default: object) -> object:
    """The value of option `name` in `options`: its field, else its entry in `extra`, else `default`."""
    if name in _FIELDS[type(options)]:
        return getattr(options, name)
    return options.extra.get(name, default)


def with_options(options: _Record, values: Mapping[str, object], written: Iterable[str] = ()) -> _Record:
    """`options` with `values` in place (fields, or entries of `extra`); which options count as written: those of
    `options`, and `written`."""
    fields = _FIELDS[type(options)]
    changes: dict[str, Any] = {name: value for name, value in values.items() if name in fields}
    added = {name: value for name, value in values.items() if name not in fields}
    if added:
        changes["extra"] = {**options.extra, **added}
    return attrs.evolve(options, **changes, given=options.given | frozenset(written))
