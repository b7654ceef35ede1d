"""The facts of a bug report (`trainplan env`): versions, the driver and its GPUs, the probe's facts, the
relevant environment variables (secret-looking values already masked) and the optional packages installed."""

from __future__ import annotations

import attrs

from trainplan.spec.environment import Environment
from trainplan.spec.frozen import FrozenMap
from trainplan.spec.gpus import GpuFacts


def _gpu_tuple(value: tuple[GpuFacts, ...] | list[GpuFacts]) -> tuple[GpuFacts, ...]:
    return tuple(value)


def _package_tuple(
    value: tuple[tuple[str, str | None], ...] | list[tuple[str, str | None]],
) -> tuple[tuple[str, str | None], ...]:
    return tuple((str(name), version) for name, version in value)


def _frozen_variables(value: FrozenMap | dict[str, str]) -> FrozenMap:
    return value if isinstance(value, FrozenMap) else FrozenMap(value)


@attrs.frozen(kw_only=True)
class DriverFacts:
    """What NVML (the NVIDIA driver's management library, through nvidia-ml-py) says about this machine."""

    available: bool
    """Whether NVML answered."""
    reason: str = ""
    """Why it did not (nvidia-ml-py not installed, no driver, ...); empty when it answered."""
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    """The newest CUDA version the driver supports ("12.4")."""
    gpus: tuple[GpuFacts, ...] = attrs.field(default=(), converter=_gpu_tuple)
    """Every physical GPU in driver order (CUDA_VISIBLE_DEVICES does not apply here)."""


@attrs.frozen(kw_only=True)
class TorchFacts:
    """torch's build, read without creating a CUDA context: None where this build has no such part."""

    installed: bool
    version: str | None = None
    cuda: str | None = None
    """The CUDA version torch was built with (None: a CPU or ROCm build)."""
    hip: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    problem: str = ""
    """torch is installed but could not be imported: the error (empty otherwise)."""


@attrs.frozen(kw_only=True)
class BugReport:
    """Everything `trainplan env` prints, as data (`--json` prints `render.report.report_to_dict`)."""

    trainplan: str
    python: str
    """Version and implementation, e.g. "3.11.7 (CPython)"."""
    system: str
    """The operating system (`platform.platform()`)."""
    torch: TorchFacts
    driver: DriverFacts
    environment: Environment
    """The probe's facts (its `variables` are shown masked, in `variables`)."""
    variables: FrozenMap = attrs.field(factory=FrozenMap, converter=_frozen_variables)
    """The environment variables that matter to a run, secret-looking values masked."""
    packages: tuple[tuple[str, str | None], ...] = attrs.field(default=(), converter=_package_tuple)
    """(distribution, version or None when not installed), for the optional packages trainplan works with."""
    memory: int | None = None
    """The machine's RAM in bytes, or None when the system does not say."""


__all__ = ["BugReport", "DriverFacts", "TorchFacts"]
