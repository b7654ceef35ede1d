"""The script every process of a cluster scenario runs (tests/cluster): the same file for every launcher.

In each process:

1. `trainplan.resolve(trainplan.Request(...))` (everything "auto" unless PROBE_DEVICES / PROBE_NODES /
   PROBE_CLUSTER say otherwise; PROBE_REQUEST=carried resolves with no request, as an emitted job does).
2. A refusal (`trainplan.TrainplanError`) prints one `refused` record (error type, `rule` of an Incompatible,
   `variable` of a ClusterEnvironmentError, the message) and exits with EXIT_REFUSED. torch is never imported on
   that path: a refusal costs what `import trainplan` costs.
3. Otherwise a `plan` record: the plan's cluster facts next to what the launcher's own variables say (SLURM's step,
   Open MPI's and MPICH's PMI, torchrun's), innermost launcher first (`truth`).
4. A plan of more than one process joins its world (`trainplan.join`, with the timeout PROBE_TIMEOUT through
   DDPOptions(timeout_seconds=...)), all-reduces rank + 1 over gloo (W(W+1)/2 expected) and syncs a metric store
   (a weighted mean and a sum, exact values expected): a `world` record, or a `failed` one (EXIT_FAILED).

Knobs (environment): PROBE_DEVICES, PROBE_NODES, PROBE_CLUSTER (the request); PROBE_TIMEOUT (join timeout in s,
default 60); PROBE_SLEEP (s to sleep after the plan record, before joining: a job to cancel); PROBE_EXIT and
PROBE_EXIT_RANK (that global rank exits with that code after its plan record, before joining); PROBE_JOIN_DELAY and
PROBE_JOIN_DELAY_RANK (that global rank sleeps before joining); PROBE_JOB_TAG (recorded with every peer of the world
the rank joins: two jobs must never share one); PROBE_OUT (a folder:
each process also appends its records to `<folder>/<pid>.jsonl`); PROBE_LIGHTNING=1 (also record this process's
environment, in which `lightning_verdict` gives Lightning's verdict: which cluster environment Fabric's connector picks,
and what it says. Lightning's detection reads the environment alone, so the suite runs it afterwards, in one process
for every recorded environment (`python tests/cluster/probe.py --lightning < environments.json`), rather than
importing torch and lightning_fabric in each probe).

Records are single JSON lines on stdout tagged with MARKER, so interleaved launcher output cannot hide them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

STARTED = time.monotonic()

MARKER = "@@trainplan-probe "
EXIT_REFUSED = 3
"""A TrainplanError from resolve: the typed refusal."""
EXIT_FAILED = 4
"""The plan was made, but joining, the all-reduce or the metric sync failed (or the timeout re-plan differed)."""
EXIT_WRONG = 5
"""The world formed, but a sum came out wrong."""

Json = dict[str, Any]


def _out_path() -> str | None:
    folder = os.environ.get("PROBE_OUT")
    return None if not folder else os.path.join(folder, f"{socket.gethostname()}-{os.getpid()}.jsonl")


def emit(kind: str, **fields: object) -> None:
    """One record: a tagged JSON line on stdout, and the same line appended to this process's file in PROBE_OUT."""
    record: Json = {"kind": kind, "pid": os.getpid(), "seconds": round(time.monotonic() - STARTED, 3), **fields}
    line = json.dumps(record, sort_keys=True, default=str)
    print(MARKER + line, flush=True)
    path = _out_path()
    if path is not None:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


# -- what the launchers say --------------------------------------------------------------------------------------


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def tasks_per_node(text: str | None) -> list[int] | None:
    """SLURM's tasks-per-node list (`2(x2)`, `3,1`, `2(x2),1`) expanded to one count per node."""
    if not text:
        return None
    counts: list[int] = []
    for part in text.split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if found is None:
            return None
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


def hostnames(text: str | None) -> list[str]:
    """A SLURM host list (`tpnode[1-2]`, `tpnode1,tpnode2`, `tpnode2`) expanded, enough for this test cluster."""
    if not text:
        return []
    hosts: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", text):
        if plain:
            hosts.append(plain)
            continue
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            for number in range(int(low), int(high or low) + 1):
                hosts.append(f"{prefix}{number:0{len(low)}d}")
    return hosts


