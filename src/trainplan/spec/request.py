"""The request: what the user asked for, before any fact about the machine is known."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import attrs

from trainplan.spec.entry import entry_points
from trainplan.spec.memory import MemoryPolicy, ModelFacts
from trainplan.spec.names import (
    DEFAULT_PRECISION,
    AcceleratorFlag,
    BackendName,
    ClusterFlag,
    CustomName,
    MetricsStore,
    PrecisionFlag,
    StrategyFlag,
)
from trainplan.spec.notes import Note, freeze_notes
from trainplan.spec.options import StrategyOptions

if TYPE_CHECKING:
    from trainplan.rules import Rules

NumNodes: TypeAlias = int | Literal["auto"]
"""`num_nodes`: a number of machines, or `"auto"`: the nodes a started job has (torchrun, srun, ...), else 1."""

Devices: TypeAlias = int | str | tuple[int, ...]
"""`devices` as stored: a count (`2`), all (`-1`, `"-1"`), `"auto"`, a string (`"3"`, `"0,2"`) or indices."""


def freeze_devices(value: int | str | Sequence[int]) -> Devices:
    """Converter: lists of indices become tuples so the request stays a hashable value.

    Anything else is kept as given; `resolve` validates it and names what is wrong.
    """
    if isinstance(value, list):
        return tuple(value)
    return value  # type: ignore[return-value]  # a wrong type is kept for resolve to reject by name


def _remember_given(cls: type[Request]) -> type[Request]:
    """Record which fields the caller wrote (`given`): the keywords passed. A request built with `given=` (as
    `attrs.evolve` builds one) keeps the names it is told."""
    generated: Callable[..., None] = cls.__init__

    def __init__(self: Request, **fields: Any) -> None:
        if "given" not in fields:
            fields["given"] = frozenset(fields) - {"notes"}
        generated(self, **fields)

    __init__.__doc__ = generated.__doc__
    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


def _written(value: object) -> frozenset[str]:
    """Converter of `given`: names as a frozenset (what is not a collection of names is no name: none)."""
    if isinstance(value, (set, frozenset, list, tuple)):
        return frozenset(str(name) for name in value)
    return frozenset()


@_remember_given
@attrs.frozen(kw_only=True, cache_hash=True)  # a value: hashed once (the memo's key)
class Request:
    """What to run on, how to distribute it and at which precision. Every field defaults to "decide for me".

    Names are `Literal` types, so a type checker rejects a misspelt one. Strings from config files or
    flags go through `Request.from_config`, which folds case, accepts aliases and names unknown values.
    """

    accelerator: AcceleratorFlag | CustomName = "auto"
    strategy: StrategyFlag | CustomName = "auto"
    devices: Devices = attrs.field(default="auto", converter=freeze_devices)
    num_nodes: NumNodes = "auto"
    precision: PrecisionFlag | CustomName = DEFAULT_PRECISION
    process_group_backend: BackendName | CustomName | None = None
    cluster: ClusterFlag | CustomName = "auto"
    metrics_store: MetricsStore = "device"
    sync_batchnorm: bool = False
    strategy_options: StrategyOptions | None = None
    select_usable_gpus: bool = False
    """The deprecation bridge for `auto_select_gpus=True`: take `devices` GPUs from the environment's usable
    ones (`Environment.usable_cuda_devices`). Prefer `devices=find_usable_cuda_devices(n)`."""
    model: ModelFacts | None = None
    """What one training step of the model holds in memory (written by hand, `transformer_facts(...)`, or
    `measure_model(...)`). Given, `strategy='auto'` chooses the cheapest layout that fits the devices' memory, and an
    explicit strategy is checked to fit (`Plan.memory` shows the arithmetic)."""
    memory_policy: MemoryPolicy | None = None
    """How the model is fitted (headroom, activation checkpointing, offload); None: the rule set's policy."""
    notes: tuple[Note, ...] = attrs.field(default=(), converter=freeze_notes, eq=False)
    """Deprecation notes carried from `Request.from_legacy`; they flow into the plan's notes.
    They are not part of the request's identity (two requests that ask for the same are equal)."""
    given: frozenset[str] = attrs.field(factory=frozenset, converter=_written, eq=False, repr=False)
    """The fields written explicitly (`Request(precision="32-true")` wrote precision, though it is the default;
    `from_config`: the config's keys). Not part of the request's identity either: only a launched worker reads it,
    where the launch's choices fill the fields a script's own Request leaves out (`trainplan launch`)."""

    @classmethod
    def from_config(cls, config: Mapping[str, object], rules: Rules | None = None) -> Request:
        """A normalised request from loosely typed values (a config file, CLI flags, JSON).

        Case is folded, aliases are accepted (`gpu`, `tpu`, `16`, `bf16`, `"0,1"`), digit strings are
        read as numbers, and an unknown key or value raises `InvalidRequest` naming it. Strategy names are those of
        `rules` (default: the built-in rule set), and Lightning's names kept as aliases (`single_tpu`, `xla_debug`)
        add a deprecation note.
        """
        return entry_points().request_from_config(cls, config, rules)

    @classmethod
    def from_legacy(cls, **flags: object) -> Request:
        """The modern request for old Trainer flags, with a deprecation note per old flag.

        `Request.from_legacy(gpus=2, accelerator="ddp")` is `Request(accelerator="gpu", devices=2,
        strategy="ddp")`; its `notes` name each old spelling, the new one and why. Flags that disagree
        raise `Incompatible`; strategies without a modern counterpart (ddp2, horovod) too.
        """
        return entry_points().request_from_legacy(cls, flags)
