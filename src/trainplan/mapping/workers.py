"""One plan, one world: what a plan's workers see, and what may start them (pure).

A launcher (`tp.launch`, `trainplan launch`, an emitted torchrun line) starts a plan's workers with the
environment `worker_environment` writes; inside each, the plan is `worker_view(plan, ...)`: the same layout,
launcher `external`, this worker's ranks, and on CUDA the node's GPUs renumbered as torchrun does (the
selected GPUs made visible through CUDA_VISIBLE_DEVICES, local rank i driving `cuda:i`). Resolving the
plan's request inside the worker gives the same layout (a property test holds the two together).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import attrs

from trainplan.parse.plan_json import request_to_dict
from trainplan.resolve.cluster import ClusterFacts, detect
from trainplan.resolve.refusal import incompatible
from trainplan.resolve.visible import narrowed_visible_devices
from trainplan.rules import (
    ACCELERATORS,
    BUILTIN_RULES,
    DEFAULT_PROCESS_GROUP_TIMEOUT,
    LAUNCHED_MARKER,
    LAUNCHED_WORKERS,
    LAUNCHERS,
    PLAN_VARIABLE,
    SELECTED_DEVICES_VARIABLE,
    SERVED_START_METHODS,
    UNNAMED_RULES,
    LauncherRule,
    ProcessGroupTimeout,
    Rules,
    job_variables,
    lookup,
)
from trainplan.spec.errors import ClusterEnvironmentError, Incompatible, TrainplanError
from trainplan.spec.names import LauncherName, StartMethod
from trainplan.spec.notes import Note
from trainplan.spec.options import option_value
from trainplan.spec.plan import Plan
from trainplan.spec.request import Request

STARTING_LAUNCHERS: tuple[LauncherName, ...] = tuple(name for name, rule in LAUNCHERS.items() if rule.trainplan_starts)
"""Launchers whose workers trainplan's launcher starts from this process (the rows say which)."""


def launcher_rule(plan: Plan) -> LauncherRule:
    """The row of the plan's launcher: whether it starts processes, joins a started world, who starts them."""
    return lookup(LAUNCHERS, plan.launcher, name="LAUNCHERS")


def started_by_another_launcher(plan: Plan) -> bool:
    """The plan's workers are started by a launcher that is not trainplan's, and not yet (torch_xla's): this
    process can neither start them nor join them."""
    rule = launcher_rule(plan)
    return rule.starts_processes and not rule.trainplan_starts


def visibility_variable(plan: Plan) -> str | None:
    """The variable through which a launcher hands each node its selected devices (CUDA_VISIBLE_DEVICES), from
    the accelerator's row; None where devices are not selected that way (a downstream accelerator's: its workers
    bind the plan's device strings, `Rules.extend` refuses a visibility variable for one)."""
    rule = ACCELERATORS.get(plan.accelerator)
    return None if rule is None else rule.visibility_variable


def worker_start_method(plan: Plan, available: Sequence[str]) -> StartMethod | None:
    """The multiprocessing start method this process uses for the plan's workers: the launcher's served method
    (`rules.SERVED_START_METHODS`: a forkserver for spawn) where the platform offers it (`available`, as
    `multiprocessing.get_all_start_methods()` lists them), else the launcher's own; None for a launcher that
    starts no multiprocessing workers."""
    method = LAUNCHERS[plan.launcher].start_method
    if method is None:
        return None
    served = SERVED_START_METHODS.get(plan.launcher)
    return served if served is not None and served in available else method


def process_group_timeout(plan: Plan, rules: Rules = BUILTIN_RULES) -> int:
    """Seconds a collective waits for its peers: the option of the plan's family that is the process group's timeout
    (its row in `rules` says so: `ProcessGroupTimeout`), else the default."""
    options = plan.strategy.options
    for row in rules.options.get(plan.strategy.family, ()):
        if isinstance(row.torch, ProcessGroupTimeout) and options is not None:
            value = option_value(options, row.name, row.default)
            return value if isinstance(value, int) else DEFAULT_PROCESS_GROUP_TIMEOUT
    return DEFAULT_PROCESS_GROUP_TIMEOUT


