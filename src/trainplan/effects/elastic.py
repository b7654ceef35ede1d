"""`trainplan launch`: a script on the plan's workers, run by torch's elastic engine (the one behind torchrun).

The plan gives the numbers (nodes, processes per node, this node's rank, the main address and port, the GPUs);
torch's own launcher carries them out: `torch.distributed.run`'s argument parser and `config_from_args` turn
them into a `LaunchConfig`, and `torch.distributed.launcher.api.launch_agent` runs the elastic agent. So the
rendezvous (c10d, or static with a fixed node rank), restarts (`max_restarts`), log directories, redirects and
tee, the local-ranks filter, error files (`TORCHELASTIC_ERROR_FILE`) and the OMP_NUM_THREADS default are
torchrun's own. trainplan adds, on top of the engine:

- the plan's one-line summary before anything starts, and a line while a node waits for its peers;
- each worker's output, prefixed by its rank (`[rank 3] ...`): the engine writes every rank's stdout and stderr
  to files in the log directory, and trainplan passes them on line by line, so a reader that goes away
  (`| head`) never blocks a worker (a temporary directory, removed afterwards, unless `log_dir` is given or
  files were asked for);
- exit codes: the first failing rank's exit code (128 + N for signal N), 124 when `timeout` runs out, 130 on
  Ctrl-C, 143 on SIGTERM, 129 on a hang-up;
- nothing left alive. The engine stops the workers that still run, but not what a worker started: torchrun
  2.13 leaves a worker's child processes running when the worker itself has exited (after a success and a
  failure alike). trainplan makes itself the subreaper of everything it starts (Linux) and, when the engine
  returns, stops every descendant that is left (terminate, then kill after the grace period; a second Ctrl-C
  cuts the grace short);
- a static rendezvous waits inside torch's TCPStore, where no signal reaches Python: the wait is bounded by
  `timeout`, and the command line (`exit_on_signal_while_waiting`) ends at once on Ctrl-C, SIGTERM or a
  hang-up while no worker has started yet.

Inside a started job (an srun task, a Kubeflow pod: the plan's launcher is `external`), the script runs once,
as this process's rank, with torchrun's variables; the job's own manager supervises it. Its stderr stays
stderr, and nothing it started outlives it (every descendant is reaped, as on the engine's path).
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import ctypes
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from trainplan.effects.launching import (
    DEFAULT_GRACE_PERIOD,
    LaunchError,
    _check_startable,
    _check_times,
    _forkserver_context,
    _ScriptWorker,
    _signal_name,
    _sigterm_stops_workers,
    _specs,
    _stop,
    choose_free_port,
    interrupts_deferred,
)
from trainplan.effects.lifeline import Lifeline
from trainplan.effects.rules_loading import handed_to_workers
from trainplan.effects.served_script import run_script
from trainplan.mapping.workers import (
    heterogeneous_nodes,
    launch_choices_line,
    launcher_rule,
    started_by_another_launcher,
    torchrun_variables,
)
from trainplan.rules import LAUNCH_CHOICES_VARIABLE, RUN_ID_VARIABLE, TRAINPLAN_RUN_ID_PREFIX
from trainplan.spec.errors import TrainplanError, a_kind
from trainplan.spec.plan import Plan

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.api import LogsDest

RENDEZVOUS_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")
"""The rendezvous backends torch's elastic agent registers (`--rdzv-backend`)."""


@attrs.frozen(kw_only=True)
class EngineOptions:
    """torchrun's own options for the engine: what the plan does not decide.

    The rendezvous defaults are torchrun's: one node meets through c10d on a port the system picks (as
    `--standalone`), unless a main port is known; several nodes meet through the static rendezvous (node ranks
    as given) at the main address and port, unless `rdzv_backend` says otherwise.
    """

    max_restarts: int = 0
    """Restarts of the whole worker group after a failure before the run fails (torchrun's `--max-restarts`)."""
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    """host:port of the rendezvous (default: the plan's main address and port)."""
    rdzv_id: str | None = None
    """The same on every node (default: from the main port)."""
    rdzv_conf: str = ""
    """key=value,... for the rendezvous (torchrun's `--rdzv-conf`, e.g. `timeout=60`)."""
    log_dir: str | None = None
    """Where the engine keeps each attempt's per-rank stdout.log, stderr.log and error.json."""
    redirects: str = "0"
    """Streams to the log files only, not the console: 0 none, 1 stdout, 2 stderr, 3 both, or `0:3,1:1` per rank."""
    tee: str = "0"
    """Streams to the log files and the console (the console always shows them unless redirected)."""
    local_ranks_filter: str | None = None
    """Local ranks whose output reaches the console, e.g. `0` or `0,2`."""
    no_python: bool = False
    """Run the command as a program, not through the Python interpreter (torchrun's `--no-python`)."""
    module: bool = False
    """Run the script as a module, `python -m` (torchrun's `-m`)."""
    local_addr: str | None = None
    """This node's address for the c10d rendezvous (torchrun's `--local-addr`)."""


# --------------------------------------------------------------------------------------------------
# What to run


@attrs.frozen
class Command:
    """The worker command: an executable and its arguments, and whether the engine runs it as Python."""

    program: str
    arguments: tuple[str, ...]
    python: bool
    module: bool


_INTERPRETER_OPTIONS = frozenset(f"-{letter}" for letter in "bBcdEhiIOPqsSuvVWxX")
"""The Python interpreter's own one-letter options (`python --help`), which may come before the script."""


