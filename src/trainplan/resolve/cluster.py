"""Reading the cluster environment from environment variables (pure: the variables are passed in).

Detection order, required variables and each cluster's variable schema come from the rule set's clusters
(`rules.CLUSTERS`, `ClusterRule.schemas`): one reader reads any schema through its row, checks the values (a rank
that is not a number, a port out of range, a rank beyond the world size) and reports garbage as
`ClusterEnvironmentError` naming the variable. The special spellings (SLURM's tasks per node and host lists, LSF's
host list) are one small parser per format, whichever cluster uses them.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping

import attrs

from trainplan.rules import (
    BUILTIN_RULES,
    INFERRED_JOIN_SECONDS,
    LAUNCHED_MARKER,
    LAUNCHED_WORKERS,
    NODE_RANK_INFERRED_NOTE,
    NODES_INFERRED_NOTE,
    RULES,
    RUN_ID_VARIABLE,
    TRAINPLAN_RUN_ID_PREFIX,
    ClusterRule,
    DefaultPort,
    JobPort,
    JobVariable,
    JobVariables,
    NotATask,
    Rule,
    Rules,
    TaskVerdict,
    VariableFormat,
    detected_alone,
    lookup,
)
from trainplan.spec.errors import ClusterEnvironmentError, Incompatible, Unavailable
from trainplan.spec.names import ClusterFlag, ClusterKey, CustomName
from trainplan.spec.notes import Note
from trainplan.spec.numbers import whole_number
from trainplan.spec.text import host_address


@attrs.frozen(kw_only=True)
class ClusterFacts:
    """What the cluster environment says, before it is checked against the request."""

    kind: ClusterKey
    creates_processes: bool
    main_address: str | None
    main_port: int | None
    node_rank: int | None  # None: derive from the global rank and processes per node
    global_rank: int | None
    local_rank: int | None
    world_size: int | None
    processes_per_node: int | None
    num_nodes: int | None
    detail: str  # the variables behind world_size, for messages
    launch_hint: str  # how to start the job with another layout, for messages
    reason: str
    notes: tuple[Note, ...] = ()
    launched: bool = False  # this process is a worker trainplan's launcher started
    address_from: str | None = None  # the variable that gave main_address (None: a default, or unknown)
    label: str = ""  # the cluster as messages name it ("SLURM")
    main_address_fix: str = ""  # how to give the job a main address, where it gives none over several nodes

    @property
    def started_by(self) -> str:
        """Who started this job's processes, for messages."""
        return "trainplan's launcher" if self.launched else self.label or self.kind


def detect(flag: ClusterFlag | CustomName, variables: Mapping[str, str], rules: Rules = BUILTIN_RULES) -> ClusterFacts:
    """The cluster environment asked for (or detected, for `auto`) with its facts, from the rule set's clusters."""
    index = _BUILTIN_INDEX if rules is BUILTIN_RULES else _index(rules)
    if not variables and flag in index.alone:
        return index.alone[flag]  # no variable at all: this machine alone (the same facts as reading none)
    if flag == "auto":
        rule, passed = _detected(index, variables)
        return _read(rule, index, variables, requested=False, passed=passed)
    rule = lookup(rules.clusters, flag, name="CLUSTERS")
    if not _present(rule.detect_variables, variables):  # a row without variables to find (local) is always present
        needed = " and ".join(sorted(rule.detect_variables[0]))
        label = rule.schemas[0].label
        raise Unavailable(
            requested=f"cluster={flag!r}",
            available=f"no {label} variables ({needed} not set)",
            fix=f"Run it as one of {label}'s processes ({rule.description}), set the variables by hand for a what-if, "
            "or use cluster='auto'",
        )
    _task_verdict(rule, variables)  # a process that is not a task and cannot plan alone is refused when asked for too
    return _read(rule, index, variables, requested=True)


def _present(groups: tuple[frozenset[str], ...], variables: Mapping[str, str]) -> bool:
    return any(all(name in variables for name in group) for group in groups)


@attrs.frozen
class _Index:
    """One rule set's clusters, indexed once: the detection order, and the facts of a process without variables."""

    order: tuple[ClusterRule, ...]  # rows found by their variables, highest priority first
    fallback: ClusterRule  # the row that needs no variable (this machine): what remains
    managers: str  # the clusters detection looks for, for the fallback's reason
    alone: dict[str, ClusterFacts] = attrs.field(factory=dict)  # filled once, by `_index`


@functools.lru_cache(maxsize=16)
def _index(rules: Rules) -> _Index:
    clusters = rules.clusters.values()
    order = tuple(
        sorted(
            (rule for rule in clusters if rule.detect_priority is not None and all(rule.detect_variables)),
            key=lambda rule: -(rule.detect_priority or 0),
        )
    )
    fallback = next(rule for rule in clusters if detected_alone(rule))  # every rule set has one (its checks)
    index = _Index(order, fallback, ", ".join(rule.schemas[0].label for rule in order))
    index.alone["auto"] = _read(index.fallback, index, {}, requested=False)
    index.alone[index.fallback.name] = _read(index.fallback, index, {}, requested=True)
    return index