def global_rank_of(plan: Plan, local_rank: int) -> int:
    """The global rank of local rank `local_rank` on this plan's node."""
    # Only for workers trainplan starts itself: such a plan always knows its node (0, or NODE_RANK).
    return (plan.cluster.node_rank or 0) * plan.processes_per_node + local_rank


def torchrun_variables(plan: Plan, *, rank: int, local_rank: int, port: int) -> dict[str, str]:
    """torchrun's variables for one process of the plan's world (what env:// scripts and frameworks read): every
    variable of the launched workers' schema (`rules.LAUNCHED_WORKERS`), which is what a worker reads back."""
    facts = _worker_facts(plan, rank=rank, local_rank=local_rank, port=port)
    return {
        name: lookup(facts, fact, name="the facts a launcher writes")
        for fact, source in job_variables(LAUNCHED_WORKERS.schema)
        for name in source.names
    }


def _worker_facts(plan: Plan, *, rank: int, local_rank: int, port: int) -> dict[str, str]:
    """The facts of one worker's place in the plan's world, as the text of its variables."""
    return {
        "world_size": str(plan.world_size),
        "processes_per_node": str(plan.processes_per_node),
        "global_rank": str(rank),
        "local_rank": str(local_rank),
        "node_rank": str(plan.cluster.node_rank or 0),  # a plan trainplan launches always knows its node
        "main_address": plan.cluster.main_address,
        "main_port": str(port),
    }


def worker_environment(
    plan: Plan,
    *,
    local_rank: int,
    main_port: int,
    visible_devices: str | None,
    visible_count: int,
    launcher: str,
    plan_json: str | None = None,
) -> dict[str, str]:
    """The environment a launcher gives worker `local_rank` of this node: torchrun's variables (so env://
    scripts run unchanged), the plan as JSON (`plan_json`, when the caller serialised it once for every
    worker), trainplan's marker and, on CUDA, the node's selected GPUs through CUDA_VISIBLE_DEVICES (narrowed
    from the launcher's own `visible_devices`)."""
    rank = global_rank_of(plan, local_rank)
    facts = _worker_facts(plan, rank=rank, local_rank=local_rank, port=main_port)
    variables = {
        **torchrun_variables(plan, rank=rank, local_rank=local_rank, port=main_port),
        **{
            name: lookup(facts, fact, name="the facts a launcher writes")
            for name, fact in LAUNCHED_WORKERS.also_written.items()
        },
        PLAN_VARIABLE: json.dumps(plan.to_dict()) if plan_json is None else plan_json,
        LAUNCHED_MARKER: launcher,
    }
    visibility = visibility_variable(plan)
    if visibility is not None:
        variables[visibility] = narrowed_visible_devices(visible_devices, visible_count, plan.devices)
        variables[SELECTED_DEVICES_VARIABLE] = ",".join(str(index) for index in plan.devices)
    return variables