def script_command(argv: Sequence[str], options: EngineOptions = EngineOptions()) -> Command:
    """What each worker runs, as torchrun reads it: a module (`-m pkg.train` or `module=True`), code (`-c ...`),
    a program (`no_python=True` only), or else a Python script: any other first word, `.py` or not (`./train`
    with a python shebang, say), run by this Python interpreter."""
    words = list(argv)
    if not words or not words[0]:
        raise LaunchError(
            "Nothing to launch: name the script after the flags, e.g. `trainplan launch --devices 2 train.py`"
        )
    if options.no_python and options.module:
        raise LaunchError("--no-python and -m cannot go together: a module is run by the Python interpreter")
    module = options.module
    if not options.no_python and not module and words[0] == "-m":
        module, words = True, words[1:]
        if not words:
            raise LaunchError("-m needs a module name, e.g. `trainplan launch -m pkg.train`")
    if module:
        return Command(words[0], tuple(words[1:]), python=True, module=True)
    if not options.no_python and words[0].startswith("-"):
        # Interpreter options (-c code, -X ...): the interpreter itself is the program.
        option = words[0][:2]
        if option not in _INTERPRETER_OPTIONS:
            raise LaunchError(
                f"{words[0]!r} is not an option of the Python interpreter, and a script comes first: write "
                "`trainplan launch [flags] train.py [its arguments]`, or interpreter options such as -c CODE, -X dev"
            )
        return Command(sys.executable, ("-u", *words), python=False, module=False)
    if not options.no_python:
        if not Path(words[0]).is_file():
            program = "" if shutil.which(words[0]) is None else f" ({words[0]!r} is a program on PATH: add --no-python)"
            raise LaunchError(
                f"No such script: {words[0]!r}. Name a Python file that exists, e.g. train.py; the first word is run "
                f"as a Python script, as torchrun does, unless --no-python{program}"
            )
        return Command(words[0], tuple(words[1:]), python=True, module=False)
    found = shutil.which(words[0])
    if found is None:
        raise LaunchError(
            f"Cannot run {words[0]!r}: it is not an executable program on PATH. With --no-python, name a program "
            "on PATH (or a path to one); without it, a Python script, a module (-m pkg.train) or code (-- -c '...')"
        )
    return Command(found, tuple(words[1:]), python=False, module=False)


# --------------------------------------------------------------------------------------------------
# The workers' output, prefixed by rank


class _Sink:
    """Where the workers' lines go. Once the reader is gone (`| head`), lines are dropped and the workers keep
    running: their output files are still read, so nothing waits on the reader."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.lock = threading.Lock()
        self.broken = False
        self.failure: str | None = None
        """Why writing failed, when it was not the reader going away (a full disk, say)."""

    def write(self, text: str) -> None:
        with self.lock:
            if self.broken or self.stream is None:  # no stdout at all (`>&-`): nothing to show
                return
            try:
                self.stream.write(text)
                self.stream.flush()
            except BrokenPipeError:
                self.broken = True  # the reader left (`| head`): what follows is not wanted
            except (ValueError, OSError) as error:
                self.broken = True
                self.failure = getattr(error, "strerror", None) or str(error)


_LINE_LIMIT = 1 << 16
"""A worker's output is passed on by line, or every 64 KiB without one: memory stays bounded."""
_TAIL_POLL = 0.05
"""Seconds between looks at a log file that has nothing new."""


def _pump(stream: Any, prefix: str, sink: _Sink, finished: threading.Event | None = None) -> None:
    """Pass a worker's output on, prefixed by its rank, a line at a time. A carriage return ends a line too, so
    progress bars show as they move; a run without any line end is cut every 64 KiB, never inside a UTF-8
    character. `stream` is a pipe (read to its end) or a file the worker writes (read until `finished` is set
    and nothing more is there)."""
    pending = b""
    try:
        while True:
            chunk = stream.read1(_LINE_LIMIT) if hasattr(stream, "read1") else stream.read(_LINE_LIMIT)
            if not chunk:
                if finished is None:
                    break
                if finished.is_set():
                    chunk = stream.read(_LINE_LIMIT)  # written between the last look and the end
                    if not chunk:
                        break
                else:
                    finished.wait(_TAIL_POLL)
                    continue
            pending += chunk
            while True:
                ends = [index for index in (pending.find(b"\n"), pending.find(b"\r")) if index >= 0]
                if not ends:
                    break
                cut = min(ends) + 1
                line, pending = pending[:cut], pending[cut:]
                sink.write(prefix + line.decode("utf-8", "replace").rstrip("\r\n") + "\n")
            while len(pending) > _LINE_LIMIT:
                cut = _LINE_LIMIT
                while cut > _LINE_LIMIT - 3 and pending[cut] & 0xC0 == 0x80:
                    cut -= 1  # never split a UTF-8 character across two lines
                sink.write(prefix + pending[:cut].decode("utf-8", "replace") + "\n")
                pending = pending[cut:]
        if pending:
            sink.write(prefix + pending.decode("utf-8", "replace") + "\n")
    except (OSError, ValueError):
        pass  # the pipe was closed under us while stopping
    finally:
        with contextlib.suppress(OSError):
            stream.close()


def _tail(path: str, prefix: str, sink: _Sink, finished: threading.Event) -> None:
    """Follow a log file the engine opens for a worker (it may not exist yet) until the attempt is over."""
    while not os.path.exists(path):
        if finished.wait(_TAIL_POLL) and not os.path.exists(path):
            return
    try:
        stream = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by _pump)
    except OSError:
        return
    _pump(stream, prefix, sink, finished)


def _console_streams(setting: object, local_rank: int) -> int:
    """The Std bits (1 stdout, 2 stderr) that `setting` (a Std, or a map of local rank to Std) gives a rank."""
    chosen = setting.get(local_rank, 0) if isinstance(setting, Mapping) else setting
    return int(chosen) if isinstance(chosen, int) else 0


def _logs_specs(
    *,
    log_dir: str,
    redirects: object,
    tee: object,
    ranks_filter: set[int] | None,
    out: _Sink,
    err: _Sink,
    on_start: Any,
) -> Any:
    """A torch `LogsSpecs` that sends every rank's streams to files (the engine's own layout under `log_dir`)
    and follows the files itself, rank-prefixed, for the streams the console should show."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, Std

    class PrefixedLogs(DefaultLogsSpecs):
        def __init__(self) -> None:
            super().__init__(log_dir=log_dir, redirects=Std.ALL, tee=Std.NONE)
            self.finished = threading.Event()
            self.tails: list[threading.Thread] = []

        def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
            self.finish()  # a restart: the previous attempt's files are read to their end first
            destination = super().reify(envs)
            on_start(envs)
            self.finished = threading.Event()
            for local_rank, env in envs.items():
                if ranks_filter is not None and local_rank not in ranks_filter:
                    continue
                shown = 3 & (~_console_streams(redirects, local_rank) | _console_streams(tee, local_rank))
                prefix = f"[rank {env.get('RANK', local_rank)}] "
                for bit, paths, sink in ((1, destination.stdouts, out), (2, destination.stderrs, err)):
                    if shown & bit:
                        tail = threading.Thread(
                            target=_tail, args=(paths[local_rank], prefix, sink, self.finished), daemon=True
                        )
                        tail.start()
                        self.tails.append(tail)
            return destination

        def finish(self) -> None:
            self.finished.set()
            for tail in self.tails:
                tail.join(10.0)
            self.tails = []

    return PrefixedLogs()


# --------------------------------------------------------------------------------------------------
# Nothing left alive


_PR_SET_CHILD_SUBREAPER = 36


def _set_subreaper(on: bool) -> bool:
    """Make this process the subreaper of its descendants (Linux): an orphaned grandchild becomes our child."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _children() -> set[int]:
    """This process's children in other sessions than ours (the engine starts each worker in a session of its
    own; orphans of those sessions are reparented here while we are the subreaper)."""
    me, session = os.getpid(), os.getsid(0)
    found: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields: state, ppid, pgrp, session, ...
        if len(fields) > 3 and int(fields[1]) == me and int(fields[3]) != session:
            found.add(int(entry))
    return found


