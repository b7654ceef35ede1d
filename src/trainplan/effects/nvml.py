"""NVML access: the driver's facts about each GPU, without CUDA and without torch.

Two implementations of one seam (`NvmlQuery`): nvidia-ml-py's `pynvml` (the `nvml` extra) gives compute
modes, holding processes and MIG devices; without it, the driver library is read through ctypes for the
GPUs' UUIDs alone, and usability is then confirmed by probes (see `trainplan.effects.gpus`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Protocol

from trainplan.spec.gpus import ComputeMode, GpuFacts


class NvmlQuery(Protocol):
    """Facts from NVML. Cost: a few driver calls per GPU, no CUDA context, milliseconds in all."""

    def gpus(self) -> list[GpuFacts] | None:
        """Every physical GPU in driver order, or None when NVML is not available here."""


_COMPUTE_MODES: dict[int, ComputeMode] = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


class PynvmlQuery:
    """`NvmlQuery` through nvidia-ml-py's `pynvml` (pass a module for tests; default: import it)."""

    def __init__(self, module: ModuleType | None = None) -> None:
        self._module = module

    def _pynvml(self) -> ModuleType | None:
        if self._module is not None:
            return self._module
        try:
            import pynvml
        except ImportError:
            return None
        return pynvml

    def gpus(self) -> list[GpuFacts] | None:
        nvml = self._pynvml()
        if nvml is None:
            return None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError:
            return None  # no driver
        try:
            return [self._facts(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
        finally:
            nvml.nvmlShutdown()

    def _facts(self, nvml: ModuleType, handle: object, *, allow_mig: bool = True) -> GpuFacts:
        def attempt(call: Callable[[], object]) -> object | None:
            try:
                return call()
            except nvml.NVMLError:
                return None

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


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


class CtypesNvmlQuery:
    """`NvmlQuery` through the driver library itself (ctypes): UUIDs and names only, no package needed."""

    _LIBRARIES = ("libnvidia-ml.so.1", "libnvidia-ml.so", "nvml.dll")

    def gpus(self) -> list[GpuFacts] | None:
        library = self._load()
        if library is None or library.nvmlInit_v2() != 0:
            return None
        try:
            count = ctypes.c_uint(0)
            if library.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
                return None
            found: list[GpuFacts] = []
            for index in range(count.value):
                handle = ctypes.c_void_p()
                if library.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                    break
                uuid = ctypes.create_string_buffer(96)
                name = ctypes.create_string_buffer(96)
                uuid_ok = library.nvmlDeviceGetUUID(handle, uuid, 96) == 0
                name_ok = library.nvmlDeviceGetName(handle, name, 96) == 0
                found.append(
                    GpuFacts(
                        uuid=uuid.value.decode("ascii", "replace") if uuid_ok else f"GPU-unknown-{index}",
                        name=name.value.decode("utf-8", "replace") if name_ok else "",
                    )
                )
            return found
        finally:
            library.nvmlShutdown()

    def _load(self) -> ctypes.CDLL | None:
        for name in self._LIBRARIES:
            try:
                return ctypes.CDLL(name)
            except OSError:
                continue
        return None


class _FirstAvailable:
    def __init__(self, *queries: NvmlQuery) -> None:
        self.queries = queries

    def gpus(self) -> list[GpuFacts] | None:
        for query in self.queries:
            found = query.gpus()
            if found is not None:
                return found
        return None


def default_nvml() -> NvmlQuery:
    """pynvml when installed, else the driver library through ctypes."""
    return _FirstAvailable(PynvmlQuery(), CtypesNvmlQuery())
