"""The resolver: (Request, Environment) → Plan, or a typed error. Pure and deterministic.

The steps run in a fixed order: normalise the request → read the cluster environment → choose the
accelerator → check availability and select devices → choose and validate the strategy → launcher
and world layout (checked against the cluster) → backend → precision → metric placement → notes.

Every step reports problems to a sink instead of raising directly. `resolve` passes a sink that
raises, so the first problem ends it; `check` passes one that collects, and steps continue with a
neutral fallback where one exists, so a tool can show every problem with a request at once.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from trainplan.parse import normalise
from trainplan.parse.fields import IN_CHECK_ORDER, REFUSED, REQUEST_FIELD_ROWS
from trainplan.parse.normalise import DevicesSpec
from trainplan.resolve.cluster import ClusterFacts, detect, is_loopback_host
from trainplan.resolve.mesh import MeshChoice, mesh_or_refusals
from trainplan.resolve.refusal import incompatible
from trainplan.resolve.visible import visible_entries
from trainplan.rules import (
    BUILTIN_RULES,
    HOST_DEVICE,
    HOST_LAUNCHER,
    HOST_METRICS_STORE,
    LOCAL_CLUSTER,
    MAX_CPU_COUNT,
    MAX_DEVICES_PER_NODE,
    MAX_NODES,
    MAX_WORLD_SIZE,
    OPTION_TYPES,
    SELECTED_DEVICES_VARIABLE,
    SUPPLIED_COUNTS,
    AcceleratorRule,
    AutoStrategyRule,
    FamilyRule,
    MissingRule,
    Rules,
    StrategyRule,
    lookup,
    option_checks,
)
from trainplan.spec.environment import DeviceCounts, Environment
from trainplan.spec.errors import Incompatible, InvalidRequest, TrainplanError, Unavailable
from trainplan.spec.frozen import FrozenMap, LazyTexts, Text, trusted_constructor
from trainplan.spec.names import (
    START_METHODS,
    AcceleratorFlag,
    AcceleratorKey,
    BackendKey,
    ClusterFlag,
    CustomName,
    LauncherName,
    MetricKind,
    MetricsStore,
    PrecisionKey,
    StrategyFlag,
    StrategyKey,
)
from trainplan.spec.notes import Note
from trainplan.spec.numbers import whole_number
from trainplan.spec.options import ModelParallelOptions, StrategyOptions, option_value, with_options
from trainplan.spec.plan import ClusterInfo, MetricPlacement, MetricSlot, Plan, StrategyChoice
from trainplan.spec.request import NumNodes, Request

Report = Callable[[TrainplanError], None]


def resolve(request: Request, env: Environment, rules: Rules = BUILTIN_RULES) -> Plan:
    """The plan for `request` on `env`, or the first problem as a `TrainplanError`.

    Pure: the environment is always passed in (use `trainplan.resolve` to probe this machine). `rules` is the
    rule set decided from (a downstream framework passes its extension of `BUILTIN_RULES`). Being pure, it is
    memoised: resolving an equal request on an equal environment (and rule set) again returns the same plan from a
    bounded cache (`resolve_uncached` skips it). Errors are never cached.
    """
    given: tuple[object, object] = (request, env)
    if not isinstance(given[0], Request) or not isinstance(given[1], Environment):
        return resolve_uncached(request, env, rules)  # reports the wrong type as an InvalidRequest
    try:
        key = (request, request.notes, env, rules, _type_signature(request, env))
        hash(key)
    except (TypeError, ValueError, RecursionError):
        # Unhashable garbage in a field (a dict for `devices`, say), or a value whose repr cannot be made (an
        # integer past Python's digit limit, a structure nested too deep): resolve it without the cache, which
        # reports it as an InvalidRequest. Only the key is tried here: a refusal (a ValueError too) is raised once.
        return resolve_uncached(request, env, rules)
    return _resolve_cached(*key)


def resolve_uncached(request: Request, env: Environment, rules: Rules = BUILTIN_RULES) -> Plan:
    """`resolve` without the memo: every call runs every step (for benchmarks of the cold path)."""
    plan = _run(request, env, _raise, rules)
    if plan is None:  # pragma: no cover - the raising sink ends every failed run before this
        raise TrainplanError("resolve reached no plan and no error; please report this")
    return plan


def _raise(error: TrainplanError) -> None:
    """The sink of `resolve`: the first problem ends it."""
    raise error


@functools.lru_cache(maxsize=1024)
def _resolve_cached(request: Request, notes: object, env: Environment, rules: Rules, signature: object) -> Plan:
    return resolve_uncached(request, env, rules)


def _type_signature(request: Request, env: Environment) -> tuple[object, ...]:
    """The types of the values in a request and an environment.

    Part of the memo's key because equal values of different types resolve differently: `devices=True`
    is refused while `devices=1` is not, yet `True == 1` and both hash alike.
    """
    raw: object = request.devices
    options: object = request.strategy_options
    usable: object = env.usable_cuda_devices
    counts: object = env.device_counts
    return (
        type(request.accelerator),
        type(request.strategy),
        type(raw),
        tuple(map(type, raw)) if isinstance(raw, tuple) else None,
        type(request.num_nodes),
        type(request.precision),
        type(request.process_group_backend),
        type(request.cluster),
        type(request.metrics_store),
        type(request.sync_batchnorm),
        type(request.select_usable_gpus),
        None if options is None else repr(options),
        # Which options were written is not part of a record's value, but it decides: an explicit value a preset
        # contradicts is refused, a default is not; a degree written 'auto' takes the rest, the default one not.
        getattr(options, "given", None),
        type(env.cuda_device_count),
        type(env.cuda_initialized),
        type(env.mps_available),
        type(env.xla_device_count),
        type(env.cpu_count),
        type(env.interactive),
        tuple(map(type, usable)) if isinstance(usable, tuple) else None,
        tuple(map(type, counts.values())) if isinstance(counts, Mapping) else None,  # True == 1, yet refused
    )


def check(request: Request, env: Environment, rules: Rules = BUILTIN_RULES) -> Iterator[TrainplanError]:
    """Every problem with `request` on `env` (empty when it resolves). `resolve` raises the first of them."""
    problems: list[TrainplanError] = []
    _run(request, env, problems.append, rules)
    yield from problems


# --------------------------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class _Fields:
    """The request's fields, normalised (built once per run and only read after; not frozen, which costs).

    Written by hand for speed, like `_normal_fields`, `_already_normal` and `_type_signature`: a new `Request` field
    is added to each (tests/unit/test_request_fields.py names the one it is missing from); the rest reads its row in
    `trainplan.parse.fields`."""

    accelerator: AcceleratorFlag | CustomName
    strategy: StrategyFlag | CustomName
    devices: DevicesSpec
    num_nodes: NumNodes
    precision: PrecisionKey
    process_group_backend: BackendKey | None
    cluster: ClusterFlag
    metrics_store: MetricsStore
    sync_batchnorm: bool
    select_usable_gpus: bool
    strategy_options: StrategyOptions | None
    notes: tuple[Note, ...]
    ok: bool
    as_given: bool  # the request holds these very values: it is its own normal form


# The resolver's records, built without the class call's detour (its keywords packed into a dict) and without
# converters: every value passed is already in the form the converters give (tuples, a LazyTexts map).
_new_fields = trusted_constructor(_Fields)
_new_note = trusted_constructor(Note)
_new_strategy_choice = trusted_constructor(StrategyChoice)
_new_cluster_info = trusted_constructor(ClusterInfo)
_new_metric_placement = trusted_constructor(MetricPlacement)
_new_plan = trusted_constructor(Plan)

_FALLBACK_CLUSTER = detect(LOCAL_CLUSTER, {})
"""What `check` goes on with after an error in the cluster's variables (resolve stops at the error)."""


