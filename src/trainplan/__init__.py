"""trainplan: how a PyTorch training run is laid out on hardware, explained, typed and carried out.

    import trainplan as tp
    plan = tp.resolve(tp.Request(accelerator="gpu", strategy="ddp", devices=2))

`resolve(request, env=None)` probes this machine when no environment is given; the core function
`trainplan.resolve.resolve(request, env)` always takes it explicitly. Importing trainplan never
imports torch.

`import trainplan` imports nothing of trainplan but this module: every public name loads when it is first read
(module `__getattr__`, `_LAZY`), so a tool that only resolves never builds the launchers' classes, and the CLI's
`trainplan plan` never imports the elastic launcher. The imports under TYPE_CHECKING are what a type checker sees.
"""

from __future__ import annotations

import importlib
import sys
import types

from trainplan._version import __version__
from trainplan.spec import lazy_names as _lazy_names
from trainplan.spec.entry import EntryPoints as _EntryPoints
from trainplan.spec.entry import install as _install

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads any TYPE_CHECKING as True)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from trainplan.effects.adapters import (
        accelerate_launch_flags,
        accelerate_parallelism_config,
        accelerator_arguments,
        fabric_arguments,
        lightning_trainer_arguments,
    )
    from trainplan.effects.extras import MissingExtra
    from trainplan.effects.gpus import find_usable_cuda_devices, gpu_statuses
    from trainplan.effects.launching import (
        LaunchError,
        LaunchTimeout,
        NestedLaunch,
        NotImportable,
        WorkerFailed,
        launch,
        launch_with,
    )
    from trainplan.effects.measure import NotMeasurable, measure_model
    from trainplan.effects.metrics import (
        InvalidMetric,
        MetricError,
        MetricKeyMismatch,
        MetricNaN,
        MetricOverflow,
        MetricStore,
        NotInWorld,
        PlainValue,
        metric_store,
    )
    from trainplan.effects.probing import probe
    from trainplan.effects.runtime import (
        NotWrappable,
        Runtime,
        checkpoint_blocks,
        find_blocks,
        repeated_layers,
        runtime,
    )
    from trainplan.effects.world import JoinError, World, WorldMismatch, join
    from trainplan.resolve import place_metric
    from trainplan.resolve.memory import transformer_facts
    from trainplan.rules import (
        BUILTIN_RULES,
        AcceleratorRule,
        AutoStrategyRule,
        BackendRule,
        ClusterRule,
        DefaultPort,
        FamilyRule,
        FrameworkAccelerator,
        JobPort,
        JobVariable,
        JobVariables,
        NotATask,
        PrecisionRecipe,
        PrecisionRule,
        Rules,
        StrategyRule,
    )
    from trainplan.spec import (
        AcceleratorFlag,
        AcceleratorName,
        BackendName,
        ClusterEnvironmentError,
        ClusterFlag,
        ClusterInfo,
        ClusterName,
        DDPOptions,
        DeepSpeedOptions,
        Environment,
        FSDPOptions,
        GpuFacts,
        GpuStatus,
        Incompatible,
        InvalidRequest,
        LauncherName,
        MemoryEstimate,
        MemoryPlan,
        MemoryPolicy,
        MeshDimension,
        MeshDimensionError,
        MeshLayout,
        MeshQueryError,
        MeshRankError,
        MetricPlacement,
        MetricSlot,
        MetricsStore,
        MissingRule,
        ModelFacts,
        ModelParallelOptions,
        Note,
        Plan,
        PlanFormatError,
        PrecisionFlag,
        PrecisionName,
        Request,
        StrategyChoice,
        StrategyFamily,
        StrategyFlag,
        StrategyName,
        StrategyOptions,
        TrainplanError,
        TrainplanWarning,
        Unavailable,
    )
    from trainplan.spec.names import AcceleratorKey, BackendKey, ClusterKey, CustomName, PrecisionKey, StrategyKey