@attrs.define
class _Orphan:
    """A leftover descendant, stopped through its process group as a worker is."""

    pid: int

    def exitcode(self) -> int | None:
        try:
            done, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return 0  # reaped already
        if done == 0:
            return None
        return os.waitstatus_to_exitcode(status)

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.exitcode() is None and time.monotonic() < deadline:
            time.sleep(0.01)


def _reap_descendants(before: set[int], grace: float, hurry: threading.Event | None = None) -> int:
    """Stop every descendant the run left (our children now, as their subreaper): the first round terminates each
    one's process group and kills what is left after `grace` seconds (none once `hurry` is set); a descendant that
    comes back (a child orphaned in turn, one that re-spawns itself on SIGTERM) is killed at once. Returns how many
    were still there after 30 s (0: nothing is left)."""
    settle = time.monotonic() + 30.0
    ours = os.getpgid(0)
    first = True
    left: list[int] = []
    while time.monotonic() < settle:
        left = sorted(_children() - before)
        if not left:
            return 0
        number = signal.SIGTERM if first and not (hurry is not None and hurry.is_set()) else signal.SIGKILL
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid)
                if group != ours:
                    os.killpg(group, number)  # the worker's group it was left in: its siblings too
        _stop([_Orphan(pid) for pid in left], grace=grace if number == signal.SIGTERM else 0.0, hurry=hurry)
        first = False
    return len(sorted(_children() - before))


# --------------------------------------------------------------------------------------------------
# Signals and the deadline


class _Interrupted(BaseException):
    """A signal (SIGINT, SIGTERM, SIGHUP) in the launcher, raised where the main thread is, the engine included."""

    def __init__(self, number: int) -> None:
        super().__init__(number)
        self.number = number


_HANDLED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
"""Handled by trainplan for the whole run. The engine would take them over when the workers start, and its
handler, raised again by a second Ctrl-C while it stops the workers, starts a second full grace period; ours
only cut the grace short. The engine keeps SIGQUIT."""
ENGINE_SIGNALS = "SIGQUIT"


@attrs.define
class _Signals:
    """Our handling of SIGINT, SIGTERM and SIGHUP: while the run goes, a signal is raised where the main thread is
    (`_Interrupted`); once it is cleaning up (`cleaning()`), a signal only hurries the cleanup, which always runs
    to its end, and is remembered for the exit code."""

    cleaning_up: bool = False
    received: int | None = None
    hurry: threading.Event = attrs.field(factory=threading.Event)

    def cleaning(self) -> None:
        self.cleaning_up = True

    def handle(self, number: int, frame: object) -> None:
        if not self.cleaning_up:
            raise _Interrupted(number)
        self.received = self.received or number
        self.hurry.set()


@contextlib.contextmanager
def _own_signals() -> Iterator[_Signals]:
    """Our handlers for the whole run and its cleanup (the engine is told to leave these signals alone); restored
    after."""
    signals = _Signals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    previous = {number: signal.getsignal(number) for number in _HANDLED}
    for number in _HANDLED:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(number, signals.handle)
    try:
        yield signals
    finally:
        for number, handler_before in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(number, handler_before)


@contextlib.contextmanager
def _environment(variables: Mapping[str, str]) -> Iterator[None]:
    """The workers' common variables in this process's environment (the engine passes it on), restored after
    with everything the engine itself set there (OMP_NUM_THREADS, TORCHELASTIC_SIGNALS_TO_HANDLE)."""
    saved = dict(os.environ)
    os.environ.update(variables)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            os.environ.pop(key, None)
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


class _WaitWatch:
    """While a node waits in a static rendezvous (inside torch's TCPStore, where Python's handlers never run),
    a signal ends the command at once: no worker has started, so there is nothing to stop."""

    def __init__(self, say: Any, *, cleanup: str | None, timed_out: threading.Event, timeout: float | None) -> None:
        self.say = say
        self.cleanup = cleanup
        self.timed_out = timed_out
        self.timeout = timeout
        self.waiting = threading.Event()
        self.closed = threading.Event()
        self.reader, self.writer = socket.socketpair()
        self.writer.setblocking(False)
        self.previous_fd = -1
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> _WaitWatch:
        if threading.current_thread() is threading.main_thread():
            self.previous_fd = signal.set_wakeup_fd(self.writer.fileno(), warn_on_full_buffer=False)
            self.waiting.set()
            self.thread.start()
        return self

    def started(self) -> None:
        self.waiting.clear()

    def _watch(self) -> None:
        while not self.closed.is_set():
            try:
                self.reader.settimeout(0.2)
                data = self.reader.recv(16)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data or not self.waiting.is_set():
                continue
            if self.closed.wait(1.0) or not self.waiting.is_set():
                continue  # the main thread took the signal itself
            number, code = data[-1], 128 + data[-1]
            if self.timed_out.is_set():  # the deadline's own interruption
                code = 124
                self.say(f"the workers did not finish within {self.timeout:g} s (still waiting for the other nodes)")
            else:
                self.say(f"stopped by {_signal_name(-number) or number} while waiting for the other nodes")
            if self.cleanup is not None:
                shutil.rmtree(self.cleanup, ignore_errors=True)
            os._exit(code)

    def __exit__(self, *exc: object) -> None:
        self.closed.set()
        if self.thread.is_alive():
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(self.previous_fd)
            self.thread.join(1.0)
        self.reader.close()
        self.writer.close()