def _run(request: object, given_env: object, report: Report, rules: Rules) -> Plan | None:
    if not isinstance(request, Request):
        report(
            InvalidRequest(
                field="request",
                value=request,
                reason=f"resolve takes a trainplan.Request, not {type(request).__name__}",
                fix="Build one with Request(...) or Request.from_config({...})",
            )
        )
        return None
    if not isinstance(given_env, Environment):
        report(
            InvalidRequest(
                field="env",
                value=given_env,
                reason=f"resolve takes a trainplan.Environment, not {type(given_env).__name__}",
                fix="Use trainplan.probe() for this machine, or Environment(...) for a what-if",
            )
        )
        return None
    given_rules: object = rules
    if not isinstance(given_rules, Rules):
        report(
            InvalidRequest(
                field="rules",
                value=given_rules,
                reason=f"resolve takes a trainplan.Rules, not {type(given_rules).__name__}",
                fix="Pass trainplan.BUILTIN_RULES (the default) or a rule set built with BUILTIN_RULES.extend(...)",
            )
        )
        return None
    env: Environment = given_env
    if not _plainly_valid(env) and not _check_environment(
        env, report, rules
    ):  # the common case in one expression first
        return None
    fields = _normalise(request, report, rules)
    notes: list[Note] = list(fields.notes)
    reasons: dict[str, Text] = {}  # rendered when read (LazyTexts): the cold path writes no explanation

    # Each step that can refuse is tried in place (a helper taking the step would cost a call per step): `resolve`'s
    # sink raises the refusal, `check`'s keeps it and the step's neutral fallback is taken.
    try:
        facts = detect(fields.cluster, env.variables, rules)
    except TrainplanError as error:
        report(error)
        facts = _FALLBACK_CLUSTER
    notes.extend(facts.notes)
    num_nodes, nodes_reason = _choose_num_nodes(fields.num_nodes, facts)

    chosen: tuple[AcceleratorKey, Text] | None
    try:
        chosen = _choose_accelerator(fields.accelerator, env, rules)
    except TrainplanError as error:
        report(error)
        chosen = None
    if chosen is None:
        if fields.accelerator not in rules.accelerators:
            return None
        assumed: AcceleratorKey = fields.accelerator  # type: ignore[assignment]  # narrowed by the membership test
        # Only `check` gets here: go on as if the hardware were present, to find the request's other problems.
        chosen = assumed, "assumed present (check only)"
        env = _with_plenty(env, rules)
    accelerator, reasons["accelerator"] = chosen
    accelerator_rule = lookup(rules.accelerators, accelerator, name="ACCELERATORS")
    if fields.accelerator == "auto":
        notes.append(
            _new_note(code="accelerator-auto", level="info", message=f"accelerator='auto' chose {accelerator!r}")
        )

    selected: tuple[tuple[int, ...], str, tuple[Note, ...]] | None
    try:
        if fields.select_usable_gpus:
            selected = _select_usable_devices(accelerator_rule, fields.devices, env)
        else:
            # Read only inside a started job (outside one the devices are selected as asked).
            started = facts.creates_processes or facts.launched
            nodes_known = started and (fields.num_nodes != "auto" or _job_nodes(facts) is not None)
            selected = _select_devices_in_job(accelerator_rule, fields.devices, env, facts, num_nodes, nodes_known)
    except TrainplanError as error:
        report(error)
        selected = None
    if selected is None:
        devices: tuple[int, ...] = (0,)
        reasons["devices"] = "fallback after an error"
    else:
        devices, reasons["devices"], device_notes = selected
        notes.extend(device_notes)

    strategy_name, reasons["strategy"] = _choose_strategy(
        fields.strategy, accelerator, devices, num_nodes, env, fields.strategy_options, rules
    )
    if (facts.creates_processes or facts.launched) and strategy_name in rules.script_strategy_for:
        # The job already started every process: a strategy that would start them from a function joins
        # as its script counterpart, under every launcher alike.
        instead = rules.script_strategy_for[strategy_name]
        notes.append(
            _new_note(
                code="script-strategy",
                level="warning",
                message=(
                    f"strategy={strategy_name!r} starts its workers from a function, but {facts.started_by} already "
                    f"started every process of this job: this process joins it as strategy={instead!r}"
                ),
            )
        )
        reasons["strategy"] = f"{_rendered(reasons['strategy'])}; inside a started job it runs as {instead!r}"
        strategy_name = instead
    if fields.strategy == "auto":
        notes.append(_new_note(code="strategy-auto", level="info", message=f"strategy='auto' chose {strategy_name!r}"))
    rule = lookup(rules.strategies, strategy_name, name="STRATEGIES")
    family = lookup(rules.families, rule.family, name="FAMILIES")

    chosen_by = (
        fields.strategy_options
        if fields.strategy_options is not None  # first: without options nothing chose by them (the cheapest test)
        and fields.strategy == "auto"
        and strategy_name in rules.auto_for_options.values()
        else None
    )
    for problem in _strategy_problems(strategy_name, family, accelerator_rule, devices, num_nodes, env, chosen_by):
        report(problem)
    options: StrategyOptions | None
    try:
        options = _merge_options(strategy_name, rule, family, fields.strategy_options)
    except TrainplanError as error:
        report(error)
        options = None

    processes_per_node = len(devices) if family.multi_process else 1
    world_size = num_nodes * processes_per_node
    if world_size > MAX_WORLD_SIZE:
        report(
            InvalidRequest(
                field="num_nodes",
                value=num_nodes,
                reason=f"{num_nodes} × {processes_per_node} processes is beyond torch's {MAX_WORLD_SIZE} ranks",
                fix="Ask for fewer nodes or processes per node",
            )
        )
    reasons["layout"] = (str.format, ("{}; nodes: {}", family.description, nodes_reason))

    launcher: LauncherName
    try:
        launcher = _choose_launcher(strategy_name, rule, family, facts, env, accelerator_rule, rules)
    except TrainplanError as error:
        report(error)
        launcher = HOST_LAUNCHER
    launcher_rule = lookup(rules.launchers, launcher, name="LAUNCHERS")
    reasons["launcher"] = launcher_rule.description
    if launcher_rule.joins and facts.launched:
        reasons["launcher"] = "trainplan's launcher already started every process; join its world"

    try:
        asked = {
            name: value
            for name, value in (("devices", fields.devices), ("num_nodes", fields.num_nodes))
            if value != "auto"
        }
        cluster = _place_in_cluster(facts, asked, num_nodes, processes_per_node, world_size, launcher, rules)
    except TrainplanError as error:
        report(error)
        cluster = _new_cluster_info(
            kind=facts.kind,
            creates_processes=facts.creates_processes,
            main_address=facts.main_address or "127.0.0.1",
            main_port=facts.main_port,
            node_rank=0,
            global_rank=None,
            local_rank=None,
        )
    reasons["cluster"] = facts.reason
    if (facts.creates_processes or facts.launched) and num_nodes > 1 and is_loopback_host(cluster.main_address):
        given = f"{facts.address_from}={cluster.main_address}" if facts.address_from else cluster.main_address
        notes.append(
            _new_note(
                code="job-loopback-address",
                level="warning",
                message=(
                    f"the main address {given} is this machine's loopback, but the job spans {num_nodes} nodes: "
                    "each node would meet on its own, unless every node is this one host. Unset it, or set it to the "
                    "address of node 0"
                ),
            )
        )
    cluster_rule = lookup(rules.clusters, facts.kind, name="CLUSTERS")
    if not cluster_rule.creates_processes and num_nodes > 1 and facts.address_from is None:
        notes.append(
            _new_note(
                code="multi-node-local",
                level="warning",
                message=(
                    f"num_nodes={num_nodes} without a cluster manager: set MASTER_ADDR (the host of node 0), "
                    "MASTER_PORT and NODE_RANK on every node, or the nodes meet on 127.0.0.1"
                ),
            )
        )

    backend: BackendKey | None
    try:
        backend = _choose_backend(fields.process_group_backend, family, strategy_name, accelerator_rule, rules)
    except TrainplanError as error:
        report(error)
        backend = None
    if family.has_process_group and backend is not None:
        backend_rule = lookup(rules.backends, backend, name="BACKENDS")
        how = "asked for {!r} ({})" if fields.process_group_backend is not None else "the default for {!r} ({})"
        reasons["backend"] = (
            str.format,
            (how, backend if fields.process_group_backend is not None else accelerator, backend_rule.description),
        )
    elif family.has_process_group:
        reasons["backend"] = f"asked for {fields.process_group_backend!r}"
    else:
        reasons["backend"] = "a single process creates no process group"

    try:
        precision = _choose_precision(fields.precision, accelerator, strategy_name, family, env, notes, rules)
    except TrainplanError as error:
        report(error)
        precision = fields.precision
    reasons["precision"] = lookup(rules.precisions, precision, name="PRECISIONS").description

    mesh: MeshChoice | None = None
    if isinstance(options, ModelParallelOptions):
        outcome = mesh_or_refusals(
            options,
            num_nodes=num_nodes,
            processes_per_node=processes_per_node,
            accelerator=accelerator,
            backend=backend,
            precision=precision,
            strategy=strategy_name,
        )
        if isinstance(outcome, MeshChoice):
            mesh = outcome
        else:
            for refusal in outcome:  # every rule the layout breaks, for check(); resolve raises the first
                report(refusal)
        if mesh is not None:
            options = mesh.options
            reasons["mesh"] = mesh.reason
            notes.extend(mesh.notes)

    if (
        fields.sync_batchnorm
        and world_size > 1
        and family.has_process_group
        and accelerator not in rules.sync_batchnorm_accelerators
    ):
        report(incompatible("sync-batchnorm-device", {"sync_batchnorm": True, "accelerator": accelerator}))
    metrics = _metric_placement(fields.metrics_store, accelerator_rule, backend, world_size, rules)
    reasons["metrics"] = metrics.explanation
    notes.extend(_advice(fields, accelerator_rule, family, world_size))

    if not fields.ok:
        return None
    normal_request = (
        request
        if fields.as_given or _already_normal(request, fields)
        else Request(**_normal_values(fields), notes=fields.notes)
    )
    if (fields.devices == "auto" or fields.num_nodes == "auto") and (facts.creates_processes or facts.launched):
        notes.append(
            _new_note(
                code="job-layout",
                level="info",
                message=(
                    f"inside a started job: {num_nodes} node(s) × {processes_per_node} process(es) as it started them "
                    f"({facts.detail}); this process joins it (launcher {launcher!r})"
                ),
            )
        )
    return _new_plan(
        request=normal_request,
        accelerator=accelerator,
        device_type=accelerator_rule.device_type,
        strategy=_new_strategy_choice(name=strategy_name, family=rule.family, options=options),
        devices=devices,
        physical_devices=_physical_devices(accelerator_rule, devices, env),
        num_nodes=num_nodes,
        processes_per_node=processes_per_node,
        world_size=world_size,
        launcher=launcher,
        cluster=cluster,
        process_group_backend=backend,
        precision=precision,
        metrics=metrics,
        notes=tuple(notes),
        reasons=LazyTexts(reasons),
        mesh=None if mesh is None else mesh.layout,
        rules=rules.plan_reference,
    )