_LAZY: dict[str, str] = {
    "accelerate_launch_flags": "trainplan.effects.adapters",
    "accelerate_parallelism_config": "trainplan.effects.adapters",
    "accelerator_arguments": "trainplan.effects.adapters",
    "fabric_arguments": "trainplan.effects.adapters",
    "lightning_trainer_arguments": "trainplan.effects.adapters",
    "MissingExtra": "trainplan.effects.extras",
    "find_usable_cuda_devices": "trainplan.effects.gpus",
    "gpu_statuses": "trainplan.effects.gpus",
    "LaunchError": "trainplan.effects.launching",
    "LaunchTimeout": "trainplan.effects.launching",
    "NestedLaunch": "trainplan.effects.launching",
    "NotImportable": "trainplan.effects.launching",
    "WorkerFailed": "trainplan.effects.launching",
    "launch": "trainplan.effects.launching",
    "launch_with": "trainplan.effects.launching",
    "NotMeasurable": "trainplan.effects.measure",
    "measure_model": "trainplan.effects.measure",
    "InvalidMetric": "trainplan.effects.metrics",
    "MetricError": "trainplan.effects.metrics",
    "MetricKeyMismatch": "trainplan.effects.metrics",
    "MetricNaN": "trainplan.effects.metrics",
    "MetricOverflow": "trainplan.effects.metrics",
    "MetricStore": "trainplan.effects.metrics",
    "NotInWorld": "trainplan.effects.metrics",
    "PlainValue": "trainplan.effects.metrics",
    "metric_store": "trainplan.effects.metrics",
    "probe": "trainplan.effects.probing",
    "NotWrappable": "trainplan.effects.runtime",
    "Runtime": "trainplan.effects.runtime",
    "checkpoint_blocks": "trainplan.effects.runtime",
    "find_blocks": "trainplan.effects.runtime",
    "repeated_layers": "trainplan.effects.runtime",
    "runtime": "trainplan.effects.runtime",
    "JoinError": "trainplan.effects.world",
    "World": "trainplan.effects.world",
    "WorldMismatch": "trainplan.effects.world",
    "join": "trainplan.effects.world",
    "place_metric": "trainplan.resolve",
    "transformer_facts": "trainplan.resolve.memory",
    "AcceleratorRule": "trainplan.rules",
    "AutoStrategyRule": "trainplan.rules",
    "BUILTIN_RULES": "trainplan.rules",
    "BackendRule": "trainplan.rules",
    "ClusterRule": "trainplan.rules",
    "DefaultPort": "trainplan.rules",
    "FamilyRule": "trainplan.rules",
    "FrameworkAccelerator": "trainplan.rules",
    "JobPort": "trainplan.rules",
    "JobVariable": "trainplan.rules",
    "JobVariables": "trainplan.rules",
    "NotATask": "trainplan.rules",
    "PrecisionRecipe": "trainplan.rules",
    "PrecisionRule": "trainplan.rules",
    "Rules": "trainplan.rules",
    "StrategyRule": "trainplan.rules",
    "AcceleratorFlag": "trainplan.spec",
    "AcceleratorName": "trainplan.spec",
    "BackendName": "trainplan.spec",
    "ClusterEnvironmentError": "trainplan.spec",
    "ClusterFlag": "trainplan.spec",
    "ClusterInfo": "trainplan.spec",
    "ClusterName": "trainplan.spec",
    "DDPOptions": "trainplan.spec",
    "DeepSpeedOptions": "trainplan.spec",
    "Environment": "trainplan.spec",
    "FSDPOptions": "trainplan.spec",
    "GpuFacts": "trainplan.spec",
    "GpuStatus": "trainplan.spec",
    "Incompatible": "trainplan.spec",
    "InvalidRequest": "trainplan.spec",
    "LauncherName": "trainplan.spec",
    "MemoryEstimate": "trainplan.spec",
    "MemoryPlan": "trainplan.spec",
    "MemoryPolicy": "trainplan.spec",
    "MeshDimension": "trainplan.spec",
    "MeshDimensionError": "trainplan.spec",
    "MeshLayout": "trainplan.spec",
    "MeshQueryError": "trainplan.spec",
    "MeshRankError": "trainplan.spec",
    "MetricPlacement": "trainplan.spec",
    "MetricSlot": "trainplan.spec",
    "MetricsStore": "trainplan.spec",
    "MissingRule": "trainplan.spec",
    "ModelFacts": "trainplan.spec",
    "ModelParallelOptions": "trainplan.spec",
    "Note": "trainplan.spec",
    "Plan": "trainplan.spec",
    "PlanFormatError": "trainplan.spec",
    "PrecisionFlag": "trainplan.spec",
    "PrecisionName": "trainplan.spec",
    "Request": "trainplan.spec",
    "StrategyChoice": "trainplan.spec",
    "StrategyFamily": "trainplan.spec",
    "StrategyFlag": "trainplan.spec",
    "StrategyName": "trainplan.spec",
    "StrategyOptions": "trainplan.spec",
    "TrainplanError": "trainplan.spec",
    "TrainplanWarning": "trainplan.spec",
    "Unavailable": "trainplan.spec",
    "AcceleratorKey": "trainplan.spec.names",
    "BackendKey": "trainplan.spec.names",
    "ClusterKey": "trainplan.spec.names",
    "CustomName": "trainplan.spec.names",
    "PrecisionKey": "trainplan.spec.names",
    "StrategyKey": "trainplan.spec.names",
}
"""Each public name → the module that defines it, imported when the name is first read."""