# --------------------------------------------------------------------------------------------------
# The run


@attrs.frozen
class _Meeting:
    """Where and how this node's agent meets the others."""

    backend: str
    endpoint: str
    run_id: str
    node_rank: int
    local_addr: str | None


def _meeting(plan: Plan, options: EngineOptions) -> _Meeting:
    cluster = plan.cluster
    address = cluster.main_address
    host = f"[{address}]" if ":" in address else address
    backend = options.rdzv_backend
    if backend is not None and backend not in RENDEZVOUS_BACKENDS:
        raise LaunchError(
            f"--rdzv-backend {backend!r} is not a rendezvous backend of torch's elastic agent; use one of "
            f"{', '.join(RENDEZVOUS_BACKENDS)}"
        )
    if backend is None:
        backend = "static" if cluster.main_port is not None or plan.num_nodes > 1 else "c10d"
    if options.rdzv_endpoint:
        endpoint = options.rdzv_endpoint
    elif cluster.main_port is not None:
        endpoint = f"{host}:{cluster.main_port}"
    elif backend == "static":
        endpoint = f"{host}:{choose_free_port(address)}"
    else:
        endpoint = f"{host}:0"  # the system picks the store's port: two runs on one box never clash
    port = endpoint.rsplit(":", 1)[-1]
    run_id = TRAINPLAN_RUN_ID_PREFIX + (
        options.rdzv_id or (port if port != "0" else f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
    )
    local = options.local_addr or (address if plan.num_nodes == 1 else None)
    return _Meeting(backend, endpoint, run_id, cluster.node_rank or 0, local)  # a plan it launches knows its node


class _Mismatched(Exception):
    """Raised from the engine's start of the workers when the nodes' plans disagree: the launch ends, refused."""

    def __init__(self, error: TrainplanError) -> None:
        super().__init__(str(error))
        self.error = error


def _node(plan: Plan, meeting: _Meeting) -> str:
    """This node as the banner names it: its rank, or under c10d (which assigns ranks as nodes arrive) not yet."""
    if meeting.backend == "c10d" and plan.num_nodes > 1:
        return "this node (its rank is assigned at the rendezvous)"
    return f"node {meeting.node_rank}"


def _summary(plan: Plan, meeting: _Meeting, options: EngineOptions) -> str:
    layout = (
        f"{plan.processes_per_node} process(es)"
        if plan.num_nodes == 1
        else f"{_node(plan, meeting)} of {plan.num_nodes} × {plan.processes_per_node} process(es)"
    )
    where = meeting.endpoint.removesuffix(":0") + (" (a free port)" if meeting.endpoint.endswith(":0") else "")
    restarts = f", up to {options.max_restarts} restart(s)" if options.max_restarts else ""
    return (
        f"{plan.accelerator} {plan.strategy.name} {plan.precision}, {layout}, world size {plan.world_size}, "
        f"backend {plan.process_group_backend or 'none'}; {meeting.backend} rendezvous at {where}{restarts}"
    )


def _common_variables(plan: Plan, meeting: _Meeting, port: int, server: int | None = None) -> dict[str, str]:
    """What every worker of this node shares (the engine adds each one's ranks, MASTER_ADDR and MASTER_PORT)."""
    variables = _specs(plan, port=port, launcher="trainplan launch")[0].environment()
    for per_worker in ("RANK", "LOCAL_RANK", "ROLE_RANK", "MASTER_PORT", "MASTER_ADDR", "GROUP_RANK"):
        variables.pop(per_worker, None)
    if meeting.backend != "static" and plan.num_nodes > 1:
        variables.pop("NODE_RANK", None)  # the rendezvous assigns node ranks (GROUP_RANK) as nodes arrive
    variables["PYTHONUNBUFFERED"] = "1"
    variables.update(handed_to_workers(plan, server))  # the rule set `--rules` named, for the workers started here
    return variables


def _engine_arguments(plan: Plan, meeting: _Meeting, options: EngineOptions, log_dir: str) -> list[str]:
    """torchrun's command line for this plan (parsed by torchrun's own parser)."""
    words = [
        f"--nnodes={plan.num_nodes}",
        f"--nproc-per-node={plan.processes_per_node}",
        f"--node-rank={meeting.node_rank}",
        f"--rdzv-backend={meeting.backend}",
        f"--rdzv-endpoint={meeting.endpoint}",
        f"--rdzv-id={meeting.run_id}",
        f"--max-restarts={options.max_restarts}",
        f"--log-dir={log_dir}",
    ]
    if meeting.backend == "static":
        host, _, port = meeting.endpoint.rpartition(":")
        words += [f"--master-addr={host.strip('[]')}", f"--master-port={port}"]
    if options.rdzv_conf:
        words.append(f"--rdzv-conf={options.rdzv_conf}")
    if meeting.local_addr:
        words.append(f"--local-addr={meeting.local_addr}")
    return words


def _parse_streams(name: str, text: str) -> object:
    from torch.distributed.elastic.multiprocessing.api import Std

    try:
        return Std.from_str(text)
    except ValueError:
        raise LaunchError(
            f"--{name} {text!r}: write 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or per local rank as 0:3,1:1"
        ) from None


def _parse_ranks_filter(text: str | None) -> set[int] | None:
    if text is None:
        return None
    try:
        ranks = {int(part) for part in text.split(",")}
    except ValueError:
        ranks = set()
    if not ranks or min(ranks) < 0:
        raise LaunchError(f"--local-ranks-filter {text!r}: write local ranks separated by commas, e.g. 0 or 0,2")
    return ranks


def _import_engine() -> None:
    """torch's elastic engine, or a LaunchError that says why torch cannot be imported (not installed, or
    installed but broken: a missing libcudart is an OSError)."""
    try:
        import torch.distributed.launcher.api
        import torch.distributed.run  # noqa: F401
    except (ImportError, OSError) as error:
        raise LaunchError(
            f"trainplan launch runs the workers through torch's elastic engine, and torch failed to import "
            f"({type(error).__name__}: {error}). Install a torch that works in this environment"
        ) from None


_WHOLE_SECONDS = ("timeout", "join_timeout", "last_call_timeout", "close_timeout", "read_timeout")
"""Rendezvous settings that torch reads as whole seconds."""


def _parse_rdzv_conf(text: str) -> dict[str, str]:
    """torchrun's `--rdzv-conf key=value,...`, checked before anything starts."""
    settings: dict[str, str] = {}
    for item in text.split(",") if text.strip() else []:
        key, separator, value = item.partition("=")
        if not separator or not key.strip() or not value.strip():
            raise LaunchError(
                f"--rdzv-conf {text!r}: {item!r} is not key=value; write settings as key=value,..., e.g. timeout=60"
            )
        key, value = key.strip(), value.strip()
        if key in _WHOLE_SECONDS and not (value.isascii() and value.isdigit()):
            raise LaunchError(f"--rdzv-conf {key}={value}: {key} is whole seconds, e.g. {key}=60")
        settings[key] = value
    return settings


def _log_dir(given: str | None, lifeline: Lifeline | None = None) -> str:
    """The engine's log directory: `--log-dir` (created if need be) or a new temporary one; refused when it
    cannot be created or written. `lifeline`: a temporary one is told to it before it is made (it goes with the
    launch, even if this process is killed at once)."""
    what = f"--log-dir {given}" if given is not None else "a temporary log directory"
    try:
        if given is None and lifeline is not None:
            return lifeline.temporary_directory("trainplan-launch-")
        if given is None:
            return tempfile.mkdtemp(prefix="trainplan-launch-")
        os.makedirs(given, exist_ok=True)
        if not os.access(given, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable")
    except FileExistsError:
        raise LaunchError(f"{what}: cannot be used as the log directory (it is a file); name a directory") from None
    except OSError as error:
        raise LaunchError(
            f"{what}: cannot be created or used as the log directory ({error.strerror or error}); "
            "name a directory this user can write"
        ) from None
    return given


def launch_script(
    plan: Plan,
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    options: EngineOptions = EngineOptions(),
    stdout: Any = None,
    stderr: Any = None,
    quiet: bool = False,
    exit_on_signal_while_waiting: bool = False,
    variables: Mapping[str, str] | None = None,
    refused: list[TrainplanError] | None = None,
) -> int:
    """Run a script on each of the plan's workers on this node through torch's elastic agent, with the
    environment torchrun gives (so `torch.distributed.init_process_group()` with env:// works unchanged) plus
    the plan; output prefixed by rank. `variables` go into the workers' environment too (the command line's
    --env-file and --set-env, which the plan was made from); the plan's own variables win over them.

    Returns the exit code of the first failing worker (0 when all succeed, after any restarts; 124 on timeout;
    128 + N when this process got signal N); nothing it started is alive when it returns. `refused`: where a
    refusal found at the rendezvous goes (the nodes met with different plans: exit 2), instead of a line on stderr
    (the CLI's --json writes it as the error record).
    """
    if not isinstance(plan, Plan):
        raise LaunchError(f"launch_script takes a trainplan.Plan, not {a_kind(plan)}")
    _check_times(timeout, grace_period)
    restarts: object = options.max_restarts
    if not isinstance(restarts, int) or restarts < 0:
        raise LaunchError(f"max_restarts={options.max_restarts!r}: write a whole number ≥ 0")
    command = script_command(argv, options)
    given = {str(key): str(value) for key, value in (variables or {}).items()}
    rendezvous = _parse_rdzv_conf(options.rdzv_conf)
    out = _Sink(sys.stdout if stdout is None else stdout)
    err = _Sink(sys.stderr if stderr is None else stderr)

    def say(text: str) -> None:
        err.write(f"trainplan: {text}\n")

    if started_by_another_launcher(plan):
        raise LaunchError("trainplan launch does not start XLA workers; use torch_xla's launcher for this plan")
    if launcher_rule(plan).joins:
        code = _run_as_this_rank(plan, command, timeout=timeout, grace=grace_period, out=out, err=err, variables=given)
    else:
        _check_startable(plan)
        # If this process is killed outright, the lifeline kills the workers and removes the temporary log directory.
        # Made first, so that the forkserver (started next, its torch import overlapping this process's own) carries
        # its mark, and each worker it forks with it.
        lifeline = Lifeline()
        server: dict[str, str] | None = None
        try:
            # Signals are held while the server starts and torch's engine is imported (multiprocessing blocks signals
            # around its spawn, and an interrupt inside those imports can be lost), then delivered here: a Ctrl-C in
            # between is never lost, and the run's own handlers take over from there.
            with interrupts_deferred():
                server = _start_server(command, lifeline)
                _import_engine()
                from torch.distributed import run as _torchrun  # noqa: F401  # what `_run_engine` imports next
                from torch.distributed.launcher import api as _launcher_api  # noqa: F401
            redirects = _parse_streams("redirects", options.redirects)
            tee = _parse_streams("tee", options.tee)
            ranks_filter = _parse_ranks_filter(options.local_ranks_filter)
            meeting = _meeting(plan, options)
        except BaseException:
            _stop_server(server)
            lifeline.release()
            raise
        if not quiet:
            say(_summary(plan, meeting, options))
            choices = launch_choices_line(
                plan.request, frozenset(filter(None, given.get(LAUNCH_CHOICES_VARIABLE, "").split(",")))
            )
            if choices is not None:
                say(choices)
        code = _run_engine(
            plan,
            command,
            meeting,
            options,
            timeout=timeout,
            grace=grace_period,
            logs=(redirects, tee, ranks_filter),
            out=out,
            err=err,
            say=say,
            quiet=quiet,
            watch_wait=exit_on_signal_while_waiting and meeting.backend == "static",
            variables=given,
            rendezvous=rendezvous,
            lifeline=lifeline,
            server=server,
            refused=refused,
        )
    for sink in (out, err):
        if sink.failure is not None:
            # The workers ran, but their output was lost: say so, and do not report plain success.
            with contextlib.suppress(OSError, ValueError, AttributeError):
                print(f"trainplan: error: the workers' output could not be written ({sink.failure})", file=sys.stderr)
            return code or 2
    return code


def end_on_late_signals() -> Callable[[], None]:
    """SIGTERM and SIGHUP end `trainplan launch` with the shell's code (128 + the signal) at every moment, also after
    the launch has restored its own handlers and while the interpreter shuts down: a signal repeated after the
    cleanup it hurried (everything is reaped then) exits 143 or 129, never by the default action."""

    def leave(number: int, frame: object) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(128 + number)  # no exception into whatever runs now (an atexit finalizer): the launch is done

    def ignore_while_exiting() -> None:
        # The interpreter's shutdown puts its handlers back to the default action: a signal then would end the
        # command by that signal (-15), not with its code. The exit code is decided by now.
        for number in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, OSError):
                signal.signal(number, signal.SIG_IGN)

    for number in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(number) is signal.SIG_DFL:  # an inherited SIG_IGN stays ignored
            signal.signal(number, leave)
    atexit.register(ignore_while_exiting)  # registered last, so it runs first
    return ignore_while_exiting


def _run_engine(
    plan: Plan,
    command: Command,
    meeting: _Meeting,
    options: EngineOptions,
    *,
    timeout: float | None,
    grace: float,
    logs: tuple[object, object, set[int] | None],
    out: _Sink,
    err: _Sink,
    say: Any,
    quiet: bool,
    watch_wait: bool,
    variables: Mapping[str, str],
    rendezvous: Mapping[str, str],
    lifeline: Lifeline,
    server: Mapping[str, str] | None,
    refused: list[TrainplanError] | None = None,
) -> int:
    """The engine's run; `lifeline` is the launch's (released here), `server` the environment the launch's
    forkserver started with (`_start_server`; None: the engine starts each worker as a process of its own)."""
    _import_engine()
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import launch_agent

    redirects, tee, ranks_filter = logs
    keep_files = options.log_dir is not None or options.redirects != "0" or options.tee != "0"
    log_dir = _log_dir(options.log_dir, None if keep_files else lifeline)
    if keep_files and options.log_dir is None:
        say(f"the workers' log files (--redirects/--tee) are kept in {log_dir} (--log-dir chooses where)")
    port = int(meeting.endpoint.rsplit(":", 1)[-1])
    timed_out = threading.Event()
    watch: Any = contextlib.nullcontext()
    if watch_wait:
        watch = _WaitWatch(say, cleanup=None if keep_files else log_dir, timed_out=timed_out, timeout=timeout)
    attempts = [0]

    def on_start(envs: dict[int, dict[str, str]]) -> None:
        if isinstance(watch, _WaitWatch):
            watch.started()
        restart = next(iter(envs.values()), {}).get("TORCHELASTIC_RESTART_COUNT", "0")
        if restart != "0":
            say(f"restarting the workers (restart {restart} of {options.max_restarts})")
        elif plan.num_nodes > 1 and not quiet:
            group = next(iter(envs.values()), {}).get("GROUP_RANK", str(meeting.node_rank))
            say(f"the {plan.num_nodes} nodes met; starting node {group}'s {plan.processes_per_node} worker(s)")
        attempts[0] += 1
        first = next(iter(envs.values()), {})
        world = first.get("WORLD_SIZE")
        if world is not None and world.isdigit() and int(world) != plan.world_size:
            # The nodes met with different plans (different --devices): refused here, before any worker starts.
            raise _Mismatched(heterogeneous_nodes(plan, int(world), first.get("LOCAL_WORLD_SIZE"), "trainplan launch"))

    specs = _logs_specs(
        log_dir=log_dir, redirects=redirects, tee=tee, ranks_filter=ranks_filter, out=out, err=err, on_start=on_start
    )
    # The lifeline was started before the children are counted: its watcher is a child of ours that the reaping
    # must leave alone.
    before = _children()
    subreaper = _set_subreaper(True)
    deadline: threading.Timer | None = None
    code = left = 0
    common = {**variables, **_common_variables(plan, meeting, port, _server_pid(server)), **lifeline.variables}
    with _own_signals() as signals:
        try:
            with _environment(common), watch:
                words = _engine_arguments(plan, meeting, options, log_dir)
                if command.module:
                    words.append("--module")
                elif not command.python:
                    words.append("--no-python")
                # torchrun's parser reads the flags and the program only: the script's own words (`--d 1`) would be
                # read as abbreviations of its flags, so they are added to the worker's command line afterwards.
                arguments = torchrun.get_args_parser().parse_args([*words, command.program])
                config, entrypoint, entry_arguments = torchrun.config_from_args(arguments)
                worker_arguments: list[Any] = [*entry_arguments, *command.arguments]
                if server is not None:  # forked from the server that imported torch, not started afresh
                    config.start_method = "forkserver"
                    entrypoint = run_script
                    worker_arguments = [command.program, command.module, command.arguments, dict(os.environ), server]
                config.logs_specs = specs
                config.signals_to_handle = ENGINE_SIGNALS
                config.shutdown_timeout = max(0, math.ceil(grace))
                if timeout is not None:
                    # A static rendezvous waits inside torch's store: its own timeout must end that wait too.
                    config.rdzv_configs["timeout"] = min(int(rendezvous.get("timeout", 900)), math.ceil(timeout))

                    def expire() -> None:
                        timed_out.set()
                        with contextlib.suppress(RuntimeError):
                            _thread.interrupt_main(signal.SIGTERM)

                    deadline = threading.Timer(timeout, expire)
                    deadline.daemon = True
                    deadline.start()
                if plan.num_nodes > 1 and not quiet:
                    others = plan.num_nodes - 1
                    say(f"{_node(plan, meeting)} is waiting for the other {others} node(s) at {meeting.endpoint}")
                try:
                    with (
                        _loopback_stores(plan.num_nodes == 1 and not options.rdzv_endpoint),
                        _fresh_store_per_round(options.max_restarts > 0),
                        _failures_said_by_the_launch(),
                    ):
                        launch_agent(config, entrypoint, worker_arguments)
                except _Mismatched as mismatch:
                    if refused is None:
                        say(f"error: {mismatch.error}")
                    else:
                        refused.append(mismatch.error)
                    code = 2
                except ChildFailedError as failure:
                    rank, first = failure.get_first_failure()
                    code = first.exitcode if first.exitcode > 0 else 128 - first.exitcode
                    tried = f" after {attempts[0]} attempt(s)" if attempts[0] > 1 else ""
                    # One line per failed rank, the first (by time) first; the engine's own log of each is held back.
                    # The siblings the engine stopped are in its failures too (SIGTERM, then SIGKILL): "stopped".
                    engine_stopped = (-signal.SIGTERM, -signal.SIGKILL)
                    also_failed = sorted(
                        (
                            each
                            for each in failure.failures.items()
                            if each[0] != rank and each[1].exitcode not in engine_stopped
                        ),
                        key=lambda each: each[0],
                    )
                    for place, (failed_rank, failed) in enumerate([(rank, first), *also_failed]):
                        how = _signal_name(failed.exitcode) or f"exit code {failed.exitcode}"
                        then = f"{tried}; the others were stopped" if place == 0 else " too"
                        say(f"worker rank {failed_rank} failed ({how}){then}")
                        message: object = failed.message
                        if isinstance(message, dict):  # the error file's own record: {"message": ..., "extraInfo": ...}
                            message = message.get("message")
                        if os.path.isfile(failed.error_file) and isinstance(message, str) and message.strip():
                            # Without kept log files the error file is removed at the end: its text is quoted, not
                            # its path.
                            where = f" ({failed.error_file})" if keep_files else ""
                            say(f"its error{where}: {message.strip().splitlines()[0]}")
                except (SignalException, _Interrupted) as stopped:
                    number = stopped.sigval if isinstance(stopped, SignalException) else stopped.number
                    code = 124 if timed_out.is_set() else 128 + int(number)
                except KeyboardInterrupt:
                    code = 124 if timed_out.is_set() else 130
                except Exception as error:  # the rendezvous failed (a peer never came, an address not ours), or worse
                    if timed_out.is_set():
                        code = 124
                    elif _rendezvous_failure(error):
                        say(f"error: the rendezvous at {meeting.endpoint} failed ({type(error).__name__}: {error})")
                        code = 1
                    else:
                        say(f"error: torch's elastic engine failed ({type(error).__name__}: {error})")
                        code = 1
                if code == 124:
                    say(f"the workers did not finish within {timeout:g} s; stopped them")
        except KeyboardInterrupt:
            code = 124 if timed_out.is_set() else 130
        except _Interrupted as stopped:
            code = 124 if timed_out.is_set() else 128 + stopped.number
        finally:
            signals.cleaning()  # from here on, a signal hurries the cleanup and never cuts it short
            if deadline is not None:
                deadline.cancel()
            specs.finish()
            _stop_server(server)
            try:
                # After a signal or the deadline the engine has had its grace period already: kill what is left.
                left = _reap_descendants(before, 0.0 if code == 124 or code > 128 else grace, signals.hurry)
            finally:
                if subreaper:
                    _set_subreaper(False)
                if not keep_files:
                    shutil.rmtree(log_dir, ignore_errors=True)
                lifeline.release()
    if signals.received is not None and code == 0:
        code = 128 + signals.received
    if left:
        say(f"error: {left} process(es) the workers started could not be stopped (they survive SIGKILL?)")
        code = code or 1
    return code


_STORE_ARGUMENTS = (
    "host_name",
    "port",
    "world_size",
    "is_master",
    "timeout",
    "wait_for_workers",
    "multi_tenant",
    "master_listen_fd",
    "use_libuv",
)
"""torch's TCPStore arguments, in their order."""


@contextlib.contextmanager
def _loopback_stores(one_node: bool) -> Iterator[None]:
    """While the elastic engine runs a one-node world in this process: every TCPStore server it starts (the
    rendezvous's, the agent's store the workers meet at) listens on 127.0.0.1 alone, through a socket bound here and
    handed to the store (`master_listen_fd`); torch's own would listen on every interface. Several nodes: unchanged,
    since the other nodes must reach the store."""
    if not one_node:
        yield
        return
    from torch import distributed
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, static_tcp_rendezvous

    original = distributed.TCPStore  # type: ignore[attr-defined]  # re-exported at runtime

    class LoopbackStore(original):  # type: ignore[misc, valid-type]  # a pybind class, subclassed at runtime
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.update(zip(_STORE_ARGUMENTS, args, strict=False))
            if kwargs.get("is_master") and kwargs.get("master_listen_fd") is None:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    listener.bind(("127.0.0.1", int(kwargs.get("port") or 0)))
                    listener.listen()
                except OSError as error:
                    listener.close()
                    raise RuntimeError(f"cannot listen on 127.0.0.1:{kwargs.get('port')}: {error}") from None
                kwargs["port"] = listener.getsockname()[1]
                kwargs["master_listen_fd"] = listener.detach()  # the store owns the socket from here on
            super().__init__(**kwargs)

    modules = (distributed, c10d_rendezvous_backend, static_tcp_rendezvous)
    saved = [(module, getattr(module, "TCPStore", None)) for module in modules]
    for module, _ in saved:
        module.TCPStore = LoopbackStore  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module, value in saved:
            module.TCPStore = value  # type: ignore[attr-defined]


def _server_pid(server: Mapping[str, str] | None) -> int | None:
    """The pid of the forkserver this launch started (`_start_server`), or None when it serves no workers."""
    if server is None:
        return None
    from multiprocessing import forkserver

    pid: Any = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


_ENGINE_FAILURE_LOGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch.distributed.elastic.multiprocessing.api", ("failed (exitcode", "Sending process")),
    ("torch.multiprocessing.spawn", ("Terminating process",)),
)
"""What torch's engine logs of a failing worker, by logger and the start of its message: a traceback of its own
polling (`ProcessExitedException: process 1 terminated with exit code 3`, or the worker's error a second time,
wrapped in the engine's frames), and each sibling it stops. The launch says the same in a line per failed rank
("worker rank 1 failed (exit code 3); the others were stopped"), and the worker's own traceback is on its stderr."""


class _HeldBack(logging.Filter):
    """Drops the records whose message starts with one of `starts`: the rest of the logger's records pass."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts)


@contextlib.contextmanager
def _failures_said_by_the_launch() -> Iterator[None]:
    """Hold back the engine's own log of failing workers (`_ENGINE_FAILURE_LOGS`) while it runs: the launch reports
    them itself, one line per failed rank."""
    held = [(logging.getLogger(name), _HeldBack(starts)) for name, starts in _ENGINE_FAILURE_LOGS]
    for logger, held_back in held:
        logger.addFilter(held_back)
    try:
        yield
    finally:
        for logger, held_back in held:
            logger.removeFilter(held_back)


def _start_server(command: Command, lifeline: Lifeline) -> dict[str, str] | None:
    """Start the forkserver the workers of a Python script (or module) are forked from: a fresh interpreter (none of
    this process's state, no CUDA) that imports torch once, while this process imports it too, so that no worker
    starts an interpreter and imports torch of its own (torch's engine forks them through its multiprocessing
    context, `start_method="forkserver"`, with `served_script.run_script` as the entry point). Returns the
    environment it started with (each worker takes the launch's environment over it), or None where the engine
    starts each worker as a process instead: --no-python programs and -c code, and where no forkserver can run
    (not Linux, or its socket path too long for AF_UNIX)."""
    import multiprocessing

    if not command.python or not sys.platform.startswith("linux"):
        return None
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    environment = {**os.environ, **lifeline.variables}
    try:
        # A server of an earlier launch has another environment: a new one, with the lifeline's mark, told to it
        # (and its socket's directory, which this process removes at exit) before it starts.
        _forkserver_context(fresh=True, lifeline=lifeline)
    except OSError:
        return None
    return {**environment, "PYTHONSAFEPATH": "1"}  # `_forkserver_context` starts it with PYTHONSAFEPATH set


def _stop_server(server: Mapping[str, str] | None) -> None:
    """Stop the launch's forkserver (nothing of a launch outlives it); its workers have ended or been stopped."""
    if server is None:
        return
    from multiprocessing import forkserver

    running: Any = getattr(forkserver, "_forkserver", None)
    pid = getattr(running, "_forkserver_pid", None)
    if isinstance(pid, int):
        # Killed, not asked: it holds nothing but the preloaded modules, and a server with torch imported takes
        # most of a second to tear its interpreter down. Then multiprocessing forgets it (its socket, its pipe).
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError, ChildProcessError):
            running._stop()


@contextlib.contextmanager
def _fresh_store_per_round(restarts: bool) -> Iterator[None]:
    """While the elastic engine runs a world that may restart: each round of its c10d rendezvous (each attempt) opens
    a new agent store, on a port of its own, for the workers to meet at.

    torch's engine opens that store once and shares it across attempts, so a restarted rank reads the keys its failed
    attempt left (gloo's listening addresses): it connects to a port nobody listens on any more (`connectFullMesh ...
    refused`) or waits for a peer that already left. Forgetting the round's store before the next round makes the
    engine open a new one (through `_loopback_stores` on one node: still on 127.0.0.1); the workers stay its clients.
    Measured with `benchmarks/bench_restarts.py`. A static rendezvous (several nodes named by rank, a fixed port)
    keeps torch's one store."""
    if not restarts:
        yield
        return
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    original = DynamicRendezvousHandler.next_rendezvous

    def next_rendezvous(self: Any) -> Any:
        self._bootstrap_store_info = None  # the previous round's store and its address: a new one is opened
        self._shared_tcp_store_server = None
        return original(self)

    DynamicRendezvousHandler.next_rendezvous = next_rendezvous  # type: ignore[method-assign]
    try:
        yield
    finally:
        DynamicRendezvousHandler.next_rendezvous = original  # type: ignore[method-assign]


def _rendezvous_failure(error: BaseException) -> bool:
    """Whether the engine's error comes from meeting the other nodes (its rendezvous and store, the network)."""
    names = {kind.__name__ for kind in type(error).__mro__}
    return bool(names & {"RendezvousError", "DistStoreError", "DistNetworkError", "OSError", "TimeoutError"})


def _run_as_this_rank(
    plan: Plan,
    command: Command,
    *,
    timeout: float | None,
    grace: float,
    out: _Sink,
    err: _Sink,
    variables: Mapping[str, str],
) -> int:
    """Inside a started job: run the script once, as this process's rank, with torchrun's variables; its stdout
    and stderr passed on to ours, rank-prefixed. Nothing it started is left alive when this returns, a
    process in a session of its own included (this process is their subreaper)."""
    cluster = plan.cluster
    port = cluster.main_port or choose_free_port(cluster.main_address)
    rank = cluster.global_rank or 0
    given, variables = variables, torchrun_variables(plan, rank=rank, local_rank=cluster.local_rank or 0, port=port)
    words = (
        [sys.executable, "-u", *(["-m"] if command.module else []), command.program]
        if command.python
        else [command.program]
    )
    environment = {
        **os.environ,
        **given,
        **variables,
        RUN_ID_VARIABLE: f"{TRAINPLAN_RUN_ID_PREFIX}{port}",
        "PYTHONUNBUFFERED": "1",
    }
    code = 0
    process: subprocess.Popen[bytes] | None = None
    pumps: list[threading.Thread] = []
    lifeline = Lifeline()  # the script and what it starts end with this process, however it ends
    before = _children()  # the lifeline's watcher among them: never reaped
    subreaper = _set_subreaper(True)
    try:
        with _sigterm_stops_workers():
            try:
                process = subprocess.Popen(
                    [*words, *command.arguments],
                    env={**environment, **lifeline.variables},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            except OSError as error:
                raise LaunchError(f"Cannot run {command.program!r} ({error.strerror or error})") from None
            lifeline.watch(process.pid)
            for stream, sink in ((process.stdout, out), (process.stderr, err)):
                pump = threading.Thread(target=_pump, args=(stream, f"[rank {rank}] ", sink), daemon=True)
                pump.start()
                pumps.append(pump)
            try:
                returned = process.wait(timeout)
            except subprocess.TimeoutExpired:
                err.write(f"trainplan: the script did not finish within {timeout:g} s; stopping it\n")
                code = 124
            else:
                code = returned if returned >= 0 else 128 - returned
    except KeyboardInterrupt:
        code = 130
    finally:
        try:
            if process is not None:
                _stop([_ScriptWorker(process)], grace=grace)
            # What the script started and left (a child in a session of its own, say) is ours now: stop it.
            _reap_descendants(before, 0.0 if code == 124 or code > 128 else grace)
        finally:
            if subreaper:
                _set_subreaper(False)
            lifeline.release()
        for pump in pumps:
            pump.join(5.0)
    return code