# --------------------------------------------------------------------------------------------------
# Normalisation and the environment's own sanity


def _already_normal(request: Request, fields: _Fields) -> bool:
    """Whether the request holds the normalised values themselves (then it is its own normal form)."""
    return (
        request.accelerator is fields.accelerator
        and request.strategy is fields.strategy
        and request.devices is fields.devices
        and request.num_nodes is fields.num_nodes
        and type(request.precision) is str
        and request.precision == fields.precision  # the same name (written in another module: another object)
        and request.process_group_backend is fields.process_group_backend
        and request.cluster is fields.cluster
        and request.metrics_store is fields.metrics_store
        and request.sync_batchnorm is fields.sync_batchnorm
        and request.strategy_options is fields.strategy_options
        and request.select_usable_gpus is fields.select_usable_gpus
        and _same_items(request.notes, fields.notes)
    )


def _normal_values(fields: _Fields) -> dict[str, Any]:
    """The normalised fields by their `Request` names (each row's field), to build the normal request from."""
    return {row.name: getattr(fields, row.name) for row in REQUEST_FIELD_ROWS}


def _same_items(given: object, notes: tuple[Note, ...]) -> bool:
    """The very notes, in order (compared by identity: a value of any type may sit in a hand-made request)."""
    return type(given) is tuple and len(given) == len(notes) and all(map(operator.is_, given, notes))


_ENVIRONMENT_FACTS = tuple(attribute.name for attribute in attrs.fields(Environment))


def _plainly_valid(env: Environment) -> bool:
    """The common case, checked in one expression: every fact has its declared type and range."""
    cuda: object = env.cuda_device_count
    xla: object = env.xla_device_count
    cpus: object = env.cpu_count
    initialised: object = env.cuda_initialized
    mps: object = env.mps_available
    interactive: object = env.interactive
    usable: object = env.usable_cuda_devices
    variables: object = env.variables
    methods: object = env.start_methods
    packages: object = env.packages
    counts: object = env.device_counts
    return (
        type(cuda) is int
        and type(xla) is int
        and type(cpus) is int
        and 0 <= cuda <= MAX_DEVICES_PER_NODE
        and 0 <= xla <= MAX_DEVICES_PER_NODE
        and 1 <= cpus <= MAX_CPU_COUNT
        and type(initialised) is bool
        and type(mps) is bool
        and type(interactive) is bool
        and usable is None
        and isinstance(methods, tuple)
        and set(map(type, methods)) <= _STRINGS  # strings hash: the subset test below cannot raise
        and _START_METHODS.issuperset(methods)
        and isinstance(packages, frozenset)
        and set(map(type, packages)) <= _STRINGS
        and type(counts) is DeviceCounts
        and not counts  # downstream accelerators' counts: checked one by one by _check_environment
        and (
            variables.plain
            if isinstance(variables, FrozenMap)
            else isinstance(variables, Mapping)
            and all(type(key) is str and type(value) is str for key, value in env.variables.items())
        )
    )


_START_METHODS: frozenset[str] = frozenset(START_METHODS)
_STRINGS: frozenset[type] = frozenset({str})


def _check_environment(env: Environment, report: Report, rules: Rules) -> bool:
    """Each fact checked on its own, each problem reported (when `_plainly_valid` found one somewhere)."""
    ok = True

    def bad(field: str, value: object, reason: str) -> None:
        nonlocal ok
        ok = False
        report(
            InvalidRequest(
                field=f"Environment.{field}",
                value=value,
                reason=reason,
                fix="Fix the environment facts (or let trainplan.probe() gather them)",
            )
        )

    # The record's types say what each fact is; values written by hand at runtime may still be anything.
    facts: dict[str, object] = {name: getattr(env, name) for name in _ENVIRONMENT_FACTS}
    limits = (
        ("cuda_device_count", 0, MAX_DEVICES_PER_NODE),
        ("xla_device_count", 0, MAX_DEVICES_PER_NODE),
        ("cpu_count", 1, MAX_CPU_COUNT),
    )
    for field, minimum, maximum in limits:
        value = facts[field]
        if type(value) is not int or not minimum <= value <= maximum:
            bad(field, value, f"it must be a whole number from {minimum} to {maximum}")
    for field in ("cuda_initialized", "mps_available", "interactive"):
        if type(facts[field]) is not bool:
            bad(field, facts[field], "it must be True or False")
    methods = facts["start_methods"]
    if not isinstance(methods, tuple) or not all(method in START_METHODS for method in methods):
        bad("start_methods", methods, f"start methods are among {START_METHODS}")
    packages = facts["packages"]
    if not isinstance(packages, frozenset) or not all(isinstance(name, str) for name in packages):
        bad("packages", packages, "packages is a set of package names, e.g. {'deepspeed'}")
    variables = facts["variables"]
    if not isinstance(variables, Mapping) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in variables.items()
    ):
        bad("variables", variables, "environment variables map strings to strings")
    counts = facts["device_counts"]
    if not isinstance(counts, Mapping) or not all(
        isinstance(name, str) and type(number) is int and 0 <= number <= MAX_DEVICES_PER_NODE
        for name, number in counts.items()
    ):
        bad(
            "device_counts",
            counts,
            f"it maps a downstream accelerator's name to its visible devices (0 to {MAX_DEVICES_PER_NODE}), e.g. "
            "{'npu': 8}",
        )
    elif counts:
        # A count the rule set reads nowhere would be dropped silently (a typo in a plugin's name plans CPU).
        counted = tuple(name for name, rule in rules.accelerators.items() if rule.count_fact == SUPPLIED_COUNTS)
        for name in counts:
            if name not in counted:
                ok = False
                own = rules.accelerators.get(name)
                there = f"it counts {', '.join(map(repr, counted))} there" if counted else "it adds no accelerator"
                report(
                    InvalidRequest(
                        field="Environment.device_counts",
                        value=name,
                        reason=f"the rule set resolving counts no such accelerator through device_counts ({there})"
                        if own is None
                        else f"{name!r} is "
                        + ("counted by its own fact" if own.count_fact is not None else "always there")
                        + f", not through device_counts ({there})",
                        allowed=counted,
                        fix="Name an accelerator the rule set adds, or pass the rule set that adds it "
                        "(trainplan.resolve(request, env, rules=RULES))"
                        if own is None
                        else f"Write Environment({own.count_fact}=...) for {name!r}"
                        if own.count_fact is not None
                        else f"Leave {name!r} out: it is always there",
                    )
                )
    usable, count = facts["usable_cuda_devices"], facts["cuda_device_count"]
    if (
        usable is not None
        and isinstance(count, int)
        and (
            not isinstance(usable, tuple)
            or not all(
                isinstance(index, int) and not isinstance(index, bool) and 0 <= index < count for index in usable
            )
            or len(set(usable)) != len(usable)
        )
    ):
        bad("usable_cuda_devices", usable, "usable devices are distinct visible CUDA indices")
    return ok


