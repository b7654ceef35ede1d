"""`launch(plan, fn, *args, **kwargs)`: run a plan's workers and bring back their results, or a clear failure.

The plan decided everything (how many processes, started how, on which devices, with which backend);
this module only carries it out:

- `none`: run `fn` inline. `external` (torchrun, SLURM, ...): this process is one rank of a world that
  already exists; join it and run `fn` here. `spawn` / `fork`: start the processes with multiprocessing.
  `subprocess`: start fresh interpreters that import `fn` (it must be importable).
- Each worker gets the torch.distributed environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
  NODE_RANK, GROUP_RANK, MASTER_ADDR, MASTER_PORT) and the plan as JSON; its device is bound from the
  plan; the process group is initialised with the plan's backend before `fn` and destroyed after.
- A worker that raises, exits non-zero or dies by a signal stops its siblings (terminate, then kill
  after a grace period) and the caller gets `WorkerFailed` naming the rank, with the worker's traceback,
  exit code or signal. A world that overruns its timeout is stopped and `LaunchTimeout` raised. Ctrl-C
  or SIGTERM in the caller stops every worker. No worker outlives `launch`; nothing is written to disk.
- A free main port is chosen when the plan has none; a port taken meanwhile is retried, not fatal.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import multiprocessing
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, Literal, Protocol, TypeVar

import attrs

from trainplan.effects.extras import require_torch
from trainplan.effects.lifeline import Lifeline, close_inherited_lifelines, die_with_parent
from trainplan.effects.probing import process_variables
from trainplan.effects.rules_loading import handed_rules, load_rules, loaded_rules, read_plan_text
from trainplan.effects.world import join
from trainplan.mapping.workers import (
    global_rank_of,
    heterogeneous_nodes,
    launcher_rule,
    nested_launch,
    started_by_another_launcher,
    torchrun_variables,
    unlaunchable,
    worker_environment,
    worker_start_method,
    worker_view,
)
from trainplan.resolve.cluster import launched_by_trainplan
from trainplan.rules import FORKSERVER_PRELOAD, LAUNCHED_MARKER, PLAN_VARIABLE, UNNAMED_RULES, LauncherRule
from trainplan.spec.errors import TrainplanError, a_kind
from trainplan.spec.names import StartMethod
from trainplan.spec.numbers import real_number
from trainplan.spec.plan import Plan

R = TypeVar("R")

"""Environment variable holding the plan's JSON in every launched worker."""
LAUNCHED_VARIABLE = LAUNCHED_MARKER
"""Set in every launched worker (to the launcher's name): the resolver then reads the world from RANK etc."""
DEFAULT_GRACE_PERIOD = 5.0
PORT_ATTEMPTS = 3
EXIT_ALLOWANCE = 30.0
"""Seconds (beyond the grace period) that workers which sent their results may take to exit, all together."""


class LaunchError(TrainplanError, RuntimeError):
    """The workers could not be started or run."""


class NestedLaunch(LaunchError):
    """This process is itself one rank of a started job; starting the plan's workers here would nest a world."""


class NotImportable(LaunchError, ValueError):
    """`fn` cannot be found by a fresh interpreter (a lambda, a nested function, an interactive `__main__`)."""


class LaunchTimeout(LaunchError):
    """The world did not finish in time; every worker was stopped."""

    def __init__(self, message: str, *, timeout: float) -> None:
        super().__init__(message)
        self.timeout = timeout


class WorkerFailed(LaunchError):
    """A worker raised, exited non-zero or died by a signal; its siblings were stopped."""

    def __init__(
        self,
        *,
        rank: int,
        local_rank: int,
        exitcode: int | None,
        signal_name: str | None,
        traceback_text: str,
        port_clash: bool = False,
        how: str | None = None,
    ) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.exitcode = exitcode
        self.signal_name = signal_name
        self.traceback_text = traceback_text
        self.port_clash = port_clash
        if how is not None:
            pass
        elif traceback_text:
            how = "raised an exception"
        elif signal_name is not None:
            how = f"was killed by {signal_name}"
        else:
            how = f"exited with code {exitcode} without returning"
        detail = f":\n{traceback_text.rstrip()}" if traceback_text else ""
        super().__init__(
            f"Worker rank {rank} (local rank {local_rank}) {how}; its siblings were stopped. "
            f"Fix the worker's error and launch again{detail}"
        )


# --------------------------------------------------------------------------------------------------
# What a worker needs, and what it does


@attrs.frozen(kw_only=True)
class WorkerSpec:
    """Everything one worker needs: its ranks, the world's meeting port, the plan as JSON, its environment."""

    global_rank: int
    local_rank: int
    main_port: int
    plan_json: str
    variables: dict[str, str] = attrs.field(hash=False)
    """The variables `mapping.workers.worker_environment` writes (torchrun's, the plan, the marker, the GPUs)."""
    rules: str | None = None
    """The reference of the downstream rule set the plan was made from, which the launcher has loaded (its caller
    imported it): the worker imports it by that name, handed over with the launch itself, never from the plan."""

    def environment(self) -> dict[str, str]:
        """The torch.distributed (and torchrun-compatible) environment of this worker."""
        return dict(self.variables)


