"""Reading the cluster environment from environment variables (pure: the variables are passed in).

Detection order and required variables come from `tables.CLUSTERS`; this module parses each
manager's variables, checks them (a rank that is not a number, a port out of range, a rank beyond
the world size) and reports garbage as `ClusterEnvironmentError` naming the variable.
"""

from __future__ import annotations

import ipaddress
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping

import attrs

from trainplan.spec.errors import ClusterEnvironmentError, Unavailable
from trainplan.spec.names import ClusterFlag, ClusterName, ClusterSchema
from trainplan.spec.notes import Note
from trainplan.spec.numbers import whole_number
from trainplan.spec.tables import (
    CLUSTERS,
    DEFAULT_MAIN_PORT,
    LAUNCHED_MARKER,
    TRAINPLAN_RUN_ID_PREFIX,
    ClusterRule,
    JobPort,
    lookup,
)


@attrs.frozen(kw_only=True)
class ClusterFacts:
    """What the cluster environment says, before it is checked against the request."""

    kind: ClusterName
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

    @property
    def started_by(self) -> str:
        """Who started this job's processes, for messages."""
        return "trainplan's launcher" if self.launched else self.kind


def detect(flag: ClusterFlag, variables: Mapping[str, str]) -> ClusterFacts:
    """The cluster environment asked for (or detected, for `auto`) with its facts."""
    if not variables and flag in _ALONE:
        return _ALONE[flag]  # no variable at all: this machine alone (the same facts as reading none)
    if flag == "auto":
        return _read(_detected(variables), variables, requested=False)
    rule = lookup(CLUSTERS, flag, name="CLUSTERS")
    if not _present(rule.detect_variables, variables):  # a row without variables to find (local) is always present
        needed = " and ".join(sorted(rule.detect_variables[0]))
        raise Unavailable(
            requested=f"cluster={flag!r}",
            available=f"no {rule.description} variables ({needed} not set)",
            fix=f"Run inside a {flag} job, set the variables by hand for a what-if, or use cluster='auto'",
        )
    return _read(flag, variables, requested=True)


def _present(groups: tuple[frozenset[str], ...], variables: Mapping[str, str]) -> bool:
    return any(all(name in variables for name in group) for group in groups)


_DETECTION_ORDER = tuple(
    sorted(
        # Rows found by their variables; the one that needs none (this machine alone) is what remains.
        (rule for rule in CLUSTERS.values() if rule.detect_priority is not None and all(rule.detect_variables)),
        key=lambda rule: -(rule.detect_priority or 0),
    )
)

THIS_MACHINE: ClusterName = next(rule.name for rule in CLUSTERS.values() if not all(rule.detect_variables))
"""The cluster found without any variable (the row with an empty set of them: this machine alone), where detection
ends when no cluster manager's variables are found."""


_HOST_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,252})", flags=re.ASCII)


def host_address(text: str) -> str | None:
    """`text` as a host to meet at (a name, an IPv4 or an IPv6 address; `[::1]` loses its brackets), or None
    for anything else: a port glued on (`host:1234`), control characters, spaces, shell metacharacters."""
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
        if ":" not in text:
            return None
    if ":" in text:
        try:
            return str(ipaddress.IPv6Address(text.split("%", 1)[0])) if text.count(":") >= 2 else None
        except ValueError:
            return None
    return text if _HOST_NAME.fullmatch(text) else None


def launched_by_trainplan(variables: Mapping[str, str]) -> bool:
    """Whether trainplan's launcher started this process: its marker is set, and no torchrun started inside
    that worker has since given this process a world of its own (torchrun's run id is then not trainplan's)."""
    if LAUNCHED_MARKER not in variables:
        return False
    return variables.get("TORCHELASTIC_RUN_ID", TRAINPLAN_RUN_ID_PREFIX).startswith(TRAINPLAN_RUN_ID_PREFIX)


def _detected(variables: Mapping[str, str]) -> ClusterName:
    if not variables or launched_by_trainplan(variables):
        return THIS_MACHINE
    for rule in _DETECTION_ORDER:
        if _present(rule.detect_variables, variables) and not _passed_by(rule, variables):
            return rule.name
    return THIS_MACHINE


def _passed_by(rule: ClusterRule, variables: Mapping[str, str]) -> bool:
    """Whether the row's variables say the cluster does not manage the processes (SLURM's interactive sessions)."""
    unless = rule.not_detected_when
    return unless is not None and variables.get(unless.variable, "") in unless.values


