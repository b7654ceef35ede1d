"""trainplan under real engines: SLURM (two nodes on this host), Open MPI, MPICH's Hydra and torchrun.

Every process of a scenario runs tests/cluster/probe.py, which resolves a plan, prints it next to what the launcher's
own variables say, and joins the world (a gloo all-reduce and a metric store's sync, exact values expected), or
prints the typed refusal. Each scenario must end in one of two ways (the verdicts of issue 20):

- the right world: every rank's plan has the launcher's ranks, world size, node ranks and main address, and the
  all-reduce and metric sums are exact on every rank;
- the same typed refusal on every rank (error type, rule or variable), within 60 s, without importing torch.

And nothing is left behind: no process carrying the scenario's marker, no SLURM job with its comment.

The scenarios run concurrently (tests/cluster/harness.py's Pool); each test reads its own. Lightning's verdict in
the same processes (`PROBE_LIGHTNING=1`: each records its environment, in which Lightning's cluster detection, run
afterwards in one process, gives the cluster environment Fabric's connector picks and what it says) is asserted by
`test_lightning` against LIGHTNING_TABLE, the table the README's text comes from
(`lightning_markdown()`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import shlex
import socket
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import pytest

from tests.cluster.harness import (
    MPICH,
    OPEN_MPI,
    PROBE,
    PYTHON,
    ROOT,
    SLURM_TIME_LIMIT,
    TRAINPLAN,
    Job,
    Pool,
    Run,
    free_port,
    run_batch,
    run_command,
    scenario,
)
from tests.cluster.probe import EXIT_REFUSED

# The suite is this one file: under pytest-xdist's `--dist loadfile` (make test) one worker runs it all, with one
# SLURM session and one pool of scenarios.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

PROBE_COMMAND = [PYTHON, PROBE]
PROBE_LINE = f"{shlex.quote(PYTHON)} {PROBE}"
LIGHTNING = {"PROBE_LIGHTNING": "1"}
JOIN_TIMEOUT = 10
"""The join timeout of the failing-rank scenario (s): the ranks that wait must stop within it."""
REFUSAL_SECONDS = 60.0


def srun(*arguments: str, job: Job) -> list[str]:
    return ["srun", job.comment, f"--time={SLURM_TIME_LIMIT}", *arguments]


def salloc(*arguments: str, job: Job) -> list[str]:
    return ["salloc", job.comment, f"--time={SLURM_TIME_LIMIT}", *arguments]


def emitted_script(job: Job, *, nodes: int, devices: int = 2) -> str:
    """`trainplan plan --emit slurm` for the probe, written to the job's folder as it is printed."""
    done = subprocess.run(
        [
            TRAINPLAN,
            "plan",
            "--accelerator",
            "cpu",
            "--devices",
            str(devices),
            "--num-nodes",
            str(nodes),
            "--emit",
            "slurm",
            "--",
            PROBE,
        ],
        cwd=ROOT,
        env=job.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    path = job.folder / f"emitted-n{nodes}.sbatch"
    path.write_text(done.stdout)
    return str(path)


# -- the scenarios -------------------------------------------------------------------------------------------------
# The pool starts them in the order the tests read them; `heavy` (many torch processes) and `slurm` (SLURM jobs)
# limit how many of a kind run at once (harness.GROUP_LIMITS).


@scenario("srun-launch-2x2", heavy=True)
def _srun_launch(job: Job) -> Run:
    command = srun("-N2", "--ntasks-per-node=2", TRAINPLAN, "launch", PROBE, job=job)
    return run_command(job, command, extra=LIGHTNING)


@scenario("emitted-sbatch-2-nodes", heavy=True)
def _emitted_two(job: Job) -> Run:
    return run_batch(job, [emitted_script(job, nodes=2)], extra={"PROBE_REQUEST": "carried", **LIGHTNING})


@scenario("torchrun-c10d-2x2", heavy=True, slurm=False)
def _torchrun_c10d(job: Job) -> Run:
    port = str(free_port())
    for _ in range(2):
        job.spawn(torchrun("--nnodes", "2", "--nproc-per-node", "2", *c10d(port, job)), env=job.env(**LIGHTNING))
    job.wait(150)
    return job.finish()


@scenario("failing-rank", heavy=True)
def _failing_rank(job: Job) -> Run:
    command = srun("-N2", "--ntasks-per-node=2", *PROBE_COMMAND, job=job)
    extra = {"PROBE_EXIT": "7", "PROBE_EXIT_RANK": "1", "PROBE_TIMEOUT": str(JOIN_TIMEOUT)}
    return run_command(job, command, extra=extra)


@scenario("failing-rank-kill-on-bad-exit", heavy=True)
def _failing_rank_killed(job: Job) -> Run:
    command = srun("--kill-on-bad-exit=1", "-N2", "--ntasks-per-node=2", *PROBE_COMMAND, job=job)
    extra = {"PROBE_EXIT": "7", "PROBE_EXIT_RANK": "1", "PROBE_TIMEOUT": "120"}
    return run_command(job, command, extra=extra)


@scenario("srun-2-nodes-n4")
def _srun_three_plus_one(job: Job) -> Run:
    return run_command(job, srun("-N2", "-n4", *PROBE_COMMAND, job=job), extra=LIGHTNING)


@scenario("srun-2-nodes-n3")
def _srun_two_plus_one(job: Job) -> Run:
    return run_command(job, srun("-N2", "-n3", *PROBE_COMMAND, job=job))


@scenario("srun-pmi2-2-nodes-n3")
def _srun_pmi2_two_plus_one(job: Job) -> Run:
    """srun's own PMI plugin sets MPI's variables beside SLURM's: the same job, and the same refusal."""
    return run_command(job, srun("--mpi=pmi2", "-N2", "-n3", *PROBE_COMMAND, job=job))


@scenario("sbatch-no-srun")
def _sbatch_no_srun(job: Job) -> Run:
    return run_batch(job, ["-N1", "--ntasks-per-node=2", "--wrap", PROBE_LINE], extra=LIGHTNING)


@scenario("mpich-sbatch-2-nodes-no-address")
def _mpich_two_nodes_no_address(job: Job) -> Run:
    line = shlex.join([*MPICH, "-n", "4", *PROBE_COMMAND])
    return run_batch(job, ["-N2", "--ntasks-per-node=2", "--wrap", line])


@scenario("mpich-sbatch-2-nodes-no-port")
def _mpich_two_nodes_no_port(job: Job) -> Run:
    line = shlex.join([*MPICH, "-genv", "MASTER_ADDR", "127.0.0.1", "-n", "4", *PROBE_COMMAND])
    return run_batch(job, ["-N2", "--ntasks-per-node=2", "--wrap", line])


@scenario("srun-3-plus-1-hostfile")
def _srun_hostfile(job: Job) -> Run:
    # The 3 + 1 placement for certain (srun -N2 -n4 gives it only while tpnode1 has 3 CPUs free).
    hostfile = job.folder / "hostfile"
    hostfile.write_text("tpnode1\ntpnode1\ntpnode1\ntpnode2\n")
    command = srun("-n4", "--distribution=arbitrary", *PROBE_COMMAND, job=job)
    return run_command(job, command, extra={"SLURM_HOSTFILE": str(hostfile)})


@scenario("srun-pty")
def _srun_pty(job: Job) -> Run:
    # srun --pty needs a terminal: script(1) gives it one.
    line = shlex.join(srun("--pty", "-n1", *PROBE_COMMAND, job=job))
    return run_command(job, ["script", "-qec", line, "/dev/null"])


@scenario("srun-pty-n2")
def _srun_pty_two(job: Job) -> Run:
    # srun --pty of two tasks running the script itself: SLURM's world (the pty is task 0's).
    line = shlex.join(srun("--pty", "-N1", "-n2", *PROBE_COMMAND, job=job))
    return run_command(job, ["script", "-qec", line, "/dev/null"])


@scenario("srun-pty-shell-n2")
def _srun_pty_shell(job: Job) -> Run:
    # srun --pty -n2 bash, and the script typed into task 0's shell: the step's other task runs no copy of it.
    line = shlex.join(srun("--pty", "-N1", "-n2", "bash", "--norc", job=job))
    return run_command(job, ["script", "-qec", line, "/dev/null"], stdin=f"{PROBE_LINE}; exit\n")


@scenario("openmpi-sbatch-seq")
def _openmpi_sequential(job: Job) -> Run:
    """mpirun --map-by seq with a hostfile naming tpnode2 first: MPI's rank 0 is the daemons' srun task 1, so
    SLURM's step states the same world size but not the same ranks."""
    hostfile = job.folder / "hostfile"
    hostfile.write_text("tpnode2\ntpnode1\n")
    mapping = ("--map-by", "seq", "--hostfile", str(hostfile), "-x", "MASTER_ADDR=127.0.0.1")
    line = shlex.join([*OPEN_MPI, *mapping, "-np", "2", *PROBE_COMMAND])
    return run_batch(job, ["-N2", "--ntasks-per-node=1", "--wrap", line])


@scenario("mpich-sbatch-2-plus-1")
def _mpich_two_plus_one(job: Job) -> Run:
    """mpiexec -n 3 -ppn 2 over 2 nodes: 2 ranks on tpnode1, 1 on tpnode2; MPICH states no node count."""
    port = str(free_port())
    address = ("-genv", "MASTER_ADDR", "127.0.0.1", "-genv", "MASTER_PORT", port)
    line = shlex.join([*MPICH, *address, "-n", "3", "-ppn", "2", *PROBE_COMMAND])
    return run_batch(job, ["-N2", "--ntasks-per-node=2", "--wrap", line])


@scenario("openmpi-sbatch-2-nodes-no-address")
def _openmpi_two_nodes_no_address(job: Job) -> Run:
    line = shlex.join([*OPEN_MPI, "-np", "4", *PROBE_COMMAND])
    return run_batch(job, ["-N2", "--ntasks-per-node=2", "--wrap", line])


@scenario("torchrun-uneven", slurm=False)
def _torchrun_uneven(job: Job) -> Run:
    port = str(free_port())
    for processes in ("2", "1"):
        job.spawn(torchrun("--nnodes", "2", "--nproc-per-node", processes, *c10d(port, job)), env=job.env(**LIGHTNING))
    job.wait(150)
    return job.finish()


@scenario("scancel-srun")
def _scancel_srun(job: Job) -> Run:
    job.spawn(srun("-N2", "--ntasks-per-node=1", *PROBE_COMMAND, job=job), env=job.env(PROBE_SLEEP="300"))
    return cancel_when_planned(job, planned=2)


@scenario("scancel-emitted-sbatch")
def _scancel_emitted(job: Job) -> Run:
    job_id = job.submit([emitted_script(job, nodes=2)], env=job.env(PROBE_SLEEP="300", PROBE_REQUEST="carried"))
    return cancel_when_planned(job, planned=4, job_id=job_id)


@scenario("scancel-srun-launch")
def _scancel_launch(job: Job) -> Run:
    command = srun("-N2", "--ntasks-per-node=1", TRAINPLAN, "launch", PROBE, job=job)
    job.spawn(command, env=job.env(PROBE_SLEEP="300"))
    return cancel_when_planned(job, planned=2)


@scenario("srun-n2")
def _srun_n2(job: Job) -> Run:
    return run_command(job, srun("-N1", "-n2", *PROBE_COMMAND, job=job), extra=LIGHTNING)


@scenario("srun-ntasks-per-node-2")
def _srun_per_node(job: Job) -> Run:
    return run_command(job, srun("-N1", "--ntasks-per-node=2", *PROBE_COMMAND, job=job))


@scenario("srun-2x2")
def _srun_two_nodes(job: Job) -> Run:
    return run_command(job, srun("-N2", "--ntasks-per-node=2", *PROBE_COMMAND, job=job), extra=LIGHTNING)


@scenario("srun-2x2-cyclic")
def _srun_cyclic(job: Job) -> Run:
    # Ranks dealt round-robin: 0 and 2 on tpnode1, 1 and 3 on tpnode2.
    return run_command(job, srun("-N2", "--ntasks-per-node=2", "--distribution=cyclic", *PROBE_COMMAND, job=job))


@scenario("srun-bash")
def _srun_bash(job: Job) -> Run:
    return run_command(job, srun("-N1", "-n2", "bash", "-c", PROBE_LINE, job=job), extra=LIGHTNING)


@scenario("salloc-srun")
def _salloc_srun(job: Job) -> Run:
    command = salloc("-N1", "--ntasks-per-node=2", "srun", *PROBE_COMMAND, job=job)
    return run_command(job, command, extra=LIGHTNING)


@scenario("salloc-shell-srun")
def _salloc_shell_srun(job: Job) -> Run:
    # srun typed into the allocation's shell (salloc with no command runs the user's shell, reading stdin here).
    return run_command(job, salloc("-N1", "--ntasks-per-node=2", job=job), stdin=f"srun {PROBE_LINE}\n")


@scenario("salloc-shell-python")
def _salloc_shell_python(job: Job) -> Run:
    return run_command(job, salloc("-N1", "--ntasks-per-node=2", *PROBE_COMMAND, job=job), extra=LIGHTNING)


@scenario("sbatch-one-task")
def _sbatch_one_task(job: Job) -> Run:
    return run_batch(job, ["-n1", "--wrap", PROBE_LINE])


@scenario("emitted-sbatch-1-node")
def _emitted_one(job: Job) -> Run:
    return run_batch(job, [emitted_script(job, nodes=1)], extra={"PROBE_REQUEST": "carried"})


@scenario("openmpi-np2", slurm=False)
def _openmpi(job: Job) -> Run:
    return run_command(job, [*OPEN_MPI, "-np", "2", *PROBE_COMMAND], extra=LIGHTNING)


@scenario("openmpi-twice", slurm=False)
def _openmpi_twice(job: Job) -> Run:
    for _ in range(2):
        job.spawn([*OPEN_MPI, "-np", "2", *PROBE_COMMAND])
    job.wait(120)
    return job.finish()


@scenario("mpich-n2", slurm=False)
def _mpich(job: Job) -> Run:
    return run_command(job, [*MPICH, "-launcher", "fork", "-n", "2", *PROBE_COMMAND], extra=LIGHTNING)


@scenario("mpich-twice", slurm=False)
def _mpich_twice(job: Job) -> Run:
    """Two MPICH jobs on one host at once, rank 1 of the first and rank 0 of the second joining late: with one fixed
    port the late ranks would meet the other job's early ones in one world (the review's crossing)."""
    for tag, late in (("A", "1"), ("B", "0")):
        job.spawn(
            [*MPICH, "-launcher", "fork", "-n", "2", *PROBE_COMMAND],
            env=job.env(PROBE_JOB_TAG=tag, PROBE_JOIN_DELAY="8", PROBE_JOIN_DELAY_RANK=late),
        )
        time.sleep(2)
    job.wait(150)
    return job.finish()


@scenario("srun-steps-side-by-side")
def _srun_steps(job: Job) -> Run:
    """Two srun steps run side by side in one allocation (a sweep), each rank 1 and rank 0 late in turn."""
    step = shlex.join(["srun", "-n2", "-N1", "--exact", *PROBE_COMMAND])
    script = (
        f"PROBE_JOB_TAG=A PROBE_JOIN_DELAY=8 PROBE_JOIN_DELAY_RANK=1 {step} & sleep 2; "
        f"PROBE_JOB_TAG=B PROBE_JOIN_DELAY=8 PROBE_JOIN_DELAY_RANK=0 {step} & wait"
    )
    return run_batch(job, ["-N1", "-n4", "--wrap", script])


@scenario("mpich-sbatch-2-nodes")
def _mpich_two_nodes(job: Job) -> Run:
    port = str(free_port())
    line = shlex.join(
        [*MPICH, "-genv", "MASTER_ADDR", "127.0.0.1", "-genv", "MASTER_PORT", port, "-n", "4", *PROBE_COMMAND]
    )
    return run_batch(job, ["-N2", "--ntasks-per-node=2", "--wrap", line], extra=LIGHTNING)


@scenario("openmpi-sbatch-2-nodes")
def _openmpi_two_nodes(job: Job) -> Run:
    line = shlex.join([*OPEN_MPI, "-x", "MASTER_ADDR=127.0.0.1", "-np", "4", *PROBE_COMMAND])
    return run_batch(job, ["-N2", "--ntasks-per-node=2", "--wrap", line])


@scenario("openmpi-sbatch-1-node")
def _openmpi_one_node(job: Job) -> Run:
    line = shlex.join([*OPEN_MPI, "-np", "2", *PROBE_COMMAND])
    return run_batch(job, ["-N1", "--ntasks-per-node=2", "--wrap", line], extra=LIGHTNING)


@scenario("torchrun-static-2x2", slurm=False)
def _torchrun_static(job: Job) -> Run:
    port = str(free_port())
    for node in ("0", "1"):
        static = ("--master-addr", "127.0.0.1", "--master-port", port, "--node-rank", node)
        job.spawn(torchrun("--nnodes", "2", "--nproc-per-node", "2", *static, "--local-addr", "127.0.0.1"))
    job.wait(150)
    return job.finish()


def torchrun(*arguments: str) -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", "--max-restarts", "0", *arguments, PROBE]


def c10d(port: str, job: Job) -> tuple[str, ...]:
    endpoint = f"127.0.0.1:{port}"
    return ("--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", job.mark, "--local-addr", "127.0.0.1")


def cancel_when_planned(job: Job, *, planned: int, job_id: str | None = None) -> Run:
    """Wait (bounded) until `planned` processes have printed their plan, scancel the job, wait for it to end."""
    ready = job.wait_for(lambda records: sum(record["kind"] == "plan" for record in records) >= planned, 120)
    job.notes["planned_before_cancel"] = ready
    if job_id is None:
        ids = {str(record["readings"]["slurm_job"]["job_id"]) for record in job.records() if record["kind"] == "plan"}
        job_id = next(iter(ids), None)
    if job_id is not None:
        cancelled = time.monotonic()
        job.cancel(job_id)
        if job_id in job.slurm:
            job.wait_slurm(job_id, 60)
        else:
            job.wait(60)
        job.notes["cancel_seconds"] = round(time.monotonic() - cancelled, 2)
    return job.finish()


# -- what a scenario must end in -------------------------------------------------------------------------------------


def problems_of_world(
    run: Run,
    *,
    size: int,
    nodes: int,
    per_node: int,
    cluster: str,
    truth: str,
    address: str | None = None,
    notes: Sequence[str] = (),
) -> list[str]:
    """What is wrong with `run` as the right world (empty: nothing)."""
    problems: list[str] = []
    if run.timed_out:
        problems.append("the scenario ran out of time")
    if any(code != 0 for code in run.returncodes):
        problems.append(f"exit codes {run.returncodes}, expected 0")
    for job_id, facts in run.slurm.items():
        if (facts.get("JobState"), facts.get("ExitCode")) != ("COMPLETED", "0:0"):
            problems.append(f"SLURM job {job_id}: {facts.get('JobState')} ExitCode={facts.get('ExitCode')}")
    for refused in run.of_kind("refused") + run.of_kind("failed"):
        problems.append(f"{refused['kind']} ({refused.get('stage')}): {refused.get('type')}: {refused.get('message')}")
    plans = run.of_kind("plan")
    if len(plans) != size:
        problems.append(f"{len(plans)} plan(s), expected {size} (one per process)")
    for plan in plans:
        said = plan["truth"]
        rank = said.get("global_rank")
        expected: dict[str, Any] = {
            "cluster": cluster,
            "launcher": "external",
            "world_size": size,
            "num_nodes": nodes,
            "processes_per_node": per_node,
            "global_rank": rank,
            "local_rank": said.get("local_rank"),
            "node_rank": said.get("node_rank"),
        }
        if said.get("launcher") != truth or said.get("world_size") != size:
            problems.append(f"the launcher's variables say {said} (expected {truth}'s world of {size})")
        for key, value in expected.items():
            if plan.get(key) != value:
                problems.append(f"rank {rank}: plan {key} = {plan.get(key)!r}, the launcher says {value!r}")
        wanted_address = said.get("master_addr") or address
        if wanted_address is not None and plan.get("main_address") != wanted_address:
            problems.append(f"rank {rank}: main address {plan.get('main_address')!r}, expected {wanted_address!r}")
        if said.get("master_port") is not None and plan.get("main_port") != said["master_port"]:
            problems.append(f"rank {rank}: main port {plan.get('main_port')}, MASTER_PORT says {said['master_port']}")
        codes = {note["code"] for note in plan.get("notes", [])}
        for code in notes:
            if code not in codes:
                problems.append(f"rank {rank}: no note {code!r} (notes: {sorted(codes)})")
    if sorted(plan["truth"].get("global_rank") for plan in plans) != list(range(len(plans))):
        problems.append(f"global ranks {sorted(str(plan['truth'].get('global_rank')) for plan in plans)}")
    meeting = {(plan.get("main_address"), plan.get("main_port")) for plan in plans}
    if len(meeting) > 1:
        problems.append(f"the ranks meet at different places: {sorted(map(str, meeting))}")
    for host, _ in meeting:
        if not loopback(str(host)):
            problems.append(f"the main address {host!r} is not this machine's loopback")
    worlds = run.of_kind("world")
    if len(worlds) != size or not all(world["exact"] for world in worlds):
        problems.append(f"{len(worlds)} of {size} rank(s) finished the all-reduce and metric sync exactly")
    return problems + problems_left(run)


def loopback(host: str) -> bool:
    """Whether `host` resolves to a loopback address (every address of the suite must)."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def problems_left(run: Run) -> list[str]:
    problems = []
    if run.leftovers:
        problems.append(f"processes left behind: {run.leftovers}")
    if run.stale_jobs:
        problems.append(f"SLURM jobs left: {run.stale_jobs}")
    return problems


def problems_of_refusal(
    run: Run,
    *,
    count: int,
    error: str,
    rule: str | None = None,
    variable: str | None = None,
    words: Sequence[str] = (),
    exit_code: int | None = EXIT_REFUSED,
    any_variable: bool = False,
) -> list[str]:
    """What is wrong with `run` as the same typed refusal on all `count` processes (empty: nothing). `words`:
    regular expressions every refusal's message must match; `any_variable`: the variable a ClusterEnvironmentError
    names is not checked here (only that every rank names the same one, by the caller)."""
    problems: list[str] = []
    refused = run.of_kind("refused")
    if run.timed_out:
        problems.append("the scenario ran out of time")
    if len(refused) != count or run.of_kind("plan"):
        planned = [
            (plan.get("global_rank"), plan.get("world_size"), plan.get("cluster")) for plan in run.of_kind("plan")
        ]
        problems.append(f"{len(refused)} of {count} process(es) refused; planned (rank, world, cluster): {planned}")
    for record in refused:
        said = f"{record.get('type')} rule={record.get('rule')} variable={record.get('variable')}: {record['message']}"
        named = variable if not any_variable else record.get("variable")
        if (record.get("type"), record.get("rule"), record.get("variable")) != (error, rule, named):
            problems.append(f"refused as {said}; expected {error} rule={rule} variable={variable}")
        for word in words:
            if re.search(word, record["message"]) is None:
                problems.append(f"the refusal does not say {word!r}: {record['message']}")
        if "cannot work together" in record["message"] or re.match(r"\w+=\S+ cannot be used", record["message"]):
            problems.append(f"the refusal cites request fields nobody set: {record['message']}")
        if record.get("torch_loaded"):
            problems.append("the refusing process had imported torch")
        if record["seconds"] > REFUSAL_SECONDS:
            problems.append(f"a refusal took {record['seconds']} s")
    if exit_code is not None and run.returncode != exit_code and not run.slurm:
        problems.append(f"exit code {run.returncode}, expected {exit_code}")
    for job_id, facts in run.slurm.items():
        if exit_code is not None and facts.get("ExitCode") != f"{exit_code}:0":
            problems.append(f"SLURM job {job_id}: ExitCode={facts.get('ExitCode')}, expected {exit_code}:0")
    return problems + problems_left(run)


def check(problems: list[str], run: Run) -> None:
    """Fail with every distinct problem once (with how many ranks had it), then the run in short."""
    if not problems:
        return
    counted = {problem: problems.count(problem) for problem in problems}
    listed = "\n".join(f"- {problem}" + (f" (x{count})" if count > 1 else "") for problem, count in counted.items())
    pytest.fail(f"{listed}\n\n{run.describe()}", pytrace=False)


def first_host(run: Run) -> str | None:
    """The first host of the SLURM job's node list (trainplan's main address for a SLURM world)."""
    for plan in run.of_kind("plan"):
        nodes = plan["readings"].get("slurm_job", {}).get("nodes") or [None]
        return str(nodes[0]) if nodes[0] is not None else None
    return None


def slurm_port(run: Run) -> int | None:
    for plan in run.of_kind("plan"):
        job_id = plan["readings"].get("slurm_job", {}).get("job_id")
        return None if job_id is None else 15000 + int(job_id) % 10000
    return None


# -- SLURM -----------------------------------------------------------------------------------------------------------


@pytest.mark.scenario("srun-n2")
def test_srun_n2_is_a_slurm_world(scenarios: Pool) -> None:
    run = scenarios.result("srun-n2")
    check(
        problems_of_world(run, size=2, nodes=1, per_node=2, cluster="slurm", truth="slurm", address=first_host(run)),
        run,
    )
    assert {plan["main_port"] for plan in run.of_kind("plan")} == {slurm_port(run)}, run.describe()


@pytest.mark.scenario("srun-ntasks-per-node-2")
def test_srun_ntasks_per_node(scenarios: Pool) -> None:
    run = scenarios.result("srun-ntasks-per-node-2")
    check(
        problems_of_world(run, size=2, nodes=1, per_node=2, cluster="slurm", truth="slurm", address=first_host(run)),
        run,
    )


@pytest.mark.scenario("srun-2x2")
def test_srun_two_real_nodes(scenarios: Pool) -> None:
    run = scenarios.result("srun-2x2")
    check(problems_of_world(run, size=4, nodes=2, per_node=2, cluster="slurm", truth="slurm", address="tpnode1"), run)
    assert sorted(plan["node_rank"] for plan in run.of_kind("plan")) == [0, 0, 1, 1], run.describe()
    assert {plan["node_name"] for plan in run.of_kind("plan")} == {"tpnode1", "tpnode2"}, run.describe()


def placement(run: Run) -> list[int] | None:
    """How SLURM placed the step's tasks (SLURM_STEP_TASKS_PER_NODE, one count per node), as a probe read it."""
    for record in run.records:
        step = record.get("readings", {}).get("slurm_step")
        if step is not None:
            return list(step["tasks_per_node"])
    return None