def worker_view(plan: Plan, *, global_rank: int, local_rank: int, main_port: int, started_by: str = "") -> Plan:
    """`plan` as one of the workers its launcher started sees it: launcher `external`, this worker's ranks and
    port, and on CUDA the devices renumbered 0..n-1 (the launcher narrowed CUDA_VISIBLE_DEVICES to them;
    `physical_devices` still names the physical GPUs)."""
    if not 0 <= local_rank < plan.processes_per_node or not 0 <= global_rank < plan.world_size:
        raise TrainplanError(
            f"rank {global_rank} (local rank {local_rank}) is outside the plan's world of {plan.world_size} "
            f"({plan.processes_per_node} per node); the worker's RANK/LOCAL_RANK do not belong to this plan"
        )
    devices = tuple(range(len(plan.devices))) if visibility_variable(plan) is not None else plan.devices
    # A worker of trainplan's own launcher is inside the job that launcher started: it becomes what the row says.
    launcher_rule = lookup(LAUNCHERS, plan.launcher, name="LAUNCHERS")
    launcher = (launcher_rule.in_started_job or plan.launcher) if launcher_rule.trainplan_starts else plan.launcher
    reasons = dict(plan.reasons)
    notes = list(plan.notes)
    who = (
        "`trainplan launch`"
        if started_by == "trainplan launch"
        else f"trainplan's {started_by or plan.launcher!r} launcher"
    )
    if launcher != plan.launcher:
        reasons["launcher"] = f"this process is a worker that {who} started; it joins the world"
        notes.append(
            Note(
                code="job-layout",
                level="info",
                message=(
                    f"inside a started job: {plan.num_nodes} node(s) × {plan.processes_per_node} process(es) as "
                    f"{who} started them; this process (rank {global_rank}) joins it (launcher {launcher!r})"
                ),
            )
        )
    if devices != plan.devices:
        reasons["devices"] = (
            f"{reasons.get('devices', '')}; the launcher made them visible as cuda:0..{len(devices) - 1}"
        ).lstrip("; ")
    return attrs.evolve(
        plan,
        devices=devices,
        launcher=launcher,
        cluster=attrs.evolve(
            plan.cluster,
            creates_processes=True,
            # The node this rank runs on (under a c10d rendezvous, not necessarily the launching command's).
            node_rank=global_rank // plan.processes_per_node,
            global_rank=global_rank,
            local_rank=local_rank,
            main_port=main_port,
        ),
        reasons=reasons,
        notes=tuple(notes),
    )


def job_of(variables: Mapping[str, str], rules: Rules = BUILTIN_RULES) -> ClusterFacts | None:
    """The started job this process belongs to (torchrun, srun, mpirun, jsrun, trainplan's launchers, a cluster
    manager of `rules`), or None."""
    try:
        facts = detect("auto", variables, rules)
    except TrainplanError:
        return None  # garbage in a cluster's variables: resolve reports it where it matters
    return facts if facts.creates_processes or facts.launched else None


def nested_launch(plan: Plan, variables: Mapping[str, str], rules: Rules = BUILTIN_RULES) -> Incompatible | None:
    """The error for starting a plan's workers from a process that is itself one rank of a started job (of a cluster
    manager of `rules`, the plan's rule set)."""
    if plan.launcher not in STARTING_LAUNCHERS:
        return None
    job = job_of(variables, rules)
    if job is None:
        return None
    started_by = "trainplan's launcher" if job.launched else job.kind
    rank = "?" if job.global_rank is None else job.global_rank
    world = "?" if job.world_size is None else job.world_size
    values = {"launcher": plan.launcher, "world_size": plan.world_size}
    return incompatible("nested-launch", values, started_by=started_by, rank=rank, world=world)


def unlaunchable(plan: Plan) -> Incompatible | None:
    """Why this plan's workers cannot be started here, or None: several nodes need one agreed main port."""
    if plan.num_nodes > 1 and plan.cluster.main_port is None and plan.launcher in STARTING_LAUNCHERS:
        return incompatible("multi-node-port", {"num_nodes": plan.num_nodes})
    return None


_LAYOUT_FIELDS = ("devices", "num_nodes", "cluster", "select_usable_gpus", "notes")


def carried_request(plan: Plan) -> str | None:
    """The request an emitted job carries to its script (JSON for TRAINPLAN_REQUEST), when it chose more than
    the layout the job itself gives (an accelerator, strategy, precision, backend, options); else None."""
    request = plan.request
    default = Request()
    chosen = [
        name
        for name in attrs.fields_dict(Request)
        if name not in (*_LAYOUT_FIELDS, "given") and getattr(request, name) != getattr(default, name)
    ]
    downstream = plan.accelerator not in ACCELERATORS
    if not chosen and not downstream:
        return None
    # The job is the cluster now, and its own GPUs are the selection: neither choice travels.
    inside = attrs.evolve(request, cluster="auto", select_usable_gpus=False)
    if downstream:
        # The emitting side counted a downstream accelerator's devices (the framework's count, or `--assume`); the
        # job's probe cannot: the accelerator travels as chosen, so that the job plans it (given its count) or says
        # plainly that it has none, never quietly another.
        inside = attrs.evolve(inside, accelerator=plan.accelerator)
    return json.dumps(request_to_dict(inside), separators=(",", ":"))