def _passed_by_notes(variables: Mapping[str, str]) -> tuple[Note, ...]:
    """A note for each cluster whose variables are present but that detection passed by."""
    return tuple(
        Note(
            code=rule.not_detected_when.note_code,
            level="info",
            message=rule.not_detected_when.note.format(
                variable=rule.not_detected_when.variable, value=variables[rule.not_detected_when.variable]
            ),
        )
        for rule in _DETECTION_ORDER
        if rule.not_detected_when is not None
        and _present(rule.detect_variables, variables)
        and _passed_by(rule, variables)
    )


def _job_port(port: JobPort, job_id: int | None) -> int | None:
    """The main port the row's formula gives for the job id (or its default without one)."""
    return port.default if job_id is None else port.base + job_id % port.modulo


def _read(kind: ClusterName, variables: Mapping[str, str], *, requested: bool) -> ClusterFacts:
    rule = lookup(CLUSTERS, kind, name="CLUSTERS")
    return _READERS[rule.schema](rule, variables, requested)


class _Variables:
    """Typed reads of one cluster's variables; garbage raises `ClusterEnvironmentError` naming the variable."""

    def __init__(self, cluster: str, variables: Mapping[str, str]) -> None:
        self.cluster = cluster
        self.variables = variables

    def error(self, name: str, reason: str, fix: str) -> ClusterEnvironmentError:
        return ClusterEnvironmentError(
            cluster=self.cluster, variable=name, value=self.variables.get(name, ""), reason=reason, fix=fix
        )

    def integer(self, name: str, *, minimum: int, required: bool = True, default: int | None = None) -> int | None:
        raw = self.variables.get(name)
        if raw is None:
            if required:
                raise ClusterEnvironmentError(
                    cluster=self.cluster,
                    variable=name,
                    value="",
                    reason="it is not set, and the cluster environment needs it",
                    fix=f"Start the processes with the {self.cluster} launcher, which sets it, or set it by hand",
                )
            return default
        value = whole_number(raw.strip(), signed=True)
        if value is None:
            raise self.error(
                name, "it is not a whole number (ASCII digits, at most 18)", "Unset it, or set it to a whole number"
            )
        if value < minimum:
            raise self.error(name, f"it must be at least {minimum}", f"Set it to a number ≥ {minimum}")
        return value

    def port(self, name: str) -> int | None:
        value = self.integer(name, minimum=0, required=False)
        if value is not None and not 1 <= value <= 65535:
            raise self.error(
                name, "a TCP port is between 1 and 65535", "Set it to a free port such as 29500, or unset it"
            )
        return value

    def address(self, name: str) -> str | None:
        raw = self.variables.get(name)
        if raw is None:
            return None
        host = host_address(raw.strip())
        if host is None:
            raise self.error(
                name,
                "it is not a host name or an IP address (letters, digits, '.', '-', '_'; an IPv6 address)",
                "Set it to the host of rank 0, e.g. node001 or 10.0.0.1, without a port",
            )
        return host

    def below(self, name: str, value: int | None, limit: int | None, limit_name: str) -> None:
        if value is not None and limit is not None and value >= limit:
            raise self.error(
                name,
                f"it must be smaller than {limit_name}={limit}",
                f"Check how the job was started: ranks run from 0 to {limit - 1}",
            )


def _local(rule: ClusterRule, variables: Mapping[str, str], requested: bool) -> ClusterFacts:
    if launched_by_trainplan(variables):
        return _launched(variables)
    read = _Variables(rule.name, variables)
    node_rank_name = "NODE_RANK" if "NODE_RANK" in variables else "GROUP_RANK"
    node_rank = read.integer(node_rank_name, minimum=0, required=False, default=0)
    address = read.address("MASTER_ADDR")
    port = read.port("MASTER_PORT")
    reason = (
        "cluster='local' was asked for"
        if requested
        else "no cluster manager's variables were found (torchelastic, SLURM, Kubeflow, LSF, MPI)"
    )
    notes = () if requested else _passed_by_notes(variables)
    return ClusterFacts(
        kind=rule.name,
        creates_processes=rule.creates_processes,
        main_address=address or "127.0.0.1",
        main_port=port,
        node_rank=node_rank,
        global_rank=None,
        local_rank=None,
        world_size=None,
        processes_per_node=None,
        num_nodes=None,
        detail="",
        launch_hint=rule.launch_hint,
        reason=reason,
        notes=notes,
    )


_ALONE: dict[ClusterFlag, ClusterFacts] = {
    "auto": _local(CLUSTERS[THIS_MACHINE], {}, requested=False),
    THIS_MACHINE: _local(CLUSTERS[THIS_MACHINE], {}, requested=True),
}
"""The facts of a process without any cluster variable, read once."""