def uneven_refusal(count: int, placed: list[int]) -> dict[str, Any]:
    """The refusal of an uneven SLURM placement: the variable, and how SLURM placed the tasks in words."""
    first, second = placed
    words = (rf"{first} tasks? on tpnode1", rf"{second} (tasks? )?on tpnode2", "--ntasks-per-node")
    return {"count": count, "error": "ClusterEnvironmentError", "variable": "SLURM_STEP_TASKS_PER_NODE", "words": words}


@pytest.mark.scenario("srun-2-nodes-n4")
def test_srun_n4_on_two_nodes_is_the_world_slurm_placed(scenarios: Pool) -> None:
    """`srun -N2 -n4`: SLURM puts 3 tasks on tpnode1 and 1 on tpnode2 while tpnode1 has 3 CPUs free, and 2 + 2 when
    other jobs hold its CPUs (`SLURM_STEP_TASKS_PER_NODE` says which). Uneven: refused on every rank; even: the
    world of 2 × 2."""
    run = scenarios.result("srun-2-nodes-n4")
    placed = placement(run)
    if placed == [2, 2]:
        check(
            problems_of_world(run, size=4, nodes=2, per_node=2, cluster="slurm", truth="slurm", address="tpnode1"), run
        )
    else:
        assert placed is not None and sum(placed) == 4, run.describe()
        check(problems_of_refusal(run, **uneven_refusal(4, placed)), run)