def _normalise(request: Request, report: Report, rules: Rules) -> _Fields:
    """Every field in its normal form; each refused field is reported (in its row's check order) and takes its row's
    default, so that `check` lists every problem and `resolve` raises the first."""
    fields = _normal_fields(request, rules)  # the common case, at a glance
    return fields if fields is not None else _normalise_each(request, report, rules)


def _normalise_each(request: Request, report: Report, rules: Rules) -> _Fields:
    """`_normalise` field by field, through each field's row: its normaliser, the notes its spelling carries, and the
    default a refused value takes."""
    problems: list[TrainplanError] = []
    given_notes: object = request.notes
    notes: list[Note] = (
        [note for note in given_notes if isinstance(note, Note)] if isinstance(given_notes, tuple) else []
    )
    normal: dict[str, Any] = {}  # each value normalised by its row
    for row in IN_CHECK_ORDER:
        value = getattr(request, row.name)
        try:
            normal[row.name] = found = row.normalise(value, rules)
        except TrainplanError as error:
            problems.append(error)
            normal[row.name] = row.default(rules)
            found = REFUSED
        if row.notes is not None:
            notes.extend(row.notes(value, found, rules))
    for problem in problems:
        report(problem)
    return _new_fields(
        **normal,
        notes=tuple(notes),
        ok=not problems,
        as_given=False,  # `_already_normal` tells
    )


# The normal names, bound here: read a dozen times per call, each through the module would cost an attribute load.
_NORMAL_ACCELERATORS = normalise.NORMAL_ACCELERATORS
_NORMAL_PRECISIONS = normalise.NORMAL_PRECISIONS
_NORMAL_BACKENDS = normalise.NORMAL_BACKENDS
_NORMAL_CLUSTERS = normalise.NORMAL_CLUSTERS
_NORMAL_STORES = normalise.NORMAL_STORES


def _normal_fields(request: Request, rules: Rules) -> _Fields | None:
    """The fields of a request written in normal names (the common case), each checked at a glance; None sends the
    request through the normalisers field by field (`_normalise_each`), which fold spellings, note aliases and
    report refusals. Both give the same values: tests/unit/test_normal_fields.py compares them."""
    accelerator: object = request.accelerator
    strategy: object = request.strategy
    precision: object = request.precision
    backend: object = request.process_group_backend
    cluster: object = request.cluster
    store: object = request.metrics_store
    nodes: object = request.num_nodes
    devices: object = request.devices
    options: object = request.strategy_options
    batchnorm: object = request.sync_batchnorm
    usable: object = request.select_usable_gpus
    given_notes: object = request.notes
    if not (
        type(accelerator) is str
        and accelerator in _NORMAL_ACCELERATORS
        and accelerator not in rules.accelerator_alias_notes
        and type(strategy) is str
        and rules.strategy_spellings.get(strategy) == strategy
        and strategy not in rules.strategy_alias_notes
        and type(precision) is str
        and precision in _NORMAL_PRECISIONS
        and (backend is None or (type(backend) is str and backend in _NORMAL_BACKENDS))
        and type(cluster) is str
        and cluster in _NORMAL_CLUSTERS
        and type(store) is str
        and store in _NORMAL_STORES
        and (nodes == "auto" if type(nodes) is str else type(nodes) is int and 1 <= nodes <= MAX_NODES)
        and type(batchnorm) is bool
        and type(usable) is bool
        and type(given_notes) is tuple
    ):
        return None
    given_devices = devices
    if not (
        devices == "auto" if type(devices) is str else type(devices) is int and 0 < devices <= MAX_DEVICES_PER_NODE
    ):
        try:
            devices = normalise.devices(devices)  # indices, -1, or a refusal the field-by-field pass reports
        except TrainplanError:
            return None
    if options is not None:
        try:
            options = option_checks.strategy_options(options)  # the record itself, its values checked
        except TrainplanError:
            return None
    # A normal name is its own normal form: the request's own values are kept (equal to the normalisers' names), so
    # a request without notes whose devices needed no rewriting is its own normal form, known without comparing.
    return _new_fields(
        accelerator=accelerator,  # type: ignore[arg-type]  # a normal name, checked above
        strategy=strategy,  # type: ignore[arg-type]  # a normal name of the rule set, checked above
        devices=devices,  # type: ignore[arg-type]  # checked above, or normalised
        num_nodes=nodes,  # type: ignore[arg-type]  # checked above
        precision=precision,  # type: ignore[arg-type]  # a normal name, checked above
        process_group_backend=backend,  # type: ignore[arg-type]  # None or a normal name, checked above
        cluster=cluster,  # type: ignore[arg-type]  # a normal name, checked above
        metrics_store=store,  # type: ignore[arg-type]  # a normal name, checked above
        sync_batchnorm=batchnorm,
        select_usable_gpus=usable,
        strategy_options=options,
        notes=tuple([note for note in given_notes if isinstance(note, Note)]) if given_notes else (),
        ok=True,
        as_given=devices is given_devices and not given_notes,
    )


# --------------------------------------------------------------------------------------------------
# Accelerator and devices


def _visible(env: Environment, rule: AcceleratorRule) -> int:
    """How many devices of `rule`'s accelerator the facts count (its row names the fact; `device_counts`, the
    counts a framework supplies for the accelerators it adds, is read at the accelerator's name)."""
    fact = rule.count_fact
    if fact is None:
        return 1
    if fact == SUPPLIED_COUNTS:
        return env.device_counts.get(rule.name, 0)
    return int(getattr(env, fact))


def _available(env: Environment, rules: Rules) -> dict[AcceleratorKey, int]:
    """Device count per available accelerator, from the fact each row names (no fact: one place to run)."""
    found: dict[AcceleratorKey, int] = {}
    for name, rule in rules.accelerators.items():
        count = _visible(env, rule)
        if count > 0:
            found[name] = count
    return found


def _best_available(env: Environment, rules: Rules) -> str:
    return f"the best available of {_describe(_available(env, rules), rules)} (order: {rules.accelerator_order})"


_PLENTY = 1 << 12
"""Devices enough that no selection fails for want of them (`check` going on past an absent accelerator)."""


def _with_plenty(env: Environment, rules: Rules) -> Environment:
    """The facts with every accelerator of the rule set present: each row's count fact at plenty (a yes/no fact
    yes), the downstream ones' counts supplied, the usable-GPU probe forgotten."""
    facts: dict[str, Any] = {"usable_cuda_devices": None}
    supplied: dict[str, int] = {}
    for rule in rules.accelerators.values():
        fact = rule.count_fact
        if fact == SUPPLIED_COUNTS:
            supplied[rule.name] = _PLENTY
        elif fact is not None:
            facts[fact] = True if isinstance(_ENVIRONMENT_DEFAULTS[fact], bool) else _PLENTY
    return attrs.evolve(env, device_counts=supplied, **facts)


_ENVIRONMENT_DEFAULTS: dict[str, object] = {field.name: field.default for field in attrs.fields(Environment)}


def _rendered(text: Text) -> str:
    return text if isinstance(text, str) else text[0](*text[1])