@attrs.frozen
class _Outcome:
    kind: Literal["ok", "error"]
    value: object = None
    traceback_text: str = ""
    port_clash: bool = False


def _is_port_clash(error: BaseException) -> bool:
    text = str(error)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


class _KeepRunning:
    """A worker's stdout or stderr that a reader cannot end the run through: once the stream is gone (the reader of
    `| head` left, or the caller's stdout was closed), the worker's output is dropped and the worker goes on, as
    under `trainplan launch` (and on every launcher alike)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return int(self._stream.write(text))
            except (OSError, ValueError):
                self._gone = True
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._gone = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _keep_running_streams() -> None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _KeepRunning):
            setattr(sys, name, _KeepRunning(stream))


def run_worker(
    spec: WorkerSpec, fn: Callable[..., object], args: Sequence[object], kwargs: Mapping[str, Any]
) -> _Outcome:
    """Inside a worker: set the environment, join the world, run `fn`, leave the world."""
    _keep_running_streams()
    os.environ.update(spec.environment())
    try:
        rules = None if spec.rules is None else load_rules(spec.rules)
        plan = worker_view(
            read_plan_text(spec.plan_json, rules=rules),
            global_rank=spec.global_rank,
            local_rank=spec.local_rank,
            main_port=spec.main_port,
            started_by=spec.variables.get(LAUNCHED_VARIABLE, ""),
        )
        with join(plan):
            value = fn(*args, **kwargs)
        return _Outcome("ok", value)
    except BaseException as error:  # the worker reports everything, KeyboardInterrupt included
        return _Outcome("error", None, traceback.format_exc(), _is_port_clash(error))


def _send(connection: Connection, outcome: _Outcome) -> None:
    try:
        connection.send(outcome)
    except Exception:  # the result could not be pickled: report that instead
        connection.send(_Outcome("error", None, "The return value could not be sent back:\n" + traceback.format_exc()))


_SAFE_PATH_ADDED = "TRAINPLAN_SAFE_PATH_ADDED"


def _multiprocessing_entry(
    spec: WorkerSpec,
    fn: Callable[..., object],
    args: Sequence[object],
    kwargs: Mapping[str, Any],
    connection: Connection,
    forked: bool,
    environment: Mapping[str, str] | None = None,
    parent: int | None = None,
) -> None:
    # A worker the caller started itself (forked or spawned; not one a forkserver forked) dies with the caller.
    if parent is not None:
        die_with_parent(parent)
    # A forked worker inherits the caller's handlers (the launcher's own SIGTERM handler among them), and copies of
    # the launcher's lifelines, which only the launcher may hold open.
    if forked:
        close_inherited_lifelines()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    if environment is not None:
        # Forked from the forkserver: take the caller's environment of now (the worker's variables included),
        # not the one the server started with.
        os.environ.clear()
        os.environ.update(environment)
    elif os.environ.pop(_SAFE_PATH_ADDED, None) is not None:
        os.environ.pop("PYTHONSAFEPATH", None)  # only the bootstrap needed it; the worker's own children do not
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if environment is not None and torch is not None and threads.isdigit() and int(threads) > 0:
        # The server imported torch with its own environment: take the caller's OMP_NUM_THREADS of now, as a
        # spawned interpreter would have at its import of torch.
        torch.set_num_threads(int(threads))
    if forked and torch is not None:
        # The caller's OpenMP thread pool does not survive fork: a parallel region in the child (any large
        # tensor operation) would wait forever for threads that are not there. One intra-op thread per worker,
        # torchrun's OMP_NUM_THREADS=1 default for several workers per node.
        torch.set_num_threads(1)
    _own_process_group()
    _send(connection, run_worker(spec, fn, args, kwargs))
    connection.close()


def _own_process_group() -> None:
    # Each worker leads its own process group, so stopping it also stops anything it started.
    if hasattr(os, "setpgid"):
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)


# --------------------------------------------------------------------------------------------------
# Starting workers


class Stoppable(Protocol):
    """A started process the launcher can stop."""

    @property
    def pid(self) -> int:
        """The process id (each worker leads its own process group)."""

    def exitcode(self) -> int | None:
        """The exit code once it has exited (negative: killed by that signal), None while it runs."""

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for it to exit."""


class WorkerHandle(Stoppable, Protocol):
    """A started worker as the supervisor sees it: a process, and the pipe it reports through."""

    local_rank: int
    connection: Connection


@attrs.define
class _ProcessWorker:
    local_rank: int
    connection: Connection
    process: multiprocessing.process.BaseProcess

    @property
    def pid(self) -> int:
        return self.process.pid or 0

    def exitcode(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float) -> None:
        self.process.join(timeout)