@pytest.mark.scenario("srun-3-plus-1-hostfile")
def test_srun_three_plus_one_is_refused_on_every_rank(scenarios: Pool) -> None:
    """F3: 3 tasks on tpnode1 and 1 on tpnode2 (an arbitrary distribution from SLURM_HOSTFILE)."""
    run = scenarios.result("srun-3-plus-1-hostfile")
    assert placement(run) == [3, 1], run.describe()
    check(problems_of_refusal(run, **uneven_refusal(4, [3, 1])), run)


@pytest.mark.scenario("srun-2-nodes-n3")
def test_srun_two_plus_one_is_refused_on_every_rank(scenarios: Pool) -> None:
    run = scenarios.result("srun-2-nodes-n3")
    placed = placement(run)
    assert placed is not None and sorted(placed) == [1, 2], run.describe()
    check(problems_of_refusal(run, **uneven_refusal(3, placed)), run)


@pytest.mark.scenario("srun-pmi2-2-nodes-n3")
def test_srun_with_its_pmi_plugin_two_plus_one_is_refused_on_every_rank(scenarios: Pool) -> None:
    run = scenarios.result("srun-pmi2-2-nodes-n3")
    placed = placement(run)
    assert placed is not None and sorted(placed) == [1, 2], run.describe()
    check(problems_of_refusal(run, **uneven_refusal(3, placed)), run)