class _Face(types.ModuleType):
    """This module's type: importing the subpackage `trainplan.resolve` (which happens on first use now, not at
    `import trainplan`) must not replace the face's `resolve` function with the subpackage, as the import system
    sets a package's attribute to each submodule it loads. The subpackage stays reachable as
    `sys.modules["trainplan.resolve"]` and through `from trainplan.resolve import ...`."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "resolve" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Face


def _load_entry_points() -> _EntryPoints:
    """The records' entry points (`trainplan.spec.entry`). Each imports its implementation on its own first call: a
    plan's explanation (`trainplan plan`) loads neither the JSON wire format nor the legacy bridge."""
    return _EntryPoints(
        request_from_config=_request_from_config,
        request_from_legacy=_request_from_legacy,
        plan_to_dict=_plan_to_dict,
        plan_from_dict=_plan_from_dict,
        explain=_explain,
    )


def _request_from_config(record: type[Request], config: Mapping[str, object], rules: Rules | None) -> Request:
    from trainplan.parse.fields import request_from_config

    return request_from_config(record, config, rules)


def _request_from_legacy(record: type[Request], flags: Mapping[str, object]) -> Request:
    from trainplan.parse.legacy import from_legacy

    return from_legacy(record, flags)


def _plan_to_dict(plan: Plan) -> dict[str, object]:
    from trainplan.parse.plan_json import plan_to_dict

    return plan_to_dict(plan)


def _plan_from_dict(data: object, rules: Rules | None) -> Plan:
    from trainplan.parse.plan_json import plan_from_dict

    return plan_from_dict(data, rules)


def _explain(plan: Plan) -> str:
    from trainplan.render.explain import explain

    return explain(plan)


_install(_load_entry_points)


def resolve(request: Request | None = None, env: Environment | None = None, rules: Rules | None = None) -> Plan:
    """The plan for `request` (default: everything "auto") on `env` (default: this machine, probed).

    Inside a process a launcher started (torchrun, srun, mpirun, jsrun, `trainplan launch`, `launch`),
    `devices="auto"` and `num_nodes="auto"` take the layout the job started and the launcher is `external`.
    With no arguments: in a worker of trainplan's own launchers, the launcher's plan (its strategy, precision
    and options) seen from this worker; with a request there, the launch's choices fill the fields the request
    leaves out, and a field it sets otherwise (a default value written included) keeps its value with a
    `launch-choice-overridden` warning. With no request: in an emitted job (`trainplan plan --emit
    torchrun|slurm|kubeflow`), the request the job was emitted for (TRAINPLAN_REQUEST), decided by the rule set
    it was emitted with (TRAINPLAN_RULES: `rules`, or that rule set when the script has imported it; a variable
    never imports a module); `env` may then add what
    probe() cannot see, such as a downstream accelerator's device count. `rules` is the rule set to decide from
    (`Rules.extend`; None: `BUILTIN_RULES`).

    Examples:
        A what-if machine with two GPUs; without `env`, this machine is probed:

        >>> import trainplan as tp
        >>> plan = tp.resolve(tp.Request(devices=2, precision="bf16-mixed"), tp.Environment(cuda_device_count=2))
        >>> plan.accelerator, plan.strategy.name, plan.world_size, plan.precision
        ('cuda', 'ddp', 2, 'bf16-mixed')
    """
    probe, resolve_core, BUILTIN_RULES, Request, TrainplanWarning, warn, PLAN_VARIABLE = _resolving()
    rules = BUILTIN_RULES if rules is None else rules
    if request is None:
        import os

        from trainplan.effects.launching import worker_plan
        from trainplan.parse.plan_json import request_from_json_text
        from trainplan.rules import REQUEST_VARIABLE, RULES_VARIABLE

        launched = worker_plan() if env is None else None
        if launched is not None:
            return launched  # inside a launched worker: the launcher's plan, with this worker's rank
        carried = os.environ.get(REQUEST_VARIABLE)
        reference = os.environ.get(RULES_VARIABLE)
        if reference is not None:  # inside an emitted job of a downstream rule set: that rule set decides
            rules = _carried_rules(reference, rules)
        if carried is not None:  # inside an emitted job: the request it was emitted for
            request = request_from_json_text(carried, source=f"the environment variable {REQUEST_VARIABLE}")
        elif PLAN_VARIABLE in os.environ and env is None:
            # A job started inside a trainplan worker (torchrun there): the outer plan's choices, the job's layout.
            import attrs

            from trainplan.effects.rules_loading import read_plan_text, rules_of

            outer_plan = read_plan_text(
                os.environ[PLAN_VARIABLE],
                rules=None if rules is BUILTIN_RULES else rules,
                named_by=f"the outer launcher's plan ({PLAN_VARIABLE})",
            )
            if rules is BUILTIN_RULES:
                rules = rules_of(outer_plan)
            outer = outer_plan.request
            request = attrs.evolve(outer, devices="auto", num_nodes="auto", cluster="auto", select_usable_gpus=False)
    elif env is None:
        env = _probed(probe, request, rules)
        if PLAN_VARIABLE in env.variables:  # the probe copies trainplan's variables: maybe a launched worker
            request = _with_launch_choices(request, rules)
    request = Request() if request is None else request
    if env is None:
        env = _probed(probe, request, rules)
    plan = resolve_core(request, env, rules)
    for note in plan.notes:
        if note.level == "warning":  # said where it is seen, not only kept in the plan (filter TrainplanWarning)
            warn(TrainplanWarning(f"{note.code}: {note.message}", note.code), stacklevel=2)
    return plan


