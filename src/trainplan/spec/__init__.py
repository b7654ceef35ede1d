"""The typed spec: records (Request, Environment, Plan), the vocabulary, the rule tables and the errors.

Imports nothing else of trainplan, and never torch.

Its names load on first use (module `__getattr__`): `trainplan.spec.entry` or `trainplan.spec.names` alone
does not build every record. The imports under TYPE_CHECKING are what a type checker sees. `lazy_names` builds that
`__getattr__` for this package, the face (`trainplan`) and `trainplan.effects` alike; it lives here, in the module
every import of trainplan loads first, so that it costs `import trainplan` no module of its own.
"""

from __future__ import annotations

from types import ModuleType

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads any TYPE_CHECKING as True)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, MutableMapping

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


def lazy_names(
    package: str,
    namespace: MutableMapping[str, object],
    modules: Mapping[str, str],
    load: Callable[[str], ModuleType],
    public: Iterable[str],
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module `__getattr__` and `__dir__` of `package`, whose globals are `namespace`: a name in `modules`
    (name → the module that defines it) is read from `load(module)` when first asked for and kept in `namespace`,
    so it is loaded once; any other name is the AttributeError Python raises for a module. `__dir__` lists `public`
    (what `from package import *` gives) and the module's own dunders, never its helper imports."""

    def __getattr__(name: str) -> object:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(load(module), name)
        namespace[name] = value
        return value

    listed = frozenset(public)

    def __dir__() -> list[str]:
        return sorted({*listed, *(name for name in namespace if name.startswith("__") and name.endswith("__"))})

    return __getattr__, __dir__


_LAZY: dict[str, str] = {
    "Environment": "trainplan.spec.environment",
    "ClusterEnvironmentError": "trainplan.spec.errors",
    "Incompatible": "trainplan.spec.errors",
    "InvalidRequest": "trainplan.spec.errors",
    "MeshDimensionError": "trainplan.spec.errors",
    "MeshQueryError": "trainplan.spec.errors",
    "MeshRankError": "trainplan.spec.errors",
    "MissingRule": "trainplan.spec.errors",
    "PlanFormatError": "trainplan.spec.errors",
    "TrainplanError": "trainplan.spec.errors",
    "TrainplanWarning": "trainplan.spec.errors",
    "Unavailable": "trainplan.spec.errors",
    "FrozenMap": "trainplan.spec.frozen",
    "ComputeMode": "trainplan.spec.gpus",
    "GpuFacts": "trainplan.spec.gpus",
    "GpuStatus": "trainplan.spec.gpus",
    "MemoryEstimate": "trainplan.spec.memory",
    "MemoryPlan": "trainplan.spec.memory",
    "MemoryPolicy": "trainplan.spec.memory",
    "ModelFacts": "trainplan.spec.memory",
    "MeshLayout": "trainplan.spec.mesh",
    "AcceleratorFlag": "trainplan.spec.names",
    "AcceleratorName": "trainplan.spec.names",
    "BackendName": "trainplan.spec.names",
    "ClusterFlag": "trainplan.spec.names",
    "ClusterName": "trainplan.spec.names",
    "LauncherName": "trainplan.spec.names",
    "MeshDimension": "trainplan.spec.names",
    "MetricKind": "trainplan.spec.names",
    "MetricsStore": "trainplan.spec.names",
    "NoteLevel": "trainplan.spec.names",
    "PrecisionFlag": "trainplan.spec.names",
    "PrecisionName": "trainplan.spec.names",
    "StartMethod": "trainplan.spec.names",
    "StrategyFamily": "trainplan.spec.names",
    "StrategyFlag": "trainplan.spec.names",
    "StrategyName": "trainplan.spec.names",
    "Note": "trainplan.spec.notes",
    "DDPOptions": "trainplan.spec.options",
    "DeepSpeedOptions": "trainplan.spec.options",
    "FSDPOptions": "trainplan.spec.options",
    "ModelParallelOptions": "trainplan.spec.options",
    "StrategyOptions": "trainplan.spec.options",
    "ClusterInfo": "trainplan.spec.plan",
    "MetricPlacement": "trainplan.spec.plan",
    "MetricSlot": "trainplan.spec.plan",
    "Plan": "trainplan.spec.plan",
    "StrategyChoice": "trainplan.spec.plan",
    "Devices": "trainplan.spec.request",
    "Request": "trainplan.spec.request",
}
"""Each public name → the module that defines it, imported when the name is first read."""


def _load(module: str) -> ModuleType:
    """`module` (one of `_LAZY`'s), imported now: each import written out, as the core imports nothing dynamically
    (no importlib: the layering contracts read every import)."""
    if module == "trainplan.spec.environment":
        from trainplan.spec import environment

        return environment
    if module == "trainplan.spec.errors":
        from trainplan.spec import errors

        return errors
    if module == "trainplan.spec.frozen":
        from trainplan.spec import frozen

        return frozen
    if module == "trainplan.spec.gpus":
        from trainplan.spec import gpus

        return gpus
    if module == "trainplan.spec.memory":
        from trainplan.spec import memory

        return memory
    if module == "trainplan.spec.mesh":
        from trainplan.spec import mesh

        return mesh
    if module == "trainplan.spec.names":
        from trainplan.spec import names

        return names
    if module == "trainplan.spec.notes":
        from trainplan.spec import notes

        return notes
    if module == "trainplan.spec.options":
        from trainplan.spec import options

        return options
    if module == "trainplan.spec.plan":
        from trainplan.spec import plan

        return plan
    if module == "trainplan.spec.request":
        from trainplan.spec import request

        return request
    raise LookupError(f"trainplan.spec: _LAZY names {module}, which _load does not import")


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

__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY, _load, __all__)
