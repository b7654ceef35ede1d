"""NVML access: the driver's facts about each GPU, without CUDA and without torch.

One seam (`NvmlQuery`), implemented over nvidia-ml-py's `pynvml` (a dependency of trainplan: pure Python, it
loads the driver's own library): compute modes, holding processes, MIG devices, and for bug reports the
driver's version. A machine without the NVIDIA driver answers None at once. Where NVML cannot say whether a
GPU can take a process, usability is confirmed by probes (see `trainplan.effects.gpus`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Protocol

from trainplan.spec.gpus import ComputeMode, GpuFacts
from trainplan.spec.report import DriverFacts


class NvmlQuery(Protocol):
    """Facts from NVML. Cost: a few driver calls per GPU, no CUDA context, milliseconds in all."""

    def gpus(self) -> list[GpuFacts] | None:
        """Every physical GPU in driver order, or None when NVML is not available here."""


_LIBRARY = "libnvidia-ml.so.1"
"""The NVIDIA driver's NVML library, as pynvml loads it outside Windows."""

_COMPUTE_MODES: dict[int, ComputeMode] = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


class PynvmlQuery:
    """`NvmlQuery` through nvidia-ml-py's `pynvml` (pass a module for tests; default: import it)."""

    def __init__(self, module: ModuleType | None = None) -> None:
        self._module = module

    def _pynvml(self) -> ModuleType | str:
        """pynvml, or why NVML cannot answer here. Where the driver's library cannot be loaded (outside Windows it
        is `libnvidia-ml.so.1`, the name pynvml itself loads), pynvml is not imported: importing it is most of what
        asking a machine without the NVIDIA driver costs."""
        if self._module is not None:
            return self._module
        if not sys.platform.startswith("win"):
            import ctypes

            try:
                ctypes.CDLL(_LIBRARY)
            except OSError:
                return "no NVIDIA driver here: NVML Shared Library Not Found"
        try:
            import pynvml
        except ImportError:
            return "nvidia-ml-py is not installed: pip install nvidia-ml-py"
        return pynvml

    def gpus(self) -> list[GpuFacts] | None:
        driver = self.driver()
        return list(driver.gpus) if driver.available else None

    def driver(self) -> DriverFacts:
        """The driver's version and every physical GPU, or why NVML cannot answer here."""
        nvml = self._pynvml()
        if isinstance(nvml, str):
            return DriverFacts(available=False, reason=nvml)
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            return DriverFacts(available=False, reason=f"no NVIDIA driver here: {_error_text(error)}")
        try:
            version = _text(_attempt(nvml, nvml.nvmlSystemGetDriverVersion))
            cuda = _attempt(nvml, nvml.nvmlSystemGetCudaDriverVersion)
            count = nvml.nvmlDeviceGetCount()
            gpus = [self._facts(nvml, nvml.nvmlDeviceGetHandleByIndex(index)) for index in range(count)]
        except nvml.NVMLError as error:
            return DriverFacts(available=False, reason=f"NVML failed: {_error_text(error)}")
        finally:
            nvml.nvmlShutdown()
        return DriverFacts(
            available=True,
            driver_version=version,
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) and cuda > 0 else None,
            gpus=gpus,
        )

    def _facts(self, nvml: ModuleType, handle: object, *, allow_mig: bool = True) -> GpuFacts:
        def attempt(call: Callable[[], object]) -> object | None:
            return _attempt(nvml, call)

        memory = attempt(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        mode = attempt(lambda: nvml.nvmlDeviceGetComputeMode(handle))
        processes = attempt(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        mig_mode = attempt(lambda: nvml.nvmlDeviceGetMigMode(handle)) if allow_mig else None
        mig_enabled = isinstance(mig_mode, (tuple, list)) and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
        migs: list[GpuFacts] = []
        if mig_enabled:
            count = attempt(lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
            for index in range(count if isinstance(count, int) else 0):
                mig = attempt(partial(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, index))
                if mig is not None:
                    migs.append(self._facts(nvml, mig, allow_mig=False))
        name = attempt(lambda: nvml.nvmlDeviceGetName(handle))
        uuid = attempt(lambda: nvml.nvmlDeviceGetUUID(handle))
        return GpuFacts(
            uuid=_text(uuid) or "unknown",
            name=_text(name) or "",
            memory_total=getattr(memory, "total", None),
            memory_used=getattr(memory, "used", None),
            compute_mode=_COMPUTE_MODES.get(mode, "unknown") if isinstance(mode, int) else "unknown",
            running_pids=None if processes is None else tuple(int(p.pid) for p in processes),  # type: ignore[attr-defined]
            mig_enabled=mig_enabled,
            mig_devices=tuple(migs),
        )


def _attempt(nvml: ModuleType, call: Callable[[], object]) -> object | None:
    """The call's answer, or None where this driver or device cannot say (NVML_ERROR_NOT_SUPPORTED, ...)."""
    try:
        return call()
    except nvml.NVMLError:
        return None


def _error_text(error: BaseException) -> str:
    return str(error) or type(error).__name__


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def default_nvml() -> PynvmlQuery:
    """NVML through nvidia-ml-py (a dependency of trainplan); it answers None where there is no driver."""
    return PynvmlQuery()