@pytest.mark.scenario("srun-2x2-cyclic")
def test_srun_cyclic_distribution(scenarios: Pool) -> None:
    """`--distribution=cyclic`: the node and local ranks are SLURM's, not derived from the global rank."""
    run = scenarios.result("srun-2x2-cyclic")
    check(problems_of_world(run, size=4, nodes=2, per_node=2, cluster="slurm", truth="slurm", address="tpnode1"), run)
    places = sorted((plan["global_rank"], plan["node_rank"], plan["local_rank"]) for plan in run.of_kind("plan"))
    assert places == [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)], run.describe()


@pytest.mark.scenario("srun-pty")
def test_srun_pty_one_task_is_local(scenarios: Pool) -> None:
    """`srun --pty` with one task: an interactive shell step, where trainplan starts the processes itself."""
    run = scenarios.result("srun-pty")
    problems = problems_left(run)
    plans = run.of_kind("plan")
    if run.returncode != 0 or len(plans) != 1:
        problems.append(f"exit code {run.returncode}, {len(plans)} plan(s): expected 0 and one")
    for plan in plans:
        codes = {note["code"] for note in plan["notes"]}
        if plan["cluster"] != "local" or "slurm-interactive-step" not in codes:
            problems.append(
                f"cluster {plan['cluster']!r}, notes {sorted(codes)}: expected local, slurm-interactive-step"
            )
    check(problems + [f"refused: {record['message']}" for record in run.of_kind("refused")], run)


