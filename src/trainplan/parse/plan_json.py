"""The plan's and the request's wire format (JSON), both ways in one module so that what is written is what is
read back: `Plan.to_dict`/`Plan.from_dict`, the request carried by emitted jobs, and the plan text a launched worker
reads. A plan read back is checked as resolve would have made it (ranges, consistency, the rule set's rows).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable

import attrs

from trainplan.parse.fields import IN_READ_ORDER, REQUEST_FIELD_ROWS
from trainplan.parse.memory import memory_plan_from_json, memory_plan_to_dict
from trainplan.parse.wire import Reader, check_document, note_from, options_from_dict, options_to_dict
from trainplan.rules import (
    BUILTIN_RULES,
    HOST_DEVICE,
    LIGHTNING_SIZES,
    MAX_DEVICES_PER_NODE,
    MAX_NODES,
    OPTION_TYPES,
    UNNAMED_RULES,
    FamilyRule,
    Rules,
    is_rules_reference,
    option_checks,
)
from trainplan.rules.mesh import MESH_DIMENSIONS as MESH_RULES
from trainplan.rules.mesh import (
    context_parallel_violations,
    group_backend_violations,
    layout_violations,
    pipeline_option_violations,
    pipeline_violation,
    planned_pipeline,
)
from trainplan.spec.errors import InvalidRequest, PlanFormatError
from trainplan.spec.mesh import ContextParallelLayout, MeshLayout, PipelineLayout
from trainplan.spec.names import (
    ACCELERATORS,
    BACKENDS,
    CLUSTERS,
    CONTEXT_PARALLEL_BALANCERS,
    CONTEXT_PARALLEL_ROTATES,
    CUSTOM_NAME,
    CUSTOM_PRECISION,
    GROUP_BACKENDS,
    LAUNCHERS,
    MESH_DIMENSIONS,
    METRICS_STORES,
    PIPELINE_SCHEDULES,
    PRECISIONS,
    STRATEGY_FAMILIES,
    STRATEGY_NAMES,
    MeshDimension,
    StrategyFamily,
)
from trainplan.spec.options import ModelParallelOptions, StrategyOptions, option_value
from trainplan.spec.plan import ClusterInfo, MetricPlacement, Plan, StrategyChoice
from trainplan.spec.request import Request
from trainplan.spec.text import host_address

_PHYSICAL_DEVICE = re.compile(r"\d{1,6}|(?:GPU|MIG)-[A-Za-z0-9/-]{1,120}", flags=re.ASCII)
"""A physical device as CUDA_VISIBLE_DEVICES names it: an index, or a GPU's or MIG device's UUID (MIG-GPU-<uuid>/1/0
in old drivers' form)."""


def plan_to_dict(plan: Plan) -> dict[str, object]:
    """`Plan.to_dict`: plain JSON-compatible data; `plan_from_dict` reads it back to an equal plan."""
    return {
        "version": 1,
        "request": request_to_dict(plan.request),
        "accelerator": plan.accelerator,
        "device_type": plan.device_type,
        "strategy": {
            "name": plan.strategy.name,
            "family": plan.strategy.family,
            "options": options_to_dict(plan.strategy.options),
        },
        "devices": list(plan.devices),
        "num_nodes": plan.num_nodes,
        "processes_per_node": plan.processes_per_node,
        "world_size": plan.world_size,
        "launcher": plan.launcher,
        "cluster": attrs.asdict(plan.cluster),
        "process_group_backend": plan.process_group_backend,
        "precision": plan.precision,
        "metrics": attrs.asdict(plan.metrics),
        "notes": [attrs.asdict(note) for note in plan.notes],
        "reasons": dict(plan.reasons),
        "physical_devices": list(plan.physical_devices),
        "mesh": None
        if plan.mesh is None
        else {
            "dimensions": list(plan.mesh.dimensions),
            "shape": list(plan.mesh.shape),
            "ep": plan.mesh.ep,
            "pipeline": attrs.asdict(plan.mesh.pipeline),
            "context_parallel": attrs.asdict(plan.mesh.context_parallel),
            "backends": {name: plan.mesh.backends[name] for name in MESH_DIMENSIONS if name in plan.mesh.backends},
        },
        "memory": memory_plan_to_dict(plan.memory),
        **({} if plan.rules is None else {"rules": plan.rules}),
    }


def plan_from_dict(data: object, rules: Rules | None = None) -> Plan:
    """`Plan.from_dict`: `plan_to_dict`'s output read back and checked; anything else raises `PlanFormatError`."""
    check_document(data, "plan")
    plan = _read(data)
    _check_plan(plan, rules)
    return plan


def _read(data: object) -> Plan:
    read = Reader(data, "plan")
    version = read.field("version", int)
    if version != 1:
        raise PlanFormatError(path="plan.version", reason=f"version {version} is not 1")
    strategy = read.child("strategy")
    cluster = read.child("cluster")
    metrics = read.child("metrics")
    return Plan(
        request=_request_from_dict(read.child("request")),
        accelerator=read.strategy("accelerator", ACCELERATORS),
        device_type=read.field("device_type", str),
        strategy=StrategyChoice(
            name=strategy.strategy("name", STRATEGY_NAMES),
            family=strategy.choice("family", STRATEGY_FAMILIES),
            options=options_from_dict(strategy, "options"),
        ),
        devices=tuple(read.int_list("devices")),
        num_nodes=read.field("num_nodes", int),
        processes_per_node=read.field("processes_per_node", int),
        world_size=read.field("world_size", int),
        launcher=read.choice("launcher", LAUNCHERS),
        cluster=ClusterInfo(
            kind=cluster.strategy("kind", CLUSTERS),
            creates_processes=cluster.field("creates_processes", bool),
            main_address=cluster.field("main_address", str),
            main_port=cluster.optional("main_port", int),
            node_rank=cluster.optional("node_rank", int),
            global_rank=cluster.optional("global_rank", int),
            local_rank=cluster.optional("local_rank", int),
        ),
        process_group_backend=read.optional_custom("process_group_backend", BACKENDS),
        precision=read.strategy("precision", PRECISIONS, CUSTOM_PRECISION),
        metrics=MetricPlacement(
            default_store=metrics.choice("default_store", METRICS_STORES),
            device_type=metrics.field("device_type", str),
            reduces_on=metrics.choice("reduces_on", ("device", "where_stored", "nowhere")),
            cpu_values_move_for_reduction=metrics.field("cpu_values_move_for_reduction", bool),
            explanation=metrics.field("explanation", str),
        ),
        notes=tuple(note_from(item) for item in read.children("notes")),
        reasons=read.string_map("reasons"),
        physical_devices=tuple(read.string_list("physical_devices") if "physical_devices" in read.data else ()),
        mesh=_mesh_from(read),
        memory=memory_plan_from_json(read),
        rules=_rules_reference_from(read),
    )


def _mesh_from(read: Reader) -> MeshLayout | None:
    if read.data.get("mesh") is None:
        return None
    mesh = read.child("mesh")
    names = mesh.string_list("dimensions")
    if tuple(names) != MESH_DIMENSIONS:
        raise PlanFormatError(path=f"{mesh.path}.dimensions", reason=f"a mesh's dimensions are {list(MESH_DIMENSIONS)}")
    shape = mesh.int_list("shape")
    if len(shape) != len(MESH_DIMENSIONS) or any(not 1 <= size <= _MAX_DEGREE for size in shape):
        raise PlanFormatError(
            path=f"{mesh.path}.shape",
            reason=f"one size from 1 to {_MAX_DEGREE} per dimension of {list(MESH_DIMENSIONS)}",
        )
    ep = mesh.field("ep", int) if "ep" in mesh.data else 1
    if not 1 <= ep <= _MAX_DEGREE:
        raise PlanFormatError(path=f"{mesh.path}.ep", reason=f"an expert-parallel degree from 1 to {_MAX_DEGREE}")
    pipeline = PipelineLayout()
    if "pipeline" in mesh.data:
        stages = mesh.child("pipeline")
        schedule = stages.field("schedule", str)
        if schedule not in PIPELINE_SCHEDULES:
            raise PlanFormatError(path=f"{stages.path}.schedule", reason=f"one of {list(PIPELINE_SCHEDULES)}")
        counts = {key: stages.field(key, int) for key in ("microbatches", "virtual_stages")}
        for key, count in counts.items():
            if not 1 <= count <= _MAX_DEGREE:
                raise PlanFormatError(path=f"{stages.path}.{key}", reason=f"a whole number from 1 to {_MAX_DEGREE}")
        pipeline = PipelineLayout(schedule=schedule, **counts)
    context = ContextParallelLayout()
    if "context_parallel" in mesh.data:
        cp = mesh.child("context_parallel")
        context = ContextParallelLayout(
            rotate_method=cp.choice("rotate_method", CONTEXT_PARALLEL_ROTATES),
            load_balancer=cp.choice("load_balancer", CONTEXT_PARALLEL_BALANCERS),
        )
    backends = mesh.string_map("backends") if "backends" in mesh.data else {}
    for name, backend in backends.items():
        if name not in MESH_DIMENSIONS:
            raise PlanFormatError(path=f"{mesh.path}.backends", reason=f"keys among {list(MESH_DIMENSIONS)}")
        if backend not in GROUP_BACKENDS:
            raise PlanFormatError(path=f"{mesh.path}.backends.{name}", reason=f"one of {list(GROUP_BACKENDS)}")
    return MeshLayout(
        shape=tuple(shape),
        ep=ep,
        pipeline=pipeline,
        context_parallel=context,
        backends=backends,  # type: ignore[arg-type]  # checked above: dimension → group backend
    )


_MAX_DEGREE = 2**31 - 1


def request_to_dict(request: Request) -> dict[str, object]:
    """A request as plain JSON data (the `request` part of `Plan.to_dict`): each field as its row writes it."""
    data = {row.name: row.to_json(getattr(request, row.name)) for row in REQUEST_FIELD_ROWS}
    return {**data, "notes": [attrs.asdict(note) for note in request.notes]}


def _request_from_dict(read: Reader) -> Request:
    values = {row.name: row.from_json(read, row.name) for row in IN_READ_ORDER}
    return Request(**values, notes=tuple(note_from(item) for item in read.children("notes")))  # type: ignore[arg-type]


def _lookup_family(rules: Rules, family: StrategyFamily, bad: Callable[[str, str], PlanFormatError]) -> FamilyRule:
    found = rules.families.get(family)
    if found is None:
        raise bad("strategy.family", f"the rule set has no family {family!r}")
    return found


def _rules_reference_from(read: Reader) -> str | None:

    if "rules" not in read.data:
        return None
    reference = read.field("rules", str)
    if reference != UNNAMED_RULES and not is_rules_reference(reference):
        raise PlanFormatError(
            path="plan.rules", reason=f"expected 'module:NAME' or {UNNAMED_RULES!r}, found {reference!r}"
        )
    return reference


def _check_plan(plan: Plan, given: Rules | None) -> None:
    """Ranges and consistency of a plan read from JSON; `PlanFormatError` names the first bad path."""

    def bad(path: str, reason: str) -> PlanFormatError:
        return PlanFormatError(path=f"plan.{path}", reason=reason)

    supplied: object = given
    if supplied is not None and not isinstance(supplied, Rules):
        raise TypeError(f"rules must be a trainplan.Rules, not {type(supplied).__name__}")
    if given is not None and not given.may_have_made(plan.rules):
        raise bad(
            "rules",
            f"the plan was made from the rule set {plan.rules!r}, and is read with "
            f"{given.reference or 'another one'!r}: read it with the rule set it names",
        )
    # Without its rule set, a downstream plan is checked as far as its own facts go: its family's and precision's
    # rows may be replaced, and its accelerator, backend and precision may be the extension's own (the built-in
    # accelerator and backend rows, which no extension replaces, are still read where the plan names them).
    relaxed = given is None and plan.rules is not None
    rules = BUILTIN_RULES if given is None else given
    accelerator_rule = rules.accelerators.get(plan.accelerator)
    if accelerator_rule is None and not relaxed:
        raise bad("accelerator", f"the rule set has no accelerator {plan.accelerator!r}")
    backend_rule = None if plan.process_group_backend is None else rules.backends.get(plan.process_group_backend)
    if plan.process_group_backend is not None and backend_rule is None and not relaxed:
        raise bad("process_group_backend", f"the rule set has no backend {plan.process_group_backend!r}")
    if plan.precision not in rules.precisions and not relaxed:
        raise bad("precision", f"the rule set has no precision {plan.precision!r}")
    if plan.cluster.kind not in rules.clusters and not relaxed:
        raise bad("cluster.kind", f"the rule set has no cluster {plan.cluster.kind!r}")
    if plan.request.cluster not in rules.cluster_spellings and not relaxed:
        raise bad("request.cluster", f"the rule set has no cluster {plan.request.cluster!r}")

    if not 1 <= plan.num_nodes <= MAX_NODES:
        raise bad("num_nodes", f"it must be from 1 to {MAX_NODES}, not {plan.num_nodes}")
    if not 1 <= plan.processes_per_node <= MAX_DEVICES_PER_NODE:
        raise bad("processes_per_node", f"it must be from 1 to {MAX_DEVICES_PER_NODE}, not {plan.processes_per_node}")
    if plan.world_size != plan.num_nodes * plan.processes_per_node:
        raise bad(
            "world_size",
            f"it is {plan.world_size}, but num_nodes × processes_per_node = {plan.num_nodes * plan.processes_per_node}",
        )
    # A strategy is checked against its row (family and launcher) where the rule set at hand has it.
    rule = rules.strategies.get(plan.strategy.name)
    if rule is not None and plan.strategy.family != rule.family:
        raise bad("strategy.family", f"strategy {plan.strategy.name!r} is of family {rule.family!r}")
    in_force = plan.strategy.options
    if rule is not None and in_force is not None:  # the options its name fixes are in force, as resolve puts them
        for option, value in rule.preset.items():
            if option_value(in_force, option, value) != value:
                raise bad(
                    f"strategy.options.{option}",
                    f"strategy {plan.strategy.name!r} fixes {option}={value!r}, and the plan says "
                    f"{option_value(in_force, option, value)!r}",
                )
    family = None if relaxed else _lookup_family(rules, plan.strategy.family, bad)
    backend = plan.process_group_backend
    # What the family row says, or (relaxed) what the plan's own facts say: a process group has a backend.
    multi_process = plan.processes_per_node > 1 or backend is not None if family is None else family.multi_process
    has_process_group = backend is not None if family is None else family.has_process_group
    family_name = plan.strategy.family
    devices = plan.devices
    if len(set(devices)) != len(devices) or any(not 0 <= index < MAX_DEVICES_PER_NODE for index in devices):
        raise bad("devices", "device indices are distinct, from 0 to the node's device count")
    if multi_process and len(devices) != plan.processes_per_node:
        raise bad(
            "devices",
            f"{family_name} runs one process per device: {len(devices)} devices, "
            f"{plan.processes_per_node} processes per node",
        )
    if not multi_process and (plan.processes_per_node != 1 or not devices):
        raise bad("processes_per_node", f"{family_name} runs one process over its devices")
    if plan.physical_devices and (
        len(plan.physical_devices) != len(devices) or len(set(plan.physical_devices)) != len(devices)
    ):
        raise bad("physical_devices", "it names one distinct physical GPU per device")
    for name in plan.physical_devices:
        if not _PHYSICAL_DEVICE.fullmatch(name):
            raise bad(
                "physical_devices",
                f"{name[:40]!r} is not a GPU's index or UUID (digits, or GPU-/MIG- and letters, digits, '-' and '/'): "
                "it is written into CUDA_VISIBLE_DEVICES, where a ',' would make it several GPUs",
            )
    if family is not None and plan.accelerator not in family.accelerators:
        raise bad("accelerator", f"strategy family {family_name!r} does not run on {plan.accelerator!r}")
    launcher_rule = rules.launchers.get(plan.launcher)
    joins = launcher_rule is not None and launcher_rule.joins  # a started job's processes join its world
    if (rule is not None and plan.launcher != rule.launcher and not joins) or (joins and not has_process_group):
        started_by = "its own launcher" if rule is None else repr(rule.launcher)
        raise bad("launcher", f"strategy {plan.strategy.name!r} is started by {started_by} (or joins: 'external')")
    if family is not None and family.has_process_group != (backend is not None):
        raise bad(
            "process_group_backend",
            f"family {family_name!r} {'needs' if family.has_process_group else 'has'} "
            f"{'a process-group backend' if family.has_process_group else 'no process group'}",
        )
    if backend_rule is not None and plan.accelerator not in backend_rule.accelerators:
        raise bad("process_group_backend", f"{backend!r} does not reduce {plan.accelerator!r} tensors")
    if family is not None and (
        plan.precision not in family.precisions or plan.accelerator not in rules.precisions[plan.precision].accelerators
    ):
        raise bad("precision", f"{plan.precision!r} does not run with {plan.strategy.name!r} on {plan.accelerator!r}")
    if family is not None and plan.accelerator in rules.precisions[plan.precision].fallback:
        raise bad("precision", f"{plan.precision!r} runs as its fallback on {plan.accelerator!r}")
    device_type = plan.device_type if accelerator_rule is None else accelerator_rule.device_type
    if plan.device_type != device_type:
        raise bad("device_type", f"the plan's accelerator {plan.accelerator!r} has device type {device_type!r}")
    if not CUSTOM_NAME.fullmatch(device_type):
        raise bad("device_type", "a torch device type is a lowercase name such as 'cuda' or 'cpu'")
    if plan.metrics.device_type != device_type:
        raise bad("metrics.device_type", f"the plan's accelerator {plan.accelerator!r} has device type {device_type!r}")
    if (
        plan.request.sync_batchnorm is True
        and plan.world_size > 1
        and plan.accelerator not in rules.sync_batchnorm_accelerators
    ):
        raise bad("request.sync_batchnorm", f"SyncBatchNorm does not run on {plan.accelerator!r}")
    if plan.world_size == 1 or backend is None:
        reduces_on: str = "nowhere"
    elif backend_rule is None:  # a downstream backend, its rule set not at hand: as the plan says
        reduces_on = plan.metrics.reduces_on
    else:
        reduces_on = "device" if backend_rule.needs_device_tensors else "where_stored"
    if plan.metrics.reduces_on != reduces_on:
        raise bad("metrics.reduces_on", f"this plan's metrics are {reduces_on!r}")
    moves = reduces_on == "device" and device_type != HOST_DEVICE
    if plan.metrics.cpu_values_move_for_reduction != moves:
        raise bad("metrics.cpu_values_move_for_reduction", f"it is {moves} for this backend and device")
    cluster = plan.cluster
    address = cluster.main_address
    if host_address(address) != address:  # as resolve writes it: a checked host, in its canonical form
        raise bad(
            "cluster.main_address",
            "it is not a host name or an IP address (letters, digits, '.', '-', '_'; an IPv6 address without "
            "brackets, in its short form), as resolve writes one",
        )
    if cluster.main_port is not None and not 1 <= cluster.main_port <= 65535:
        raise bad("cluster.main_port", "a TCP port is from 1 to 65535")
    if cluster.node_rank is not None and not 0 <= cluster.node_rank < plan.num_nodes:
        raise bad("cluster.node_rank", f"it must be from 0 to {plan.num_nodes - 1}")
    if cluster.global_rank is not None and not 0 <= cluster.global_rank < plan.world_size:
        raise bad("cluster.global_rank", f"it must be from 0 to {plan.world_size - 1}")
    if cluster.local_rank is not None and not 0 <= cluster.local_rank < plan.processes_per_node:
        raise bad("cluster.local_rank", f"it must be from 0 to {plan.processes_per_node - 1}")
    expected = OPTION_TYPES.get(family_name)
    options = plan.strategy.options
    if (expected is None) != (options is None) or (expected is not None and not isinstance(options, expected)):
        raise bad("strategy.options", f"family {family_name!r} takes {expected.__name__ if expected else 'none'}")
    _check_mesh(plan, bad)
    request = plan.request
    # A downstream plan read without its rule set: its options are checked by trainplan's rows, those it adds are not.
    checks: dict[str, Callable[[], object]] = {
        "strategy.options": lambda: option_checks.strategy_options(_known(options, relaxed), rules.options),
        "request.strategy_options": lambda: option_checks.strategy_options(
            _known(plan.request.strategy_options, relaxed), rules.options
        ),
        **{
            f"request.{row.name}": functools.partial(row.read_check, getattr(request, row.name))
            for row in REQUEST_FIELD_ROWS
            if row.read_check is not None
        },
    }
    for path, check in checks.items():
        try:
            check()
        except InvalidRequest as error:
            raise bad(path, error.reason) from None


def _known(options: StrategyOptions | None, relaxed: bool) -> StrategyOptions | None:
    """`options` as far as trainplan's rows know them: without the plan's rule set (`relaxed`), the options it adds
    are left out (and so unchecked)."""
    if options is None or not relaxed:
        return options
    return attrs.evolve(options, extra={}, given=options.given - set(options.extra))


def _check_mesh(plan: Plan, bad: Callable[[str, str], PlanFormatError]) -> None:
    """A mesh plan's mesh: the resolved degrees of its options, and a layout that keeps every mesh rule."""
    options = plan.strategy.options
    mesh = plan.mesh
    if not isinstance(options, ModelParallelOptions):
        if mesh is not None:
            raise bad("mesh", f"strategy {plan.strategy.name!r} has no device mesh")
        return
    if mesh is None:
        raise bad("mesh", f"strategy {plan.strategy.name!r} plans a device mesh, and the plan has none")
    pipeline = mesh.pipeline
    if (
        options.degrees != mesh.sizes
        or options.ep != mesh.ep
        or options.backends != dict(mesh.backends)
        or (options.cp_rotate_method, options.cp_load_balancer)
        != (mesh.context_parallel.rotate_method, mesh.context_parallel.load_balancer)
        or any(getattr(options, size.argument) is not None for size in LIGHTNING_SIZES)
    ):
        raise bad(
            "strategy.options",
            f"the options in force are the mesh's degrees, {mesh.sizes}, ep={mesh.ep}, and its backends, "
            f"{dict(mesh.backends)}",
        )
    for option in pipeline_option_violations(
        mesh.size("pp"), options.pp_schedule, options.pp_virtual_stages, options.pp_microbatches
    ):
        raise bad(f"strategy.options.{option}", f"it breaks the rule mesh-option-unused ({option} with pp=1)")
    planned = planned_pipeline(options.pp_schedule, mesh.size("pp"), options.pp_virtual_stages, options.pp_microbatches)
    if pipeline != planned:
        # Derived as the resolver derives it, so a record the options left unset cannot drift either.
        raise bad(
            "mesh.pipeline",
            f"the options in force (pp={mesh.size('pp')}, pp_schedule={options.pp_schedule!r}, "
            f"pp_virtual_stages={options.pp_virtual_stages}, pp_microbatches={options.pp_microbatches}) plan "
            f"schedule={planned.schedule!r}, virtual_stages={planned.virtual_stages}, "
            f"microbatches={planned.microbatches}; the record says schedule={pipeline.schedule!r}, "
            f"virtual_stages={pipeline.virtual_stages}, microbatches={pipeline.microbatches}",
        )
    asked = plan.request.strategy_options
    if isinstance(asked, ModelParallelOptions):
        # The degrees written (a default of 1 may be the mesh's rest) and Lightning's sizes (None: not used).
        spellings: dict[str, MeshDimension] = {name: name for name in MESH_DIMENSIONS if name in asked.given}
        spellings.update({size.argument: size.dimension for size in LIGHTNING_SIZES})
        for spelling, name in spellings.items():
            degree = getattr(asked, spelling)
            torchtitan_auto = degree == -1 and MESH_RULES[name].minus_one_is_auto  # dp_shard=-1: 'auto'
            if isinstance(degree, int) and degree != mesh.size(name) and not torchtitan_auto:
                raise bad(
                    f"request.strategy_options.{spelling}",
                    f"the request asked for {spelling}={degree}, but the mesh has {name}={mesh.size(name)}",
                )
    for violation in layout_violations(
        mesh.sizes,
        num_nodes=plan.num_nodes,
        processes_per_node=plan.processes_per_node,
        accelerator=plan.accelerator,
        backend=plan.process_group_backend,
        precision=plan.precision,
        ep=mesh.ep,
    ):
        where = "" if violation.dimension is None else f" ({violation.dimension}={violation.degree})"
        raise bad("mesh", f"it breaks the rule {violation.rule}{where}: {violation.detail}")
    for field, option in context_parallel_violations(mesh.size("cp"), mesh.context_parallel):
        raise bad(f"mesh.context_parallel.{field}", f"it breaks the rule mesh-option-unused ({option} with cp=1)")
    for rule, name, why in group_backend_violations(mesh.sizes, mesh.backends, accelerator=plan.accelerator):
        raise bad(f"mesh.backends.{name}", f"it breaks the rule {rule} ({name}={mesh.size(name)}): {why}")
    broken = pipeline_violation(pipeline.schedule, mesh.size("pp"), pipeline.virtual_stages, pipeline.microbatches)
    if broken is not None:
        raise bad("mesh.pipeline", f"it breaks the rule {broken[0]}: {broken[1]}")


def request_from_json_text(text: str, *, source: str = "request") -> Request:
    """A request from the JSON text `request_to_dict` wrote (as emitted jobs carry it); `PlanFormatError` names
    the bad path."""
    if not isinstance(text, str):
        raise PlanFormatError(path=source, reason=f"expected JSON text, found {type(text).__name__}")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise PlanFormatError(path=source, reason=f"not JSON ({error})") from None
    check_document(data, source)
    return _request_from_dict(Reader(data, source))


def plan_from_json_text(text: str, rules: Rules | None = None) -> Plan:
    """A plan from its JSON text (as `json.dumps(plan.to_dict())` wrote it), checked against `rules` (see
    `Plan.from_dict`)."""
    given: object = text
    if not isinstance(given, (str, bytes, bytearray)):
        raise PlanFormatError(path="plan", reason=f"expected JSON text, found {type(given).__name__}")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise PlanFormatError(path="plan", reason=f"not JSON, or nested too deeply ({error})") from None
    return plan_from_dict(data, rules)