@attrs.frozen
class _World:
    """The torchrun-style variables every torchrun (and trainplan-launched) worker carries."""

    world: int | None
    local_world: int | None
    rank: int | None
    local_rank: int | None
    nodes: int | None


def _torchrun_world(read: _Variables) -> _World:
    world = read.integer("WORLD_SIZE", minimum=1)
    local_world = read.integer("LOCAL_WORLD_SIZE", minimum=1)
    rank = read.integer("RANK", minimum=0)
    local_rank = read.integer("LOCAL_RANK", minimum=0)
    read.below("RANK", rank, world, "WORLD_SIZE")
    read.below("LOCAL_RANK", local_rank, local_world, "LOCAL_WORLD_SIZE")
    nodes = None
    if world is not None and local_world is not None and world % local_world == 0:
        nodes = world // local_world
    return _World(world, local_world, rank, local_rank, nodes)


def _launched(variables: Mapping[str, str]) -> ClusterFacts:
    """A worker started by trainplan's launcher: the world and this worker's place in it."""
    read = _Variables("trainplan launch", variables)
    world = _torchrun_world(read)
    how = variables.get(LAUNCHED_MARKER, "").strip() or "a"
    return ClusterFacts(
        kind=THIS_MACHINE,
        creates_processes=True,
        main_address=read.address("MASTER_ADDR") or "127.0.0.1",
        main_port=read.port("MASTER_PORT"),
        # A static meeting gives NODE_RANK; a c10d rendezvous assigns node ranks as nodes arrive (GROUP_RANK).
        node_rank=read.integer("NODE_RANK" if "NODE_RANK" in variables else "GROUP_RANK", minimum=0),
        global_rank=world.rank,
        local_rank=world.local_rank,
        world_size=world.world,
        processes_per_node=world.local_world,
        num_nodes=world.nodes,
        detail=f"WORLD_SIZE={world.world}, LOCAL_WORLD_SIZE={world.local_world}",
        launch_hint="trainplan launch with num_nodes={num_nodes} and devices={processes_per_node}",
        reason=(
            f"this process is worker {world.rank} of {world.world} that trainplan's {how!r} launcher started "
            f"({LAUNCHED_MARKER} is set)"
        ),
        launched=True,
    )


def _torchelastic(rule: ClusterRule, variables: Mapping[str, str], requested: bool) -> ClusterFacts:
    how = "asked for" if requested else "detected"
    read = _Variables(rule.name, variables)
    world = _torchrun_world(read)
    group_rank = read.integer("GROUP_RANK", minimum=0)
    address = read.address("MASTER_ADDR")
    if address is None:
        raise read.error("MASTER_ADDR", "torchrun always sets it, and it is missing", "Start the script with torchrun")
    port = read.port("MASTER_PORT")
    if port is None:
        raise read.error("MASTER_PORT", "torchrun always sets it, and it is missing", "Start the script with torchrun")
    return ClusterFacts(
        kind=rule.name,
        creates_processes=rule.creates_processes,
        main_address=address,
        main_port=port,
        node_rank=group_rank,
        global_rank=world.rank,
        local_rank=world.local_rank,
        world_size=world.world,
        processes_per_node=world.local_world,
        num_nodes=world.nodes,
        detail=f"WORLD_SIZE={world.world}, LOCAL_WORLD_SIZE={world.local_world}",
        launch_hint=rule.launch_hint,
        reason=f"torchelastic was {how} (RANK, GROUP_RANK, LOCAL_RANK and LOCAL_WORLD_SIZE are set)",
    )