@pytest.mark.scenario("srun-pty-n2")
def test_srun_pty_of_two_tasks_running_the_script_is_slurms_world(scenarios: Pool) -> None:
    run = scenarios.result("srun-pty-n2")
    check(
        problems_of_world(run, size=2, nodes=1, per_node=2, cluster="slurm", truth="slurm", address=first_host(run)),
        run,
    )


@pytest.mark.scenario("srun-pty-shell-n2")
def test_a_script_typed_into_an_interactive_srun_shell_plans_alone_with_a_warning(scenarios: Pool) -> None:
    """D2: `srun --pty -n2 bash`, then the script typed into task 0's shell: no other task runs it, so it plans
    this machine alone and says so (it used to wait for a rank 1 that never came)."""
    run = scenarios.result("srun-pty-shell-n2")
    problems = problems_left(run)
    plans = run.of_kind("plan")
    if len(plans) != 1:
        problems.append(f"{len(plans)} plan(s): expected one")
    for plan in plans:
        levels = {note["code"]: note["level"] for note in plan["notes"]}
        if plan["cluster"] != "local" or levels.get("slurm-interactive-shell") != "warning":
            problems.append(f"cluster {plan['cluster']!r}, notes {levels}: expected local, slurm-interactive-shell")
    check(problems + [f"{r['kind']}: {r['message']}" for r in run.of_kind("refused") + run.of_kind("failed")], run)


@pytest.mark.scenario("srun-bash")
def test_srun_through_bash_is_a_slurm_world(scenarios: Pool) -> None:
    """F1: the job is named `bash`, and its tasks are still srun's."""
    run = scenarios.result("srun-bash")
    check(
        problems_of_world(run, size=2, nodes=1, per_node=2, cluster="slurm", truth="slurm", address=first_host(run)),
        run,
    )


@pytest.mark.scenario("salloc-srun")
def test_salloc_srun_is_a_slurm_world(scenarios: Pool) -> None:
    """F1: salloc names the job `interactive`; srun's tasks in it are SLURM's."""
    run = scenarios.result("salloc-srun")
    check(
        problems_of_world(run, size=2, nodes=1, per_node=2, cluster="slurm", truth="slurm", address=first_host(run)),
        run,
    )


@pytest.mark.scenario("salloc-shell-srun")
def test_srun_typed_in_the_allocation_shell_is_a_slurm_world(scenarios: Pool) -> None:
    run = scenarios.result("salloc-shell-srun")
    check(
        problems_of_world(run, size=2, nodes=1, per_node=2, cluster="slurm", truth="slurm", address=first_host(run)),
        run,
    )


@pytest.mark.scenario("salloc-shell-python")
def test_the_allocation_shell_itself_is_local_with_a_warning(scenarios: Pool) -> None:
    run = scenarios.result("salloc-shell-python")
    problems = problems_left(run)
    plans = run.of_kind("plan")
    if run.returncode != 0 or len(plans) != 1:
        problems.append(f"exit code {run.returncode}, {len(plans)} plan(s): expected 0 and one")
    for plan in plans:
        if plan["readings"].get("slurm_job", {}).get("shape") != "allocation-shell":
            problems.append(f"not the allocation's shell: {plan['readings']}")
        if plan["cluster"] != "local":
            problems.append(f"cluster {plan['cluster']!r}, expected 'local'")
        levels = {note["code"]: note["level"] for note in plan["notes"]}
        if levels.get("slurm-allocation-shell") != "warning":
            problems.append(f"no warning note 'slurm-allocation-shell' (notes: {levels})")
    check(problems + [f"refused: {record['message']}" for record in run.of_kind("refused")], run)


@pytest.mark.scenario("sbatch-no-srun")
def test_the_batch_step_of_a_two_task_job_is_refused(scenarios: Pool) -> None:
    """F4: `sbatch --ntasks-per-node=2 --wrap 'python probe.py'` runs one process: it must not wait for a second."""
    run = scenarios.result("sbatch-no-srun")
    check(problems_of_refusal(run, count=1, error="Incompatible", rule="slurm-batch-step", words=("srun",)), run)


@pytest.mark.scenario("sbatch-one-task")
def test_the_batch_step_of_a_one_task_job_is_local(scenarios: Pool) -> None:
    run = scenarios.result("sbatch-one-task")
    problems = problems_left(run)
    plans = run.of_kind("plan")
    states = [(facts.get("JobState"), facts.get("ExitCode")) for facts in run.slurm.values()]
    if states != [("COMPLETED", "0:0")] or len(plans) != 1:
        problems.append(f"SLURM says {states}, {len(plans)} plan(s): expected COMPLETED 0:0 and one")
    problems += [f"cluster {plan['cluster']!r}, expected 'local'" for plan in plans if plan["cluster"] != "local"]
    check(problems + [f"refused: {record['message']}" for record in run.of_kind("refused")], run)


@pytest.mark.scenario("emitted-sbatch-1-node")
def test_the_emitted_one_node_sbatch_runs_as_it_is(scenarios: Pool) -> None:
    run = scenarios.result("emitted-sbatch-1-node")
    check(problems_of_world(run, size=2, nodes=1, per_node=2, cluster="torchelastic", truth="torchrun"), run)


@pytest.mark.scenario("emitted-sbatch-2-nodes")
def test_the_emitted_two_node_sbatch_runs_as_it_is(scenarios: Pool) -> None:
    run = scenarios.result("emitted-sbatch-2-nodes")
    check(problems_of_world(run, size=4, nodes=2, per_node=2, cluster="torchelastic", truth="torchrun"), run)
    assert {plan["node_name"] for plan in run.of_kind("plan")} == {"tpnode1", "tpnode2"}, run.describe()


@pytest.mark.scenario("srun-launch-2x2")
def test_srun_trainplan_launch(scenarios: Pool) -> None:
    """`srun -N2 --ntasks-per-node=2 trainplan launch probe.py`: the script once per task, one world of 4 whose
    ranks are SLURM's."""
    run = scenarios.result("srun-launch-2x2")
    check(problems_of_world(run, size=4, nodes=2, per_node=2, cluster="torchelastic", truth="torchrun"), run)
    for plan in run.of_kind("plan"):
        step = plan["readings"]["slurm_step"]
        assert (plan["global_rank"], plan["node_rank"]) == (step["global_rank"], step["node_rank"]), run.describe()


# -- MPI -------------------------------------------------------------------------------------------------------------


@pytest.mark.scenario("openmpi-np2")
def test_openmpi_one_node(scenarios: Pool) -> None:
    run = scenarios.result("openmpi-np2")
    check(problems_of_world(run, size=2, nodes=1, per_node=2, cluster="mpi", truth="openmpi", address="127.0.0.1"), run)