def _describe(found: Mapping[AcceleratorKey, int], rules: Rules) -> str:
    parts: list[str] = []
    for rule in rules.accelerators_by_priority:
        name = rule.name
        if name not in found:
            continue
        if rule.count_fact is None:
            parts.append(name)
        else:
            count = found[name]
            parts.append(f"{name} ({count} device{'s' if count != 1 else ''})")
    alone = len(parts) == 1 and rules.accelerators[next(iter(found))].count_fact is None
    return "only " + parts[0] if alone else ", ".join(parts)


def _choose_accelerator(
    flag: AcceleratorFlag | CustomName, env: Environment, rules: Rules
) -> tuple[AcceleratorKey, Text]:
    # Each branch counts only the accelerators it asks about: every count is read again for a message when one is
    # written (the environment is a value, so the counts are the same).
    if flag == "auto":
        for rule in rules.accelerators_by_priority:
            fact = rule.count_fact  # `_visible`, inlined (the facts are checked)
            if (
                fact is None
                or (env.device_counts.get(rule.name, 0) if fact == SUPPLIED_COUNTS else getattr(env, fact)) > 0
            ):
                return rule.name, (_best_available, (env, rules))
        raise MissingRule(table="ACCELERATORS", key="an available accelerator")
    group = rules.accelerator_groups.get(flag)
    if group is not None:
        for member in group:
            member_rule = rules.accelerators.get(member)
            if member_rule is not None and _visible(env, member_rule) > 0:
                return member, f"accelerator={flag!r} means {member!r} here"
        members = " or ".join(name.upper() for name in group)
        raise Unavailable(
            requested=f"accelerator={flag!r}",
            available=_describe(_available(env, rules), rules),
            fix=f"Use accelerator='cpu' (or 'auto'), or run where a {members} GPU is visible",
        )
    name: AcceleratorKey = flag  # type: ignore[assignment]  # the normaliser folds aliases; groups are above
    rule = lookup(rules.accelerators, name, name="ACCELERATORS")
    if _visible(env, rule) <= 0:
        variable = rule.visibility_variable
        hidden = variable is not None and variable in env.variables
        hidden = hidden and env.variables.get(variable or "", "").strip() in ("", "-1")
        supplied = rule.count_fact == SUPPLIED_COUNTS
        raise Unavailable(
            requested=f"accelerator={name!r}",
            available=_describe(_available(env, rules), rules)
            + (f" ({variable} hides every GPU)" if hidden else "")
            + (f"; Environment.device_counts has no {name!r} devices" if supplied else ""),
            fix=f"Pass the count the device plugin sees, e.g. probe().with_device_counts({{{name!r}: 8}}), or use "
            "accelerator='auto'"
            if supplied
            else "Use accelerator='auto' to take the best available, or run where that hardware is visible",
        )
    return name, (str.format, ("asked for {!r} ({})", name, rule.description))


def _select_devices(
    rule: AcceleratorRule, spec: DevicesSpec, env: Environment
) -> tuple[tuple[int, ...], str, tuple[Note, ...]]:
    if not rule.takes_indices:
        return _counted_devices(spec, env)
    accelerator = rule.name
    total = _visible(env, rule)
    noun = f"{accelerator} device{'s' if total != 1 else ''}"
    if spec == "auto":
        interactive = rule.interactive_auto_devices
        if interactive is not None and env.interactive and total > interactive:
            note = _new_note(
                code="devices-interactive",
                level="info",
                message=(
                    f"devices='auto' uses {interactive} of {total} GPUs in an interactive session; ask for "
                    f"devices={total} (with strategy='ddp_notebook') to use them all"
                ),
            )
            return tuple(range(interactive)), "one GPU: 'auto' in an interactive session", (note,)
        if rule.device_counts == "one":
            return (0,), f"the one {accelerator.upper()} device", ()
        return (
            tuple(range(total)),
            f"'auto': all {total} visible {noun}",
            (_new_note(code="devices-auto", level="info", message=f"devices='auto' chose {total} {noun}"),),
        )
    if spec == -1:
        return tuple(range(total)), f"-1: all {total} visible {noun}", ()
    if isinstance(spec, int):
        if rule.device_counts == "one" and spec != 1:
            raise Unavailable(
                requested=f"devices={spec} on accelerator={accelerator!r}",
                available=rule.counts_why,
                fix="Use devices=1, or accelerator='cpu' with several processes",
            )
        if rule.device_counts == "one_or_all" and spec not in (1, total):
            raise InvalidRequest(
                field="devices",
                value=spec,
                reason=rule.counts_why.format(total=total, count=spec),
                fix=f"Write devices=1, devices={total} (or -1), or a single index such as devices=[0]",
            )
        if spec > total:
            raise Unavailable(
                requested=f"devices={spec} on accelerator={accelerator!r}",
                available=f"{total} visible {noun}",
                fix=f"Ask for at most devices={total} (or devices=-1 for all)",
            )
        return tuple(range(spec)), f"the first {spec} of {total} visible {noun}", ()
    missing = [index for index in spec if index >= total]
    if missing:
        raise Unavailable(
            requested=f"device index {missing[0]} on accelerator={accelerator!r}",
            available=f"{total} visible {noun} (indices 0 to {total - 1}"
            + ("" if rule.visibility_variable is None else f"; indices count after {rule.visibility_variable}")
            + ")",
            fix=f"Name indices below {total}, e.g. devices={list(range(min(len(spec), total)))}",
        )
    if rule.device_counts == "one_or_all" and len(spec) != 1:
        raise InvalidRequest(
            field="devices",
            value=list(spec),
            reason=f"{accelerator.upper()} takes one device index, or a count (1 or all)",
            fix=f"Write devices=[{spec[0]}] for one device, or devices={total} for all",
        )
    return spec, f"the visible indices asked for, {list(spec)}", ()


def _choose_num_nodes(asked: NumNodes, facts: ClusterFacts) -> tuple[int, str]:
    """`num_nodes`: as asked, or for 'auto' the nodes of the started job this process belongs to (else 1)."""
    if asked != "auto":
        return asked, f"asked for num_nodes={asked}"
    if facts.creates_processes or facts.launched:
        nodes = _job_nodes(facts)
        if nodes is not None:
            return nodes, f"'auto': the {nodes} node(s) the job started ({facts.detail})"
    return 1, "'auto': this machine alone"


def _job_nodes(facts: ClusterFacts) -> int | None:
    if facts.num_nodes is not None:
        return facts.num_nodes
    world, per_node = facts.world_size, facts.processes_per_node
    if world is not None and per_node is not None and world % per_node == 0:
        return world // per_node
    return None


def _job_processes_per_node(facts: ClusterFacts, num_nodes: int, nodes_known: bool) -> int:
    """The processes per node a started job has, or `job-layout-unknown` when it does not say."""
    if facts.processes_per_node is not None:
        return facts.processes_per_node
    if nodes_known and facts.world_size is not None and facts.world_size % num_nodes == 0:
        return facts.world_size // num_nodes
    world = facts.world_size if facts.world_size is not None else "?"
    raise incompatible("job-layout-unknown", {}, cluster=facts.started_by, world_size=world, detail=facts.detail)


