"""Cluster environments: how each is detected, its variable schema (which variable gives each fact of the job, in
which format), its ports and launch hints, the workers trainplan's launchers start, and the cluster aliases."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, Literal

import attrs

from trainplan.spec.frozen import freeze_nested_maps
from trainplan.spec.names import (
    ClusterFlag,
    ClusterKey,
)

SLURM_DEFAULT_PORT: Final[int] = 12910
"""Lightning's SLURM main port when there is no job id."""

SLURM_PORT_BASE: Final[int] = 15000
"""SLURM main port with a job id: 15000 + the job id's last four digits (Lightning's rule, so every task agrees)."""

LSF_PORT_BASE: Final[int] = 10000
"""LSF main port: 10000 + job id modulo 1000 (Lightning's rule)."""

MPI_PORT_BASE: Final[int] = 20000
"""MPI main port: 20000 + the job family (OMPI_MCA_ess_base_jobid >> 16, Open MPI) or Hydra's proxy modulo 10000, the
same on every rank of one mpirun and another for the next (below Linux's ephemeral ports, as SLURM's are)."""

MPI_PROXY_FACT: Final[str] = "TRAINPLAN_MPI_PROXY"
"""Not a variable anyone sets: the probe writes it (`effects.probing`) for a rank of Hydra (MPICH, Intel MPI), from
/proc: the pid and start time of the `hydra_pmi_proxy` that started it, as one number. Two jobs on one host have two
proxies; the ranks of one job on one node share theirs."""

MPI_DAEMON_FACT: Final[str] = "TRAINPLAN_MPI_DAEMON"
"""Not a variable anyone sets: the probe writes it (`effects.probing`) for a process with MPI's variables when an MPI
launcher's daemon is among its ancestors in /proc (its name: `orted`, `prted`, `hydra_pmi_proxy`, `mpirun`,
`mpiexec`): MPI started it, so the SLURM step variables it also carries are those of the step that started MPI's
daemons, never its own world (srun's own PMI plugin, where SLURM started the rank, leaves no such ancestor)."""

MPI_NODES_FACT: Final[str] = "TRAINPLAN_MPI_NODES"
"""Not a variable anyone sets: the probe writes it for an MPI rank whose daemon (Hydra's proxy, Open MPI's orted) srun
started as a step of one task per node (the daemon's parent is slurmstepd): that step's node count
(SLURM_STEP_NUM_NODES), the nodes the MPI job runs on. Hydra states none; Open MPI's OMPI_MCA_orte_num_nodes counts a
hostfile's nodes beside the allocation's (4 for `--map-by seq --hostfile` over 2 nodes, read off Open MPI 4.1)."""

SLURM_SHELL_FACT: Final[str] = "TRAINPLAN_SLURM_SHELL"
"""Not a variable anyone sets: the probe writes it for a process with SLURM's step variables whose ancestors in /proc
(at most 16 read) reach slurmstepd through an interactive shell (a shell started without a command or a script: `srun
--pty bash`): the process was typed into that shell, and is not one of the step's tasks."""

PROCESS_TREE_FACTS: Final[tuple[str, ...]] = (MPI_PROXY_FACT, MPI_DAEMON_FACT, MPI_NODES_FACT, SLURM_SHELL_FACT)
"""The facts of the process tree the probe writes as variables (never taken from the environment)."""

NODES_INFERRED_NOTE: Final[str] = "cluster-nodes-inferred"
"""The code of the note a plan carries when its job's node count was inferred (world size / processes on this node)
rather than stated by the launcher: `trainplan.join` then bounds its wait for rank 0's store (`INFERRED_JOIN_SECONDS`),
since another rank may have read another layout and refused."""

NODE_RANK_INFERRED_NOTE: Final[str] = "cluster-node-rank-inferred"
"""The code of the note a plan carries when this node's rank was inferred (global rank // processes per node, for a
cluster that numbers ranks node after node) because the cluster's node rank variable is not set."""

INFERRED_JOIN_SECONDS: Final[int] = 60
"""How long `trainplan.join` waits for the world's store to form when the plan's node count was inferred."""

DEFAULT_MAIN_PORT: Final[int] = 29500
"""torch.distributed's customary port, used where a cluster gives neither MASTER_PORT nor a job id (MPI)."""

LAUNCHED_MARKER: Final[str] = "TRAINPLAN_LAUNCHED"
"""Set by `trainplan.launch` in every worker it starts. Those workers also carry torchrun's variables (RANK,
LOCAL_RANK, GROUP_RANK, LOCAL_WORLD_SIZE) for scripts that expect them; the marker tells the resolver that
trainplan, not torchrun, started them, so the plan keeps its own launcher and gains the worker's ranks."""

JOB_IDENTITY_VARIABLES: Final[tuple[str, ...]] = (
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "TORCHELASTIC_RUN_ID",
    "OMPI_MCA_ess_base_jobid",
    "LSB_JOBID",
)
"""The variables every rank of one job (one srun step, one torchrun run, one mpirun, one LSF job) shares and another
job does not: the world's store records them, and a rank whose values differ met another job's store (two jobs on
one port). A launcher without such a variable (MPICH's Hydra) is not compared."""