@pytest.mark.scenario("mpich-n2")
def test_mpich_one_node_meets_on_its_proxys_port(scenarios: Pool) -> None:
    """MPICH states no job id: the port comes from the hydra proxy that started the ranks (one per job and node)."""
    run = scenarios.result("mpich-n2")
    problems = problems_of_world(run, size=2, nodes=1, per_node=2, cluster="mpi", truth="mpich", address="127.0.0.1")
    ports = {p["main_port"] for p in run.of_kind("plan")}
    check(problems + ([] if len(ports) == 1 and 29500 not in ports else [f"ports {sorted(ports)}"]), run)


def problems_of_two_jobs(run: Run) -> list[str]:
    """Two jobs of two ranks each, every world holding one job's ranks only (by the tag each job's command had)."""
    worlds = run.of_kind("world")
    problems = [] if len(worlds) == 4 else [f"{len(worlds)} rank(s) formed a world, expected 4"]
    for world in worlds:
        tags = {tag for _, tag in world.get("peers", [])}
        if len(tags) != 1 or world.get("world_size") != 2 or not world.get("exact"):
            problems.append(f"pid {world['pid']}: a world of {world.get('peers')} (exact: {world.get('exact')})")
    ports = {plan["main_port"] for plan in run.of_kind("plan")}
    if len(ports) != 2:
        problems.append(f"the two jobs' main ports: {sorted(map(str, ports))}")
    return problems


@pytest.mark.scenario("mpich-twice")
def test_two_mpich_jobs_on_one_host_never_share_a_world(scenarios: Pool) -> None:
    check(problems_of_two_jobs(scenarios.result("mpich-twice")), scenarios.result("mpich-twice"))


@pytest.mark.scenario("srun-steps-side-by-side")
def test_two_srun_steps_side_by_side_never_share_a_world(scenarios: Pool) -> None:
    run = scenarios.result("srun-steps-side-by-side")
    check(problems_of_two_jobs(run), run)


@pytest.mark.scenario("openmpi-twice")
def test_two_openmpi_jobs_at_once_do_not_clash(scenarios: Pool) -> None:
    """F6: the main port comes from Open MPI's job id, so two jobs on one machine meet at different ports."""
    run = scenarios.result("openmpi-twice")
    job_of_pid = {plan["pid"]: str(plan["readings"]["openmpi"]["job_id"]) for plan in run.of_kind("plan")}
    jobs: dict[str, list[dict[str, Any]]] = {}
    for record in run.records:
        jobs.setdefault(job_of_pid.get(record["pid"], "?"), []).append(record)
    problems = [] if len(jobs) == 2 else [f"records of {len(jobs)} job(s), expected 2: {sorted(jobs)}"]
    for records in jobs.values():
        one = dataclasses.replace(run, records=records)
        problems += problems_of_world(
            one, size=2, nodes=1, per_node=2, cluster="mpi", truth="openmpi", address="127.0.0.1"
        )
    ports = {plan["main_port"] for plan in run.of_kind("plan")}
    if len(ports) != 2:
        problems.append(f"the two jobs' main ports: {sorted(map(str, ports))}")
    check(sorted(set(problems)), run)


@pytest.mark.scenario("mpich-sbatch-2-nodes-no-address")
def test_mpich_two_nodes_without_master_addr_is_refused(scenarios: Pool) -> None:
    run = scenarios.result("mpich-sbatch-2-nodes-no-address")
    words = ("MASTER_ADDR", "-genv")
    check(problems_of_refusal(run, count=4, error="Incompatible", rule="cluster-main-address", words=words), run)


@pytest.mark.scenario("mpich-sbatch-2-nodes-no-port")
def test_mpich_two_nodes_without_master_port_is_refused(scenarios: Pool) -> None:
    """MPICH states no job id every node shares: a fixed port over several nodes could meet another job there."""
    run = scenarios.result("mpich-sbatch-2-nodes-no-port")
    words = ("MASTER_PORT", "-genv MASTER_PORT", "fixed port 29500")
    check(
        problems_of_refusal(run, count=4, error="ClusterEnvironmentError", variable="MASTER_PORT", words=words),
        run,
    )


@pytest.mark.scenario("mpich-sbatch-2-nodes")
def test_mpich_two_nodes_with_master_addr(scenarios: Pool) -> None:
    run = scenarios.result("mpich-sbatch-2-nodes")
    check(problems_of_world(run, size=4, nodes=2, per_node=2, cluster="mpi", truth="mpich", address="127.0.0.1"), run)


@pytest.mark.scenario("openmpi-sbatch-2-nodes-no-address")
def test_openmpi_two_nodes_without_master_addr_is_refused(scenarios: Pool) -> None:
    run = scenarios.result("openmpi-sbatch-2-nodes-no-address")
    words = ("MASTER_ADDR", "-x")
    check(problems_of_refusal(run, count=4, error="Incompatible", rule="cluster-main-address", words=words), run)


@pytest.mark.scenario("openmpi-sbatch-2-nodes")
def test_openmpi_two_nodes_with_master_addr(scenarios: Pool) -> None:
    run = scenarios.result("openmpi-sbatch-2-nodes")
    check(problems_of_world(run, size=4, nodes=2, per_node=2, cluster="mpi", truth="openmpi", address="127.0.0.1"), run)
    assert {plan["node_name"] for plan in run.of_kind("plan")} == {"tpnode1", "tpnode2"}, run.describe()


@pytest.mark.scenario("openmpi-sbatch-seq")
def test_mpirun_with_a_sequential_mapping_inside_sbatch_is_mpis_world(scenarios: Pool) -> None:
    """D3: SLURM's daemon step states MPI's world size (2 tasks, one per node) but other ranks: MPI's win."""
    run = scenarios.result("openmpi-sbatch-seq")
    check(problems_of_world(run, size=2, nodes=2, per_node=1, cluster="mpi", truth="openmpi", address="127.0.0.1"), run)
    places = {(plan["global_rank"], plan["node_name"]) for plan in run.of_kind("plan")}
    assert places == {(0, "tpnode2"), (1, "tpnode1")}, run.describe()


@pytest.mark.scenario("mpich-sbatch-2-plus-1")
def test_an_uneven_mpich_job_is_refused_on_every_rank(scenarios: Pool) -> None:
    """D1: the lone rank on tpnode2 reads the nodes off the proxies' srun step, and refuses with the others."""
    run = scenarios.result("mpich-sbatch-2-plus-1")
    words = ("MPI started 3 processes", "-ppn")
    check(
        problems_of_refusal(run, count=3, error="ClusterEnvironmentError", variable="MPI_LOCALNRANKS", words=words),
        run,
    )


@pytest.mark.scenario("openmpi-sbatch-1-node")
def test_openmpi_inside_sbatch_is_mpis_world(scenarios: Pool) -> None:
    """F2: mpirun starts its ranks through an srun step of one task; the ranks are MPI's, not that step's."""
    run = scenarios.result("openmpi-sbatch-1-node")
    check(problems_of_world(run, size=2, nodes=1, per_node=2, cluster="mpi", truth="openmpi", address="127.0.0.1"), run)


# -- torchrun --------------------------------------------------------------------------------------------------------


@pytest.mark.scenario("torchrun-c10d-2x2")
def test_torchrun_c10d_two_agents(scenarios: Pool) -> None:
    run = scenarios.result("torchrun-c10d-2x2")
    check(problems_of_world(run, size=4, nodes=2, per_node=2, cluster="torchelastic", truth="torchrun"), run)


@pytest.mark.scenario("torchrun-static-2x2")
def test_torchrun_static_two_agents(scenarios: Pool) -> None:
    run = scenarios.result("torchrun-static-2x2")
    check(problems_of_world(run, size=4, nodes=2, per_node=2, cluster="torchelastic", truth="torchrun"), run)


