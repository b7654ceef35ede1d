"""Which GPUs a process sees, and whether each can take a new process, decided from the driver's facts.

Pure: the facts (`GpuFacts`) come from NVML through the effects layer. A verdict of None means the
facts cannot decide (the driver could not list processes on an exclusive device, or gave no compute
mode); the effects layer then confirms with a real allocation in a child process.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from trainplan.resolve.visible import visible_device_order
from trainplan.spec.gpus import GpuFacts


@attrs.frozen
class Verdict:
    usable: bool | None
    reason: str | None


def visible_gpus(value: str | None, gpus: Sequence[GpuFacts]) -> tuple[GpuFacts, ...]:
    """The devices CUDA_VISIBLE_DEVICES exposes, in visible order: GPUs by index or `GPU-` UUID, or MIG
    devices by `MIG-` UUID (matched against the MIG devices of GPUs in MIG mode)."""
    if value is None:  # unset: every device, in the driver's order
        return tuple(gpus)
    if value.strip().startswith("MIG-"):
        migs = [mig for gpu in gpus for mig in gpu.mig_devices]
        return tuple(migs[index] for index in visible_device_order(value, [mig.uuid for mig in migs]))
    return tuple(gpus[index] for index in visible_device_order(value, [gpu.uuid for gpu in gpus]))


def judge(gpu: GpuFacts) -> Verdict:
    """Whether a new process can use this device now, and why not; None when the facts cannot say."""
    if gpu.mig_enabled:
        instances = ", ".join(mig.uuid for mig in gpu.mig_devices) or "none created yet"
        return Verdict(
            False,
            f"MIG is enabled, so work runs on its MIG devices ({instances}); select one with "
            "CUDA_VISIBLE_DEVICES=MIG-<uuid>",
        )
    if gpu.compute_mode == "prohibited":
        return Verdict(False, "compute mode is Prohibited: no process may create a context on it")
    if gpu.compute_mode in ("exclusive_process", "exclusive_thread"):
        mode = "exclusive-process" if gpu.compute_mode == "exclusive_process" else "exclusive-thread"
        if gpu.running_pids is None:
            return Verdict(None, None)
        if gpu.running_pids:
            holders = ", ".join(str(pid) for pid in gpu.running_pids)
            return Verdict(False, f"{mode} mode, held by pid {holders}")
        return Verdict(True, None)
    if gpu.compute_mode == "default":
        return Verdict(True, None)
    return Verdict(None, None)