@attrs.define
class _ScriptWorker:
    """A process started with Popen (a `trainplan launch` script reports through its exit code alone)."""

    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    def exitcode(self) -> int | None:
        return self.process.poll()

    def wait(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)


@attrs.define
class _PopenWorker(_ScriptWorker):
    """A 'subprocess' launcher worker: a Popen process and the pipe it reports through."""

    local_rank: int = attrs.field(kw_only=True)
    connection: Connection = attrs.field(kw_only=True)


def _function_reference(fn: Callable[..., object], *, interactive: bool) -> tuple[str, str, str | None]:
    """(module, qualname, script path) by which a fresh interpreter finds `fn`, or `NotImportable`."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise NotImportable(f"{fn!r} has no module and name a fresh interpreter could import it by. {_IMPORTABLE_FIX}")
    if "<lambda>" in qualname or "<locals>" in qualname:
        kind = "a lambda" if "<lambda>" in qualname else "defined inside another function"
        raise NotImportable(
            f"{module}.{qualname} is {kind}, so the fresh interpreters of the 'subprocess' launcher cannot "
            f"import it. {_IMPORTABLE_FIX}"
        )
    script: str | None = None
    if module == "__main__":
        main = sys.modules.get("__main__")
        script = getattr(main, "__file__", None)
        if interactive or script is None:
            raise NotImportable(
                f"{qualname} is defined in the __main__ of an interactive session, which a fresh interpreter "
                f"cannot import. {_IMPORTABLE_FIX}"
            )
        script = os.path.abspath(script)
    return module, qualname, script


_IMPORTABLE_FIX = (
    "Define it at the top level of a module (or of the script you run), or use strategy='ddp_notebook' "
    "(fork), which needs no import"
)


@contextlib.contextmanager
def _temporary_environment(variables: Mapping[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _forkserver_context(*, fresh: bool = False, lifeline: Lifeline | None = None) -> Any:
    """multiprocessing's forkserver context, its server running with torch imported (`FORKSERVER_PRELOAD`).

    The server is a fresh interpreter (nothing of the caller's state, CUDA's above all), started once per
    caller and reused by every later launch; PYTHONSAFEPATH keeps its `python -c` bootstrap from importing
    modules out of the working directory. Preloads the caller asked for itself are kept. `fresh`: a server
    running already is stopped first, so that the new one starts with the caller's environment of now (what
    `trainplan launch`'s workers inherit: the engine sets only each rank's own variables over it).

    `lifeline`: the launch's. The server is started with its mark and told to it (it goes if the caller is killed,
    even while it starts), and so is multiprocessing's directory for the server's socket, before it is made. The
    resource tracker is started first, without the mark: it must outlive the workers to remove what they leaked,
    and ends by itself once they are gone.
    """
    from multiprocessing import forkserver

    marked: Mapping[str, str] = {}
    if lifeline is not None:
        _prepare_multiprocessing(lifeline)
        marked = lifeline.variables

    if fresh:
        server: Any = getattr(forkserver, "_forkserver", None)
        if server is not None and getattr(server, "_forkserver_pid", None) is not None:
            server._stop()
    context: Any = multiprocessing.get_context("forkserver")
    asked = list(getattr(getattr(forkserver, "_forkserver", None), "_preload_modules", None) or [])
    hold, *ours = FORKSERVER_PRELOAD  # the first holds Ctrl-C off the server's imports, the caller's included
    context.set_forkserver_preload([hold, *(name for name in asked if name not in FORKSERVER_PRELOAD), *ours])
    with _temporary_environment({"PYTHONSAFEPATH": "1", **marked}):
        forkserver.ensure_running()
    if lifeline is not None:
        for helper in _multiprocessing_helpers():
            lifeline.watch(helper)
    return context


def _prepare_multiprocessing(lifeline: Lifeline) -> None:
    """Before multiprocessing starts a helper for a launch: its resource tracker running (unmarked: see
    `_forkserver_context`) and its temporary directory told to the launch's watcher before it is made."""
    from multiprocessing import resource_tracker, util

    with _temporary_environment({"PYTHONSAFEPATH": "1"}):  # its `python -c` would import from the cwd first
        resource_tracker.ensure_running()
    config: Any = getattr(multiprocessing.current_process(), "_config", None)
    if not isinstance(config, dict):
        return
    if config.get("tempdir") is None:
        directory = lifeline.temporary_directory("pymp-")
        # As multiprocessing's own get_temp_dir does: removed when this process exits.
        util.Finalize(None, shutil.rmtree, args=(directory,), kwargs={"ignore_errors": True}, exitpriority=-100)
        config["tempdir"] = directory
    else:
        lifeline.remove(config["tempdir"])


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP until the block ends, then deliver the first one received.

    Starting a worker is not atomic: a forkserver forks it, then sends its pid back (the first time, only once
    the server has imported torch: about a second). Interrupted in between, the caller would never learn the
    pid of a worker that runs: held until the pid is known, the interrupt then stops it with its siblings.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    watched = [number for number in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if number]
    previous = {number: signal.signal(number, lambda caught, frame: received.append(caught)) for number in watched}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if received:
            signal.raise_signal(received[0])  # now, under the caller's own handler


