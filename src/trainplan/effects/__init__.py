"""The effects layer: everything that touches the world (probing, CUDA, processes, collectives).

Thin by rule: it gathers facts and carries out a plan's decisions, and decides nothing that
`trainplan.resolve` could decide from facts. Importing it does not import torch.
"""

from __future__ import annotations

from trainplan.effects.elastic import EngineOptions, launch_script

# `import trainplan` stays light: it loads this package only when something probes, launches or logs.
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