@pytest.mark.scenario("torchrun-uneven")
def test_uneven_torchrun_world_is_refused_on_every_rank(scenarios: Pool) -> None:
    """F8: 2 processes on one agent, 1 on the other."""
    run = scenarios.result("torchrun-uneven")
    words = ("WORLD_SIZE", "GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE")
    problems = problems_of_refusal(
        run, count=3, error="ClusterEnvironmentError", words=words, exit_code=None, any_variable=True
    )
    check(problems, run)
    variables = {record["variable"] for record in run.of_kind("refused")}
    assert len(variables) == 1, f"the ranks name different variables: {variables}\n{run.describe()}"
    assert all(code not in (0, None) for code in run.returncodes), run.describe()


# -- cancelling and failing ------------------------------------------------------------------------------------------


SCANCELLED_SRUN_EXIT = 143
"""What srun exits with when its job is cancelled (128 + SIGTERM), as docs/clusters.md says."""


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("scancel-srun", marks=pytest.mark.scenario("scancel-srun")),
        pytest.param("scancel-emitted-sbatch", marks=pytest.mark.scenario("scancel-emitted-sbatch")),
        pytest.param("scancel-srun-launch", marks=pytest.mark.scenario("scancel-srun-launch")),
    ],
)
def test_scancel_leaves_nothing(scenarios: Pool, name: str) -> None:
    run = scenarios.result(name)
    problems = problems_left(run)
    if not run.notes.get("planned_before_cancel"):
        problems.append("the job's processes did not all print their plan before the cancel")
    if run.timed_out:
        problems.append("the cancelled job did not end within 60 s")
    if run.of_kind("world"):
        problems.append("a world formed: the job was not cancelled while it slept")
    for job_id, facts in run.slurm.items():
        if facts.get("JobState") != "CANCELLED":
            problems.append(f"SLURM job {job_id}: {facts.get('JobState')}")
    if name != "scancel-emitted-sbatch" and run.returncode != SCANCELLED_SRUN_EXIT:
        problems.append(f"srun exited {run.returncode} after scancel, not {SCANCELLED_SRUN_EXIT} (docs/clusters.md)")
    check(problems, run)


@pytest.mark.scenario("failing-rank")
def test_a_failing_rank_fails_the_job_and_the_others_stop(scenarios: Pool) -> None:
    run = scenarios.result("failing-rank")
    problems = problems_left(run)
    if run.returncode != 7:
        problems.append(f"srun exited {run.returncode}, expected rank 1's 7")
    exits = run.of_kind("exit")
    if [record["rank"] for record in exits] != [1]:
        problems.append(f"exits: {exits}")
    failed = run.of_kind("failed")
    if len(failed) != 3:
        problems.append(f"{len(failed)} of the other 3 ranks stopped with an error")
    for record in failed:
        if record["join_seconds"] > JOIN_TIMEOUT + 15:
            problems.append(f"a waiting rank stopped after {record['join_seconds']} s (join timeout {JOIN_TIMEOUT} s)")
    check(problems, run)


@pytest.mark.scenario("failing-rank-kill-on-bad-exit")
def test_with_kill_on_bad_exit_a_failing_rank_stops_the_others(scenarios: Pool) -> None:
    """`srun --kill-on-bad-exit=1`: SLURM ends the step's other tasks when rank 1 exits 7, so none waits out its join
    timeout (120 s here: longer than the scenario's bound) and none trains on."""
    run = scenarios.result("failing-rank-kill-on-bad-exit")
    problems = problems_left(run)
    if run.timed_out or run.returncode in (0, None):
        problems.append(f"srun exited {run.returncode} (timed out: {run.timed_out}), expected a failure")
    if [record["rank"] for record in run.of_kind("exit")] != [1]:
        problems.append(f"exits: {run.of_kind('exit')}")
    if run.of_kind("failed") or run.of_kind("world"):
        problems.append("a rank reached its join's end: SLURM did not stop it")
    check(problems, run)


# -- Lightning 2.6 in the same processes -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What Lightning's cluster detection gives in every process of a scenario (mpi4py is not installed here, so its
    MPIEnvironment never detects: Lightning 2.6 needs mpi4py to see MPI at all)."""

    pattern: str
    """The launch, as a user types it."""
    environment: str | None
    """The ClusterEnvironment Fabric's connector picks, or None when creating it raises."""
    ranks: tuple[int, ...]
    """The global ranks Lightning gives the processes, sorted (its world is a world when they are 0..W-1)."""
    world: int | None
    """The world size every process is told (None when Lightning raises)."""
    trainplan: str
    """trainplan's verdict in the same spot (asserted by the scenario's own test)."""
    error: str | None = None
    """A pattern the error's message matches, when Lightning raises."""


LIGHTNING_TABLE: dict[str, Verdict] = {
    "srun-n2": Verdict(
        "srun -N1 -n2 python train.py",
        None,
        (),
        None,
        "SLURM world of 2",
        error=r"You set `--ntasks=2`.*Use `--ntasks-per-node=2`",
    ),
    "srun-2x2": Verdict(
        "srun -N2 --ntasks-per-node=2 python train.py", "SLURMEnvironment", (0, 1, 2, 3), 4, "SLURM world of 2 × 2"
    ),
    "srun-2-nodes-n4": Verdict(
        "srun -N2 -n4 python train.py",
        None,
        (),
        None,
        "3 + 1: ClusterEnvironmentError on every rank (SLURM_STEP_TASKS_PER_NODE); 2 + 2: SLURM world of 2 × 2",
        error=r"You set `--ntasks=4`.*Use `--ntasks-per-node=4`",
    ),
    "srun-bash": Verdict(
        "srun -N1 -n2 bash -c 'python train.py'",
        "LightningEnvironment",
        (0, 0),
        1,
        "SLURM world of 2",
    ),
    "salloc-srun": Verdict(
        "salloc -N1 --ntasks-per-node=2 srun python train.py",
        "LightningEnvironment",
        (0, 0),
        1,
        "SLURM world of 2",
    ),
    "salloc-shell-python": Verdict(
        "salloc -N1 --ntasks-per-node=2 python train.py",
        "LightningEnvironment",
        (0,),
        1,
        "local, warning note slurm-allocation-shell",
    ),
    "sbatch-no-srun": Verdict(
        "sbatch -N1 --ntasks-per-node=2 --wrap 'python train.py'",
        "SLURMEnvironment",
        (0,),
        2,
        "Incompatible slurm-batch-step",
    ),
    "emitted-sbatch-2-nodes": Verdict(
        "sbatch job.sbatch  # trainplan plan --devices 2 --num-nodes 2 --emit slurm -- train.py",
        "TorchElasticEnvironment",
        (0, 1, 2, 3),
        4,
        "torchelastic world of 2 × 2",
    ),
    "srun-launch-2x2": Verdict(
        "srun -N2 --ntasks-per-node=2 trainplan launch train.py",
        "TorchElasticEnvironment",
        (0, 1, 2, 3),
        4,
        "torchelastic world of 2 × 2",
    ),
    "openmpi-np2": Verdict(
        "mpirun -np 2 python train.py  # Open MPI", "LightningEnvironment", (0, 0), 1, "MPI world of 2"
    ),
    "mpich-n2": Verdict(
        "mpiexec.hydra -n 2 python train.py  # MPICH",
        "LightningEnvironment",
        (0, 0),
        1,
        "MPI world of 2 (main port 29500, note mpi-default-port)",
    ),
    "openmpi-sbatch-1-node": Verdict(
        "sbatch -N1 --ntasks-per-node=2 --wrap 'mpirun -np 2 python train.py'",
        "SLURMEnvironment",
        (0, 0),
        1,
        "MPI world of 2",
    ),
    "mpich-sbatch-2-nodes": Verdict(
        "sbatch -N2 --ntasks-per-node=2 --wrap 'mpiexec -genv MASTER_ADDR … -n 4 python train.py'",
        "SLURMEnvironment",
        (0, 0, 1, 1),
        4,
        "MPI world of 2 × 2 (no MASTER_ADDR: Incompatible cluster-main-address on every rank)",
    ),
    "torchrun-c10d-2x2": Verdict(
        "torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d …  # on 2 nodes",
        "TorchElasticEnvironment",
        (0, 1, 2, 3),
        4,
        "torchelastic world of 2 × 2",
    ),
    "torchrun-uneven": Verdict(
        "torchrun --nnodes 2 --nproc-per-node 2 …  # and --nproc-per-node 1 on the other node",
        "TorchElasticEnvironment",
        (0, 1, 2),
        3,
        "ClusterEnvironmentError on every rank (WORLD_SIZE, GROUP_WORLD_SIZE, LOCAL_WORLD_SIZE)",
    ),
}