def readings(env: Mapping[str, str]) -> Json:
    """Every launcher's own statement about this process, as read from the variables it set."""
    found: Json = {}
    if "TORCHELASTIC_RUN_ID" in env or {"RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK"} <= set(env):
        found["torchrun"] = {
            "world_size": _int(env, "WORLD_SIZE"),
            "global_rank": _int(env, "RANK"),
            "local_rank": _int(env, "LOCAL_RANK"),
            "local_world_size": _int(env, "LOCAL_WORLD_SIZE"),
            "node_rank": _int(env, "GROUP_RANK"),
            "group_world_size": _int(env, "GROUP_WORLD_SIZE"),
        }
    if "OMPI_COMM_WORLD_SIZE" in env:
        found["openmpi"] = {
            "world_size": _int(env, "OMPI_COMM_WORLD_SIZE"),
            "global_rank": _int(env, "OMPI_COMM_WORLD_RANK"),
            "local_rank": _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
            "local_world_size": _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
            "job_id": env.get("OMPI_MCA_ess_base_jobid"),
        }
    if "PMI_SIZE" in env:
        found["pmi"] = {
            "world_size": _int(env, "PMI_SIZE"),
            "global_rank": _int(env, "PMI_RANK"),
            "local_rank": _int(env, "MPI_LOCALRANKID"),
            "local_world_size": _int(env, "MPI_LOCALNRANKS"),
        }
    if "SLURM_STEP_ID" in env:
        per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE"))
        node = _int(env, "SLURM_NODEID")
        found["slurm_step"] = {
            "world_size": _int(env, "SLURM_STEP_NUM_TASKS"),
            "global_rank": _int(env, "SLURM_PROCID"),
            "local_rank": _int(env, "SLURM_LOCALID"),
            "node_rank": node,
            "num_nodes": _int(env, "SLURM_STEP_NUM_NODES"),
            "tasks_per_node": per_node,
            "local_world_size": per_node[node] if per_node and node is not None and node < len(per_node) else None,
            "nodes": hostnames(env.get("SLURM_STEP_NODELIST")),
            "step_id": env.get("SLURM_STEP_ID"),
        }
    if "SLURM_JOB_ID" in env:
        shape = "task" if "SLURM_STEP_ID" in env else "batch" if "SLURM_PROCID" in env else "allocation-shell"
        found["slurm_job"] = {
            "job_id": env.get("SLURM_JOB_ID"),
            "job_name": env.get("SLURM_JOB_NAME"),
            "shape": shape,
            "ntasks": _int(env, "SLURM_NTASKS"),
            "nnodes": _int(env, "SLURM_NNODES"),
            "tasks_per_node": tasks_per_node(env.get("SLURM_TASKS_PER_NODE")),
            "nodes": hostnames(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")),
            "node_name": env.get("SLURMD_NODENAME"),
            "pty": "SLURM_PTY_PORT" in env,
        }
    return found


def truth(found: Json, env: Mapping[str, str]) -> Json:
    """The innermost launcher's statement: torchrun over MPI over SLURM's step; MPICH's PMI that restates the SLURM
    step's world (srun's own PMI plugin) is SLURM's. MPI states no node rank (None)."""
    step = found.get("slurm_step")
    if "torchrun" in found:
        chosen, launcher = dict(found["torchrun"]), "torchrun"
    elif "openmpi" in found:
        chosen, launcher = {**found["openmpi"], "node_rank": None}, "openmpi"
    elif "pmi" in found and not (
        step is not None
        and (step["world_size"], step["global_rank"]) == (found["pmi"]["world_size"], found["pmi"]["global_rank"])
    ):
        chosen, launcher = {**found["pmi"], "node_rank": None}, "mpich"
    elif step is not None:
        chosen, launcher = dict(step), "slurm"
    else:
        return {"launcher": None}
    chosen.pop("job_id", None)
    return {
        "launcher": launcher,
        **chosen,
        "master_addr": env.get("MASTER_ADDR"),
        "master_port": _int(env, "MASTER_PORT"),
    }


# -- the request ---------------------------------------------------------------------------------------------------


def _request_fields() -> dict[str, object]:
    fields: dict[str, object] = {}
    devices = os.environ.get("PROBE_DEVICES")
    if devices:
        fields["devices"] = int(devices) if devices.lstrip("-").isdigit() else devices
    nodes = os.environ.get("PROBE_NODES")
    if nodes:
        fields["num_nodes"] = int(nodes) if nodes.isdigit() else nodes
    cluster = os.environ.get("PROBE_CLUSTER")
    if cluster:
        fields["cluster"] = cluster
    return fields


def _refusal(error: BaseException, stage: str) -> Json:
    return {
        "stage": stage,
        "type": type(error).__name__,
        "rule": getattr(error, "rule", None),
        "variable": getattr(error, "variable", None),
        "message": str(error),
        "torch_loaded": "torch" in sys.modules,
    }


def _cluster_facts(plan: Any) -> Json:
    cluster = plan.cluster
    return {
        "cluster": str(cluster.kind),
        "launcher": str(plan.launcher),
        "creates_processes": cluster.creates_processes,
        "world_size": plan.world_size,
        "num_nodes": plan.num_nodes,
        "processes_per_node": plan.processes_per_node,
        "global_rank": cluster.global_rank,
        "local_rank": cluster.local_rank,
        "node_rank": cluster.node_rank,
        "main_address": cluster.main_address,
        "main_port": cluster.main_port,
        "strategy": str(plan.strategy.name),
        "backend": plan.process_group_backend,
        "notes": [{"code": note.code, "level": str(note.level), "message": note.message} for note in plan.notes],
    }


# -- Lightning's verdict -------------------------------------------------------------------------------------------


def lightning_verdict() -> Json:
    """What Lightning 2.x makes of this process: the cluster environment Fabric's connector picks (its own
    `_choose_and_init_cluster_environment`, so its order: TorchElastic > SLURM > LSF > MPI > Lightning) and what that
    environment says, or the error it raises. The environment is restored afterwards (Lightning writes MASTER_ADDR
    and MASTER_PORT into it)."""
    import importlib.util
    import warnings

    saved = dict(os.environ)
    verdict: Json = {"mpi4py": importlib.util.find_spec("mpi4py") is not None}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from lightning_fabric import __version__ as version
            from lightning_fabric.connector import _Connector
            from lightning_fabric.plugins import environments

            verdict["version"] = version
            order = [
                environments.TorchElasticEnvironment,
                environments.SLURMEnvironment,
                environments.LSFEnvironment,
                environments.MPIEnvironment,
            ]
            verdict["detected"] = [kind.__name__ for kind in order if kind.detect()]
            if not verdict["mpi4py"]:
                verdict["mpi_note"] = "MPIEnvironment.detect() is False: mpi4py is not installed"
            holder = type("Flags", (), {"_cluster_environment_flag": None})()
            try:
                chosen = _Connector._choose_and_init_cluster_environment(holder)
            except Exception as error:
                verdict["error"] = {"type": type(error).__name__, "message": str(error).strip()}
                return verdict
            verdict["environment"] = type(chosen).__name__
            verdict["world_size"] = chosen.world_size()
            verdict["global_rank"] = chosen.global_rank()
            verdict["local_rank"] = chosen.local_rank()
            verdict["node_rank"] = chosen.node_rank()
            verdict["main_address"] = chosen.main_address
            verdict["main_port"] = chosen.main_port
    except Exception as error:
        verdict["error"] = {"type": type(error).__name__, "message": str(error).strip()}
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return verdict


# -- the world -----------------------------------------------------------------------------------------------------


def run_world(tp: Any, plan: Any) -> int:
    """Join, all-reduce, sync metrics; the exit code."""
    joined = time.monotonic()
    stage = "import"
    try:
        import torch
        from torch import distributed

        stage = "join"
        with tp.join(plan) as world:
            rank, size = world.rank, world.world_size
            stage = "all_reduce"
            tensor = torch.tensor([float(rank + 1)])
            distributed.all_reduce(tensor)
            reduced = float(tensor.item())
            # Who is in this world: each rank's job (its parent's pid, and the job tag its command was given), so
            # that a test sees two jobs' ranks that met in one world, which the sums alone cannot show.
            peers: list[object] = [None] * size
            distributed.all_gather_object(peers, [os.getppid(), os.environ.get("PROBE_JOB_TAG")])
            stage = "metrics"
            store = tp.metric_store(plan)
            store.log("loss", float(rank + 1), weight=rank + 1)
            store.log("tokens", 10 * (rank + 1), reduce="sum")
            values = store.compute()
    except Exception as error:
        emit("failed", join_seconds=round(time.monotonic() - joined, 3), **_refusal(error, stage))
        return EXIT_FAILED
    expected_sum = size * (size + 1) / 2
    weights = size * (size + 1) // 2
    expected_loss = sum((r + 1) * (r + 1) for r in range(size)) / weights
    expected_tokens = 5 * size * (size + 1)
    exact = reduced == expected_sum and values.get("loss") == expected_loss and values.get("tokens") == expected_tokens
    emit(
        "world",
        rank=rank,
        world_size=size,
        peers=peers,
        all_reduce=reduced,
        expected_all_reduce=expected_sum,
        metrics=values,
        expected_metrics={"loss": expected_loss, "tokens": expected_tokens},
        exact=exact,
        join_seconds=round(time.monotonic() - joined, 3),
    )
    return 0 if exact else EXIT_WRONG


def main() -> int:
    import trainplan as tp

    env = dict(os.environ)
    found = readings(env)
    facts: Json = {
        "readings": found,
        "truth": truth(found, env),
        "host": socket.gethostname(),
        "node_name": env.get("SLURMD_NODENAME"),
        "marker": env.get("TRAINPLAN_CLUSTER_MARK"),
    }
    lightning = os.environ.get("PROBE_LIGHTNING") == "1"
    timeout = int(os.environ.get("PROBE_TIMEOUT") or 60)
    try:
        if os.environ.get("PROBE_REQUEST") == "carried":
            plan = tp.resolve()
        else:
            plan = tp.resolve(tp.Request(**_request_fields()))  # type: ignore[arg-type]  # the knobs' values
    except tp.TrainplanError as error:
        emit("refused", **_refusal(error, "resolve"), **facts)
        if lightning:
            emit("environment", variables=env)
        return EXIT_REFUSED
    if plan.world_size > 1:
        # The same request with a bounded join: the DDP family's timeout (the plan is otherwise the same).
        import attrs

        try:
            bounded = tp.resolve(
                attrs.evolve(plan.request, strategy_options=tp.DDPOptions(timeout_seconds=timeout)),
            )
        except tp.TrainplanError as error:
            emit("failed", **_refusal(error, "timeout"), **facts)
            return EXIT_FAILED
        if bounded.cluster != plan.cluster or bounded.world_size != plan.world_size:
            emit("failed", stage="timeout", type="Different", message="the bounded plan differs", **facts)
            return EXIT_FAILED
        plan = bounded
    emit("plan", **_cluster_facts(plan), timeout=timeout, **facts)
    if lightning:
        emit("environment", variables=env)
    sleep = float(os.environ.get("PROBE_SLEEP") or 0)
    if sleep:
        time.sleep(sleep)
    exit_code = os.environ.get("PROBE_EXIT")
    exit_rank = os.environ.get("PROBE_EXIT_RANK")
    rank = facts["truth"].get("global_rank")
    if exit_code and (exit_rank is None or str(rank) == exit_rank):
        emit("exit", code=int(exit_code), rank=rank)
        return int(exit_code)
    if plan.world_size == 1:
        return 0  # one process: nothing to join (and no torch to import)
    delay_rank = os.environ.get("PROBE_JOIN_DELAY_RANK")
    if delay_rank is not None and str(rank) == delay_rank:
        time.sleep(float(os.environ.get("PROBE_JOIN_DELAY") or 0))  # joins late: another job's ranks come first
    return run_world(tp, plan)


def lightning_verdicts(environments: list[dict[str, str]]) -> list[Json]:
    """Lightning's verdict in each of `environments` (each set as this process's whole environment in turn)."""
    saved = dict(os.environ)
    verdicts = []
    try:
        for environment in environments:
            os.environ.clear()
            os.environ.update(environment)
            verdicts.append(lightning_verdict())
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return verdicts


if __name__ == "__main__":
    if sys.argv[1:] == ["--lightning"]:
        print(json.dumps(lightning_verdicts(json.load(sys.stdin)), default=str))
        sys.exit(0)
    sys.exit(main())
