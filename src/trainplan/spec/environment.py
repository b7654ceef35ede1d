"""The environment: facts about the machine (or cluster), gathered by `effects.probing()` or written by hand."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from trainplan.spec.frozen import FrozenMap, freeze_map, freeze_sequence
from trainplan.spec.names import StartMethod

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


@attrs.frozen(kw_only=True)
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
    start_methods: tuple[StartMethod, ...] = attrs.field(
        default=("fork", "spawn", "forkserver"), converter=_freeze_start_methods
    )
    packages: frozenset[str] = attrs.field(default=frozenset(), converter=_freeze_packages)
    """Installed optional packages that change what is possible (deepspeed, torch_xla, transformer_engine, ...)."""
    variables: FrozenMap = attrs.field(factory=FrozenMap, converter=freeze_map)
    """The environment variables that matter (CUDA_VISIBLE_DEVICES, SLURM_*, RANK, MASTER_ADDR, ...)."""

    def with_variables(self, variables: Mapping[str, str]) -> Environment:
        """The same facts with these environment variables added (or replaced)."""
        return attrs.evolve(self, variables={**self.variables, **variables})