def _start_multiprocessing(
    launcher: LauncherRule,
    method: StartMethod,
    specs: Sequence[WorkerSpec],
    fn: Callable[..., object],
    args: Sequence[object],
    kwargs: Mapping[str, Any],
    lifeline: Lifeline,
) -> list[WorkerHandle]:
    """Start the workers of `launcher` with `method`: its own start method, or the one that serves it
    (`worker_start_method`: a forkserver for spawn), whose server forks each worker with the caller's environment.
    Each worker is told to `lifeline` as soon as it has a pid."""
    served = method != launcher.start_method
    context: Any = None
    if served:
        try:
            context = _forkserver_context(lifeline=lifeline)
        except OSError:  # its socket cannot be made (a TMPDIR too deep for AF_UNIX's 108 bytes): unserved, as asked
            if launcher.start_method is None:
                raise
            served, method = False, launcher.start_method
    if context is None:
        context = multiprocessing.get_context(method)
    fresh = not served and not launcher.forks  # a fresh interpreter, started with the worker's environment
    if fresh:
        _prepare_multiprocessing(lifeline)  # spawn starts the resource tracker: before the workers' mark is set
    parent = None if served else os.getpid()  # a forkserver's child has the server for its parent
    workers: list[WorkerHandle] = []
    try:
        for spec in specs:
            receive, send = context.Pipe(duplex=False)
            environment = {**os.environ, **spec.variables} if served else None
            process = context.Process(
                target=_multiprocessing_entry,
                args=(spec, fn, args, kwargs, send, launcher.forks and not served, environment, parent),
                name=f"trainplan-worker-{spec.global_rank}",
                daemon=False,
            )
            try:
                # A spawned interpreter starts with this environment: give it the worker's (its GPUs above all)
                # before it imports anything, as torchrun would; PYTHONSAFEPATH keeps multiprocessing's
                # `python -c` bootstrap from putting the working directory first on sys.path (Python 3.11+).
                spawned: dict[str, str] = {}
                if fresh:
                    spawned = {**spec.variables, "PYTHONSAFEPATH": "1"}
                    if "PYTHONSAFEPATH" not in os.environ:
                        spawned[_SAFE_PATH_ADDED] = "1"  # the worker takes it out of its own environment again
                with _temporary_environment(spawned), interrupts_deferred():
                    process.start()
                    lifeline.watch(process.pid)
            except BaseException as error:
                if process.pid is not None:  # started, then interrupted while being fed: stop it too
                    workers.append(_ProcessWorker(spec.local_rank, receive, process))
                if not isinstance(error, Exception) or isinstance(error, NotImportable):
                    raise
                receive.close()
                send.close()
                raise NotImportable(
                    f"The {launcher.name} launcher could not send {getattr(fn, '__qualname__', fn)!r} or its arguments "
                    f"to a new interpreter ({type(error).__name__}: {error}). {_IMPORTABLE_FIX}"
                ) from None
            send.close()  # the worker holds the only writing end: its death closes the pipe
            workers.append(_ProcessWorker(spec.local_rank, receive, process))
    except BaseException:
        _stop(workers, grace=DEFAULT_GRACE_PERIOD)
        raise
    return workers


_WORKER_BOOTSTRAP = (
    # `python -m` or `-c` puts the working directory first on sys.path, so a module file there (attrs.py in a
    # shared directory) would shadow installed packages in every worker: drop that entry before importing.
    "import sys\nif sys.path and sys.path[0] in ('', '.'): del sys.path[0]\n"
    "from trainplan.effects._worker import main\nmain()"
)


def _is_open(descriptor: int) -> bool:
    try:
        os.fstat(descriptor)
    except OSError:
        return False
    return True


def _pipe_above_standard_streams() -> tuple[int, int]:
    """A pipe whose ends are not 0, 1 or 2 (with the caller's stdout closed, `os.pipe` would hand out 1, and the
    worker's prints would land in its result)."""
    ends = []
    for end in os.pipe():
        if end > 2:
            ends.append(end)
            continue
        moved = fcntl.fcntl(end, fcntl.F_DUPFD_CLOEXEC, 3)
        os.close(end)
        ends.append(moved)
    return ends[0], ends[1]