RUN_ID_VARIABLE: Final[str] = "TORCHELASTIC_RUN_ID"
"""torchrun's run id: `trainplan launch` sets it too (`TRAINPLAN_RUN_ID_PREFIX`), so another one in a process that
carries trainplan's marker means a torchrun started inside a trainplan worker gave this process its world."""

JobFact = Literal[
    "world_size",
    "processes_per_node",
    "global_rank",
    "local_rank",
    "node_rank",
    "num_nodes",
    "main_address",
    "main_port",
]
"""A fact of a started job that its variables state (and trainplan's launchers write for their workers)."""

VariableFormat = Literal["integer", "port", "host", "tasks_per_node", "job_number", "slurm_hostlist", "rank_hosts"]
"""How a variable spells its fact; `resolve.cluster` has one parser per format, whichever cluster sets it:

- `integer`: a whole number in ASCII digits (a count, a rank, a job id): at least 1 for a count, 0 for the rest;
- `port`: a TCP port, 1-65535;
- `host`: a host name or an IP address, without a port (`[::1]` loses its brackets);
- `tasks_per_node`: SLURM's `4` or `4(x2)` (an uneven `4(x2),2` has no single value: refused);
- `job_number`: a job id that may be blank (then the job has none);
- `slurm_hostlist`: SLURM's host list (`node[001-004,7],gpu2`), checked whole: its first host;
- `rank_hosts`: LSF's `host count host count ...`: the hosts that run ranks (the first, the launch node, runs none
  under jsrun, as Lightning reads it): their number, or the first of them.
"""


@attrs.frozen(kw_only=True)
class JobVariable:
    """Where one fact of a started job comes from: the first of `names` that is set (the others are fallbacks, in
    order), read in `format`. When none is set, the fact is `default` (None: unknown), or, for a `required` one, a
    `ClusterEnvironmentError` naming the last name (the one every such process carries) with `unset_reason` and
    `unset_fix` ({cluster}: the schema's label)."""

    names: tuple[str, ...]
    format: VariableFormat = "integer"
    required: bool = False
    default: int | None = None
    unset_reason: str = "it is not set, and the cluster environment needs it"
    unset_fix: str = "Start the processes with the {cluster} launcher, which sets it, or set it by hand"


def _required(*names: str, format: VariableFormat = "integer") -> JobVariable:
    return JobVariable(names=names, format=format, required=True)


def _optional(*names: str, format: VariableFormat = "integer", default: int | None = None) -> JobVariable:
    return JobVariable(names=names, format=format, default=default)