def is_loopback_host(host: str) -> bool:
    """Whether `host` names this machine's loopback (127.0.0.0/8, ::1, localhost): a meeting point no other
    machine can reach."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def launched_by_trainplan(variables: Mapping[str, str]) -> bool:
    """Whether trainplan's launcher started this process: its marker is set, and no torchrun started inside
    that worker has since given this process a world of its own (torchrun's run id is then not trainplan's)."""
    if LAUNCHED_MARKER not in variables:
        return False
    return variables.get(RUN_ID_VARIABLE, TRAINPLAN_RUN_ID_PREFIX).startswith(TRAINPLAN_RUN_ID_PREFIX)


def _detected(
    index: _Index, variables: Mapping[str, str]
) -> tuple[ClusterRule, tuple[tuple[ClusterRule, NotATask], ...]]:
    """The innermost cluster that started this process (highest priority first), and the rows of the clusters passed
    by on the way because this process is not one of their tasks."""
    if not variables or launched_by_trainplan(variables):
        return index.fallback, ()
    passed: list[tuple[ClusterRule, NotATask]] = []
    for rule in index.order:
        if not _present(rule.detect_variables, variables):
            continue
        row = _task_verdict(rule, variables)
        if row is not None:
            passed.append((rule, row))
            continue
        return _same_job(rule, index, variables) or rule, tuple(passed)
    return index.fallback, tuple(passed)


def _matches(row: NotATask, variables: Mapping[str, str]) -> bool:
    return not any(name in variables for name in row.unset) and all(name in variables for name in row.set)


def _task_verdict(rule: ClusterRule, variables: Mapping[str, str]) -> NotATask | None:
    """The row that says this process is not one of the cluster's tasks and plans this machine (None: it is a task);
    a row whose verdict is `refuse` raises its refusal."""
    for row in rule.not_tasks:
        if not _matches(row, variables):
            continue
        tasks = _tasks(row, variables)
        verdict: TaskVerdict = row.when_many if tasks is not None and tasks > 1 else row.when_one
        if verdict == "refuse":
            refusal = lookup(_REFUSALS, row.code, name="RULES")
            values = _Values(variables, tasks=tasks)
            raise Incompatible(
                values={}, rule=row.code, reason=refusal.reason.format_map(values), fix=refusal.fix.format_map(values)
            )
        return row if verdict == "alone" else None
    return None


_REFUSALS: Mapping[str, Rule] = dict(RULES.items())
"""The refusals by id as a cluster's row names one (`NotATask.code`: a plain string, a note's code where the row plans
this machine alone)."""


def _tasks(row: NotATask, variables: Mapping[str, str]) -> int | None:
    """The job's count of tasks by the row's variables (the first that is set), None when unset or unreadable."""
    return whole_number(next((variables[name] for name in row.tasks if name in variables), "").strip())


class _Values(dict[str, str]):
    """The variables as template values, each cut to 64 characters: an unset one reads as '?'."""

    def __init__(self, variables: Mapping[str, str], *, tasks: int | None = None) -> None:
        super().__init__((name, value[:64]) for name, value in variables.items())
        self["tasks"] = "?" if tasks is None else str(tasks)

    def __missing__(self, key: str) -> str:
        return "?"


def _same_job(rule: ClusterRule, index: _Index, variables: Mapping[str, str]) -> ClusterRule | None:
    """The cluster, among the row's `same_job_as`, that started this process itself and whose variables state the
    same world, rank for rank (the same world size and global rank, and the same processes per node and local rank
    where both state one): its row reads the job, stating more (the nodes, the main address). None where the row's
    own daemon started the process (`started_by_fact`: MPI's daemons, started by an srun step, carry that step's
    variables), or where the worlds differ: this row, found first, is the innermost launcher."""
    if not rule.same_job_as or (rule.started_by_fact and rule.started_by_fact in variables):
        return None
    world = _peek_world(rule, variables)
    if world[0] is None or world[2] is None:
        return None
    for other in index.order:
        if other.name not in rule.same_job_as or not _present(other.detect_variables, variables):
            continue
        if any(_matches(row, variables) for row in other.not_tasks):
            continue
        stated = _peek_world(other, variables)
        same = all(mine is None or theirs is None or mine == theirs for mine, theirs in zip(world, stated, strict=True))
        if same and (stated[0], stated[2]) == (world[0], world[2]):
            return other
    return None


_PEEKED = ("world_size", "processes_per_node", "global_rank", "local_rank")
"""What `_same_job` compares of two rows' worlds (the counts and this process's ranks in them)."""


def _peek_world(rule: ClusterRule, variables: Mapping[str, str]) -> tuple[int | None, ...]:
    """A row's world size, processes per node, global rank and local rank as its variables state them, nothing else
    checked (None where unset or unreadable: the full read reports those)."""
    schema = next((each for each in rule.schemas if _sets_world_size(each, variables)), rule.schemas[-1])
    values: list[int | None] = []
    for fact in _PEEKED:
        source = getattr(schema, fact)
        value: int | None = source if isinstance(source, int) else None
        if isinstance(source, JobVariable):
            text = next((variables[name] for name in source.names if name in variables), None)
            parse = _NUMBER_FORMATS.get(source.format)
            if text is not None and parse is not None:
                try:
                    value = parse(text, 0)
                except (_Unreadable, _Uneven):
                    value = None
        values.append(value)
    return tuple(values)


def _read(
    rule: ClusterRule,
    index: _Index,
    variables: Mapping[str, str],
    *,
    requested: bool,
    passed: tuple[tuple[ClusterRule, NotATask], ...] = (),
) -> ClusterFacts:
    """The facts of a job under `rule`: its schema read; on the row that needs no variables, a worker trainplan's
    launcher started reads the launched workers' schema instead. `passed`: the rows of the clusters detection passed
    by (this process is not one of their tasks), each a note."""
    if not rule.creates_processes and launched_by_trainplan(variables):
        return _launched(rule, variables)
    schemas = rule.schemas
    schema = next((each for each in schemas if _sets_world_size(each, variables)), schemas[-1])
    job = _Job.read(schema, variables, rule.job_port, rule.default_port)
    if rule.node_rank_in_blocks:
        job.node_rank_in_blocks(rule.node_rank_variable)
    template = schema.reason_asked if requested and schema.reason_asked else schema.reason
    reason = template.format(how="asked for" if requested else "detected", values=job.values, managers=index.managers)
    if passed and not rule.creates_processes:  # found, then passed by: say so, not "no variables were found"
        reason = "no cluster manager started this process: " + "; ".join(
            f"{other.schemas[0].label}'s variables are set, but it is not one of its tasks (note {row.code})"
            for other, row in passed
        )
    notes = job.notes + tuple(_passed_note(row, variables) for _, row in passed)
    return job.facts(rule.name, rule.creates_processes, rule.launch_hint, reason, notes)


def _passed_note(row: NotATask, variables: Mapping[str, str]) -> Note:
    """The note of a cluster passed by (this process is not one of its tasks): at the row's level for its count."""
    tasks = _tasks(row, variables)
    one = tasks is None or tasks <= 1
    level = row.level_when_one if one and row.level_when_one is not None else row.level
    return Note(code=row.code, level=level, message=row.message.format_map(_Values(variables, tasks=tasks)))