def _start_subprocesses(
    specs: Sequence[WorkerSpec],
    fn: Callable[..., object],
    args: Sequence[object],
    kwargs: Mapping[str, Any],
    *,
    interactive: bool,
    lifeline: Lifeline,
) -> list[WorkerHandle]:
    module, qualname, script = _function_reference(fn, interactive=interactive)
    workers: list[WorkerHandle] = []
    try:
        for spec in specs:
            try:
                body = pickle.dumps((spec, module, qualname, script, tuple(args), dict(kwargs)))
            except Exception as error:  # PicklingError, TypeError, a __reduce__ that raises, a graph too deep
                raise NotImportable(
                    f"The subprocess launcher could not send the arguments of {qualname!r} to a new interpreter "
                    f"({error}). Pass picklable arguments (numbers, strings, plain data), or build the object inside "
                    "the worker"
                ) from None
            # The caller's own sys.path travels first, so the worker imports exactly as the caller does.
            payload = pickle.dumps((list(sys.path), body))
            read_end, write_end = _pipe_above_standard_streams()
            process = subprocess.Popen(
                # The bootstrap's arguments: this process's pid (the worker dies with it), the result's pipe.
                [sys.executable, "-c", _WORKER_BOOTSTRAP, str(os.getpid()), str(write_end)],
                env={**os.environ, **spec.variables},
                stdin=subprocess.PIPE,
                stdout=None if _is_open(1) else subprocess.DEVNULL,  # a closed stdout: the worker's output is dropped
                stderr=None if _is_open(2) else subprocess.DEVNULL,
                pass_fds=(write_end,),
                start_new_session=True,
            )
            os.close(write_end)
            lifeline.watch(process.pid)
            # Tracked before it is fed its (possibly large) arguments, so an interruption meanwhile stops it too.
            workers.append(_PopenWorker(process, local_rank=spec.local_rank, connection=Connection(read_end)))
            assert process.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                process.stdin.write(payload)
                process.stdin.close()
    except BaseException:
        _stop(workers, grace=DEFAULT_GRACE_PERIOD)
        raise
    return workers


# --------------------------------------------------------------------------------------------------
# Supervising


def _signal_worker(worker: Stoppable, signal_number: int) -> None:
    """Signal the worker's whole process group: the worker and anything it started, even after the worker
    itself has exited (its children keep the group alive)."""
    if hasattr(os, "killpg"):
        try:
            os.killpg(worker.pid, signal_number)
            return
        except (ProcessLookupError, PermissionError):
            pass  # no such group (yet): the worker may not have made its own group; signal it alone
    if worker.exitcode() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(worker.pid, signal_number)