def _slurm(rule: ClusterRule, variables: Mapping[str, str], requested: bool) -> ClusterFacts:
    how = "asked for" if requested else "detected"
    read = _Variables("SLURM", variables)
    world = read.integer("SLURM_NTASKS", minimum=1)
    rank = read.integer("SLURM_PROCID", minimum=0)
    local_rank = read.integer("SLURM_LOCALID", minimum=0)
    node_rank = read.integer("SLURM_NODEID", minimum=0)
    read.below("SLURM_PROCID", rank, world, "SLURM_NTASKS")
    nodes_name = "SLURM_NNODES" if "SLURM_NNODES" in variables else "SLURM_JOB_NUM_NODES"
    nodes = read.integer(nodes_name, minimum=1, required=False)
    read.below("SLURM_NODEID", node_rank, nodes, nodes_name)
    per_node = _slurm_tasks_per_node(read, variables)
    read.below("SLURM_LOCALID", local_rank, per_node, "SLURM_NTASKS_PER_NODE")
    address = read.address("MASTER_ADDR")
    if address is None:
        nodelist_name = "SLURM_NODELIST" if "SLURM_NODELIST" in variables else "SLURM_JOB_NODELIST"
        nodelist = variables.get(nodelist_name)
        if nodelist is None:
            address = "127.0.0.1"
        else:
            try:
                address = first_host(nodelist)
            except ValueError as error:
                raise read.error(
                    nodelist_name, str(error), "Check the job's node list; set MASTER_ADDR to override it"
                ) from None
    port = read.port("MASTER_PORT")
    job_port = rule.job_port
    if port is None and job_port is not None:
        job_id = variables.get(job_port.variable, "").strip()
        number = whole_number(job_id) if job_id else None
        if job_id and number is None:
            raise read.error(job_port.variable, "it is not a job number", "Set MASTER_PORT to choose the port yourself")
        port = _job_port(job_port, number)
    return ClusterFacts(
        kind=rule.name,
        creates_processes=rule.creates_processes,
        main_address=address,
        main_port=port,
        node_rank=node_rank,
        global_rank=rank,
        local_rank=local_rank,
        world_size=world,
        processes_per_node=per_node,
        num_nodes=nodes,
        detail=f"SLURM_NTASKS={world}" + ("" if per_node is None else f", SLURM_NTASKS_PER_NODE={per_node}"),
        launch_hint=rule.launch_hint,
        reason=f"SLURM was {how} (SLURM_NTASKS is set and SLURM_JOB_NAME is not an interactive allocation)",
    )


def _slurm_tasks_per_node(read: _Variables, variables: Mapping[str, str]) -> int | None:
    raw = variables.get("SLURM_NTASKS_PER_NODE")
    if raw is None:
        return None
    # "4" or "4(x2)" (four tasks on each of two nodes); uneven layouts ("4(x2),2") have no single value.
    match = re.fullmatch(r"\s*(\d{1,18})(?:\(x\d{1,18}\))?\s*", raw, flags=re.ASCII)
    if match is None:
        if re.fullmatch(r"[\d(x),]+", raw.strip(), flags=re.ASCII):
            raise read.error(
                "SLURM_NTASKS_PER_NODE",
                "the job has a different number of tasks on different nodes",
                "Ask SLURM for the same --ntasks-per-node on every node",
            )
        raise read.error("SLURM_NTASKS_PER_NODE", "it is not a number of tasks", "Unset it or fix the job script")
    value = int(match.group(1))
    if value < 1:
        raise read.error("SLURM_NTASKS_PER_NODE", "it must be at least 1", "Fix the job's --ntasks-per-node")
    return value


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
    host = next(_names(items[0]))
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


def _parse_item(item: str) -> list[_Segment]:
    """`name[1-3]x[07,9]` as segments ("name", ranges), ("x", ranges), ("", ()) — checked, not expanded."""
    segments: list[_Segment] = []
    rest = item
    while True:
        match = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", rest)
        literal = rest if match is None else match.group(1)
        if not _HOST_CHARACTERS.fullmatch(literal):
            raise ValueError(f"{item!r} is not a host name")
        if match is None:
            segments.append((literal, ()))
            return segments
        segments.append((literal, _parse_ranges(match.group(2), item)))
        rest = match.group(3)
        if not rest:
            return segments


def _parse_ranges(text: str, item: str) -> tuple[tuple[int, int, int], ...]:
    ranges = []
    for raw_part in text.split(","):
        part = raw_part.strip()
        bounds = re.fullmatch(r"(\d{1,18})(?:-(\d{1,18}))?", part, flags=re.ASCII)
        if bounds is None:
            raise ValueError(f"{part!r} in {item!r} is not a number or a range like 001-004")
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