def carried_rules(plan: Plan, job: str) -> str | None:
    """The rule set an emitted `job` ("torchrun line", "sbatch script", "PyTorchJob") carries to its script
    (TRAINPLAN_RULES): the reference of the downstream rule set the plan was made from; None for trainplan's own.
    A rule set without a name cannot be imported inside the job: `Incompatible` says to name it."""
    if plan.rules is None:
        return None
    if plan.rules == UNNAMED_RULES:
        raise incompatible("emit-unnamed-rules", {"rules": plan.rules}, job=job)
    return plan.rules


def downstream_devices_note(plan: Plan) -> Note | None:
    """What a job of a downstream accelerator's plan needs that trainplan cannot give it: the count of the devices
    on its node (`probe()` knows trainplan's own accelerators only), from the framework's plugin; None otherwise."""
    if plan.accelerator in ACCELERATORS:
        return None
    return Note(
        code="downstream-devices",
        level="warning",
        message=(
            f"the job plans accelerator {plan.accelerator!r} of {plan.rules}, whose devices trainplan.probe() "
            "cannot count: inside the job, pass the count its plugin sees, e.g. trainplan.resolve(env=trainplan."
            f"probe().with_device_counts({{{plan.accelerator!r}: {len(plan.devices)}}})) (without it, resolve "
            f"refuses {plan.accelerator!r})"
        ),
    )


def script_strategy_note(strategy: str, rules: Rules = BUILTIN_RULES) -> Note | None:
    """The note for running a function-launching strategy (spawn, fork, notebook) as a script, or None (`rules`:
    the rule set whose script counterparts to read, a downstream one's own included)."""
    instead = rules.script_strategy_for.get(strategy)  # type: ignore[call-overload]
    if instead is None:
        return None
    return Note(
        code="script-strategy",
        level="warning",
        message=(
            f"strategy={strategy!r} starts its workers from a function; a launcher that runs the script on every "
            f"worker runs it as strategy={instead!r} (write {instead!r} or 'auto' in the script too)"
        ),
    )


def _launch_choices() -> dict[str, str]:
    """The choices a launch makes beyond the layout: each request field with a flag, as the flag spells it."""
    from trainplan.parse.fields import REQUEST_FIELD_ROWS

    return {
        row.name: row.flag.option
        for row in REQUEST_FIELD_ROWS
        if row.flag is not None and row.name not in _LAYOUT_FIELDS
    }


def with_launch_choices(
    script: Request, launched: Request, chosen: frozenset[str] = frozenset(), rules: Rules = BUILTIN_RULES
) -> Request:
    """A script's own `Request` inside a worker of trainplan's launchers: the launch's choices (strategy,
    precision, options, backend, ...) fill the fields the script leaves out; a field the script
    sets otherwise keeps the script's value, with a `launch-choice-overridden` warning note naming both.

    The launch's choices are the fields of `launched` away from their defaults, and the fields in `chosen` (those
    its flags wrote, a default value included). A script's field counts as left when it equals its default and the
    script did not write it (`Request.given`: `Request(precision="32-true")` sets precision, though to its default).
    Options travel with their strategy: the script's strategy, or
    the script-mode counterpart a launcher runs it as (`ddp_spawn` runs as `ddp`), must be the launch's."""
    default = Request()
    taken: dict[str, object] = {}
    notes: list[Note] = []
    for field, flag in _launch_choices().items():
        mine, theirs = getattr(script, field), getattr(launched, field)
        if (theirs == getattr(default, field) and field not in chosen) or mine == theirs:
            continue
        runs = taken.get("strategy", script.strategy)
        if field == "strategy_options" and _runs_as(runs, rules) != _runs_as(launched.strategy, rules):
            # Options travel with their strategy: not applied, and said so (they were dropped without a word).
            notes.append(
                Note(
                    code="launch-choice-overridden",
                    level="warning",
                    message=f"the launch chose strategy_options={theirs!r} ({flag}) for strategy="
                    f"{launched.strategy!r}, and this script's Request runs strategy={runs!r}: the launch's options "
                    f"were not applied. Launch with --strategy {runs}, or set the options in the script's Request",
                )
            )
            continue
        left = mine == getattr(default, field) and field not in script.given
        if left or (field == "strategy" and _runs_as(mine, rules) == theirs):
            taken[field] = theirs
            continue
        notes.append(
            Note(
                code="launch-choice-overridden",
                level="warning",
                message=f"the launch chose {field}={theirs!r} ({flag}), and this script's Request sets "
                f"{field}={mine!r}: the script's runs. Leave {field} out of the Request to take the launch's, or "
                f"launch with the script's",
            )
        )
    if not taken and not notes:
        return script
    return attrs.evolve(script, **taken, notes=(*script.notes, *notes))  # type: ignore[arg-type]