def _select_devices_in_job(
    rule: AcceleratorRule,
    spec: DevicesSpec,
    env: Environment,
    facts: ClusterFacts,
    num_nodes: int,
    nodes_known: bool,
) -> tuple[tuple[int, ...], str, tuple[Note, ...]]:
    """Devices inside a started job: 'auto' takes the job's processes per node (torchrun's convention on GPUs:
    local rank i drives visible device i); explicit indices that the job's launcher selected are those GPUs."""
    started = facts.creates_processes or facts.launched
    if not started or not rule.job_layout:
        return _select_devices(rule, spec, env)
    if spec == "auto":
        per_node = _job_processes_per_node(facts, num_nodes, nodes_known)
        if rule.count_fact is None:
            return tuple(range(per_node)), f"'auto' inside a started job: its {per_node} process(es) on this node", ()
        visible = _visible(env, rule)
        if per_node > visible:
            raise incompatible(
                "job-gpus",
                {},
                cluster=facts.started_by,
                processes_per_node=per_node,
                visible=visible,
            )
        return (
            tuple(range(per_node)),
            f"'auto' inside a started job: its {per_node} process(es) on this node, local rank i on visible GPU i",
            (),
        )
    if rule.visibility_variable is None or not isinstance(spec, tuple):
        return _select_devices(rule, spec, env)
    selection, variable = _job_selection(env, rule.visibility_variable)
    if selection is None or spec != selection:
        if variable == SELECTED_DEVICES_VARIABLE and selection is not None:
            raise incompatible(
                "job-device-selection",
                {"devices": list(spec)},
                selected=list(selection),
                variable=f"{variable}={','.join(map(str, selection))}",
            )
        return _select_devices(rule, spec, env)
    if rule.count_fact is None or len(spec) > _visible(env, rule):
        return _select_devices(rule, spec, env)  # the facts disagree: report the indices as usual
    renumbered = tuple(range(len(spec)))
    note = _new_note(
        code="job-devices",
        level="info",
        message=(
            f"devices={list(spec)} are the GPUs this job was started on ({variable}); "
            f"inside it they are visible as {', '.join(f'{rule.device_type}:{index}' for index in renumbered)}"
        ),
    )
    return renumbered, f"the GPUs {list(spec)} the job's launcher selected, visible here as {list(renumbered)}", (note,)


def _job_selection(env: Environment, visibility: str) -> tuple[tuple[int, ...] | None, str]:
    """The device indices a job's launcher selected: trainplan's own variable, else an all-integer visibility
    variable (what `CUDA_VISIBLE_DEVICES=0,2 torchrun ...` selected)."""
    for variable in (SELECTED_DEVICES_VARIABLE, visibility):
        raw = env.variables.get(variable)
        if raw is None:
            continue
        numbers = [whole_number(part.strip()) for part in raw.split(",")]
        if all(number is not None for number in numbers):
            return tuple(number for number in numbers if number is not None), variable
        if variable == SELECTED_DEVICES_VARIABLE:
            raise InvalidRequest(
                field=f"environment variable {variable}",
                value=raw,
                reason="it is not a comma-separated list of device indices",
                fix=f"Unset {variable} (trainplan's launchers set it), or set it to indices such as 0,2",
            )
    return None, ""


def _physical_devices(rule: AcceleratorRule, devices: tuple[int, ...], env: Environment) -> tuple[str, ...]:
    """Which physical GPU each visible index is, as the visibility variable names it (the index when unset)."""
    if rule.visibility_variable is None or rule.count_fact is None:
        return ()
    entries = visible_entries(env.variables.get(rule.visibility_variable), _visible(env, rule))
    return tuple(entries[index] if index < len(entries) else str(index) for index in devices)


def _select_usable_devices(
    rule: AcceleratorRule, spec: DevicesSpec, env: Environment
) -> tuple[tuple[int, ...], str, tuple[Note, ...]]:
    """Devices for `select_usable_gpus` (the `auto_select_gpus` bridge): the first usable visible GPUs."""
    if not rule.probes_usable:
        raise incompatible("usable-needs-cuda", {"select_usable_gpus": True, "accelerator": rule.name})
    if isinstance(spec, tuple):
        raise incompatible("usable-with-indices", {"select_usable_gpus": True, "devices": list(spec)})
    usable = env.usable_cuda_devices
    if usable is None:
        raise Unavailable(
            requested="usable GPUs (select_usable_gpus / auto_select_gpus)",
            available="no usability facts (the environment was not probed for usable GPUs)",
            fix=(
                "Resolve with trainplan.resolve(request), which probes them when asked, or pass "
                "Environment(usable_cuda_devices=...); better: devices=find_usable_cuda_devices(n)"
            ),
        )
    total = env.cuda_device_count
    usable_set = set(usable)
    busy = [index for index in range(total) if index not in usable_set]
    if isinstance(spec, int) and spec != -1:
        wanted = spec
    else:
        interactive = rule.interactive_auto_devices
        auto_few = spec == "auto" and env.interactive and interactive is not None and len(usable) > interactive
        wanted = interactive if auto_few and interactive is not None else len(usable)
    if wanted == 0 or len(usable) < wanted:
        raise Unavailable(
            requested=f"{wanted if wanted else 'any'} usable GPU(s)",
            available=f"{len(usable)} usable of {total} visible (busy: {busy or 'none'})",
            fix="Ask for fewer devices, wait for the busy GPUs, or run where more are free",
        )
    chosen = tuple(sorted(usable)[:wanted])
    return chosen, f"the first {wanted} usable of {total} visible GPUs (busy: {busy or 'none'})", ()


def _counted_devices(spec: DevicesSpec, env: Environment) -> tuple[tuple[int, ...], str, tuple[Note, ...]]:
    """`devices` on an accelerator without indices (CPU processes): a count of processes."""
    if spec == "auto":
        return (0,), "'auto' on CPU: one process", ()
    if isinstance(spec, tuple):
        raise InvalidRequest(
            field="devices",
            value=list(spec),
            reason="CPU processes have no device indices",
            fix=f"Write the number of processes instead, e.g. devices={len(spec)}",
        )
    if spec == -1:
        raise InvalidRequest(
            field="devices",
            value=-1,
            reason="on CPU, 'all devices' has no meaning: devices counts the processes to start",
            fix=f"Write the number of processes, e.g. devices=2 (this machine has {env.cpu_count} CPUs)",
        )
    notes: tuple[Note, ...] = ()
    if spec > env.cpu_count:
        notes = (
            _new_note(
                code="cpu-oversubscribed",
                level="warning",
                message=f"{spec} CPU processes on {env.cpu_count} CPU(s): they will compete for cores",
            ),
        )
    return tuple(range(spec)), f"{spec} CPU process(es)", notes


# --------------------------------------------------------------------------------------------------
# Strategy


def _choose_strategy(
    flag: StrategyFlag | CustomName,
    accelerator: AcceleratorKey,
    devices: tuple[int, ...],
    num_nodes: int,
    env: Environment,
    options: StrategyOptions | None,
    rules: Rules,
) -> tuple[StrategyKey, Text]:
    if flag != "auto":
        return flag, (str.format, ("asked for {!r}", flag))
    if options is not None:
        for family, name in rules.auto_for_options.items():
            if isinstance(options, OPTION_TYPES[family]):
                return name, f"'auto' with {type(options).__name__}"
    count, interactive = len(devices), env.interactive
    for row in rules.auto_strategies:
        if (  # whether the row holds, written out: a call per row would cost more than the test
            (row.accelerators is None or accelerator in row.accelerators)
            and count >= row.min_devices
            and (row.max_devices is None or count <= row.max_devices)
            and num_nodes >= row.min_nodes
            and (row.interactive is None or row.interactive == interactive)
        ):
            return row.strategy, (_auto_reason, (row, num_nodes, count))
    raise MissingRule(table="AUTO_STRATEGIES", key=(accelerator, len(devices), num_nodes, env.interactive))


def _auto_reason(row: AutoStrategyRule, num_nodes: int, devices: int) -> str:
    return row.reason.format(num_nodes=num_nodes, devices=devices)


def _strategy_problems(
    name: StrategyKey,
    family: FamilyRule,
    accelerator_rule: AcceleratorRule,
    devices: tuple[int, ...],
    num_nodes: int,
    env: Environment,
    chosen_by: StrategyOptions | None = None,
) -> Iterator[TrainplanError]:
    """`chosen_by`: the options record that made strategy='auto' choose `name` (the user wrote no strategy)."""
    accelerator = accelerator_rule.name
    if accelerator not in family.accelerators and chosen_by is not None:
        supported = " or ".join(repr(item) for item in sorted(family.accelerators))
        yield incompatible(
            "options-accelerator",
            {"strategy_options": chosen_by, "accelerator": accelerator},
            options=type(chosen_by).__name__,
            strategy=name,
            supported=supported,
            why=family.why_not.get(accelerator, "the strategy does not support it"),
        )
    elif accelerator not in family.accelerators:
        supported = " or ".join(repr(item) for item in sorted(family.accelerators))
        # The family's own fix (the XLA families point to XLA hardware), else the accelerator's, else the generic one.
        fix = (
            family.accelerator_fix
            or accelerator_rule.strategy_fix
            or f"Use accelerator='cuda' on a machine with NVIDIA GPUs, or strategy='auto' for {accelerator!r}"
        )
        yield incompatible(
            "strategy-accelerator",
            {"strategy": name, "accelerator": accelerator},
            supported=supported,
            why=family.why_not.get(accelerator, "the strategy does not support it"),
            fix=fix,
        )
    if family.requires_package is not None and family.requires_package not in env.packages:
        yield incompatible("strategy-package", {"strategy": name}, package=family.requires_package)
    if family.max_nodes is not None and num_nodes > family.max_nodes:
        yield incompatible("strategy-nodes", {"strategy": name, "num_nodes": num_nodes})
    if family.max_devices_per_node is not None and len(devices) > family.max_devices_per_node:
        yield incompatible("strategy-device-count", {"strategy": name, "devices": list(devices)}, count=len(devices))