def _even_fix(schema: JobVariables, world: int, nodes: int) -> str:
    """The schema's fix for an uneven job: the same number of processes on each of `nodes`, enough for `world`."""
    per_node = -(-world // max(nodes, 1))
    return schema.uneven_fix.format(num_nodes=nodes, per_node=per_node, world_size=per_node * nodes)


def _sets_world_size(schema: JobVariables, variables: Mapping[str, str]) -> bool:
    return schema.world_size is not None and any(name in variables for name in schema.world_size.names)


def _launched(rule: ClusterRule, variables: Mapping[str, str]) -> ClusterFacts:
    """A worker started by trainplan's launcher: the world and this worker's place in it."""
    schema = LAUNCHED_WORKERS.schema
    job = _Job.read(schema, variables, None, None)
    launcher = variables.get(LAUNCHED_MARKER, "").strip() or "a"
    reason = schema.reason.format(how="detected", values=job.values, launcher=launcher, managers="")
    return job.facts(rule.name, True, LAUNCHED_WORKERS.launch_hint, reason, job.notes, launched=True)


class _Unreadable(Exception):
    """A variable's text is not in its format: why, and what to do (a template: {cluster}, {address}, {port})."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fix = fix


_FACTS = (
    ("world_size", 1),
    ("processes_per_node", 1),
    ("global_rank", 0),
    ("local_rank", 0),
    ("node_rank", 0),
    ("num_nodes", 1),
)
"""The numeric facts in reading order, with the least each may be: a count is at least 1, a rank at least 0."""

_SHOWN = ("world_size", "processes_per_node")
"""The facts whose variables a message shows (`ClusterFacts.detail`)."""

_BELOW = (("global_rank", "world_size"), ("local_rank", "processes_per_node"), ("node_rank", "num_nodes"))
"""A rank and the count it must stay below."""


@attrs.define
class _Job:
    """One schema read from the variables: the facts, and the variable each came from."""

    schema: JobVariables
    variables: Mapping[str, str]
    values: dict[str, int | None] = attrs.field(factory=dict)
    names: dict[str, str] = attrs.field(factory=dict)  # fact → the variable it was read from
    address: str | None = None
    address_from: str | None = None
    port: int | None = None
    notes: tuple[Note, ...] = ()

    @classmethod
    def read(
        cls, schema: JobVariables, variables: Mapping[str, str], job_port: JobPort | None, default: DefaultPort | None
    ) -> _Job:
        """Read `schema` in order: the counts and ranks, each rank against its count, a required job id, the main
        address, the main port (its variable, else the row's formula from the job id, else the row's default)."""
        job = cls(schema, variables)
        values, names = job.values, job.names
        for fact, minimum in _FACTS:
            source = getattr(schema, fact)
            values[fact] = job.number(fact, source, minimum=minimum) if isinstance(source, JobVariable) else source
        world, per_node, nodes = values["world_size"], values["processes_per_node"], values["num_nodes"]
        if nodes is None and world is not None and per_node is not None and world % per_node == 0:
            values["num_nodes"] = world // per_node
            if "processes_per_node" in names and world > per_node:  # several nodes, by arithmetic alone
                job.notes += (job.inferred_note(world, per_node),)
        elif nodes is None and world is not None and per_node is not None and "processes_per_node" in names:
            raise job.error(  # MPICH states no node count: a world that no node's share divides is uneven
                names["processes_per_node"],
                f"{schema.label} started {world} processes ({names['world_size']}={world}), {per_node} of them on "
                f"this node: {world} does not split into nodes of {per_node}, so the nodes run different numbers of "
                "processes, and a plan runs the same number on every node",
                _even_fix(schema, world, -(-world // per_node)),
            )
        elif world is not None and per_node is not None and nodes is not None and world != per_node * nodes:
            raise job.error(
                names["processes_per_node"],
                f"{schema.label} started {world} processes ({names['world_size']}={world}) on {nodes} nodes "
                f"({names['num_nodes']}={nodes}), {per_node} of them on this node: the nodes run different numbers "
                "of processes, and a plan runs the same number on every node",
                _even_fix(schema, world, nodes),
            )
        job.check_listed_nodes()
        for rank, count in _BELOW:  # checked where both come from variables
            value, limit = values[rank], values[count]
            if rank in names and count in names and value is not None and limit is not None and value >= limit:
                raise job.error(
                    names[rank],
                    f"it must be smaller than {names[count]}={limit}",
                    f"Check how the job was started: ranks run from 0 to {limit - 1}",
                )
        job_id = schema.job_id
        if job_id is not None and job_id.required:
            values["job_id"] = job.number("job_id", job_id, minimum=0)
        job.read_address()
        job.read_port(job_port, default)
        return job

    def node_rank_in_blocks(self, variable: str) -> None:
        """For a cluster that numbers ranks node after node (`ClusterRule.node_rank_in_blocks`) whose node rank
        `variable` is not set: the node is global rank // processes per node where the local rank agrees (with a
        note), and refused naming `variable` where it does not (the ranks are not in blocks: the node is unknown), or
        where the processes per node are unset too (a schema whose variable could state them). A stated node rank is
        checked against the blocks (local rank = global rank % processes per node, node = global rank // them).
        Left to the layout where the processes per node are no variable's (LSF's come from the plan)."""
        values, names, schema = self.values, self.names, self.schema
        rank, local, per_node = values["global_rank"], values["local_rank"], values["processes_per_node"]
        node = values["node_rank"]
        if rank is None or local is None or not all(fact in names for fact in ("global_rank", "local_rank")):
            return
        per_node_source, node_source = schema.processes_per_node, schema.node_rank
        if node is None and per_node is None and isinstance(per_node_source, JobVariable):
            # Neither the node nor the processes per node are stated, where variables could state them: unknown.
            fix = node_source.unset_fix if isinstance(node_source, JobVariable) else "Set it in every process"
            raise self.error(
                variable,
                f"it is not set, nor {per_node_source.names[0]}, so the node of this process "
                f"({names['global_rank']}={rank}, {names['local_rank']}={local}) is unknown",
                fix,
            )
        if per_node is None or "processes_per_node" not in names:
            return
        stated = f"{names['global_rank']}={rank}, {names['local_rank']}={local}"
        stated += f", {names['processes_per_node']}={per_node}"
        if node is not None and "node_rank" in names:
            self._check_stated_node_rank(rank, local, per_node, node, stated)
            return
        if node is not None:
            return
        if rank % per_node != local:
            fix = node_source.unset_fix if isinstance(node_source, JobVariable) else "Set it in every process"
            raise self.error(
                variable,
                f"it is not set, and the ranks ({stated}) are not numbered node after node (global rank {rank} "
                f"would be local rank {rank % per_node} of node {rank // per_node}), so this process's node is unknown",
                fix,
            )
        values["node_rank"] = rank // per_node
        self.notes += (
            Note(
                code=NODE_RANK_INFERRED_NOTE,
                level="info",
                message=(
                    f"{variable} is not set: node rank {rank // per_node} inferred from {stated} ({self.schema.label} "
                    "numbers ranks node after node)"
                ),
            ),
        )

    def _check_stated_node_rank(self, rank: int, local: int, per_node: int, node: int, stated: str) -> None:
        """A stated node rank: the ranks still run node after node (node × processes per node + local rank)."""
        names = self.names
        if rank % per_node != local:
            raise self.error(
                names["local_rank"],
                f"it disagrees with the ranks ({stated}, {names['node_rank']}={node}): global rank {rank} is "
                f"local rank {rank % per_node} of node {rank // per_node} when ranks run node after node",
                f"Check how the job was started: each process needs {names['local_rank']} = "
                f"{names['global_rank']} % {names['processes_per_node']}",
            )
        if rank // per_node != node:
            raise self.error(
                names["node_rank"],
                f"it disagrees with the ranks ({stated}): global rank {rank} is on node {rank // per_node} when "
                f"ranks run node after node (node {node} holds ranks {node * per_node} to "
                f"{node * per_node + per_node - 1})",
                f"Check how the job was started: each process needs {names['node_rank']} = "
                f"{names['global_rank']} // {names['processes_per_node']}",
            )

    def inferred_note(self, world: int, per_node: int) -> Note:
        """The note of a node count inferred (world size / processes on this node), not stated by the launcher."""
        names, label = self.names, self.schema.label
        message = (
            f"{label} states no node count: {world // per_node} nodes inferred from {names['world_size']}={world} "
            f"and {names['processes_per_node']}={per_node} on this node. Should another node run a different number "
            f"of ranks, its ranks refuse their layout, and trainplan.join here stops waiting for the world after "
            f"{INFERRED_JOIN_SECONDS} s; {_even_fix(self.schema, world, world // per_node)}"
        )
        return Note(code=NODES_INFERRED_NOTE, level="info", message=message)

    def error(self, name: str, reason: str, fix: str) -> ClusterEnvironmentError:
        """The error for variable `name`; the fix may name the cluster and the schema's address and port variables."""
        schema = self.schema
        fix = fix.format(
            cluster=schema.label,
            address=schema.main_address[0].names[0] if schema.main_address else "the main address",
            port=schema.main_port.names[0] if schema.main_port is not None else "the main port",
        )
        return ClusterEnvironmentError(
            cluster=schema.label, variable=name, value=self.variables.get(name, ""), reason=reason, fix=fix
        )

    def text(self, source: JobVariable) -> tuple[str, str | None]:
        """The variable read for `source` (the first set) and its text; unset: its last name, and None (an error
        for a required one)."""
        for name in source.names:
            text = self.variables.get(name)
            if text is not None:
                return name, text
        name = source.names[-1]
        if source.required:
            raise self.error(name, source.unset_reason, source.unset_fix)
        return name, None

    def number(self, fact: str, source: JobVariable | int | None, *, minimum: int) -> int | None:
        """A count, rank, port or job id: parsed in its variable's format, or the variable's default when unset."""
        if not isinstance(source, JobVariable):
            return source  # a fact of the cluster itself, or unknown
        name = source.names[0]
        text = self.variables.get(name)
        if text is None:  # a fallback, or unset
            name, text = self.text(source)
            if text is None:
                return source.default
        parse = _NUMBER_FORMATS.get(source.format) or lookup(_NUMBER_FORMATS, source.format, name="number formats")
        try:
            value = parse(text, minimum)
        except _Unreadable as unreadable:
            raise self.error(name, unreadable.reason, unreadable.fix) from None
        except _Uneven as uneven:
            raise self.error(name, *self.placement(uneven.groups)) from None
        if value is not None:
            self.names[fact] = name
        return value

    def check_listed_nodes(self) -> None:
        """SLURM's tasks per node as a list (`2(x3)`, `3,1`) names as many nodes as the job has: a list of other
        nodes is garbage. (A bare count, `4`, is the same on every node: SLURM_NTASKS_PER_NODE's form.)"""
        source = self.schema.processes_per_node
        name = self.names.get("processes_per_node")
        nodes = self.values["num_nodes"]
        if not isinstance(source, JobVariable) or source.format != "tasks_per_node" or name is None or nodes is None:
            return
        groups = _task_groups(self.variables[name])
        if groups == [(groups[0][0], 1)]:
            return
        listed = sum(repeat for _, repeat in groups)
        if listed != nodes and "num_nodes" in self.names:
            raise self.error(
                name,
                f"it lists {listed} node(s), and the job has {nodes} ({self.names['num_nodes']}={nodes})",
                "Check how the job was started: srun sets both",
            )

    def placement(self, groups: list[tuple[int, int]]) -> tuple[str, str]:
        """Why an uneven placement of tasks (count, nodes) cannot be planned, naming the nodes where the schema lists
        them, and the layout that fits."""
        hosts: list[str] = []
        if self.schema.node_list is not None:
            _, text = self.text(self.schema.node_list)
            try:
                hosts = expand_hostlist(text) if text is not None else []
            except ValueError:
                hosts = []
        parts: list[str] = []
        start = 0
        for count, repeat in groups[:4]:
            names = hosts[start : start + repeat]
            start += repeat
            tasks = f"{count} task{'s' if count != 1 else ''}"
            if repeat == 1:
                parts.append(f"{tasks} on {names[0] if names else f'node {start - 1}'}")
            else:
                where = f" ({names[0]} … {names[-1]})" if len(names) == repeat else ""
                parts.append(f"{tasks} on each of {repeat} nodes{where}")
        if len(groups) > 4:
            parts.append("…")
        placed = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
        total = sum(count * repeat for count, repeat in groups)
        nodes = sum(repeat for _, repeat in groups)
        reason = (
            f"the step asked for {total} tasks on {nodes} nodes without --ntasks-per-node, and {self.schema.label} put "
            f"{placed} (it fills a node's free CPUs first); a plan runs the same number of processes on every node, "
            "so no plan fits this step"
        )
        if total % nodes == 0:
            fix = f"Ask for the same number on every node: srun --nodes={nodes} --ntasks-per-node={total // nodes}"
        else:
            even = -(-total // nodes)
            fix = (
                f"Ask for the same number on every node ({total} tasks do not split evenly over {nodes} nodes): "
                f"srun --nodes={nodes} --ntasks-per-node={even} ({even * nodes} tasks), or srun --nodes=1 "
                f"--ntasks-per-node={total}"
            )
        return reason, fix

    def read_address(self) -> None:
        """The host of rank 0: the first of the schema's address variables that gives one, else 127.0.0.1 (only for
        a job known to run on one node, where the schema says so)."""
        for source in self.schema.main_address:
            name, text = self.text(source)
            if text is None:
                continue
            parse = lookup(_ADDRESS_FORMATS, source.format, name="address formats")
            try:
                host = parse(text)
            except _Unreadable as unreadable:
                raise self.error(name, unreadable.reason, unreadable.fix) from None
            if host is not None:
                self.address, self.address_from = host, name
                return
        if not self.schema.loopback_needs_one_node or self.values["num_nodes"] == 1:
            self.address = "127.0.0.1"

    def read_port(self, job_port: JobPort | None, default: DefaultPort | None) -> None:
        schema = self.schema
        self.port = self.number("main_port", schema.main_port, minimum=0)
        one_node = self.values["num_nodes"] == 1
        if self.port is None and job_port is not None and schema.job_id is not None:
            job_id = (
                self.values["job_id"] if "job_id" in self.values else self.number("job_id", schema.job_id, minimum=0)
            )
            if job_id is not None and (one_node or not schema.job_id_is_the_nodes):
                step = self.number("step_id", schema.step_id, minimum=0) if schema.step_id is not None else None
                self.port = job_port.base + ((job_id >> schema.job_id_shift) + job_port.step_stride * (step or 0)) % (
                    job_port.modulo
                )
        if self.port is None and default is not None:
            # (Without an address either, the resolver refuses the address, and its fix names the port too.)
            if default.one_node_only and not one_node and schema.main_port is not None and self.address is not None:
                variable = schema.main_port.names[0]
                raise self.error(
                    variable,
                    f"it is not set, and {schema.label} states no job id to take a port from: ranks on several nodes "
                    f"would meet on the fixed port {default.port}, where another job may be meeting too",
                    default.several_nodes_fix.format(variable=variable, port=default.port),
                )
            self.port = default.port
            if default.note:
                variable = schema.main_port.names[0] if schema.main_port is not None else "the main port"
                message = default.note.format(port=default.port, variable=variable)
                self.notes += (Note(code=default.note_code, level="info", message=message),)

    def facts(
        self,
        kind: ClusterKey,
        creates_processes: bool,
        launch_hint: str,
        reason: str,
        notes: tuple[Note, ...],
        *,
        launched: bool = False,
    ) -> ClusterFacts:
        """The facts read, with what the row adds; `detail` shows the variables behind the world's size."""
        values = self.values
        shown = [f"{self.names[fact]}={values[fact]}" for fact in _SHOWN if fact in self.names]
        detail = ", ".join(shown)
        if detail and self.schema.detail_unit:
            detail += f" {self.schema.detail_unit}"
        return ClusterFacts(
            kind=kind,
            creates_processes=creates_processes,
            main_address=self.address,
            main_port=self.port,
            node_rank=values["node_rank"],
            global_rank=values["global_rank"],
            local_rank=values["local_rank"],
            world_size=values["world_size"],
            processes_per_node=values["processes_per_node"],
            num_nodes=values["num_nodes"],
            detail=detail,
            launch_hint=launch_hint,
            reason=reason,
            notes=notes,
            launched=launched,
            address_from=self.address_from,
            label=self.schema.label,
            main_address_fix=self.schema.main_address_fix,
        )


# --------------------------------------------------------------------------------------------------
# One parser per format (`rules.VariableFormat`): the text of a set variable → its value, or `_Unreadable`.


def _integer(text: str, minimum: int) -> int:
    value = whole_number(text.strip(), signed=True)
    if value is None:
        raise _Unreadable(
            "it is not a whole number (ASCII digits, at most 18)", "Unset it, or set it to a whole number"
        )
    if value < minimum:
        raise _Unreadable(f"it must be at least {minimum}", f"Set it to a number ≥ {minimum}")
    return value


def _port(text: str, minimum: int) -> int:
    value = _integer(text, minimum)
    if not 1 <= value <= 65535:
        raise _Unreadable("a TCP port is between 1 and 65535", "Set it to a free port such as 29500, or unset it")
    return value


class _Uneven(Exception):
    """SLURM's tasks per node list different counts for different nodes: (count, nodes) groups, in node order."""

    def __init__(self, groups: list[tuple[int, int]]) -> None:
        super().__init__("uneven tasks per node")
        self.groups = groups


_TASK_GROUP = re.compile(r"(\d{1,18})(?:\(x(\d{1,18})\))?", flags=re.ASCII)


def _task_groups(text: str) -> list[tuple[int, int]]:
    """SLURM's "3(x2),1" as (tasks, nodes) groups, in node order; `_Unreadable` for anything else."""
    groups: list[tuple[int, int]] = []
    for part in text.strip().split(",") if len(text) <= 100_000 else ["?"]:
        match = _TASK_GROUP.fullmatch(part.strip())
        if match is None:
            raise _Unreadable("it is not a number of tasks, such as 4 or 4(x2)", "Unset it or fix the job script")
        groups.append((int(match.group(1)), int(match.group(2) or 1)))
    return groups


def _tasks_per_node(text: str, minimum: int) -> int:
    # "4", "4(x2)" (four tasks on each of two nodes), or an uneven "3,1" / "2(x3),1" (refused, with the placement).
    groups = _task_groups(text)
    if len({count for count, _ in groups}) > 1:
        raise _Uneven(groups)
    value = groups[0][0]
    if value < minimum:
        raise _Unreadable(f"it must be at least {minimum}", "Fix the job's --ntasks-per-node")
    return value


def _job_number(text: str, minimum: int) -> int | None:
    stripped = text.strip()
    if not stripped:
        return None  # a blank job id: the job has none
    value = whole_number(stripped)  # unsigned: at least 0
    if value is None:
        raise _Unreadable("it is not a job number", "Set {port} to choose the port yourself")
    return value


def _rank_hosts(text: str) -> list[str]:
    words = text.split()
    if len(words) % 2 != 0 or not all(whole_number(count) is not None for count in words[1::2]):
        raise _Unreadable("it is not a list of 'host count' pairs", "Unset it, or set {address}")
    hosts = words[0::2]
    # The first entry is the launch (batch) node, which runs no rank under jsrun (Lightning skips it too).
    return hosts[1:] if len(hosts) > 1 else hosts


def _rank_host_count(text: str, minimum: int) -> int | None:
    return len(_rank_hosts(text)) or None


def _first_rank_host(text: str) -> str | None:
    hosts = _rank_hosts(text)
    return _host(hosts[0]) if hosts else None


def _host(text: str) -> str:
    host = host_address(text.strip())
    if host is None:
        raise _Unreadable(
            "it is not a host name or an IP address (letters, digits, '.', '-', '_'; an IPv6 address)",
            "Set it to the host of rank 0, e.g. node001 or 10.0.0.1, without a port",
        )
    return host


def _first_listed_host(text: str) -> str:
    try:
        return first_host(text)
    except ValueError as error:
        raise _Unreadable(str(error), "Check the job's node list; set {address} to override it") from None


_NUMBER_FORMATS: Mapping[VariableFormat, Callable[[str, int], int | None]] = {
    "integer": _integer,
    "port": _port,
    "tasks_per_node": _tasks_per_node,
    "job_number": _job_number,
    "rank_hosts": _rank_host_count,
}
"""The parser of each format a count, a rank, a port or a job id may be written in."""

_ADDRESS_FORMATS: Mapping[VariableFormat, Callable[[str], str | None]] = {
    "host": _host,
    "slurm_hostlist": _first_listed_host,
    "rank_hosts": _first_rank_host,
}
"""The parser of each format the main address may be written in."""


MAX_HOSTS = 100_000
"""`expand_hostlist` refuses lists that name more hosts than this (resolving needs the first alone)."""

_Segment = tuple[str, tuple[tuple[int, int, int], ...]]  # a literal, then the ranges of one bracket group


def expand_hostlist(text: str) -> list[str]:
    """Expand a SLURM host list: `node[001-004,7],gpu2` → node001 … node004, node7, gpu2.

    Zero padding of ranges is kept, several bracket groups in one name multiply out, and a malformed
    list raises `ValueError` saying where; so does a list of more than `MAX_HOSTS` names (nothing is
    expanded before the whole list has been checked and counted).
    """
    items = _parse_hostlist(text)
    total = sum(_count(segments) for segments in items)
    if total > MAX_HOSTS:
        raise ValueError(f"the host list names more than {MAX_HOSTS} hosts")
    return [name for segments in items for name in _names(segments)]


def first_host(text: str) -> str:
    """The first host of a SLURM host list (the main address), after checking the whole list; no expansion."""
    items = _parse_hostlist(text)
    # Built from the first number of each bracket group: nothing is expanded, whatever the list's size.
    host = "".join(literal + (str(ranges[0][0]).zfill(ranges[0][2]) if ranges else "") for literal, ranges in items[0])
    if host_address(host) is None:
        raise ValueError(f"its first host {host[:40]!r} is not a host name")
    return host


def _parse_hostlist(text: str) -> list[list[_Segment]]:
    if len(text) > 100_000:
        raise ValueError("the host list is implausibly long")
    items = [_parse_item(item) for item in _split_top_level(text.strip())]
    if not items:
        raise ValueError("the host list is empty")
    return items


def _split_top_level(text: str) -> list[str]:
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for character in text:
        if character == "[":
            depth += 1
            if depth > 1:
                raise ValueError("brackets cannot nest")
        elif character == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("a ']' has no matching '['")
        if character == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(character)
    if depth != 0:
        raise ValueError("a '[' is not closed")
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


_HOST_CHARACTERS = re.compile(r"[A-Za-z0-9._-]*", flags=re.ASCII)
_BRACKET_GROUP = re.compile(r"([^\[]*)\[([^\]]*)\]")
MAX_HOST_NAME = 253
"""The longest host name (DNS's limit): a longer one in a host list is refused before anything is expanded."""


def _parse_item(item: str) -> list[_Segment]:
    """`name[1-3]x[07,9]` as segments ("name", ranges), ("x", ranges), ("", ()) — checked, not expanded; read in
    one pass (each bracket group from where the last ended, never a copy of the rest)."""
    segments: list[_Segment] = []
    position = 0
    length = 0  # the longest name the item expands to
    while True:
        match = _BRACKET_GROUP.match(item, position)
        literal = item[position:] if match is None else match.group(1)
        if not _HOST_CHARACTERS.fullmatch(literal):
            raise ValueError(f"{item[:60]!r} is not a host name")
        length += len(literal)
        if match is not None:
            ranges = _parse_ranges(match.group(2), item)
            segments.append((literal, ranges))
            length += max(max(len(str(high)), width) for _, high, width in ranges)
        else:
            segments.append((literal, ()))
        if length > MAX_HOST_NAME:
            raise ValueError(f"{item[:60]!r} is not a host name: it names hosts of over {MAX_HOST_NAME} characters")
        if match is None:
            return segments
        position = match.end()
        if position == len(item):
            return segments


def _parse_ranges(text: str, item: str) -> tuple[tuple[int, int, int], ...]:
    ranges = []
    for raw_part in text.split(","):
        part = raw_part.strip()
        bounds = re.fullmatch(r"(\d{1,18})(?:-(\d{1,18}))?", part, flags=re.ASCII)
        if bounds is None:
            raise ValueError(f"{part[:40]!r} in {item[:60]!r} is not a number or a range like 001-004")
        low_text, high_text = bounds.group(1), bounds.group(2) or bounds.group(1)
        low, high = int(low_text), int(high_text)
        if high < low:
            raise ValueError(f"the range {part!r} in {item!r} runs backwards")
        if high - low > MAX_HOSTS:
            raise ValueError(f"the range {part!r} in {item!r} is implausibly large")
        width = len(low_text) if low_text.startswith("0") else 0
        ranges.append((low, high, width))
    return tuple(ranges)


def _count(segments: list[_Segment]) -> int:
    total = 1
    for _, ranges in segments:
        if ranges:
            total *= sum(high - low + 1 for low, high, _ in ranges)
            if total > MAX_HOSTS:
                return total  # enough to refuse; never multiply further
    return total


def _names(segments: list[_Segment]) -> Iterator[str]:
    choices: list[Iterable[str]] = []
    for literal, ranges in segments:
        choices.append([literal])
        if ranges:
            choices.append(_numbers(ranges))
    for parts in itertools.product(*choices):
        yield "".join(parts)


def _numbers(ranges: tuple[tuple[int, int, int], ...]) -> Iterable[str]:
    return [str(number).zfill(width) for low, high, width in ranges for number in range(low, high + 1)]


_BUILTIN_INDEX = _index(BUILTIN_RULES)
"""trainplan's own clusters, indexed at import (the cold path reads them without a cache lookup)."""
