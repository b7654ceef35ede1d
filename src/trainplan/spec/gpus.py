"""GPU facts and verdicts: what the driver says about each GPU, and whether it can take a new process."""

from __future__ import annotations

from typing import Literal, TypeAlias

import attrs

ComputeMode: TypeAlias = Literal["default", "exclusive_thread", "exclusive_process", "prohibited", "unknown"]
"""NVML's compute mode of a device; `unknown` when the driver could not say."""

CheckedBy: TypeAlias = Literal["nvml", "probe", "none"]
"""Who decided a GPU's usability: the driver's facts, a real allocation in a child process, or nobody."""


def _freeze_pids(value: tuple[int, ...] | list[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(value)


def _freeze_mig(value: tuple[GpuFacts, ...] | list[GpuFacts]) -> tuple[GpuFacts, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class GpuFacts:
    """NVML's view of one physical GPU (or one MIG device of a GPU in MIG mode)."""

    uuid: str
    name: str = ""
    memory_total: int | None = None
    """Bytes; None when unknown."""
    memory_used: int | None = None
    compute_mode: ComputeMode = "unknown"
    running_pids: tuple[int, ...] | None = attrs.field(default=None, converter=_freeze_pids)
    """Processes with a compute context on the device; None when the driver could not list them."""
    mig_enabled: bool = False
    """A GPU in MIG mode runs work only through its MIG devices."""
    mig_devices: tuple[GpuFacts, ...] = attrs.field(default=(), converter=_freeze_mig)


@attrs.frozen(kw_only=True)
class GpuStatus:
    """One visible GPU: where it is, what it is, and whether a new process can use it now (and why not)."""

    index: int
    """The visible index (after CUDA_VISIBLE_DEVICES): what `devices=[...]` and `cuda:N` mean."""
    uuid: str
    name: str
    memory_total: int | None
    memory_used: int | None
    usable: bool
    reason: str | None
    """Why it is not usable (None when usable)."""
    checked_by: CheckedBy