def _group_alive(worker: Stoppable) -> bool:
    """Whether the worker or any process in its group is still running."""
    if worker.exitcode() is None:
        return True
    if not hasattr(os, "killpg"):
        return False
    try:
        os.killpg(worker.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


_STOP_POLL = 0.05


def _stop(workers: Sequence[Stoppable], *, grace: float, hurry: threading.Event | None = None) -> None:
    """Terminate every worker's process group, wait up to `grace` seconds, kill what is left, reap all.

    Runs to the end whatever happens meanwhile: a second Ctrl-C (or SIGTERM) during the grace period only cuts the
    grace short, so nothing is ever left running. A caller whose own handlers stay in charge passes `hurry`, which
    they set, instead.
    """
    own_handlers = hurry is None
    hurry = hurry or threading.Event()
    previous: dict[int, Any] = {}
    if own_handlers and threading.current_thread() is threading.main_thread():
        for caught in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, OSError):
                previous[caught] = signal.signal(caught, lambda *_: hurry.set())
    try:
        for worker in workers:
            _signal_worker(worker, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while not hurry.is_set() and time.monotonic() < deadline:
            for worker in workers:
                worker.wait(0)  # reap an exited leader, so that its group no longer counts it
            if not any(_group_alive(worker) for worker in workers):
                break
            time.sleep(_STOP_POLL)
        kill: int = getattr(signal, "SIGKILL", signal.SIGTERM)
        for worker in workers:
            if _group_alive(worker):
                _signal_worker(worker, kill)
        for worker in workers:
            worker.wait(10.0)
        # SIGKILL is delivered, not yet acted on: wait (bounded) until every group is empty.
        settle = time.monotonic() + 10.0
        while any(_group_alive(worker) for worker in workers) and time.monotonic() < settle:
            time.sleep(0.01)
    finally:
        for number, handler in previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(number, handler)
        for worker in workers:
            connection = getattr(worker, "connection", None)
            if connection is not None:
                with contextlib.suppress(OSError):
                    connection.close()


def _signal_name(exitcode: int | None) -> str | None:
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _supervise(
    workers: Sequence[WorkerHandle],
    specs: Sequence[WorkerSpec],
    *,
    timeout: float | None,
    grace: float,
    begun: float | None = None,
) -> list[object]:
    by_connection = {id(worker.connection): worker for worker in workers}
    rank_of = {spec.local_rank: spec.global_rank for spec in specs}
    results: dict[int, object] = {}
    pending = list(workers)
    # The deadline counts from the launch's start: starting the workers (spawn feeds each one) is inside it.
    deadline = None if timeout is None else (time.monotonic() if begun is None else begun) + timeout
    failure: LaunchError | None = None
    try:
        while pending and failure is None:
            wait_for = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
            for connection in wait([worker.connection for worker in pending], timeout=wait_for):
                assert isinstance(connection, Connection)
                worker = by_connection[id(connection)]
                pending.remove(worker)
                try:
                    outcome: _Outcome | None = connection.recv()
                except (EOFError, OSError):
                    outcome = None
                except (Exception, SystemExit):  # sent, but not rebuilt here (a class only the worker imported)
                    outcome = _Outcome(
                        "error",
                        None,
                        "The worker's result could not be read back in the caller:\n" + traceback.format_exc(),
                    )
                if outcome is not None and outcome.kind == "ok":
                    results[worker.local_rank] = outcome.value
                    continue
                worker.wait(1.0)
                failure = WorkerFailed(
                    rank=rank_of[worker.local_rank],
                    local_rank=worker.local_rank,
                    exitcode=worker.exitcode(),
                    signal_name=_signal_name(worker.exitcode()),
                    traceback_text="" if outcome is None else outcome.traceback_text,
                    port_clash=outcome is not None and outcome.port_clash,
                )
                break
            if failure is None and deadline is not None and time.monotonic() >= deadline and pending:
                failure = LaunchTimeout(
                    f"The world of {len(specs)} local worker(s) did not finish within {timeout:g} s "
                    f"(still running: local ranks {sorted(worker.local_rank for worker in pending)}); every worker "
                    "was stopped. Raise the timeout, or look for a worker waiting on a collective its siblings "
                    "never reach",
                    timeout=timeout or 0.0,
                )
        if failure is None:
            failure = _await_exits(workers, rank_of, deadline=deadline, timeout=timeout, grace=grace)
    finally:
        _stop(workers, grace=grace)
    if failure is not None:
        raise failure
    return [results[spec.local_rank] for spec in specs]


def _await_exits(
    workers: Sequence[WorkerHandle],
    rank_of: Mapping[int, int],
    *,
    deadline: float | None,
    timeout: float | None,
    grace: float,
) -> LaunchError | None:
    """Every worker sent its result; now each must exit cleanly, within the world's deadline (or, without one,
    within grace + 30 s for all of them together)."""
    limit = time.monotonic() + grace + EXIT_ALLOWANCE
    if deadline is not None:
        limit = min(limit, deadline)
    for worker in workers:  # each wait returns as soon as that worker exits
        worker.wait(max(0.0, limit - time.monotonic()))
    for worker in workers:
        code = worker.exitcode()
        if code is None:
            if deadline is not None and time.monotonic() >= deadline:
                return LaunchTimeout(
                    f"Local rank {worker.local_rank} returned its result but had not exited when the world's "
                    f"{timeout:g} s ran out (a non-daemon thread, or an atexit handler, still running?); every "
                    "worker was stopped",
                    timeout=timeout or 0.0,
                )
            return WorkerFailed(
                rank=rank_of[worker.local_rank],
                local_rank=worker.local_rank,
                exitcode=None,
                signal_name=None,
                traceback_text="",
                how=(
                    f"returned its result but did not exit within {grace + EXIT_ALLOWANCE:g} s (a non-daemon thread, "
                    "or an atexit handler, still running?)"
                ),
            )
        if code != 0:
            return WorkerFailed(
                rank=rank_of[worker.local_rank],
                local_rank=worker.local_rank,
                exitcode=code,
                signal_name=_signal_name(code),
                traceback_text="",
            )
    return None


class _Terminated(BaseException):
    """SIGTERM in the caller, raised where the supervisor waits so that `finally` stops the workers."""


@contextlib.contextmanager
def _sigterm_stops_workers() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signal_number: int, frame: object) -> None:
        raise _Terminated()

    hangup = getattr(signal, "SIGHUP", None)
    previous = signal.signal(signal.SIGTERM, handler)
    previous_hangup = signal.signal(hangup, handler) if hangup is not None else None
    try:
        yield
    except _Terminated:
        raise SystemExit(128 + signal.SIGTERM) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        if hangup is not None:
            signal.signal(hangup, previous_hangup)


# --------------------------------------------------------------------------------------------------
# The entry point


def choose_free_port(address: str) -> int:
    """A TCP port free right now on `address` (the OS picks it); another process may take it before use."""
    host = "127.0.0.1" if address == "localhost" else address.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe_socket:
            probe_socket.bind((host, 0))
            port: int = probe_socket.getsockname()[1]
            return port
    except (OSError, UnicodeError) as error:
        raise LaunchError(
            f"Cannot choose a free port on the main address {address!r} ({error}): it is not an address of this "
            "machine. Run on the main node, or export MASTER_PORT (the same on every node) so no port is chosen"
        ) from None


def launch(plan: Plan, fn: Callable[..., R], *args: object, **kwargs: object) -> list[R]:
    """Run `fn(*args, **kwargs)` on each of the plan's workers on this node; their return values in rank
    order. See the module's documentation for each launcher and for what happens on failure."""
    return launch_with(plan, fn, args=args, kwargs=kwargs)