# torch.distributed's env:// meeting point, which a user (or a launcher) may set under any cluster manager.
_MAIN_ADDRESS = _optional("MASTER_ADDR", format="host")
_MAIN_PORT = _optional("MASTER_PORT", format="port")
# How many tasks a SLURM job has: --ntasks, else one per node (what srun starts in it by default).
_SLURM_JOB_TASKS = ("SLURM_NTASKS", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
# SLURM's nodes in order: the step's own first (a step may run on part of the job's nodes).
_SLURM_NODES = _optional("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST", format="slurm_hostlist")


@attrs.frozen(kw_only=True)
class JobVariables:
    """The variables a cluster manager gives each process it starts: for each fact of the job, the variable that
    states it and its format. One reader (`resolve.cluster`) reads every schema. A fact without a variable is unknown
    (None: the resolver derives what it can), a number is a fact of the cluster itself.

    Counts are at least 1 and ranks at least 0; a rank is checked against its count (global rank < world size,
    local rank < processes per node, node rank < nodes) where both come from variables. Without a node count
    variable, the nodes are world size / processes per node where that divides evenly."""

    label: str  # the cluster as messages name it ("SLURM")
    reason: str  # why the plan is in this cluster: {how} ("detected" or "asked for"), {values[fact]}, {managers}
    reason_asked: str = ""  # the reason when asked for by name, where it is not `reason` with {how}
    world_size: JobVariable | None = None
    processes_per_node: JobVariable | int | None = None
    global_rank: JobVariable | None = None
    local_rank: JobVariable | int | None = None
    node_rank: JobVariable | None = None
    num_nodes: JobVariable | None = None
    main_address: tuple[JobVariable, ...] = ()  # the first that is set gives the host of rank 0; else 127.0.0.1
    loopback_needs_one_node: bool = False  # 127.0.0.1 only for a job known to run on one node (else unknown)
    main_port: JobVariable | None = None
    job_id: JobVariable | None = None  # read by the row's port formula (a required one is checked in any case)
    job_id_is_the_nodes: bool = False  # the job id names this node's part of the job only: used on one node alone
    job_id_shift: int = 0  # low bits of the job id dropped first (Open MPI's is its job family × 65536 + 1)
    step_id: JobVariable | None = None  # read by the row's port formula: steps of one job run side by side
    node_list: JobVariable | None = None  # the nodes in order, where the cluster names them (for messages)
    detail_unit: str = ""  # what the world size counts, in messages ("pods")
    # Where world size, processes per node and nodes all come from variables and the world is not their product, the
    # nodes run different numbers of processes: refused on every rank with this fix ({num_nodes}: the node count;
    # {per_node} and {world_size}: an even layout over those nodes that holds the job's processes).
    uneven_fix: str = "Start the same number of processes on every node"
    # Where no variable gives the main address and the job spans nodes, the refusal's fix: how to give it.
    main_address_fix: str = (
        "Give every process the host of rank 0 and a free port: MASTER_ADDR=<the host of rank 0> and "
        "MASTER_PORT=<port> in each process's environment"
    )


def job_variables(schema: JobVariables) -> tuple[tuple[JobFact | Literal["job_id"], JobVariable], ...]:
    """Every variable of a schema with the fact it states (what the probe copies, and what a launcher writes)."""
    found: list[tuple[JobFact | Literal["job_id"], JobVariable]] = []
    for fact, source in (
        ("world_size", schema.world_size),
        ("processes_per_node", schema.processes_per_node),
        ("global_rank", schema.global_rank),
        ("local_rank", schema.local_rank),
        ("node_rank", schema.node_rank),
        ("num_nodes", schema.num_nodes),
        *(("main_address", address) for address in schema.main_address),
        ("main_port", schema.main_port),
        ("job_id", schema.job_id),
    ):
        if isinstance(source, JobVariable):
            found.append((fact, source))  # type: ignore[arg-type]  # the facts above are JobFacts
    return tuple(found)


@attrs.frozen(kw_only=True)
class JobPort:
    """A main port every process of a job computes alike from the job's id (the schema's `job_id`), Lightning's
    rules: `base + id % modulo`, with `step_stride` times the schema's step id added (two steps of one SLURM job,
    run side by side, meet on two ports)."""

    base: int
    modulo: int
    step_stride: int = 0


@attrs.frozen(kw_only=True)
class DefaultPort:
    """The main port when neither the port variable nor a job id gives one; where `note` is given, a note (code
    `note_code`; {port} and {variable}, the port variable, filled in) says so."""

    port: int
    note_code: str = ""
    note: str = ""
    one_node_only: bool = False  # over several nodes a fixed port is refused: another job may meet there too
    several_nodes_fix: str = "Export {variable}=<a free port> to every rank, the same on every node"
    """The fix of that refusal, in the launcher's own words ({variable}, the port variable, and {port} filled in)."""


TaskVerdict = Literal["alone", "refuse", "task"]
"""What a `NotATask` row makes of a process: `alone` (the cluster manager started no process here: trainplan plans
this machine and may start the processes itself), `refuse` (a typed refusal: the world it would join never forms),
`task` (it is one of the cluster's tasks after all: the schema reads it)."""


@attrs.frozen(kw_only=True)
class NotATask:
    """A process that carries a cluster's variables without being one of the tasks the cluster started (SLURM's
    allocation shell, its batch script, an `srun --pty` shell), told apart by the variables that are set and unset.

    It matches when every variable of `unset` is unset and every one of `set` is set. `tasks` names the count of
    tasks that decides what follows (the first that is set): `when_one` when it is at most 1 (or unset), `when_many`
    above. An `alone` verdict adds a note (`code`, `level`, `message`) and applies to detection (`auto`) only: asking
    for the cluster by name reads the schema as a task. A `refuse` verdict raises the refusal `code` (a row of the
    messages' RULES) whether the cluster was detected or asked for. Messages are filled with every variable's value
    ({SLURM_JOB_ID}: "?" when unset) and {tasks}, the count of tasks."""

    code: str
    unset: frozenset[str]
    set: frozenset[str] = frozenset()
    tasks: tuple[str, ...]
    when_one: TaskVerdict
    when_many: TaskVerdict
    level: Literal["info", "warning"] = "info"
    level_when_one: Literal["info", "warning"] | None = None  # the note's level for one task (None: `level`)
    message: str = ""


@attrs.frozen(kw_only=True)
class ClusterRule:
    """A cluster manager: how its processes are found (`detect_variables`, tried by `detect_priority`), what their
    variables say (`schemas`), and how messages spell a job of it. A downstream one is a row of
    `Rules.extend(clusters=...)`, with a `CustomName`."""

    name: ClusterKey
    description: str
    detect_variables: tuple[frozenset[str], ...]  # detected when every variable of any one set is present
    detect_priority: int | None  # higher is tried first; None: only on request
    creates_processes: bool  # the cluster manager starts every process itself
    node_rank_variable: str  # what names the node rank in messages (the variable the cluster sets, or a phrase)
    # The variables its processes carry. Several are dialects (Open MPI's, then MPICH's): the first whose world size
    # variable is set is read, else the last.
    schemas: tuple[JobVariables, ...]
    max_processes_per_node: int | None = None  # None: no limit beyond the hardware
    launch_hint: str = ""  # how to start the job with another layout: {num_nodes}, {processes_per_node}, {world_size}
    job_port: JobPort | None = None  # the main port from the job id when the port variable is not set
    default_port: DefaultPort | None = None  # the main port when neither gives one (None: the launcher picks one)
    not_tasks: tuple[NotATask, ...] = ()  # processes with the variables that are not the cluster's tasks; first wins
    # Clusters whose variables may describe the same processes: when one of them is present and states the same world
    # size and global rank, it started them (srun's own PMI plugin sets MPI's variables; so does jsrun) and its row
    # reads the job, stating more (the nodes, the main address). Otherwise this row, found first, is the innermost.
    same_job_as: tuple[ClusterKey, ...] = ()
    # A fact of the process tree (`PROCESS_TREE_FACTS`) set when one of this cluster's own daemons started the process:
    # then this row is the innermost, whatever the `same_job_as` rows state.
    started_by_fact: str = ""
    # Without a node rank variable, whether the cluster places ranks on nodes in blocks of processes per node, so that a
    # rank's node is rank // processes per node (jsrun's resource sets); otherwise the node rank stays unknown.
    node_rank_in_blocks: bool = False


def _set_by_torchrun(name: str, format: VariableFormat) -> JobVariable:
    return JobVariable(
        names=(name,),
        format=format,
        required=True,
        unset_reason="torchrun always sets it, and it is missing",
        unset_fix="Start the script with torchrun",
    )


CLUSTERS: Final[Mapping[ClusterKey, ClusterRule]] = {
    rule.name: rule
    for rule in (
        ClusterRule(
            name="torchelastic",
            description="torchrun / torch.distributed.elastic",
            # torchrun's workers; or RANK with torchelastic's run id, which is how torch itself
            # (`torch.distributed.is_torchelastic_launched`) and Lightning's TorchElasticEnvironment tell a torchelastic
            # worker: a launcher that sets the run id without GROUP_RANK starts a torchelastic world all the same.
            detect_variables=(
                frozenset({"RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}),
                frozenset({RUN_ID_VARIABLE, "RANK"}),
            ),
            # torchrun can run inside a SLURM allocation or under mpirun, so it is checked first (as Lightning does):
            # the innermost launcher wins.
            detect_priority=7,
            creates_processes=True,
            node_rank_variable="GROUP_RANK",
            schemas=(
                JobVariables(
                    label="torchrun",
                    reason=(
                        "torchelastic was {how} (RANK, LOCAL_RANK and LOCAL_WORLD_SIZE are set, with GROUP_RANK or "
                        "TORCHELASTIC_RUN_ID)"
                    ),
                    world_size=_required("WORLD_SIZE"),
                    processes_per_node=_required("LOCAL_WORLD_SIZE"),
                    global_rank=_required("RANK"),
                    local_rank=_required("LOCAL_RANK"),
                    # torchrun sets it; a launcher that does not gets it in blocks (`node_rank_in_blocks`), where
                    # LOCAL_RANK agrees.
                    node_rank=JobVariable(
                        names=("GROUP_RANK",),
                        unset_fix="Start the script with torchrun, which sets it, or set GROUP_RANK=<this node's rank> "
                        "in every worker",
                    ),
                    num_nodes=_optional("GROUP_WORLD_SIZE"),  # the agents that met (torchrun sets it on every worker)
                    main_address=(_set_by_torchrun("MASTER_ADDR", "host"),),
                    main_port=_set_by_torchrun("MASTER_PORT", "port"),
                    uneven_fix=(
                        "Start every node with the same --nproc-per-node: torchrun --nnodes={num_nodes} "
                        "--nproc-per-node={per_node} on each"
                    ),
                ),
            ),
            launch_hint="torchrun --nnodes={num_nodes} --nproc-per-node={processes_per_node}",
            # torchelastic numbers ranks node after node (the agents' ranks in order, LOCAL_WORLD_SIZE each): without
            # GROUP_RANK, a node's rank is RANK // LOCAL_WORLD_SIZE. Lightning reads GROUP_RANK with 0 for unset.
            node_rank_in_blocks=True,
        ),
        ClusterRule(
            name="slurm",
            description="SLURM, processes started by srun",
            # SLURM_NTASKS in every srun task; SLURM_JOB_ID alone in a batch script or salloc shell without --ntasks,
            # which are then told apart below (not tasks), never mistaken for this machine alone.
            detect_variables=(frozenset({"SLURM_NTASKS"}), frozenset({"SLURM_JOB_ID"})),
            detect_priority=5,
            creates_processes=True,
            node_rank_variable="SLURM_NODEID",
            schemas=(
                JobVariables(
                    label="SLURM",
                    reason="SLURM was {how} (SLURM_NTASKS is set, and this process is an srun task: SLURM_STEP_ID)",
                    # The step's own variables first: a step may use part of the job (srun -n1 in a job of 8 tasks),
                    # and MPI launchers start their daemons as a step of one task per node.
                    world_size=_required("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
                    processes_per_node=_optional(
                        "SLURM_STEP_TASKS_PER_NODE",
                        "SLURM_TASKS_PER_NODE",
                        "SLURM_NTASKS_PER_NODE",
                        format="tasks_per_node",
                    ),
                    global_rank=_required("SLURM_PROCID"),
                    local_rank=_required("SLURM_LOCALID"),
                    node_rank=_required("SLURM_NODEID"),
                    num_nodes=_optional("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
                    main_address=(
                        _MAIN_ADDRESS,
                        _optional(
                            "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST", format="slurm_hostlist"
                        ),
                    ),
                    main_port=_MAIN_PORT,
                    job_id=_optional("SLURM_JOB_ID", format="job_number"),
                    step_id=_optional("SLURM_STEP_ID", format="job_number"),
                    node_list=_SLURM_NODES,
                    uneven_fix=(
                        "Start the step with the same number of tasks on every node: srun --nodes={num_nodes} "
                        "--ntasks-per-node={per_node}"
                    ),
                ),
            ),
            launch_hint=(
                "#SBATCH --nodes={num_nodes} --ntasks-per-node={processes_per_node}, and run the script with srun"
            ),
            # 15000 + the job id's last four digits, so every task agrees (Lightning's rule), plus 1009 per step, so
            # that steps run side by side in one allocation (a sweep) never meet; 12910 without a job id.
            job_port=JobPort(base=SLURM_PORT_BASE, modulo=10000, step_stride=1009),
            default_port=DefaultPort(port=SLURM_DEFAULT_PORT),
            # Which processes with SLURM's variables are not srun tasks (read off SLURM 22.05: an srun task carries
            # SLURM_STEP_ID and SLURM_PROCID whatever the job is called; salloc's shell carries neither; the batch
            # script carries SLURM_PROCID but no SLURM_STEP_ID; `srun --pty` sets SLURM_PTY_PORT). Lightning decides
            # by the job's name (bash, interactive), which plans every srun task of `salloc` or `srun bash -c` alone.
            not_tasks=(
                NotATask(
                    code="slurm-allocation-shell",
                    unset=frozenset({"SLURM_STEP_ID", "SLURM_PROCID"}),
                    tasks=_SLURM_JOB_TASKS,
                    when_one="alone",
                    when_many="alone",
                    level="warning",
                    message=(
                        "this is the shell of SLURM allocation {SLURM_JOB_ID} (salloc), not one of its tasks "
                        "(neither SLURM_STEP_ID nor SLURM_PROCID is set): SLURM started no other copy of this "
                        "process, so a world of the allocation's tasks would never form; trainplan plans this "
                        "machine alone and starts the processes itself. To train on the allocation's {tasks} "
                        "task(s), start the script with srun: srun python train.py"
                    ),
                ),
                NotATask(
                    code="slurm-batch-step",
                    unset=frozenset({"SLURM_STEP_ID"}),
                    set=frozenset({"SLURM_PROCID"}),
                    tasks=_SLURM_JOB_TASKS,
                    when_one="alone",
                    when_many="refuse",
                    message=(
                        "this is the batch script of SLURM job {SLURM_JOB_ID}, not an srun task (SLURM_STEP_ID is not "
                        "set): trainplan plans this machine and starts the processes itself"
                    ),
                ),
                NotATask(
                    code="slurm-interactive-shell",
                    unset=frozenset(),
                    set=frozenset({"SLURM_PTY_PORT", SLURM_SHELL_FACT}),
                    tasks=("SLURM_STEP_NUM_TASKS",),
                    when_one="alone",
                    when_many="alone",
                    level="warning",
                    level_when_one="info",
                    message=(
                        "this process was started from the interactive shell ({TRAINPLAN_SLURM_SHELL}) of an "
                        "srun --pty step of SLURM job {SLURM_JOB_ID} ({tasks} task(s)), not by srun: the step's "
                        "other tasks run no copy of it, so a world of {tasks} would never form; trainplan plans "
                        "this machine alone and starts the processes itself. To run on the step's tasks, start "
                        "the script with srun itself (srun --ntasks={tasks} python train.py)"
                    ),
                ),
                NotATask(
                    code="slurm-interactive-step",
                    unset=frozenset(),
                    set=frozenset({"SLURM_PTY_PORT"}),
                    tasks=("SLURM_STEP_NUM_TASKS",),
                    when_one="alone",
                    when_many="task",
                    message=(
                        "this is an interactive srun shell of SLURM job {SLURM_JOB_ID} (srun --pty: SLURM_PTY_PORT is "
                        "set, one task): trainplan plans this machine and starts the processes itself "
                        "(cluster='slurm' takes the step's one task instead)"
                    ),
                ),
            ),
        ),
        ClusterRule(
            name="lsf",
            description="IBM Spectrum LSF with jsrun",
            detect_variables=(
                frozenset({"LSB_JOBID", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK"}),
            ),
            detect_priority=3,
            creates_processes=True,
            node_rank_variable="node rank",
            schemas=(
                JobVariables(
                    label="LSF",
                    reason="LSF was {how} (LSB_JOBID and the JSM_NAMESPACE_* variables are set)",
                    world_size=_required("JSM_NAMESPACE_SIZE"),
                    global_rank=_required("JSM_NAMESPACE_RANK"),
                    local_rank=_required("JSM_NAMESPACE_LOCAL_RANK"),
                    num_nodes=_optional("LSB_MCPU_HOSTS", format="rank_hosts"),
                    main_address=(_MAIN_ADDRESS, _optional("LSB_MCPU_HOSTS", format="rank_hosts")),
                    main_port=_MAIN_PORT,
                    job_id=_required("LSB_JOBID"),
                ),
            ),
            launch_hint="jsrun --nrs {num_nodes} --tasks_per_rs {processes_per_node}",
            node_rank_in_blocks=True,  # jsrun fills one resource set (node) after another, as Lightning reads LSF
            job_port=JobPort(base=LSF_PORT_BASE, modulo=1000),  # 10000 + id % 1000 (Lightning)
        ),
        ClusterRule(
            name="mpi",
            description="mpirun / mpiexec (Open MPI, MPICH, Intel MPI)",
            # Open MPI, then the PMI variables of MPICH, Intel MPI and other Hydra-based launchers.
            detect_variables=(
                frozenset({"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"}),
                frozenset({"PMI_SIZE", "PMI_RANK"}),
            ),
            # Before SLURM: mpirun and mpiexec start their daemons with srun inside an allocation, so their ranks carry
            # that step's variables too (one task per node), and MPI's world is the one that started the process.
            detect_priority=6,
            creates_processes=True,
            node_rank_variable="node rank",
            schemas=(
                JobVariables(
                    label="MPI",
                    reason="MPI was {how} (OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_RANK are set)",
                    world_size=_required("OMPI_COMM_WORLD_SIZE"),
                    processes_per_node=_optional("OMPI_COMM_WORLD_LOCAL_SIZE"),
                    global_rank=_required("OMPI_COMM_WORLD_RANK"),
                    local_rank=_optional("OMPI_COMM_WORLD_LOCAL_RANK"),
                    # MPI states no node index (ranks may be mapped round-robin), so the node rank stays unknown.
                    num_nodes=_optional(MPI_NODES_FACT, "OMPI_MCA_orte_num_nodes"),  # the nodes of the ranks
                    main_address=(_MAIN_ADDRESS,),
                    loopback_needs_one_node=True,  # MPI names no hosts
                    main_port=_MAIN_PORT,
                    job_id=_optional("OMPI_MCA_ess_base_jobid", format="job_number"),  # one per mpirun
                    job_id_shift=16,  # the job family: what differs between two mpiruns
                    uneven_fix=(
                        "Map the same number of ranks to every node: mpirun -np {world_size} --map-by "
                        "ppr:{per_node}:node"
                    ),
                    main_address_fix=(
                        "Export MASTER_ADDR=<the host of rank 0> and a free MASTER_PORT to every process: mpirun -x "
                        "MASTER_ADDR=$(hostname) -x MASTER_PORT=<port>, run on rank 0's node (where mpirun places it "
                        "by default)"
                    ),
                ),
                JobVariables(
                    label="MPI",
                    reason="MPI was {how} (PMI_SIZE and PMI_RANK are set)",
                    world_size=_required("PMI_SIZE"),
                    processes_per_node=_optional("MPI_LOCALNRANKS"),
                    global_rank=_required("PMI_RANK"),
                    local_rank=_optional("MPI_LOCALRANKID"),
                    # Hydra states no node count; the probe reads it off the srun step that started its proxies.
                    num_nodes=_optional(MPI_NODES_FACT),
                    main_address=(_MAIN_ADDRESS,),
                    loopback_needs_one_node=True,
                    main_port=_MAIN_PORT,
                    # Hydra (MPICH, Intel MPI) states no job id: the probe names the proxy that started this rank
                    # (one per node and job), which names the job when it runs on one node.
                    job_id=_optional(MPI_PROXY_FACT, format="job_number"),
                    job_id_is_the_nodes=True,
                    uneven_fix="Start the same number of ranks on every node: mpiexec -n {world_size} -ppn {per_node}",
                    main_address_fix=(
                        "Export MASTER_ADDR=<the host of rank 0> and a free MASTER_PORT to every process: mpiexec "
                        "-genv MASTER_ADDR $(hostname) -genv MASTER_PORT <port>, run on rank 0's node (where mpiexec "
                        "places it by default)"
                    ),
                ),
            ),
            launch_hint="mpirun -np {world_size} --map-by ppr:{processes_per_node}:node",
            # Open MPI's job family (its job id's high bits) gives every rank of one mpirun the same port, and another
            # mpirun another one; so does Hydra's proxy for a job on one node.
            job_port=JobPort(base=MPI_PORT_BASE, modulo=10000),
            default_port=DefaultPort(
                port=DEFAULT_MAIN_PORT,
                note_code="mpi-default-port",
                note=(
                    "MPI gives no port and no job id; using {port}: a second MPI job on the same machine needs its own "
                    "(export {variable} to every rank, e.g. mpiexec -genv {variable} 29600)"
                ),
                one_node_only=True,
                several_nodes_fix=(
                    "Export a free port to every rank, the same on every node: mpiexec -genv {variable} <port> "
                    "(MPICH, Intel MPI), mpirun -x {variable}=<port> (Open MPI)"
                ),
            ),
            same_job_as=("slurm", "lsf"),
            started_by_fact=MPI_DAEMON_FACT,
        ),
        ClusterRule(
            name="kubeflow",
            description="Kubeflow PyTorchJob: one process per pod",
            detect_variables=(frozenset({"KUBERNETES_PORT", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}),),
            # Every pod has KUBERNETES_PORT, but with RANK, WORLD_SIZE and MASTER_ADDR/PORT beside it the pod is one
            # rank of a PyTorchJob (torchrun inside a pod sets LOCAL_RANK too and is found first, as torchelastic).
            # Lightning never detects it (its detect() raises): a deliberate difference.
            detect_priority=4,
            creates_processes=True,
            node_rank_variable="node rank",
            schemas=(
                JobVariables(
                    label="Kubeflow",
                    reason="Kubeflow was {how}",
                    world_size=_required("WORLD_SIZE"),
                    global_rank=_required("RANK"),
                    # One process per pod (Lightning's KubeflowEnvironment counts its world in pods): the pod's rank
                    # is its node's, and its process local rank 0.
                    processes_per_node=1,
                    local_rank=0,
                    node_rank=_required("RANK"),
                    main_address=(_MAIN_ADDRESS,),
                    loopback_needs_one_node=True,
                    main_port=_MAIN_PORT,
                    detail_unit="pods",
                ),
            ),
            # A PyTorchJob runs one process per pod (Lightning's KubeflowEnvironment counts its world in pods).
            max_processes_per_node=1,
            launch_hint="a PyTorchJob with {num_nodes} replicas",
        ),
        ClusterRule(
            name="torch_env",
            description=(
                "another launcher with torch's env:// variables (DeepSpeed's, torch.distributed.launch --use_env, "
                "a hand-written mpirun or ssh wrapper)"
            ),
            # RANK and WORLD_SIZE are what torch's init_process_group("env://") reads; LOCAL_RANK (below, not a task
            # without it) is what Lightning's LightningEnvironment takes for "processes created externally". Tried
            # after every named cluster manager, whose processes may carry these variables too.
            detect_variables=(frozenset({"RANK", "WORLD_SIZE"}),),
            detect_priority=1,
            creates_processes=True,
            node_rank_variable="NODE_RANK",
            schemas=(
                JobVariables(
                    label="env:// launcher",
                    reason=(
                        "torch's env:// variables were {how} (RANK, WORLD_SIZE and LOCAL_RANK are set, and no cluster "
                        "manager's)"
                    ),
                    world_size=_required("WORLD_SIZE"),
                    processes_per_node=_optional("LOCAL_WORLD_SIZE"),
                    global_rank=_required("RANK"),
                    local_rank=JobVariable(
                        names=("LOCAL_RANK",),
                        required=True,
                        unset_reason="it is not set, and it names this process's device on its node",
                        unset_fix="Set LOCAL_RANK=<this process's index on its node> in every process",
                    ),
                    # Lightning's order (NODE_RANK, then GROUP_RANK); without either, RANK // LOCAL_WORLD_SIZE
                    # (`node_rank_in_blocks`), and without LOCAL_WORLD_SIZE too the node is refused as unknown.
                    node_rank=JobVariable(
                        names=("NODE_RANK", "GROUP_RANK"),
                        unset_fix=(
                            "Set NODE_RANK=<this node's rank> (0 on one machine) or LOCAL_WORLD_SIZE=<processes per "
                            "node> in every process, or start the script with torchrun, which sets both"
                        ),
                    ),
                    main_address=(_MAIN_ADDRESS,),
                    loopback_needs_one_node=True,
                    main_port=_MAIN_PORT,
                    uneven_fix=(
                        "Start the same number of processes on every node: {per_node} on each of {num_nodes} "
                        "(WORLD_SIZE={world_size}, LOCAL_WORLD_SIZE={per_node})"
                    ),
                ),
            ),
            launch_hint=(
                "{world_size} processes, {processes_per_node} on each of {num_nodes} node(s) (WORLD_SIZE, "
                "LOCAL_WORLD_SIZE, NODE_RANK, RANK and LOCAL_RANK in each)"
            ),
            # torch's customary port on one machine (torch's env:// itself refuses a missing MASTER_PORT).
            default_port=DefaultPort(
                port=DEFAULT_MAIN_PORT,
                note_code="env-default-port",
                note="{variable} is not set: the processes meet on torch's customary port {port}",
                one_node_only=True,
            ),
            # Ranks numbered node after node, as torch's launchers (and DeepSpeed's) number them.
            node_rank_in_blocks=True,
            not_tasks=(
                # Lightning ignores RANK and WORLD_SIZE without LOCAL_RANK (this machine alone); torch's env://
                # would use them. Without LOCAL_RANK this process's device is unknown, and stale variables left in a
                # shell would make every lone run wait for a world that never forms: planned alone, with a note.
                NotATask(
                    code="env-without-local-rank",
                    unset=frozenset({"LOCAL_RANK"}),
                    tasks=("WORLD_SIZE",),
                    when_one="alone",
                    when_many="alone",
                    level="warning",
                    level_when_one="info",
                    message=(
                        "RANK={RANK} and WORLD_SIZE={WORLD_SIZE} are set without LOCAL_RANK: trainplan plans this "
                        "machine alone and does not join a world of {tasks}. If a launcher started this process as "
                        "one of {tasks}, set LOCAL_RANK (and NODE_RANK or LOCAL_WORLD_SIZE) in every process; "
                        "otherwise unset RANK and WORLD_SIZE"
                    ),
                ),
            ),
        ),
        ClusterRule(
            name="local",
            description="this machine (or machines you start yourself with NODE_RANK and MASTER_ADDR)",
            detect_variables=(frozenset(),),
            detect_priority=0,
            creates_processes=False,
            node_rank_variable="NODE_RANK",
            schemas=(
                JobVariables(
                    label="local",
                    reason="no cluster manager's variables were found ({managers})",
                    reason_asked="cluster='local' was asked for",
                    node_rank=_optional("NODE_RANK", "GROUP_RANK", default=0),
                    main_address=(_MAIN_ADDRESS,),
                    main_port=_MAIN_PORT,
                ),
            ),
            launch_hint="set NODE_RANK, MASTER_ADDR and MASTER_PORT on each node",
        ),
    )
}


@attrs.frozen(kw_only=True)
class LaunchedWorkers:
    """What trainplan's own launchers give each worker, and how the worker reads it back: every variable of `schema`
    (each name of a fact) and of `also_written` is written, and `schema` is read. `launch_hint` is how to start the
    job with another layout (as `ClusterRule.launch_hint`)."""

    schema: JobVariables
    also_written: Mapping[str, JobFact]
    launch_hint: str

    __attrs_post_init__ = freeze_nested_maps  # nested maps read-only: nobody changes a rule in place


LAUNCHED_WORKERS: Final[LaunchedWorkers] = LaunchedWorkers(
    schema=JobVariables(
        label="trainplan launch",
        reason=(
            "this process is worker {values[global_rank]} of {values[world_size]} that trainplan's {launcher!r} "
            f"launcher started ({LAUNCHED_MARKER} is set)"
        ),
        # torchrun's variables, for scripts that expect them.
        world_size=_required("WORLD_SIZE"),
        processes_per_node=_required("LOCAL_WORLD_SIZE"),
        global_rank=_required("RANK"),
        local_rank=_required("LOCAL_RANK"),
        # A static meeting gives NODE_RANK; a c10d rendezvous assigns node ranks as nodes arrive (GROUP_RANK).
        node_rank=_required("NODE_RANK", "GROUP_RANK"),
        main_address=(_MAIN_ADDRESS,),
        main_port=_MAIN_PORT,
    ),
    # torchelastic's role variables, which some frameworks read; trainplan writes them and reads none.
    also_written={"ROLE_RANK": "global_rank", "ROLE_WORLD_SIZE": "world_size"},
    launch_hint="trainplan launch with num_nodes={num_nodes} and devices={processes_per_node}",
)
"""The workers `trainplan launch`, `tp.launch` and the emitted jobs start (marked by `LAUNCHED_MARKER`)."""


def cluster_variables(rules: Iterable[ClusterRule]) -> frozenset[str]:
    """Every variable the cluster rows name (to detect them, to tell their tasks apart, to read their jobs), and those
    of trainplan's launched workers: what detection and the readers look at."""
    rows = tuple(rules)
    return frozenset(
        {
            *(name for rule in rows for group in rule.detect_variables for name in group),
            *(name for rule in rows for row in rule.not_tasks for name in (*row.unset, *row.set, *row.tasks)),
            *(
                name
                for schema in (*(schema for rule in rows for schema in rule.schemas), LAUNCHED_WORKERS.schema)
                for _, source in job_variables(schema)
                for name in source.names
            ),
            *LAUNCHED_WORKERS.also_written,
            LAUNCHED_MARKER,
            *PROCESS_TREE_FACTS,
            RUN_ID_VARIABLE,
        }
    )


JOB_VARIABLES: Final[frozenset[str]] = cluster_variables(CLUSTERS.values())
"""Every variable the built-in cluster rows and trainplan's launched workers name (a rule set's own, with its
downstream clusters': `Rules.cluster_variables`)."""


CLUSTER_ALIASES: Final[Mapping[str, ClusterFlag]] = {"torchrun": "torchelastic", "lightning": "local"}
"""Cluster spellings normalised before validation (`lightning`: Lightning's LightningEnvironment, this machine)."""


def detected_alone(rule: ClusterRule) -> bool:
    """Whether `rule` is the cluster of a process without any cluster manager's variables (detection's fallback)."""
    return rule.detect_priority is not None and not all(rule.detect_variables)


LOCAL_CLUSTER: Final[ClusterKey] = next(name for name, rule in CLUSTERS.items() if detected_alone(rule))
"""The built-in cluster found without any variable (this machine alone), where detection ends."""
