"""Real jobs for the cluster suite: started, waited for (every wait bounded), read back, and accounted for.

A `Job` is one scenario's run: a folder of its own (the probe's records, each command's output, SLURM's batch
output), a marker variable (`TRAINPLAN_CLUSTER_MARK`) in the environment of everything it starts, and a SLURM
comment of the same value. The marker finds every process the job left, whoever started it (srun's tasks, an
orted's ranks, a torchrun agent's workers): `Job.finish` waits (bounded) until none carries it, and reports and
kills the ones that stay. The comment finds the job's SLURM jobs to cancel when a wait runs out.

The `Pool` runs the selected scenarios concurrently (a few at a time; scenarios that share a resource, such as
MPICH's default port, take a lock), in the order the tests read them, so the suite's wall time is shorter than
the sum of its scenarios.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ROOT / "tests" / "cluster" / "engines.sh"
PROBE = "tests/cluster/probe.py"
"""The probe, relative to the repository root (every job runs there)."""
PYTHON = sys.executable
BIN = Path(sys.executable).parent
TRAINPLAN = str(BIN / "trainplan")
MARK_VARIABLE = "TRAINPLAN_CLUSTER_MARK"
MARKER = "@@trainplan-probe "

OPEN_MPI = [
    "mpirun.openmpi",
    "--allow-run-as-root",
    "--oversubscribe",
    *("--mca", "btl", "self,tcp"),
    *("--mca", "btl_tcp_if_include", "lo"),
    *("--mca", "oob_tcp_if_include", "lo"),
]
MPICH = ["mpiexec.hydra", "-iface", "lo"]

ENGINE_COMMANDS = (
    "srun",
    "sbatch",
    "salloc",
    "scancel",
    "scontrol",
    "squeue",
    "sinfo",
    "slurmctld",
    "slurmd",
    "munged",
    "mpirun.openmpi",
    "mpiexec.hydra",
)

# What the suite's own environment must not hand its jobs: a launcher's variables from the shell that runs pytest.
_CLEARED_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "OMPI_", "PMI_", "PMIX_", "TRAINPLAN_", "PROBE_", "PET_")
_CLEARED = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
        "KUBERNETES_PORT",
        "LSB_JOBID",
    }
)
_TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
)
JOIN_TIMEOUT = 30
"""Seconds a probe waits in `trainplan.join` for its peers (a world that cannot form fails this fast)."""
LAYOUT_FAILURE = "Unable to layout tasks on given cpus"
"""srun's words when task/affinity cannot place a step on the CPUs it was given (tests/cluster/engines.sh: a node
declares more CPUs than this host has); nothing of the step ran, and the scenario is started again."""
ATTEMPTS = 4
SLURM_POLL = 0.5
"""Seconds between two `scontrol show job` of a batch job being waited for (each is a process and a slurmctld call:
a batch scenario runs for 20-50 s, and a dozen of them run beside the CPU-bound probes)."""
SLURM_TIME_LIMIT = "5"
"""Minutes: SLURM's own bound on every job the suite submits, should the suite's cleanup fail."""


def missing_engines() -> list[str]:
    """The commands of the real engines this machine lacks (empty: SLURM, Open MPI and MPICH are installed)."""
    return [name for name in ENGINE_COMMANDS if shutil.which(name) is None]


def free_port() -> int:
    """A port free on loopback now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def machine_lock(name: str, timeout: float = 240.0) -> Iterator[None]:
    """A lock held across processes on this machine (another run of the suite takes the same one)."""
    path = Path("/tmp") / f"trainplan-cluster-{name}.lock"
    with path.open("a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} stayed locked for {timeout:g} s") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def marked_processes(mark: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment carries MARK_VARIABLE=mark (zombies have none)."""
    needle = f"{MARK_VARIABLE}={mark}".encode()
    found: list[tuple[int, str]] = []
    own = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == own:
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            if needle not in environ.split(b"\0"):
                continue
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found.append((int(entry), command.strip()))
    return found


def _signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def slurm_jobs_with_comment(comment: str) -> list[tuple[str, str]]:
    """(job id, state) of the SLURM jobs still known to squeue whose comment is `comment`."""
    try:
        listed = subprocess.run(
            ["squeue", "-h", "-o", "%i|%T|%k"], capture_output=True, text=True, timeout=20, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    jobs = []
    for line in listed.splitlines():
        job_id, _, rest = line.partition("|")
        state, _, job_comment = rest.partition("|")
        if job_comment.strip() == comment:
            jobs.append((job_id.strip(), state.strip()))
    return jobs


def slurm_job(job_id: str) -> dict[str, str] | None:
    """`scontrol show job` as a mapping (JobState, ExitCode, ...), or None once SLURM has forgotten the job."""
    try:
        shown = subprocess.run(
            ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=20, check=False
        )
    except subprocess.TimeoutExpired:
        return {}
    if shown.returncode != 0:
        return None
    return dict(re.findall(r"(\w+)=(\S*)", shown.stdout))


@dataclass
class Run:
    """What one scenario's job did."""

    name: str
    mark: str
    folder: Path
    seconds: float
    returncodes: list[int | None]
    """One per command the scenario started, in order; None: it was killed when its wait ran out."""
    outputs: list[str]
    """Each command's stdout and stderr together."""
    records: list[dict[str, Any]]
    """The probe's records, from the files its processes wrote."""
    leftovers: list[str]
    """Processes still carrying the job's marker when the (bounded) wait for them ended; killed since."""
    stale_jobs: list[str]
    """SLURM jobs of this scenario still queued or running after it ended; cancelled since."""
    timed_out: bool
    slurm: dict[str, dict[str, str]] = field(default_factory=dict)
    """`scontrol show job` of the batch jobs it waited for, by job id (JobState, ExitCode, ...)."""
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def returncode(self) -> int | None:
        return self.returncodes[0] if self.returncodes else None

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [record for record in self.records if record["kind"] == kind]

    def describe(self, limit: int = 2500) -> str:
        """The run in words, for an assertion's message: return codes, records in short, the output's tail."""
        lines = [
            f"scenario {self.name}: returncodes {self.returncodes}, {self.seconds:.1f} s, timed out {self.timed_out}"
        ]
        for job_id, facts in self.slurm.items():
            lines.append(f"  SLURM job {job_id}: {facts.get('JobState')} ExitCode={facts.get('ExitCode')}")
        if self.leftovers:
            lines.append(f"  left behind: {self.leftovers}")
        for record in self.records:
            short = {
                key: record.get(key)
                for key in (
                    "kind",
                    "type",
                    "rule",
                    "variable",
                    "cluster",
                    "launcher",
                    "world_size",
                    "global_rank",
                    "local_rank",
                    "node_rank",
                    "main_address",
                    "main_port",
                    "stage",
                    "exact",
                    "environment",
                    "error",
                )
                if record.get(key) is not None
            }
            if "message" in record:
                short["message"] = str(record["message"])[:400]
            if "truth" in record:
                truth = record["truth"]
                short["truth"] = {key: truth.get(key) for key in ("launcher", "world_size", "global_rank", "node_rank")}
            lines.append(f"  {json.dumps(short, default=str)}")
        for index, output in enumerate(self.outputs):
            tail = "\n".join(line for line in output.splitlines() if not line.startswith(MARKER))[-limit:]
            if tail.strip():
                lines.append(f"  --- output of command {index} (tail) ---\n{tail}")
        return "\n".join(lines)


class Job:
    """One scenario's run: its folder, its marker, the commands it started. See the module docs."""

    def __init__(self, name: str, base: Path) -> None:
        self.name = name
        self.mark = f"{name}-{uuid.uuid4().hex[:10]}"
        self.folder = base / name
        self.records_folder = self.folder / "records"
        self.records_folder.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self._processes: list[subprocess.Popen[bytes]] = []
        self._outputs: list[Path] = []
        self._returncodes: dict[int, int | None] = {}
        self._timed_out = False
        self.finished = False
        """Whether `finish` ran (it stops whatever the job left); a job that never got there is aborted."""
        self.slurm: dict[str, dict[str, str]] = {}
        self.notes: dict[str, Any] = {}

    # -- starting ------------------------------------------------------------------------------------------------

    @property
    def comment(self) -> str:
        """The SLURM comment every job of this scenario carries (`--comment=`): how a stuck one is found."""
        return f"--comment={self.mark}"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of the scenario's commands: this one without launcher variables, the venv first on PATH
        (as after `source .venv/bin/activate`), the marker, the probe's output folder, and `extra`."""
        environment = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(_CLEARED_PREFIXES) and key not in _CLEARED
        }
        environment["PATH"] = f"{BIN}{os.pathsep}{environment.get('PATH', '/usr/bin:/bin')}"
        environment["SHELL"] = "/bin/bash"
        environment[MARK_VARIABLE] = self.mark
        environment["PROBE_OUT"] = str(self.records_folder)
        environment["PROBE_TIMEOUT"] = str(JOIN_TIMEOUT)
        environment.update(extra)
        return environment

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: str | None = None) -> int:
        """Start a command (in its own session, output to a file of the job's folder); its index."""
        index = len(self._processes)
        output = self.folder / f"command-{index}.out"
        self._outputs.append(output)
        (self.folder / f"command-{index}.argv").write_text(json.dumps(list(argv)))
        with output.open("wb") as sink:
            process = subprocess.Popen(
                list(argv),
                cwd=ROOT,
                env=dict(self.env() if env is None else env),
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if stdin is not None:
            pipe: IO[bytes] | None = process.stdin
            assert pipe is not None
            pipe.write(stdin.encode())
            pipe.close()
        self._processes.append(process)
        return index

    # -- waiting -------------------------------------------------------------------------------------------------

    def wait(self, timeout: float, indices: Sequence[int] | None = None) -> bool:
        """Wait for the commands (all, or `indices`) to end, `timeout` s in all; False (and everything this job
        started stopped) when the time runs out."""
        deadline = time.monotonic() + timeout
        chosen = range(len(self._processes)) if indices is None else indices
        for index in chosen:
            process = self._processes[index]
            try:
                self._returncodes[index] = process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._timed_out = True
                self.abort()
                return False
        return True

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float) -> bool:
        """Poll the records until `predicate(records)` holds (True) or `timeout` s pass (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self.records()):
                return True
            if self._processes and all(process.poll() is not None for process in self._processes):
                return predicate(self.records())
            time.sleep(0.2)
        return False

    def submit(self, arguments: Sequence[str], *, env: Mapping[str, str] | None = None) -> str:
        """`sbatch --parsable` with the job's comment, a time limit and the batch output in the job's folder; the
        SLURM job id."""
        command = [
            "sbatch",
            "--parsable",
            self.comment,
            f"--time={SLURM_TIME_LIMIT}",
            f"--output={self.folder}/slurm-%j.out",
            *arguments,
        ]
        environment = dict(self.env() if env is None else env)
        done = subprocess.run(
            command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=30, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}")
        job_id = done.stdout.strip().split(";")[0]
        self.slurm[job_id] = {}
        return job_id

    def wait_slurm(self, job_id: str, timeout: float) -> dict[str, str]:
        """Poll `scontrol show job` until the job ends (its last facts) or `timeout` s pass (the job is then
        cancelled and its facts say so)."""
        deadline = time.monotonic() + timeout
        facts: dict[str, str] = {}
        while True:
            shown = slurm_job(job_id)
            if shown is None:
                facts.setdefault("JobState", "FORGOTTEN")
                break
            if shown:
                facts = shown
                state = shown.get("JobState", "")
                if state in _TERMINAL_STATES:
                    break
            if time.monotonic() > deadline:
                self._timed_out = True
                facts["JobState"] = f"{facts.get('JobState')} (still, after {timeout:g} s: cancelled)"
                self.abort()
                break
            time.sleep(SLURM_POLL)
        self.slurm[job_id] = facts
        return facts

    def batch_output(self, job_id: str) -> str:
        path = self.folder / f"slurm-{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def cancel(self, job_id: str, *signal_name: str) -> None:
        arguments = [f"--signal={signal_name[0]}"] if signal_name else []
        subprocess.run(["scancel", *arguments, job_id], capture_output=True, timeout=20, check=False)

    # -- reading and ending --------------------------------------------------------------------------------------

    def records(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for path in sorted(self.records_folder.glob("*.jsonl")):
            for line in path.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    found.append(json.loads(line))
        return found

    def abort(self) -> None:
        """Stop everything this job started: its SLURM jobs, its commands' sessions, every marked process."""
        for job_id, _ in slurm_jobs_with_comment(self.mark):
            self.cancel(job_id)
        for process in self._processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGTERM)
        _signal_all([pid for pid, _ in marked_processes(self.mark)], signal.SIGTERM)
        time.sleep(1.0)
        for process in self._processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
        _signal_all([pid for pid, _ in marked_processes(self.mark)], signal.SIGKILL)
        for index, process in enumerate(self._processes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
            if index not in self._returncodes:
                self._returncodes[index] = None

    def finish(self, *, settle: float = 15.0) -> Run:
        """The run: records, outputs, and whatever it left (waited for up to `settle` s, then killed)."""
        for index in range(len(self._processes)):
            if index not in self._returncodes:
                self.wait(60.0, [index])
        deadline = time.monotonic() + settle
        leftovers = marked_processes(self.mark)
        stale = slurm_jobs_with_comment(self.mark)
        while (leftovers or stale) and time.monotonic() < deadline:
            time.sleep(0.25)
            leftovers = marked_processes(self.mark)
            stale = slurm_jobs_with_comment(self.mark)
        if leftovers or stale:
            for job_id, _ in stale:
                self.cancel(job_id)
            _signal_all([pid for pid, _ in leftovers], signal.SIGKILL)
        self.finished = True
        return Run(
            name=self.name,
            mark=self.mark,
            folder=self.folder,
            seconds=time.monotonic() - self.started,
            returncodes=[self._returncodes.get(index) for index in range(len(self._processes))],
            outputs=[path.read_text(errors="replace") for path in self._outputs]
            + [self.batch_output(job_id) for job_id in self.slurm],
            records=self.records(),
            leftovers=[f"{pid}: {command}" for pid, command in leftovers],
            stale_jobs=[f"{job_id} ({state})" for job_id, state in stale],
            timed_out=self._timed_out,
            slurm=dict(self.slurm),
            notes=dict(self.notes),
        )


def run_command(
    job: Job,
    argv: Sequence[str],
    *,
    timeout: float = 150.0,
    stdin: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> Run:
    """One command (its environment: the job's and `extra`), waited for (bounded), then the run."""
    job.spawn(argv, env=job.env(**(extra or {})), stdin=stdin)
    job.wait(timeout)
    return job.finish()


def run_batch(
    job: Job, arguments: Sequence[str], *, timeout: float = 150.0, extra: Mapping[str, str] | None = None
) -> Run:
    """One sbatch job (its environment: the job's and `extra`), waited for (bounded: polled through scontrol),
    then the run."""
    job_id = job.submit(arguments, env=job.env(**(extra or {})))
    job.wait_slurm(job_id, timeout)
    return job.finish()


# -- the pool ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Job], Run]
    locks: tuple[str, ...] = ()
    """Machine-wide locks it holds while it runs (e.g. MPICH's default port)."""
    groups: tuple[str, ...] = ()
    """The groups it counts in: at most GROUP_LIMITS[group] scenarios of a group run at once."""


SCENARIOS: dict[str, Scenario] = {}


GROUP_LIMITS = {
    "heavy": 1,
    "slurm": int(os.environ.get("TRAINPLAN_CLUSTER_SLURM_AT_ONCE", "2")),
}
"""heavy: many torch processes at once (the CPUs are the limit). slurm: jobs of the SLURM cluster at once; each more
one lands on CPUs the host may lack (LAYOUT_FAILURE), and other users' jobs share the cluster."""


def scenario(
    name: str, *, locks: tuple[str, ...] = (), heavy: bool = False, slurm: bool = True
) -> Callable[[Callable[[Job], Run]], Callable[[Job], Run]]:
    """Register a scenario (the tests read its run through the `scenarios` fixture). `slurm`: it submits SLURM
    jobs; `heavy`: it starts many torch processes; `locks`: machine-wide locks it holds (`machine_lock`)."""

    def register(function: Callable[[Job], Run]) -> Callable[[Job], Run]:
        if name in SCENARIOS:
            raise ValueError(f"scenario {name!r} registered twice")
        groups = (*(("heavy",) if heavy else ()), *(("slurm",) if slurm else ()))
        SCENARIOS[name] = Scenario(name, function, locks, groups)
        return function

    return register


class Pool:
    """Runs the scenarios the selected tests read, `workers` at a time, in the order given."""

    def __init__(self, names: Sequence[str], base: Path, *, workers: int) -> None:
        self.base = base
        self.pending = [SCENARIOS[name] for name in dict.fromkeys(names)]
        self.done: dict[str, Run | BaseException] = {}
        self.times: dict[str, tuple[float, float]] = {}
        self.started = time.monotonic()
        self._condition = threading.Condition()
        self._running: dict[str, int] = {}
        self._jobs: dict[str, Job] = {}  # the job of each scenario running now, for `close` to stop
        self._closed = False
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]
        for thread in self._threads:
            thread.start()

    def _next(self) -> Scenario | None:
        with self._condition:
            while True:
                if self._closed or not self.pending:
                    return None
                for index, candidate in enumerate(self.pending):
                    if all(self._running.get(group, 0) < GROUP_LIMITS[group] for group in candidate.groups):
                        for group in candidate.groups:
                            self._running[group] = self._running.get(group, 0) + 1
                        return self.pending.pop(index)
                self._condition.wait(0.5)

    def _work(self) -> None:
        while True:
            chosen = self._next()
            if chosen is None:
                return
            begun = time.monotonic()
            outcome: Run | BaseException
            try:
                with contextlib.ExitStack() as stack:
                    for lock in chosen.locks:
                        stack.enter_context(machine_lock(lock))
                    outcome = self._attempts(chosen)
            except BaseException as error:  # reported by the test that reads it
                outcome = error
            with self._condition:
                self.done[chosen.name] = outcome
                self.times[chosen.name] = (begun - self.started, time.monotonic() - begun)
                for group in chosen.groups:
                    self._running[group] -= 1
                self._condition.notify_all()

    def _attempts(self, chosen: Scenario) -> Run:
        """The scenario's run, started again (up to ATTEMPTS times) when SLURM could not lay out a step's tasks."""
        attempt = 1
        run = self._run_once(chosen, chosen.name)
        while attempt < ATTEMPTS and any(LAYOUT_FAILURE in output for output in run.outputs):
            time.sleep(5.0 * attempt)  # until the jobs that hold the host's CPUs end
            attempt += 1
            run = self._run_once(chosen, f"{chosen.name}-attempt{attempt}")
        run.notes["attempts"] = attempt
        return run

    def _run_once(self, chosen: Scenario, name: str) -> Run:
        """One run of the scenario; whatever it started is stopped (bounded: `Job.abort`) when it did not get to
        `Job.finish`: it raised, or `close` abandoned it. An MPI rank of a page job was once left running."""
        job = Job(name, self.base)
        with self._condition:
            self._jobs[chosen.name] = job
        try:
            return chosen.run(job)
        finally:
            with self._condition:
                self._jobs.pop(chosen.name, None)
            if not job.finished:
                job.abort()

    @property
    def wall(self) -> float:
        """Seconds from the pool's start to the end of its last scenario."""
        return max((begun + seconds for begun, seconds in self.times.values()), default=0.0)

    def result(self, name: str, timeout: float = 400.0) -> Run:
        """The scenario's run (waits for it, bounded)."""
        deadline = time.monotonic() + timeout
        with self._condition:
            while name not in self.done:
                if name not in SCENARIOS:
                    raise KeyError(f"no scenario {name!r}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"scenario {name!r} did not finish within {timeout:g} s")
                self._condition.wait(0.5)
            outcome = self.done[name]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def close(self, timeout: float = 120.0, *, interrupted: bool = False) -> None:
        """No new scenario starts; the running ones end within their own bounds (`timeout` s in all), or at once
        when the session was `interrupted` (Ctrl-C). Either way every job still running then is aborted: its
        commands' process groups and marked processes killed, its SLURM jobs cancelled, so nothing a scenario
        started outlives the session (the pool's threads are daemons, which the interpreter drops at exit)."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        deadline = time.monotonic() + (0.0 if interrupted else timeout)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._condition:
            running = list(self._jobs.values())
        for job in running:
            job.abort()
        ended = time.monotonic() + 30.0  # each thread then reads its killed commands' exits and returns
        for thread in self._threads:
            thread.join(max(0.0, ended - time.monotonic()))