def _lsf(rule: ClusterRule, variables: Mapping[str, str], requested: bool) -> ClusterFacts:
    how = "asked for" if requested else "detected"
    read = _Variables("LSF", variables)
    world = read.integer("JSM_NAMESPACE_SIZE", minimum=1)
    rank = read.integer("JSM_NAMESPACE_RANK", minimum=0)
    local_rank = read.integer("JSM_NAMESPACE_LOCAL_RANK", minimum=0)
    read.below("JSM_NAMESPACE_RANK", rank, world, "JSM_NAMESPACE_SIZE")
    job_id = read.integer("LSB_JOBID", minimum=0)
    address = read.address("MASTER_ADDR")
    hosts = _lsf_hosts(read, variables)
    if address is None:
        address = hosts[0] if hosts else "127.0.0.1"
    port = read.port("MASTER_PORT")
    job_port = rule.job_port
    if port is None and job_port is not None and job_id is not None:
        port = _job_port(job_port, job_id)
    return ClusterFacts(
        kind=rule.name,
        creates_processes=rule.creates_processes,
        main_address=address,
        main_port=port,
        node_rank=None,
        global_rank=rank,
        local_rank=local_rank,
        world_size=world,
        processes_per_node=None,
        num_nodes=len(hosts) if hosts else None,
        detail=f"JSM_NAMESPACE_SIZE={world}",
        launch_hint=rule.launch_hint,
        reason=f"LSF was {how} (LSB_JOBID and the JSM_NAMESPACE_* variables are set)",
    )


def _lsf_hosts(read: _Variables, variables: Mapping[str, str]) -> list[str]:
    raw = variables.get("LSB_MCPU_HOSTS")
    if raw is None:
        return []
    words = raw.split()
    if len(words) % 2 != 0 or not all(whole_number(count) is not None for count in words[1::2]):
        raise read.error("LSB_MCPU_HOSTS", "it is not a list of 'host count' pairs", "Unset it, or set MASTER_ADDR")
    hosts = words[0::2]
    # The first entry is the launch (batch) node, which runs no rank under jsrun (Lightning skips it too).
    return hosts[1:] if len(hosts) > 1 else hosts


def _mpi(rule: ClusterRule, variables: Mapping[str, str], requested: bool) -> ClusterFacts:
    how = "asked for" if requested else "detected"
    read = _Variables("MPI", variables)
    if "OMPI_COMM_WORLD_SIZE" in variables:
        names = (
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        )
    else:
        names = ("PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    world = read.integer(names[0], minimum=1)
    rank = read.integer(names[1], minimum=0)
    read.below(names[1], rank, world, names[0])
    local_rank = read.integer(names[2], minimum=0, required=False)
    local_size = read.integer(names[3], minimum=1, required=False)
    read.below(names[2], local_rank, local_size, names[3])
    nodes = None
    if world is not None and local_size is not None and world % local_size == 0:
        nodes = world // local_size
    address = read.address("MASTER_ADDR")
    if address is None and nodes == 1:
        address = "127.0.0.1"
    port = read.port("MASTER_PORT")
    notes: tuple[Note, ...] = ()
    if port is None:
        port = DEFAULT_MAIN_PORT
        notes = (
            Note(
                code="mpi-default-port",
                level="info",
                message=f"MPI gives no port; using {DEFAULT_MAIN_PORT} (export MASTER_PORT to choose another)",
            ),
        )
    return ClusterFacts(
        kind=rule.name,
        creates_processes=rule.creates_processes,
        main_address=address,
        main_port=port,
        node_rank=None,
        global_rank=rank,
        local_rank=local_rank,
        world_size=world,
        processes_per_node=local_size,
        num_nodes=nodes,
        detail=f"{names[0]}={world}" + ("" if local_size is None else f", {names[3]}={local_size}"),
        launch_hint=rule.launch_hint,
        reason=f"MPI was {how} ({names[0]} and {names[1]} are set)",
        notes=notes,
    )


def _kubeflow(rule: ClusterRule, variables: Mapping[str, str], requested: bool) -> ClusterFacts:
    how = "asked for" if requested else "detected"
    read = _Variables("Kubeflow", variables)
    world = read.integer("WORLD_SIZE", minimum=1)
    rank = read.integer("RANK", minimum=0)
    read.below("RANK", rank, world, "WORLD_SIZE")
    address = read.address("MASTER_ADDR")
    port = read.port("MASTER_PORT")
    return ClusterFacts(
        kind=rule.name,
        creates_processes=rule.creates_processes,
        main_address=address,
        main_port=port,
        node_rank=rank,
        global_rank=rank,
        local_rank=0,
        world_size=world,
        processes_per_node=1,
        num_nodes=world,
        detail=f"WORLD_SIZE={world} pods",
        launch_hint=rule.launch_hint,
        reason=f"Kubeflow was {how}",
    )


_Reader = Callable[[ClusterRule, Mapping[str, str], bool], ClusterFacts]

_READERS: Mapping[ClusterSchema, _Reader] = {
    "torchrun": _torchelastic,
    "srun": _slurm,
    "jsrun": _lsf,
    "mpirun": _mpi,
    "pytorchjob": _kubeflow,
    "by_hand": _local,
}
"""The reader of each set of variables a row may name (`ClusterRule.schema`)."""
