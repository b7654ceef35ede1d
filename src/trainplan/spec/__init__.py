"""The typed spec: records (Request, Environment, Plan), the vocabulary, the rule tables and the errors.

Imports nothing else of trainplan, and never torch.
"""

from trainplan.spec.environment import Environment
from trainplan.spec.errors import (
    ClusterEnvironmentError,
    Incompatible,
    InvalidRequest,
    MeshDimensionError,
    MeshQueryError,
    MeshRankError,
    MissingRule,
    PlanFormatError,
    TrainplanError,
    TrainplanWarning,
    Unavailable,
)
from trainplan.spec.frozen import FrozenMap
from trainplan.spec.gpus import ComputeMode, GpuFacts, GpuStatus
from trainplan.spec.memory import MemoryEstimate, MemoryPlan, MemoryPolicy, ModelFacts
from trainplan.spec.mesh import MeshLayout
from trainplan.spec.names import (
    AcceleratorFlag,
    AcceleratorName,
    BackendName,
    ClusterFlag,
    ClusterName,
    LauncherName,
    MeshDimension,
    MetricKind,
    MetricsStore,
    NoteLevel,
    PrecisionFlag,
    PrecisionName,
    StartMethod,
    StrategyFamily,
    StrategyFlag,
    StrategyName,
)
from trainplan.spec.notes import Note
from trainplan.spec.options import DDPOptions, DeepSpeedOptions, FSDPOptions, ModelParallelOptions, StrategyOptions
from trainplan.spec.plan import ClusterInfo, MetricPlacement, MetricSlot, Plan, StrategyChoice
from trainplan.spec.request import Devices, Request

__all__ = [
    "AcceleratorFlag",
    "AcceleratorName",
    "BackendName",
    "ClusterEnvironmentError",
    "ClusterFlag",
    "ClusterInfo",
    "ClusterName",
    "ComputeMode",
    "DDPOptions",
    "DeepSpeedOptions",
    "Devices",
    "Environment",
    "FSDPOptions",
    "FrozenMap",
    "GpuFacts",
    "GpuStatus",
    "Incompatible",
    "InvalidRequest",
    "LauncherName",
    "MemoryEstimate",
    "MemoryPlan",
    "MemoryPolicy",
    "MeshDimension",
    "MeshDimensionError",
    "MeshLayout",
    "MeshQueryError",
    "MeshRankError",
    "MetricKind",
    "MetricPlacement",
    "MetricSlot",
    "MetricsStore",
    "MissingRule",
    "ModelFacts",
    "ModelParallelOptions",
    "Note",
    "NoteLevel",
    "Plan",
    "PlanFormatError",
    "PrecisionFlag",
    "PrecisionName",
    "Request",
    "StartMethod",
    "StrategyChoice",
    "StrategyFamily",
    "StrategyFlag",
    "StrategyName",
    "StrategyOptions",
    "TrainplanError",
    "TrainplanWarning",
    "Unavailable",
]
