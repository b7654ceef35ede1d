"""The environment: facts about the machine (or cluster), gathered by `effects.probing()` or written by hand."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from trainplan.spec.frozen import FrozenMap, ReadOnlyMap, freeze_map, freeze_sequence
from trainplan.spec.names import START_METHODS, StartMethod

# Converters never raise: a value of the wrong shape is kept as given, and `resolve` refuses it by name.


def _freeze_packages(value: frozenset[str] | set[str] | tuple[str, ...] | list[str]) -> frozenset[str]:
    given: object = value
    if isinstance(given, (set, frozenset, tuple, list)):
        try:
            return frozenset(given)
        except TypeError:  # unhashable members
            pass
    return given  # type: ignore[return-value]


def _freeze_start_methods(value: tuple[StartMethod, ...] | list[StartMethod]) -> tuple[StartMethod, ...]:
    return freeze_sequence(value)  # type: ignore[return-value]


def _freeze_indices(value: tuple[int, ...] | list[int] | None) -> tuple[int, ...] | None:
    return None if value is None else freeze_sequence(value)  # type: ignore[return-value]


def _freeze_memory(value: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    return freeze_sequence(value)  # type: ignore[return-value]


class DeviceCounts(ReadOnlyMap[str, int]):
    """A read-only, hashable map of accelerator name → visible devices (`Environment.device_counts`), in name order
    (so equal counts given in any order are one value)."""

    __slots__ = ()

    def __init__(self, items: Mapping[str, int] | None = None) -> None:
        # Sorted by text, so keys of the wrong type (which resolve then reports) never make sorting raise.
        super().__init__(dict(sorted((items or {}).items(), key=lambda item: (str(item[0]), repr(item)))))

    def __repr__(self) -> str:
        return f"DeviceCounts({self._items!r})"


def _freeze_counts(value: Mapping[str, int] | None) -> DeviceCounts:
    given: object = value
    if isinstance(given, DeviceCounts):
        return given
    if given is None or isinstance(given, Mapping):
        try:
            return DeviceCounts(given)
        except TypeError:  # unhashable keys
            pass
    return given  # type: ignore[return-value]  # kept as given: resolve refuses it by name


@attrs.frozen(kw_only=True, cache_hash=True)  # a value: hashed once (the memo's key)
class Environment:
    """Everything `resolve` may know about where it runs. The defaults describe a bare one-CPU machine.

    Write one by hand for a what-if (`Environment(cuda_device_count=8)`), or let `probe()` read this
    machine. The resolver never looks anywhere else.
    """

    cuda_device_count: int = 0
    """CUDA devices visible to this process (after CUDA_VISIBLE_DEVICES)."""
    cuda_initialized: bool = False
    """Whether CUDA is already initialised in this process (forking is then unsafe)."""
    usable_cuda_devices: tuple[int, ...] | None = attrs.field(default=None, converter=_freeze_indices)
    """Visible indices of GPUs that can take a new process now, when probed; None when not probed."""
    mps_available: bool = False
    xla_device_count: int = 0
    cpu_count: int = 1
    interactive: bool = False
    """A notebook or REPL: there is no script to re-run and `__main__` cannot be imported by workers."""
    start_methods: tuple[StartMethod, ...] = attrs.field(default=START_METHODS, converter=_freeze_start_methods)
    packages: frozenset[str] = attrs.field(default=frozenset(), converter=_freeze_packages)
    """Installed optional packages that change what is possible (deepspeed, torch_xla, transformer_engine, ...)."""
    variables: FrozenMap = attrs.field(factory=FrozenMap, converter=freeze_map)
    """The environment variables that matter (CUDA_VISIBLE_DEVICES, SLURM_*, RANK, MASTER_ADDR, ...)."""
    cuda_memory_bytes: tuple[int, ...] = attrs.field(default=(), converter=_freeze_memory)
    """Total memory of each visible CUDA device, in bytes, in visible order (NVML's, through `probe()`); empty when
    not known. The memory-aware choice (`Request.model`) fits the plan's smallest device."""
    host_memory_bytes: int | None = None
    """This machine's memory, in bytes, when known: where offloaded optimizer states and parameters go."""
    device_counts: DeviceCounts = attrs.field(factory=DeviceCounts, converter=_freeze_counts)
    """Visible devices of the accelerators a downstream rule set adds (`Rules.extend(accelerators=...)`), by name:
    `{"npu": 8}`. `probe()` cannot count them (it knows trainplan's own accelerators only): the framework that adds
    one supplies its count, `probe().with_device_counts({"npu": torch_npu.npu.device_count()})`. Built-in
    accelerators keep their own facts above."""

    def with_variables(self, variables: Mapping[str, str]) -> Environment:
        """The same facts with these environment variables added (or replaced)."""
        return attrs.evolve(self, variables={**self.variables, **variables})

    def with_device_counts(self, counts: Mapping[str, int]) -> Environment:
        """The same facts with these downstream accelerators' device counts added (or replaced)."""
        given: object = counts
        if not isinstance(given, Mapping):
            return attrs.evolve(self, device_counts=counts)  # kept as given: resolve refuses it by name
        return attrs.evolve(self, device_counts={**self.device_counts, **counts})