def _probed(probe: Callable[..., Environment], request: object, rules: Rules) -> Environment:
    """This machine's facts for `request`. The auto_select_gpus bridge needs to know which GPUs are free: that is
    probed only when asked."""
    return probe(usable_gpus=getattr(request, "select_usable_gpus", False) is True, rules=rules)


def _with_launch_choices(request: Request, rules: Rules) -> Request:
    """A script's own Request in a worker trainplan launched: the launch fills what it leaves (`with_launch_choices`;
    never `select_usable_gpus`, a field of the layout, so the probe made for the script's request stands).
    Elsewhere: as given."""
    import os

    from trainplan.effects.launching import worker_plan
    from trainplan.mapping.workers import with_launch_choices
    from trainplan.rules import LAUNCH_CHOICES_VARIABLE

    launched = worker_plan()
    if launched is None:
        return request
    written = frozenset(filter(None, os.environ.get(LAUNCH_CHOICES_VARIABLE, "").split(",")))
    return with_launch_choices(request, launched.request, written, rules)


def _resolving() -> _Resolving:
    """What `resolve` calls, imported on its first call and then kept (a framework may call it every step)."""
    if _resolving_parts:
        return _resolving_parts[0]
    from warnings import warn

    from trainplan.effects.probing import probe
    from trainplan.resolve import resolve as resolve_core
    from trainplan.rules import BUILTIN_RULES, PLAN_VARIABLE
    from trainplan.spec import Request, TrainplanWarning

    _resolving_parts.append((probe, resolve_core, BUILTIN_RULES, Request, TrainplanWarning, warn, PLAN_VARIABLE))
    return _resolving_parts[0]


if TYPE_CHECKING:
    _Resolving = tuple[
        Callable[..., Environment],
        Callable[[Request, Environment, Rules], Plan],
        Rules,
        type[Request],
        type[TrainplanWarning],
        Callable[..., None],
        str,
    ]
_resolving_parts: list[_Resolving] = []


def _carried_rules(reference: str, given: Rules) -> Rules:
    """The rule set an emitted job names (TRAINPLAN_RULES): `given` when it is that one, else the one this process
    has loaded (never imported: a variable names a rule set, the script passes or imports it)."""
    from trainplan.effects.rules_loading import loaded_rules
    from trainplan.rules import BUILTIN_RULES, RULES_VARIABLE
    from trainplan.spec import InvalidRequest

    if given is not BUILTIN_RULES:
        if given.reference != reference:
            raise InvalidRequest(
                field="rules",
                value=given.reference or "an unnamed rule set",
                reason=f"this job was emitted for the rule set {reference!r} ({RULES_VARIABLE}), and the carried "
                "request is decided by that one",
                fix=f"Pass that rule set: trainplan.resolve(rules=...) with the Rules {reference} names",
            )
        return given
    return loaded_rules(reference, named_by=f"the environment variable {RULES_VARIABLE}", field=RULES_VARIABLE)


