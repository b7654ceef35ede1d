"""`probe()`: gather the facts of this machine into an `Environment`, quickly and without touching CUDA.

GPUs are counted through NVML (the driver's management library, through nvidia-ml-py), so neither
torch nor a CUDA context is needed; CUDA_VISIBLE_DEVICES is applied with CUDA's own rules. On a
machine without the NVIDIA driver the library is absent and the count is 0 at once.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import sys
from collections.abc import KeysView, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from trainplan.effects.nvml import NvmlQuery, default_nvml
from trainplan.resolve.gpus import visible_gpus
from trainplan.resolve.visible import AmbiguousDevice
from trainplan.rules import (
    BUILTIN_RULES,
    MPI_DAEMON_FACT,
    MPI_NODES_FACT,
    MPI_PROXY_FACT,
    PROCESS_TREE_FACTS,
    RELEVANT_VARIABLE_PREFIXES,
    RELEVANT_VARIABLES,
    SLURM_SHELL_FACT,
    Rules,
)
from trainplan.spec.environment import Environment
from trainplan.spec.errors import TrainplanError
from trainplan.spec.gpus import GpuFacts
from trainplan.spec.names import START_METHODS, StartMethod
from trainplan.spec.numbers import whole_number

OPTIONAL_PACKAGES = ("deepspeed", "torch_xla", "transformer_engine", "torchmetrics", "mpi4py")
"""Packages whose presence changes what a plan may use; looked up without importing them."""


class ProbeError(TrainplanError, RuntimeError):
    """The machine's facts could not be read (for example an ambiguous CUDA_VISIBLE_DEVICES)."""


def relevant_variables(environ: Mapping[str, str], rules: Rules = BUILTIN_RULES) -> dict[str, str]:
    """The environment variables that matter to a plan (see `rules.RELEVANT_VARIABLES`), and those the clusters of
    `rules` name (a downstream cluster manager's, `Rules.extend(clusters=...)`)."""
    # Values are read on every call (a variable can change between two); which names matter is decided once per
    # set of names (`_relevant_names`).
    return {key: environ[key] for key in _relevant_names(environ, rules)}


_last_scan: list[tuple[object, tuple[object, ...], tuple[str, ...]]] = []
"""The last names scan: (the rule set, the environment's names then in their order, the names that matter of them)."""


def _relevant_names(environ: Mapping[str, str], rules: Rules) -> tuple[str, ...]:
    """The names of `environ` that matter under `rules`. Which names matter depends only on the set of names (and the
    rule set), so the scan is redone only when that set changed since the last call: compared as raw keys (for
    `os.environ`, its undecoded dict of bytes, compared in C), since iterating `os.environ` decodes every name. The
    names are kept as a tuple in the dict's order: the same tuple is the same set (a name removed and set again
    moves to the end, which only rescans), and comparing it is mostly identity checks, where a set hashes each."""
    raw = _raw_names(environ)
    names_now = None if raw is None else tuple(raw)
    last = _last_scan[0] if _last_scan else None
    if names_now is not None and last is not None and last[0] is rules and names_now == last[1]:
        return last[2]
    given: object = rules
    named = rules.cluster_variables if isinstance(given, Rules) else frozenset()  # else: resolve names the type
    names = tuple(
        key
        for key in environ
        if (key in RELEVANT_VARIABLES or key.startswith(RELEVANT_VARIABLE_PREFIXES) or key in named)
        and key not in PROCESS_TREE_FACTS  # facts of the process tree, never taken from a variable
    )
    if names_now is not None:
        _last_scan[:] = [(rules, names_now, names)]
    return names


def _raw_names(environ: Mapping[str, str]) -> KeysView[object] | None:
    """A live view of `environ`'s names that compares without decoding: `os.environ`'s own dict (bytes names on
    POSIX), a dict's keys; None for another mapping (scanned every call)."""
    data = getattr(environ, "_data", None) if isinstance(environ, os._Environ) else environ
    return data.keys() if type(data) is dict else None


_HYDRA_PROXY = b"hydra_pmi_proxy"
_MPI_DAEMONS = frozenset({b"orted", b"prted", _HYDRA_PROXY, b"mpirun", b"mpiexec", b"orterun", b"prterun"})
_SLURM_STEP_DAEMON = b"slurmstepd"
_SHELLS = frozenset({b"bash", b"sh", b"dash", b"zsh", b"ksh", b"mksh", b"fish", b"tcsh", b"csh"})
_ANCESTORS = 16


class _Ancestor(NamedTuple):
    pid: int
    name: bytes
    start: int  # clock ticks since boot (with the pid, the process's identity)


def _ancestors(parent: int, limit: int = _ANCESTORS) -> list[_Ancestor]:
    """This process's ancestors from `parent` up, read from /proc (at most `limit`; fewer where /proc ends)."""
    found: list[_Ancestor] = []
    pid = parent
    while len(found) < limit and pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            break
        name, _, rest = stat.partition(b"(")[2].rpartition(b")")
        fields = rest.split()
        if len(fields) < 20:
            break
        found.append(_Ancestor(pid, name, int(fields[19])))
        pid = int(fields[1])
    return found