def launch_with(
    plan: Plan,
    fn: Callable[..., R],
    *,
    args: Sequence[object] = (),
    kwargs: Mapping[str, object] | None = None,
    timeout: float | None = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    choose_port: Callable[[str], int] = choose_free_port,
    interactive: bool | None = None,
) -> list[R]:
    """`launch` with its options: a timeout for the whole world, the grace period, the port chooser."""
    if not isinstance(plan, Plan):
        raise LaunchError(f"launch takes a trainplan.Plan, not {a_kind(plan)}: build one with trainplan.resolve(...)")
    _check_times(timeout, grace_period)
    if not callable(fn):
        raise LaunchError(f"launch runs a function on each worker, and {fn!r} is not callable")
    given_args: object = args
    given_kwargs: object = kwargs
    if not isinstance(given_args, (tuple, list)):
        raise LaunchError(f"args={args!r}: write a tuple of positional arguments, e.g. args=(0.1,)")
    if given_kwargs is not None and not (
        isinstance(given_kwargs, Mapping) and all(isinstance(key, str) for key in given_kwargs)
    ):
        raise LaunchError(f"kwargs={kwargs!r}: write a dict of keyword arguments, e.g. kwargs={{'lr': 0.1}}")
    kwargs = dict(kwargs or {})
    if interactive is None:
        from trainplan.effects.probing import is_interactive

        interactive = is_interactive()
    if started_by_another_launcher(plan):
        raise LaunchError(
            f"The plan's launcher is {plan.launcher!r}: trainplan does not start XLA workers itself yet. Start them "
            "with torch_xla (torch_xla.launch(fn) or xmp.spawn(fn)), and inside each call trainplan.resolve()"
        )
    launcher = launcher_rule(plan)
    if not launcher.starts_processes:  # this process is the world's (one process), or joins a started world
        return [_run_here(plan, fn, args, kwargs, choose_port)]
    require_torch(f"trainplan.launch (starting {plan.processes_per_node} workers that join one process group)")
    _check_startable(plan)
    attempts = PORT_ATTEMPTS if plan.cluster.main_port is None else 1
    for attempt in range(attempts):
        port = plan.cluster.main_port or choose_port(plan.cluster.main_address)
        begun = time.monotonic()
        try:
            # The lifeline kills the workers (and their descendants) if this process is killed outright.
            with _sigterm_stops_workers(), Lifeline() as lifeline:
                specs = _specs(plan, port=port, launcher=plan.launcher, extra=lifeline.variables)
                method = worker_start_method(plan, multiprocessing.get_all_start_methods())
                if method is None:  # no multiprocessing method: the script runs again in fresh interpreters
                    workers = _start_subprocesses(specs, fn, args, kwargs, interactive=interactive, lifeline=lifeline)
                else:
                    workers = _start_multiprocessing(launcher, method, specs, fn, args, kwargs, lifeline)
                for helper in _multiprocessing_helpers():
                    lifeline.watch(helper)
                lifeline.remove(_multiprocessing_directory())
                _keep_between_launches(_multiprocessing_helpers(), _multiprocessing_directory())
                return _supervise(  # type: ignore[return-value]
                    workers, specs, timeout=timeout, grace=grace_period, begun=begun
                )
        except WorkerFailed as failure:
            if failure.port_clash and attempt + 1 < attempts:
                continue  # another process took the port between choosing and binding it: choose again
            raise
    raise LaunchError("unreachable: every attempt either returned or raised")  # pragma: no cover


def _check_times(timeout: object, grace_period: object) -> None:
    """A timeout is a finite number of seconds > 0 (or None); a grace period a finite number ≥ 0."""
    if timeout is not None and not _finite_number(timeout, minimum_exclusive=0.0):
        raise LaunchError(f"timeout={timeout!r}: write a finite, positive number of seconds, or None for no limit")
    if not _finite_number(grace_period, minimum_inclusive=0.0):
        raise LaunchError(
            f"grace_period={grace_period!r}: write a finite number of seconds ≥ 0 (the wait between terminate and kill)"
        )


def _finite_number(
    value: object, *, minimum_exclusive: float | None = None, minimum_inclusive: float | None = None
) -> bool:
    number = real_number(value)
    if number is None:
        return False
    if minimum_exclusive is not None and not number > minimum_exclusive:
        return False
    return not (minimum_inclusive is not None and number < minimum_inclusive)


def _check_startable(plan: Plan) -> None:
    """Refuse to start workers from a process that is itself a rank of a started job, or that cannot meet."""
    nested = nested_launch(plan, process_variables())
    if nested is not None:
        raise NestedLaunch(str(nested))
    problem = unlaunchable(plan)
    if problem is not None:
        raise LaunchError(str(problem))