def check(
    request: Request | None = None, env: Environment | None = None, rules: Rules | None = None
) -> Iterator[TrainplanError]:
    """Every problem with `request` on `env` (default: this machine) under `rules` (None: `BUILTIN_RULES`); empty
    when it resolves. `resolve` stops at the first; `check` goes on (`trainplan plan --check`).

    Examples:
        An unknown precision and a strategy the accelerator cannot run, both reported:

        >>> import trainplan as tp
        >>> request = tp.Request(accelerator="cpu", strategy="fsdp", precision="fp8")
        >>> [type(error).__name__ for error in tp.check(request, tp.Environment())]
        ['InvalidRequest', 'Incompatible']
        >>> list(tp.check(tp.Request(accelerator="cpu", devices=2), tp.Environment(cpu_count=4)))
        []
    """
    from trainplan.effects.probing import probe
    from trainplan.resolve import check as check_core
    from trainplan.rules import BUILTIN_RULES
    from trainplan.spec import Request

    rules = BUILTIN_RULES if rules is None else rules
    return check_core(Request() if request is None else request, probe(rules=rules) if env is None else env, rules)


__all__ = [
    "BUILTIN_RULES",
    "AcceleratorFlag",
    "AcceleratorKey",
    "AcceleratorName",
    "AcceleratorRule",
    "AutoStrategyRule",
    "BackendKey",
    "BackendName",
    "BackendRule",
    "ClusterEnvironmentError",
    "ClusterFlag",
    "ClusterInfo",
    "ClusterKey",
    "ClusterName",
    "ClusterRule",
    "CustomName",
    "DDPOptions",
    "DeepSpeedOptions",
    "DefaultPort",
    "Environment",
    "FSDPOptions",
    "FamilyRule",
    "FrameworkAccelerator",
    "GpuFacts",
    "GpuStatus",
    "Incompatible",
    "InvalidMetric",
    "InvalidRequest",
    "JobPort",
    "JobVariable",
    "JobVariables",
    "JoinError",
    "LaunchError",
    "LaunchTimeout",
    "LauncherName",
    "MemoryEstimate",
    "MemoryPlan",
    "MemoryPolicy",
    "MeshDimension",
    "MeshDimensionError",
    "MeshLayout",
    "MeshQueryError",
    "MeshRankError",
    "MetricError",
    "MetricKeyMismatch",
    "MetricNaN",
    "MetricOverflow",
    "MetricPlacement",
    "MetricSlot",
    "MetricStore",
    "MetricsStore",
    "MissingExtra",
    "MissingRule",
    "ModelFacts",
    "ModelParallelOptions",
    "NestedLaunch",
    "NotATask",
    "NotImportable",
    "NotInWorld",
    "NotMeasurable",
    "NotWrappable",
    "Note",
    "PlainValue",
    "Plan",
    "PlanFormatError",
    "PrecisionFlag",
    "PrecisionKey",
    "PrecisionName",
    "PrecisionRecipe",
    "PrecisionRule",
    "Request",
    "Rules",
    "Runtime",
    "StrategyChoice",
    "StrategyFamily",
    "StrategyFlag",
    "StrategyKey",
    "StrategyName",
    "StrategyOptions",
    "StrategyRule",
    "TrainplanError",
    "TrainplanWarning",
    "Unavailable",
    "WorkerFailed",
    "World",
    "WorldMismatch",
    "__version__",
    "accelerate_launch_flags",
    "accelerate_parallelism_config",
    "accelerator_arguments",
    "check",
    "checkpoint_blocks",
    "fabric_arguments",
    "find_blocks",
    "find_usable_cuda_devices",
    "gpu_statuses",
    "join",
    "launch",
    "launch_with",
    "lightning_trainer_arguments",
    "measure_model",
    "metric_store",
    "place_metric",
    "probe",
    "repeated_layers",
    "resolve",
    "runtime",
    "transformer_facts",
]

__getattr__, __dir__ = _lazy_names(__name__, globals(), _LAZY, importlib.import_module, __all__)
