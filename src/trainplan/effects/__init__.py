"""The effects layer: everything that touches the world (probing, CUDA, processes, collectives).

Thin by rule: it gathers facts and carries out a plan's decisions, and decides nothing that
`trainplan.resolve` could decide from facts. Importing it does not import torch.

Its names load on first use (module `__getattr__`): `trainplan.effects.probing` does not bring the launchers,
the elastic engine or the metric store with it. The imports under TYPE_CHECKING are what a type checker sees.
"""

from __future__ import annotations

import importlib

from trainplan.spec import lazy_names

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads any TYPE_CHECKING as True)
if TYPE_CHECKING:
    from trainplan.effects.elastic import EngineOptions, launch_script
    from trainplan.effects.extras import MissingExtra, require_torch
    from trainplan.effects.gpus import (
        GpuProbeError,
        ProbeLauncher,
        ProbeOutcome,
        ProbeProcess,
        SubprocessProbeLauncher,
        find_usable_cuda_devices,
        gpu_statuses,
    )
    from trainplan.effects.launching import (
        LaunchError,
        LaunchTimeout,
        NestedLaunch,
        NotImportable,
        WorkerFailed,
        launch,
        launch_with,
        worker_plan,
    )
    from trainplan.effects.metrics import (
        Collective,
        InvalidMetric,
        MetricError,
        MetricKeyMismatch,
        MetricNaN,
        MetricOverflow,
        MetricStore,
        NotInWorld,
        TorchCollective,
        metric_store,
    )
    from trainplan.effects.nvml import NvmlQuery, PynvmlQuery, default_nvml
    from trainplan.effects.probing import ProbeError, probe
    from trainplan.effects.world import JoinError, World, WorldMismatch, join

_LAZY: dict[str, str] = {
    "EngineOptions": "trainplan.effects.elastic",
    "launch_script": "trainplan.effects.elastic",
    "MissingExtra": "trainplan.effects.extras",
    "require_torch": "trainplan.effects.extras",
    "GpuProbeError": "trainplan.effects.gpus",
    "ProbeLauncher": "trainplan.effects.gpus",
    "ProbeOutcome": "trainplan.effects.gpus",
    "ProbeProcess": "trainplan.effects.gpus",
    "SubprocessProbeLauncher": "trainplan.effects.gpus",
    "find_usable_cuda_devices": "trainplan.effects.gpus",
    "gpu_statuses": "trainplan.effects.gpus",
    "LaunchError": "trainplan.effects.launching",
    "LaunchTimeout": "trainplan.effects.launching",
    "NestedLaunch": "trainplan.effects.launching",
    "NotImportable": "trainplan.effects.launching",
    "WorkerFailed": "trainplan.effects.launching",
    "launch": "trainplan.effects.launching",
    "launch_with": "trainplan.effects.launching",
    "worker_plan": "trainplan.effects.launching",
    "Collective": "trainplan.effects.metrics",
    "InvalidMetric": "trainplan.effects.metrics",
    "MetricError": "trainplan.effects.metrics",
    "MetricKeyMismatch": "trainplan.effects.metrics",
    "MetricNaN": "trainplan.effects.metrics",
    "MetricOverflow": "trainplan.effects.metrics",
    "MetricStore": "trainplan.effects.metrics",
    "NotInWorld": "trainplan.effects.metrics",
    "TorchCollective": "trainplan.effects.metrics",
    "metric_store": "trainplan.effects.metrics",
    "NvmlQuery": "trainplan.effects.nvml",
    "PynvmlQuery": "trainplan.effects.nvml",
    "default_nvml": "trainplan.effects.nvml",
    "ProbeError": "trainplan.effects.probing",
    "probe": "trainplan.effects.probing",
    "JoinError": "trainplan.effects.world",
    "World": "trainplan.effects.world",
    "WorldMismatch": "trainplan.effects.world",
    "join": "trainplan.effects.world",
}
"""Each public name → the module that defines it, imported when the name is first read."""


__all__ = [
    "Collective",
    "EngineOptions",
    "GpuProbeError",
    "InvalidMetric",
    "JoinError",
    "LaunchError",
    "LaunchTimeout",
    "MetricError",
    "MetricKeyMismatch",
    "MetricNaN",
    "MetricOverflow",
    "MetricStore",
    "MissingExtra",
    "NestedLaunch",
    "NotImportable",
    "NotInWorld",
    "NvmlQuery",
    "ProbeError",
    "ProbeLauncher",
    "ProbeOutcome",
    "ProbeProcess",
    "PynvmlQuery",
    "SubprocessProbeLauncher",
    "TorchCollective",
    "WorkerFailed",
    "World",
    "WorldMismatch",
    "default_nvml",
    "find_usable_cuda_devices",
    "gpu_statuses",
    "join",
    "launch",
    "launch_script",
    "launch_with",
    "metric_store",
    "probe",
    "require_torch",
    "worker_plan",
]

__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY, importlib.import_module, __all__)