def _runs_as(strategy: object, rules: Rules) -> object:
    """The strategy a launcher that re-runs the script runs `strategy` as (its script-mode counterpart)."""
    return next((after for before, after in rules.script_strategy_for.items() if before == strategy), strategy)


def _schema_name(fact: str) -> str:
    """The variable the launched workers' schema (`rules.LAUNCHED_WORKERS`) gives `fact` in."""
    return next(source.names[0] for name, source in job_variables(LAUNCHED_WORKERS.schema) if name == fact)


def heterogeneous_nodes(plan: Plan, world: int, local_world: str | None, launcher: str) -> ClusterEnvironmentError:
    """The error on every worker when the nodes' launchers met with different plans: this node planned
    `plan.world_size` processes in all, and the rendezvous formed a world of `world`."""
    here = plan.processes_per_node
    others = world - here
    layout = f"{plan.num_nodes} node(s) × {here} process(es) = {plan.world_size}"
    return ClusterEnvironmentError(
        cluster=launcher,
        variable=_schema_name("world_size"),
        value=str(world),
        reason=f"this node's {launcher} planned {layout}, and the nodes met as a world of {world}: this node "
        f"starts {local_world or here}, the other node(s) {others} in all, so the nodes were launched with "
        "different --devices",
        fix=f"Launch every node with the same --devices (here {here}), or the same --nproc-per-node",
    )


def launch_choices_line(request: Request, chosen: frozenset[str] = frozenset()) -> str | None:
    """The launch banner's line for what a script's own `Request` is given: the fields away from their defaults
    and those in `chosen` (written as flags); None when the launch chose nothing beyond the layout."""
    default = Request()
    given = [
        f"{field}={getattr(request, field)!r}"
        for field in _launch_choices()
        if getattr(request, field) != getattr(default, field) or field in chosen
    ]
    if not given:
        return None
    return (
        f"a script's own Request takes {', '.join(given)} where it leaves them out (a field it sets "
        "otherwise keeps its own, with a warning)"
    )


def script_request(request: Request, rules: Rules = BUILTIN_RULES) -> Request:
    """The request a script runs under a launcher that re-runs it (torchrun, srun, `trainplan launch`): a
    strategy that starts workers from a function (spawn, fork, notebook) becomes its script-mode counterpart
    (`rules`' counterparts: a downstream strategy's own), with a note (in the request's notes, so it reaches the
    plan)."""
    strategy: object = request.strategy
    note = script_strategy_note(strategy, rules) if isinstance(strategy, str) else None
    if note is None:
        return request
    instead = rules.script_strategy_for[strategy]  # type: ignore[index]
    return attrs.evolve(request, strategy=instead, notes=(*request.notes, note))


__all__ = [
    "STARTING_LAUNCHERS",
    "carried_request",
    "carried_rules",
    "downstream_devices_note",
    "heterogeneous_nodes",
    "job_of",
    "launch_choices_line",
    "nested_launch",
    "process_group_timeout",
    "script_request",
    "script_strategy_note",
    "unlaunchable",
    "visibility_variable",
    "with_launch_choices",
    "worker_environment",
    "worker_view",
]