def _merge_options(
    name: StrategyKey,
    rule: StrategyRule,
    family: FamilyRule,
    given: StrategyOptions | None,
    rules: Rules = BUILTIN_RULES,
) -> StrategyOptions | None:
    """The options in force: the request's record (or the defaults) with the strategy's preset merged in, which
    options were written kept as the request's; then what each option row needs of the others (`rules.options`)."""
    options_type = OPTION_TYPES.get(family.family)
    if options_type is None:
        if given is not None:
            raise incompatible(
                "strategy-options",
                {"strategy": name, "strategy_options": given},
                given=type(given).__name__,
                expected="no options",
                fix="Remove strategy_options",
            )
        return None
    if given is not None and not isinstance(given, options_type):
        raise incompatible(
            "strategy-options",
            {"strategy": name, "strategy_options": given},
            given=type(given).__name__,
            expected=options_type.__name__,
            fix=f"Pass {options_type.__name__}(...)",
        )
    defaults = _DEFAULT_OPTIONS[options_type]
    merged: StrategyOptions = given if given is not None else defaults
    for option, preset in rule.preset.items():
        current = option_value(merged, option, preset)  # an added option nobody wrote takes the preset's value
        # An option written explicitly that the preset name contradicts is a conflict, even when it equals the
        # default; one left at its default takes the preset's value.
        if current != preset and (option in merged.given or current != option_value(defaults, option, preset)):
            raise incompatible(
                "strategy-preset",
                {"strategy": name, "strategy_options": given},
                field=option,
                preset=preset,
                given=current,
                base=family.base_strategy,
            )
        merged = _with_option(merged, option, preset)
    rows = rules.options.get(family.family, ())
    for row in rows:
        needs = row.needs
        if needs is None or option_value(merged, row.name, row.default) == row.default:
            continue
        held = {other.name: option_value(merged, other.name, other.default) for other in rows}
        if any(held[needed] != value for needed, value in needs.values.items()):
            raise incompatible(
                needs.refusal,
                {"strategy": name, "strategy_options": merged},
                **{needed: held[needed] for needed in needs.values},
            )
    return merged


_DEFAULT_OPTIONS: Mapping[type[StrategyOptions], StrategyOptions] = {
    options_type: options_type() for options_type in OPTION_TYPES.values()
}
"""Each options record with every option at its default (records are values: one of each serves every plan)."""


def _with_option(options: StrategyOptions, option: str, value: object) -> StrategyOptions:
    """`options` with `option` set to `value` (a field, or an entry of `extra`), which options were written kept."""
    return with_options(options, {option: value})


def _choose_launcher(
    name: StrategyKey,
    rule: StrategyRule,
    family: FamilyRule,
    facts: ClusterFacts,
    env: Environment,
    accelerator: AcceleratorRule,
    rules: Rules,
) -> LauncherName:
    launcher = rule.launcher
    launcher_rule = lookup(rules.launchers, launcher, name="LAUNCHERS")
    override = launcher_rule.in_started_job
    if (facts.launched or facts.creates_processes) and family.has_process_group and override is not None:
        # A process of a started job joins it; it never starts more (spawn and fork strategies were turned
        # into their script counterparts above).
        return override
    if env.interactive and not launcher_rule.interactive_compatible:
        instead = rules.fork_strategy_for.get(name)
        error = incompatible(
            "interactive-launcher",
            {"strategy": name},
            launcher_description=launcher_rule.description,
            instead=instead or "",
        )
        if instead is None:
            error = Incompatible(
                values=error.values,
                rule=error.rule,
                reason=error.reason,
                fix=f"Run the code as a script: {name!r} has no notebook-compatible variant",
            )
        raise error
    if launcher_rule.forks:
        instead = rules.spawn_strategy_for.get(name)
        blocked_by = accelerator.fork_blocked_by
        refusal: Incompatible | None = None
        if launcher_rule.start_method not in env.start_methods:
            refusal = incompatible(
                "fork-unavailable",
                {"strategy": name},
                methods=", ".join(env.start_methods) or "no start method",
                instead=instead or "",
            )
        elif blocked_by is not None and getattr(env, blocked_by):
            refusal = incompatible("fork-after-cuda", {"strategy": name}, instead=instead or "")
        if refusal is not None and instead is None:
            # A strategy of an extended rule set without a spawn counterpart: there is no name to offer.
            refusal = Incompatible(
                values=refusal.values,
                rule=refusal.rule,
                reason=refusal.reason,
                fix=f"{name!r} has no spawn-started variant in this rule set: run the code as a script, or give it "
                "one (Rules.extend(spawn_counterparts=...))",
            )
        if refusal is not None:
            raise refusal
    return launcher


def _place_in_cluster(
    facts: ClusterFacts,
    asked: Mapping[str, object],
    num_nodes: int,
    processes_per_node: int,
    world_size: int,
    launcher: LauncherName,
    rules: Rules,
) -> ClusterInfo:
    values = asked  # the layout the request wrote: a refusal of the job itself names no field nobody set
    cluster_rule = lookup(rules.clusters, facts.kind, name="CLUSTERS")
    limit = cluster_rule.max_processes_per_node
    if limit is not None and processes_per_node > limit:
        raise incompatible(
            "cluster-one-process-per-node", values, cluster=facts.kind, processes_per_node=processes_per_node
        )
    if facts.creates_processes or facts.launched:
        layout = {"num_nodes": num_nodes, "processes_per_node": processes_per_node, "world_size": world_size}
        stated = (
            (facts.world_size is not None and facts.world_size != world_size)
            or (facts.processes_per_node is not None and facts.processes_per_node != processes_per_node)
            or (facts.num_nodes is not None and facts.num_nodes != num_nodes)
        )
        if stated:
            suggestion = ""
            if facts.processes_per_node is not None and facts.num_nodes is not None:
                suggestion = (
                    f", or ask for the layout it gave: devices={facts.processes_per_node}, num_nodes={facts.num_nodes}"
                )
            elif facts.world_size is not None and facts.world_size % num_nodes == 0:
                suggestion = f", or ask for devices={facts.world_size // num_nodes} per node"
            hint = facts.launch_hint.format(**layout)
            started = f"{facts.world_size if facts.world_size is not None else '?'} processes"
            if facts.num_nodes is not None and facts.processes_per_node is not None:
                started += f" as {facts.num_nodes} node(s) × {facts.processes_per_node}"
            raise incompatible(
                "cluster-world-size",
                values,
                cluster=facts.started_by,
                started=started,
                detail=facts.detail,
                nodes=num_nodes,
                processes_per_node=processes_per_node,
                world_size=world_size,
                fix=f"Start the job with {hint}{suggestion}",
            )
    node_rank = facts.node_rank  # None inside a job that states none (MPI, which may map ranks round-robin)
    if node_rank is None and cluster_rule.node_rank_in_blocks and facts.global_rank is not None:
        node_rank = facts.global_rank // processes_per_node
    elif node_rank is None and not (facts.creates_processes or facts.launched):
        node_rank = 0
    if node_rank is not None and node_rank >= num_nodes:
        variable = cluster_rule.node_rank_variable
        raise incompatible(
            "cluster-rank-range",
            values,
            what=variable,
            value=node_rank,
            limit_name="num_nodes",
            limit=num_nodes,
            fix=f"Set num_nodes to the number of machines (more than {node_rank}), or fix {variable}",
        )
    if facts.local_rank is not None and facts.local_rank >= processes_per_node:
        raise incompatible(
            "cluster-rank-range",
            values,
            what="local rank",
            value=facts.local_rank,
            limit_name="processes per node",
            limit=processes_per_node,
            fix=f"Ask for devices={facts.local_rank + 1} or more per node, or start fewer processes per node",
        )
    address = facts.main_address
    if address is None:
        if num_nodes > 1:
            raise incompatible(
                "cluster-main-address",
                values,
                cluster=facts.started_by,
                nodes=num_nodes,
                detail=facts.detail,
                fix=facts.main_address_fix,
            )
        address = "127.0.0.1"
    global_rank, local_rank = facts.global_rank, facts.local_rank
    launcher_rule = lookup(rules.launchers, launcher, name="LAUNCHERS")
    in_this_process = not launcher_rule.starts_processes and not launcher_rule.joins
    if in_this_process and world_size == 1 and global_rank is None:
        global_rank, local_rank = 0, 0
    return _new_cluster_info(
        kind=facts.kind,
        creates_processes=facts.creates_processes,
        main_address=address,
        main_port=facts.main_port,
        node_rank=node_rank,
        global_rank=global_rank,
        local_rank=local_rank,
    )