@pytest.fixture(scope="module")
def lightning(scenarios: Pool) -> dict[str, list[dict[str, Any]]]:
    """Lightning's verdict in every process of the Lightning scenarios (by scenario), from the environments the probes
    recorded, in one process (importing lightning_fabric once, not in every probe: its detection reads the
    environment alone). A scenario that fails is left out (its own test says why)."""
    environments: list[dict[str, str]] = []
    owners: list[str] = []
    for name in LIGHTNING_TABLE:
        try:
            run = scenarios.result(name)
        except Exception:  # reported by the scenario's own test
            continue
        for record in run.of_kind("environment"):
            environments.append(record["variables"])
            owners.append(name)
    done = subprocess.run(
        [PYTHON, PROBE, "--lightning"],
        cwd=ROOT,
        input=json.dumps(environments),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in LIGHTNING_TABLE}
    for name, verdict in zip(owners, json.loads(done.stdout), strict=True):
        found[name].append(verdict)
    return found


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.scenario(name)) for name in LIGHTNING_TABLE])
def test_lightning(scenarios: Pool, lightning: dict[str, list[dict[str, Any]]], name: str) -> None:
    """What Lightning 2.6's cluster detection gives in the scenario's processes, as LIGHTNING_TABLE says."""
    run = scenarios.result(name)
    expected = LIGHTNING_TABLE[name]
    verdicts = lightning[name]
    processes = len({record["pid"] for record in run.records if record["kind"] in ("plan", "refused")})
    problems = (
        []
        if verdicts and len(verdicts) == processes
        else [f"{len(verdicts)} Lightning verdict(s), {processes} processes"]
    )
    for verdict in verdicts:
        if verdict.get("mpi4py") or "MPIEnvironment" in verdict.get("detected", []):
            problems.append(f"mpi4py is installed here: the table assumes it is not ({verdict})")
        if not str(verdict.get("version", "")).startswith("2."):
            problems.append(f"Lightning {verdict.get('version')}: the table is Lightning 2's")
        error = verdict.get("error")
        if expected.error is not None:
            if error is None or re.search(expected.error, error["message"], re.DOTALL) is None:
                problems.append(f"expected Lightning to raise {expected.error!r}, it says {verdict}")
            continue
        if error is not None or verdict.get("environment") != expected.environment:
            problems.append(f"expected {expected.environment}, Lightning says {verdict}")
        if verdict.get("world_size") != expected.world:
            problems.append(f"Lightning's world size {verdict.get('world_size')}, expected {expected.world}")
    ranks = tuple(sorted(int(verdict["global_rank"]) for verdict in verdicts if "global_rank" in verdict))
    if expected.error is None and ranks != expected.ranks:
        problems.append(f"Lightning's global ranks {ranks}, expected {expected.ranks}")
    check(problems, run)


def lightning_markdown() -> str:
    """LIGHTNING_TABLE as the README's table (/work/notes/readme-engines.md was written from it)."""
    rows = ["| Launch | trainplan | Lightning 2.6 (its cluster environment: world size, ranks) |", "|---|---|---|"]
    for verdict in LIGHTNING_TABLE.values():
        if verdict.environment is None:
            lightning = "`RuntimeError` on every rank (use `--ntasks-per-node`)"
        else:
            ranks = ", ".join(map(str, verdict.ranks))
            lightning = f"{verdict.environment}: world {verdict.world}, ranks {ranks}"
        rows.append(f"| `{verdict.pattern}` | {verdict.trainplan} | {lightning} |")
    return "\n".join(rows)


# -- the clusters page's own jobs, as written ----------------------------------------------------------------------


def page_block(page: str, marker: str) -> str:
    """The fenced block under `marker` in `page` (a path from the repository's root)."""
    text = (ROOT / page).read_text()
    after = text[text.index(marker) :]
    start = after.index("\n", after.index("```")) + 1
    return after[start : after.index("```", start)]


def page_jobs(marker: str) -> list[str]:
    """The command lines of docs/clusters.md's block under `marker`."""
    return [line for line in page_block("docs/clusters.md", marker).splitlines() if line.strip()]


PAGE_JOBS = page_jobs("<!-- clusters:real-jobs -->")
OPEN_MPI_HERE = {
    # What this machine's Open MPI needs beside the page's `mpirun` line: root allowed, loopback transports only
    # (the flags of harness.OPEN_MPI, as Open MPI's own variables).
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl": "self,tcp",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}


def _jobs_named(name: str) -> list[str]:
    listed = subprocess.run(
        ["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True, timeout=20, check=False
    ).stdout
    return listed.split()


def _register_page_jobs() -> None:
    for index, line in enumerate(PAGE_JOBS):

        def run(job: Job, line: str = line) -> Run:
            (job.folder / "train.py").write_text(page_block("README.md", "<!-- scaling-out:script -->"))
            # The page's line carries no --comment: its SLURM jobs are named after the scenario's mark instead.
            environment = job.env(**OPEN_MPI_HERE, SLURM_JOB_NAME=job.mark, SBATCH_JOB_NAME=job.mark)
            job.spawn(["bash", "-c", f"cd {shlex.quote(str(job.folder))} && {line}"], env=environment)
            job.wait(150)
            finished = job.finish()
            stale = _jobs_named(job.mark)
            for job_id in stale:
                job.cancel(job_id)
            finished.stale_jobs += [f"{job_id} (named {job.mark})" for job_id in stale]
            finished.outputs += [path.read_text(errors="replace") for path in sorted(job.folder.glob("slurm-*.out"))]
            return finished

        scenario(f"page-job-{index}", slurm=not line.startswith("mpirun"))(run)


_register_page_jobs()


@pytest.mark.parametrize(
    "index",
    [pytest.param(index, marks=pytest.mark.scenario(f"page-job-{index}")) for index in range(len(PAGE_JOBS))],
    ids=[line.split()[0] for line in PAGE_JOBS],
)
def test_the_clusters_page_jobs_run_as_written(scenarios: Pool, index: int) -> None:
    run = scenarios.result(f"page-job-{index}")
    problems = problems_left(run)
    if run.returncode != 0:
        problems.append(f"{PAGE_JOBS[index]!r} exited {run.returncode}")
    printed = "\n".join(run.outputs)
    for rank in (0, 1):
        line = f"rank {rank} of 2: {{'loss': 1.6666666666666667, 'tokens': 3000}}"
        if line not in printed:
            problems.append(f"no line {line!r}")
    check(problems, run)


def test_the_page_lists_the_three_engines() -> None:
    assert [line.split()[0] for line in PAGE_JOBS] == ["srun", "mpirun", "sbatch"]
    assert "--wait" in PAGE_JOBS[2], "sbatch returns when the job ends only with --wait"