def _multiprocessing_helpers() -> list[int]:
    """The forkserver multiprocessing keeps for this process, if it started one: it has no business outliving this
    process either. (The resource tracker is left alone: it ends by itself once the workers are gone, after
    removing what they leaked.)"""
    server = getattr(sys.modules.get("multiprocessing.forkserver"), "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    return [pid] if isinstance(pid, int) and pid > 0 else []


_KEEPER: list[Lifeline] = []
"""The watcher of what a launch leaves for the next one in this process (`_keep_between_launches`), once started."""


def _keep_between_launches(helpers: list[int], directory: str | None) -> None:
    """A spawn launch keeps its forkserver for the next launch, and with it multiprocessing's directory of the
    server's socket: both are told to a watcher of this process's whole life (released at its exit, when
    multiprocessing removes them itself), so that a kill -9 between two launches leaves nothing either; so is the
    directory alone where spawn started its workers unserved (a TMPDIR too long for the server's socket). Nothing is
    started where a launch keeps neither."""
    if not helpers and directory is None:
        return
    if not _KEEPER:
        _KEEPER.append(Lifeline())
        atexit.register(_KEEPER[0].release)  # before multiprocessing's own exit function, which runs later
    for pid in helpers:
        _KEEPER[0].watch(pid)
    _KEEPER[0].remove(directory)


# A forked child has its own life: its copy of the keeper's pipe is closed (`close_inherited_lifelines`), and a
# launch it makes starts a keeper of its own.
os.register_at_fork(after_in_child=_KEEPER.clear)


def _multiprocessing_directory() -> str | None:
    """The temporary directory multiprocessing made for this process (the forkserver's socket), if any: this process
    removes it at its exit, and the lifeline if it is killed."""
    config: object = getattr(multiprocessing.current_process(), "_config", {})
    directory = config.get("tempdir") if isinstance(config, dict) else None
    return directory if isinstance(directory, str) else None


def _specs(plan: Plan, *, port: int, launcher: str, extra: Mapping[str, str] | None = None) -> list[WorkerSpec]:
    """One spec per local rank; on CUDA the node's selected GPUs are made visible (torchrun's convention); `extra`
    variables join each worker's environment (the lifeline's mark)."""
    text = json.dumps(plan.to_dict())  # once, for every worker
    # A downstream rule set this process has loaded goes to the workers by name, with the launch itself.
    rules = None if plan.rules is None or plan.rules == UNNAMED_RULES else loaded_rules(plan.rules).reference
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = max(plan.devices, default=0) + 1
    specs = []
    for local_rank in range(plan.processes_per_node):
        variables = worker_environment(
            plan,
            local_rank=local_rank,
            main_port=port,
            visible_devices=visible,
            visible_count=count,
            launcher=launcher,
            plan_json=text,
        )
        variables.update(extra or {})
        specs.append(
            WorkerSpec(
                global_rank=global_rank_of(plan, local_rank),
                local_rank=local_rank,
                main_port=port,
                plan_json=text,
                variables=variables,
                rules=rules,
            )
        )
    return specs


def _run_here(
    plan: Plan,
    fn: Callable[..., R],
    args: Sequence[object],
    kwargs: Mapping[str, Any],
    choose_port: Callable[[str], int] = choose_free_port,
) -> R:
    """Run `fn` in this process, inside the plan's world (joined through `join`, as every worker does)."""
    cluster = plan.cluster
    variables: dict[str, str] = {}
    if not launcher_rule(plan).joins:  # the world is this one process
        port = cluster.main_port or choose_port(cluster.main_address)
        variables = torchrun_variables(plan, rank=0, local_rank=0, port=port)
    elif cluster.global_rank is not None and cluster.local_rank is not None and cluster.main_port is not None:
        variables = torchrun_variables(
            plan, rank=cluster.global_rank, local_rank=cluster.local_rank, port=cluster.main_port
        )  # otherwise join refuses the plan, with the reason
    with _temporary_environment(variables), join(plan):
        return fn(*args, **kwargs)


def worker_plan(environ: Mapping[str, str] | None = None) -> Plan | None:
    """Inside a worker trainplan launched: the launcher's plan seen from this worker (launcher 'external',
    this worker's ranks and port, its GPUs as CUDA_VISIBLE_DEVICES shows them); None elsewhere."""
    environ = os.environ if environ is None else environ
    text = environ.get(PLAN_VARIABLE)
    if text is None or not launched_by_trainplan(environ):
        return None
    # The rule set `trainplan launch --rules` handed this worker, or (a plan of `tp.launch`'s, or a plan read
    # again) the one this process has loaded: a plan's reference is never imported.
    plan = read_plan_text(text, rules=handed_rules(environ), named_by=f"the launcher's plan ({PLAN_VARIABLE})")
    try:
        rank, local_rank = int(environ["RANK"]), int(environ["LOCAL_RANK"])
        port, world = int(environ["MASTER_PORT"]), int(environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    if world != plan.world_size:
        # The launchers of the nodes met in one rendezvous, and their plans differ (`--devices` per node).
        raise heterogeneous_nodes(plan, world, environ.get("LOCAL_WORLD_SIZE"), environ[LAUNCHED_VARIABLE])
    return worker_view(
        plan, global_rank=rank, local_rank=local_rank, main_port=port, started_by=environ[LAUNCHED_VARIABLE]
    )