# --------------------------------------------------------------------------------------------------
# Backend, precision, metrics


def _choose_backend(
    requested: BackendKey | None,
    family: FamilyRule,
    strategy: StrategyKey,
    accelerator_rule: AcceleratorRule,
    rules: Rules,
) -> BackendKey | None:
    accelerator = accelerator_rule.name
    if not family.has_process_group:
        if requested is not None:
            raise incompatible("backend-without-group", {"strategy": strategy, "process_group_backend": requested})
        return None
    default = accelerator_rule.default_backend
    if requested is None:
        return default
    rule = lookup(rules.backends, requested, name="BACKENDS")
    if accelerator not in rule.accelerators:
        raise incompatible(
            "backend-accelerator",
            {"process_group_backend": requested, "accelerator": accelerator},
            backend=requested,
            why=rule.why_not.get(accelerator, "it does not support this device"),
            instead=default,
        )
    return requested


def _choose_precision(
    asked: PrecisionKey,
    accelerator: AcceleratorKey,
    strategy: StrategyKey,
    family: FamilyRule,
    env: Environment,
    notes: list[Note],
    rules: Rules,
) -> PrecisionKey:
    rule = lookup(rules.precisions, asked, name="PRECISIONS")
    precision = asked
    if accelerator in rule.fallback:
        precision = rule.fallback[accelerator]
        notes.append(
            _new_note(
                code="precision-fallback",
                level="warning",
                message=(
                    f"precision={asked!r} is not supported on {accelerator!r} ({rule.fallback_why[accelerator]}); "
                    f"using {precision!r} instead"
                ),
            )
        )
        rule = lookup(rules.precisions, precision, name="PRECISIONS")
    if accelerator not in rule.accelerators:
        raise incompatible(
            "precision-accelerator",
            {"precision": asked, "accelerator": accelerator},
            why=rule.why_not.get(accelerator, "it is not supported there"),
            instead=rule.instead.get(accelerator, rules.default_precision),
        )
    if precision not in family.precisions:
        # Offer only what runs as itself or as another accepted precision here (16-mixed runs as bf16-mixed on CPU).
        accepted = (
            name
            for name in family.precisions
            if name in rules.precisions and rules.precisions[name].fallback.get(accelerator, name) in family.precisions
        )
        supported = ", ".join(repr(item) for item in sorted(accepted))
        runs_as = "" if precision == asked else f" (which runs as {precision!r} on {accelerator!r})"
        raise incompatible(
            "precision-strategy", {"precision": asked, "strategy": strategy}, supported=supported, runs_as=runs_as
        )
    if rule.requires_package is not None and rule.requires_package not in env.packages:
        raise incompatible("precision-package", {"precision": asked}, package=rule.requires_package)
    return precision


def _metric_placement(
    store: MetricsStore, accelerator: AcceleratorRule, backend: BackendKey | None, world_size: int, rules: Rules
) -> MetricPlacement:
    device_type = accelerator.device_type
    where = "on the CPU" if store == HOST_METRICS_STORE or accelerator.host else f"on the {device_type} device"
    if world_size == 1 or backend is None:
        return _new_metric_placement(
            default_store=store,
            device_type=device_type,
            reduces_on="nowhere",
            cpu_values_move_for_reduction=False,
            explanation=f"logged tensors are kept {where}; one process, so nothing is reduced",
        )
    rule = lookup(rules.backends, backend, name="BACKENDS")
    if rule.needs_device_tensors:
        moves = not accelerator.host
        return _new_metric_placement(
            default_store=store,
            device_type=device_type,
            reduces_on="device",
            cpu_values_move_for_reduction=moves,
            explanation=(
                f"logged tensors are kept {where}; {backend} reduces {device_type} tensors only, so CPU-stored "
                f"values are moved to the {device_type} device for each reduction and back"
            ),
        )
    return _new_metric_placement(
        default_store=store,
        device_type=device_type,
        reduces_on="where_stored",
        cpu_values_move_for_reduction=False,
        explanation=f"logged tensors are kept {where}; {backend} reduces them where they are stored",
    )


def place_metric(
    plan: Plan, kind: MetricKind = "tensor", store_on_cpu: bool | None = None, rules: Rules = BUILTIN_RULES
) -> MetricSlot:
    """Where one logged metric lives and is reduced under `plan`.

    `store_on_cpu=None` takes the plan's default store. A stateful metric object (torchmetrics
    `Metric`) kept on CPU cannot be reduced by a backend that takes device tensors only (NCCL):
    that is refused with `Incompatible`, since the metric reduces its own states where they live.
    """
    if kind not in ("tensor", "stateful"):
        raise InvalidRequest(
            field="kind", value=kind, reason="it is not a kind of metric", allowed=("tensor", "stateful")
        )
    if store_on_cpu is not None and not isinstance(store_on_cpu, bool):
        raise InvalidRequest(
            field="store_on_cpu",
            value=store_on_cpu,
            reason="it must be True, False or None",
            allowed=(True, False, None),
        )
    metrics = plan.metrics
    on_cpu = (metrics.default_store == HOST_METRICS_STORE) if store_on_cpu is None else store_on_cpu
    device = plan.device_for(0) if plan.processes_per_node > 0 else HOST_DEVICE
    row = rules.accelerators.get(plan.accelerator)
    host = row is not None and row.host  # a downstream accelerator (its rules elsewhere) is never the host's CPUs
    if host:
        on_cpu = True
    store_device = HOST_DEVICE if on_cpu else device
    if metrics.reduces_on == "nowhere":
        return MetricSlot(
            store_device=store_device, reduce_device=None, moves_for_reduction=False, explanation=metrics.explanation
        )
    if metrics.reduces_on == "device" and on_cpu and not host:
        if kind == "stateful":
            raise incompatible(
                "metric-stateful-cpu",
                {"kind": kind, "store_on_cpu": True, "process_group_backend": plan.process_group_backend},
                backend=plan.process_group_backend,
                device_type=metrics.device_type,
            )
        return MetricSlot(
            store_device=HOST_DEVICE,
            reduce_device=device,
            moves_for_reduction=True,
            explanation=f"kept on the CPU; moved to {device} for each reduction ({plan.process_group_backend} needs "
            f"{metrics.device_type} tensors) and back",
        )
    return MetricSlot(
        store_device=store_device,
        reduce_device=store_device,
        moves_for_reduction=False,
        explanation=f"kept and reduced on {store_device}",
    )


def _advice(
    fields: _Fields,
    accelerator: AcceleratorRule,
    family: FamilyRule,
    world_size: int,
) -> list[Note]:
    notes: list[Note] = []
    if fields.sync_batchnorm and (world_size == 1 or not family.has_process_group):
        notes.append(
            _new_note(
                code="sync-batchnorm-no-effect",
                level="warning",
                message="sync_batchnorm=True has no effect: batch statistics are synchronised across processes, "
                "and this plan has one",
            )
        )
    if fields.metrics_store == HOST_METRICS_STORE and accelerator.host:
        notes.append(
            _new_note(
                code="metrics-store-cpu", level="info", message="metrics_store='cpu' changes nothing on a CPU run"
            )
        )
    return notes


__all__ = ["check", "incompatible", "place_metric", "resolve", "resolve_uncached"]