def _interactive_shell(pid: int) -> bool:
    """Whether process `pid` is a shell started without a command or a script (`bash`, `bash -l`, `bash -i`)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    arguments = [word for word in words[1:] if word]
    return all(word.startswith(b"-") and word not in (b"-c", b"--") for word in arguments)


def process_tree_facts(environ: Mapping[str, str], parent: int | None = None) -> dict[str, str]:
    """The facts of this process's ancestors (`rules.PROCESS_TREE_FACTS`), read from /proc (at most 16 ancestors),
    only where the launcher variables make them matter:

    - a rank with MPI's variables: the MPI daemon above it (`MPI_DAEMON_FACT`: MPI, not the srun step that started
      its daemons, started it); for a rank of Hydra (PMI_RANK and MPI_LOCALRANKID), the identity of its
      `hydra_pmi_proxy` (`MPI_PROXY_FACT`: its start time, then its pid, as one number); where srun started the
      daemons as a step of one task per node, that step's node count (`MPI_NODES_FACT`);
    - a process with SLURM's step variables that reaches slurmstepd through an interactive shell
      (`SLURM_SHELL_FACT`: the shell's name).
    """
    mpi = "PMI_RANK" in environ or "OMPI_COMM_WORLD_RANK" in environ
    slurm = "SLURM_STEP_ID" in environ
    if not (mpi or slurm):
        return {}
    chain = _ancestors(os.getppid() if parent is None else parent)
    facts: dict[str, str] = {}
    if mpi:
        daemon = next((index for index, each in enumerate(chain) if each.name in _MPI_DAEMONS), None)
        if daemon is not None:
            found = chain[daemon]
            facts[MPI_DAEMON_FACT] = found.name.decode(errors="replace")
            if found.name == _HYDRA_PROXY and "MPI_LOCALRANKID" in environ and "PMI_RANK" in environ:
                facts[MPI_PROXY_FACT] = f"{found.start}{found.pid:07d}"
            above = chain[daemon + 1].name if daemon + 1 < len(chain) else b""
            nodes = environ.get("SLURM_STEP_NUM_NODES", "").strip()
            per_node = environ.get("SLURM_STEP_TASKS_PER_NODE", "").strip()
            if above == _SLURM_STEP_DAEMON and nodes.isdigit() and per_node in ("1", f"1(x{nodes})"):
                facts[MPI_NODES_FACT] = nodes  # srun started the daemons, one per node: MPI's nodes
    if slurm:
        step = next((index for index, each in enumerate(chain) if each.name == _SLURM_STEP_DAEMON), None)
        if step is not None and step > 0:
            below = chain[step - 1]  # what slurmstepd started: the task itself, or the shell this process runs in
            if below.name in _SHELLS and _interactive_shell(below.pid):
                facts[SLURM_SHELL_FACT] = below.name.decode(errors="replace")
    return facts


def cuda_initialized() -> bool:
    """Whether torch has initialised CUDA in this process (False when torch was never imported)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return bool(torch.cuda.is_initialized())


def is_interactive() -> bool:
    """A REPL or notebook (Lightning's test, plus a running IPython kernel)."""
    # `"ps1" in vars(sys)` is Lightning's `hasattr(sys, "ps1")` (sys has no module __getattr__) without raising and
    # catching an AttributeError in the common case: 1.8 µs of each probe() became 0.06 µs.
    return "ps1" in vars(sys) or bool(sys.flags.interactive) or "ipykernel" in sys.modules


def probe(
    *,
    environ: Mapping[str, str] | None = None,
    nvml: NvmlQuery | None = None,
    usable_gpus: bool = False,
    usable_timeout: float = 15.0,
    rules: Rules = BUILTIN_RULES,
) -> Environment:
    """The facts of this machine and process. Never initialises CUDA and does not import torch.

    `environ` defaults to `os.environ` and `nvml` to the driver (through nvidia-ml-py); tests pass their
    own. Facts that cannot change while a process runs (the GPUs the driver lists, installed packages,
    start methods, the machine's memory) are read once per process; environment variables, CUDA's state, the
    CPUs this process may run on and the session on every call. `usable_gpus=True` also finds which visible
    GPUs can take a new process now (`find_usable_cuda_devices`' probe), for requests with
    `select_usable_gpus`. `rules`: the rule set the facts are for; the variables of its clusters are copied
    too (a downstream cluster manager's, `Rules.extend(clusters=...)`).

    The accelerators a downstream rule set adds (`Rules.extend(accelerators=...)`) are not counted here: their
    plugin knows its devices, so the framework adds the count, `probe().with_device_counts({"npu": n})`
    (`Environment.device_counts`), and passes that environment to `resolve`.
    """
    environ = os.environ if environ is None else environ
    static = _static_facts()
    gpus = static.gpus if nvml is None else (nvml.gpus() or [])
    variables = relevant_variables(environ, rules)  # CUDA_VISIBLE_DEVICES is one of them (`rules.RELEVANT_VARIABLES`)
    try:
        visible = visible_gpus(variables.get("CUDA_VISIBLE_DEVICES"), gpus)
    except AmbiguousDevice as error:
        raise ProbeError(f"{error}. Write a longer UUID prefix, or device indices, in CUDA_VISIBLE_DEVICES.") from None
    usable: tuple[int, ...] | None = None
    if usable_gpus:
        from trainplan.effects.gpus import gpu_statuses

        statuses = gpu_statuses(timeout=usable_timeout, nvml=nvml, environ=environ)
        usable = tuple(status.index for status in statuses if status.usable and status.index < len(visible))
    # Positional, in `_Facts`' order (keywords cost a NamedTuple twice as much, on every call).
    facts = _Facts(
        len(visible),  # cuda_device_count
        _memory_of(visible),  # cuda_memory_bytes
        static.host_memory_bytes,
        cuda_initialized(),
        usable,  # usable_cuda_devices
        _mps_available(),
        _xla_device_count(environ, static.packages),
        _cpu_count(),
        is_interactive(),  # interactive
        static.start_methods,
        static.packages,
        _with_proxy(variables, variables),  # variables: the launcher variables it reads are relevant ones
    )
    last = _last_environment[0] if _last_environment else None
    if last is not None and last[0] == facts:
        return last[1]  # the same facts as the last call's: the same (immutable) value, hashed already
    env = Environment(**facts._asdict())
    _last_environment[:] = [(facts, env)]
    return env


class _Facts(NamedTuple):
    """One probe's facts, as `Environment`'s fields: compared with the last call's before a record is built."""

    cuda_device_count: int
    cuda_memory_bytes: tuple[int, ...]
    host_memory_bytes: int | None
    cuda_initialized: bool
    usable_cuda_devices: tuple[int, ...] | None
    mps_available: bool
    xla_device_count: int
    cpu_count: int
    interactive: bool
    start_methods: tuple[StartMethod, ...]
    packages: frozenset[str]
    variables: dict[str, str]


_last_environment: list[tuple[_Facts, Environment]] = []
"""The last probe's facts and the environment built from them (building one checks and converts every field)."""


def process_variables(environ: Mapping[str, str] | None = None, rules: Rules = BUILTIN_RULES) -> dict[str, str]:
    """What `probe(rules=rules)` puts in `Environment.variables`: the variables that matter, and the facts of the
    process tree written as variables (`process_tree_facts`). The effects that check a plan against this
    process read these, never the raw environment, so that they see what resolve saw."""
    environ = os.environ if environ is None else environ
    return _with_proxy(relevant_variables(environ, rules), environ)


def _with_proxy(variables: dict[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    variables.update(process_tree_facts(environ))
    return variables


class _StaticFacts(NamedTuple):
    """What cannot change while a process runs, read once (`_static_facts`)."""

    gpus: list[GpuFacts]
    packages: frozenset[str]
    start_methods: tuple[StartMethod, ...]
    host_memory_bytes: int | None


@functools.cache
def _static_facts() -> _StaticFacts:
    import multiprocessing

    available = multiprocessing.get_all_start_methods()
    return _StaticFacts(
        gpus=default_nvml().gpus() or [],
        packages=frozenset(name for name in OPTIONAL_PACKAGES if _installed(name)),
        start_methods=tuple(method for method in START_METHODS if method in available),
        host_memory_bytes=_host_memory(),
    )


def _memory_of(visible: Sequence[GpuFacts]) -> tuple[int, ...]:
    """Each visible GPU's total memory (NVML's), or nothing when any is unknown (a partial list would misplace one)."""
    totals = [gpu.memory_total for gpu in visible]
    return tuple([total for total in totals if total]) if all(totals) else ()


def _host_memory() -> int | None:
    """This machine's memory (the offload target), or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") or None
    except (ValueError, OSError, AttributeError):
        return None


def _cpu_count() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _mps_available() -> bool:
    if sys.platform != "darwin" or platform.machine() != "arm64":
        return False
    torch = sys.modules.get("torch")
    if torch is not None:
        return bool(torch.backends.mps.is_available())
    return True  # every Apple-silicon Mac on a supported macOS has the MPS device


def _installed(name: str) -> bool:
    """Whether an optional package can be imported (a stub module in sys.modules without a spec counts)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ValueError, ImportError):  # `sys.modules[name]` is a stub with no __spec__, or a broken parent
        return name in sys.modules


def _xla_device_count(environ: Mapping[str, str], packages: frozenset[str]) -> int:
    if "torch_xla" not in packages:
        return 0
    declared = environ.get("TPU_NUM_DEVICES", "").strip()
    count = whole_number(declared)
    if count is not None:
        return count
    try:
        return sum(1 for name in os.listdir("/dev") if name.startswith("accel"))
    except OSError:
        return 0
