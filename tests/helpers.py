"""Shared test helpers: environments written by hand, and one-line resolution."""

from __future__ import annotations

from collections.abc import Mapping

from trainplan import Environment, Plan, Request
from trainplan.resolve import resolve


def cuda(count: int, **facts: object) -> Environment:
    """A machine with `count` visible CUDA devices and a few CPUs."""
    return Environment(cuda_device_count=count, cpu_count=8, **facts)  # type: ignore[arg-type]


def cpu(**facts: object) -> Environment:
    """A CPU-only machine."""
    return Environment(cpu_count=8, **facts)  # type: ignore[arg-type]


def with_variables(env: Environment, variables: Mapping[str, str]) -> Environment:
    return env.with_variables(variables)


def plan_for(env: Environment, **request: object) -> Plan:
    """Resolve a request given as keyword arguments."""
    return resolve(Request(**request), env)  # type: ignore[arg-type]


SLURM_2x4 = {
    "SLURM_NTASKS": "8",
    "SLURM_NTASKS_PER_NODE": "4",
    "SLURM_NNODES": "2",
    "SLURM_PROCID": "5",
    "SLURM_STEP_ID": "0",  # an srun task (the batch script and salloc's shell have none)
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NAME": "train",
    "SLURM_JOB_ID": "1234567",
    "SLURM_NODELIST": "node[001-002]",
}

TORCHRUN_2x2 = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "GROUP_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "WORLD_SIZE": "4",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "abc",
}

LAUNCHED_1_OF_2 = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "2",
    "NODE_RANK": "0",
    "GROUP_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29555",
    "TRAINPLAN_LAUNCHED": "subprocess",
}
"""Worker 1 of 2 that trainplan's launcher started on one node (as `worker_environment` writes it)."""


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that is not ours counts as gone)."""
    from pathlib import Path

    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def child_environment(**extra: str) -> dict[str, str]:
    """This process's environment for a test's child, without any job's, launcher's or trainplan's variables (so
    the child resolves as a fresh command would), the project importable (this checkout's source), and `extra` on
    top."""
    import os
    from pathlib import Path

    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TRAINPLAN_", "SLURM_", "PET_", "TORCHELASTIC_", "MASTER_", "WORLD_", "RANK"))
        and key not in ("OMP_NUM_THREADS", "LOCAL_RANK", "NODE_RANK", "MYVAR")
    }
    root = Path(__file__).resolve().parents[1]
    # src first: a second checkout (a git worktree) sharing one editable install tests its own source.
    environment.update(PYTHONPATH=os.pathsep.join((str(root / "src"), str(root))), **extra)
    return environment


MULTI_NODE = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "0"}
"""What a node of a multi-node what-if states (its main address and rank)."""


def memory_world(count: int, device_bytes: int, host_bytes: int | None, **facts: object) -> Environment:
    """A node of `count` CUDA devices of `device_bytes` each and `host_bytes` of host memory, ready to be one of
    several."""
    return Environment(
        cuda_device_count=count,
        cuda_memory_bytes=(device_bytes,) * count,
        host_memory_bytes=host_bytes,
        variables=MULTI_NODE,
        **facts,  # type: ignore[arg-type]
    )


def ways_out(message: str, request: Request, env: Environment) -> dict[str, tuple[Request, Environment]]:
    """Each change a `memory-nothing-fits` refusal's "To fit it" names, as the request and node it describes (by the
    numbers the message prints), keyed by the kind of change: nodes, devices a node, host memory, device memory,
    the biggest model."""
    import re

    import attrs

    from trainplan.resolve.memory import smaller_model

    fix = message.split("To fit it: ", 1)[1]
    count, device = env.cuda_device_count, env.cuda_memory_bytes[0]
    nodes = request.num_nodes if isinstance(request.num_nodes, int) else 1
    found: dict[str, tuple[Request, Environment]] = {}
    if match := re.search(r"use (\d+) nodes like this one \(num_nodes=\1, (\d+) such device", fix):
        assert int(match.group(2)) == count
        found["nodes"] = attrs.evolve(request, num_nodes=int(match.group(1))), env
    if match := re.search(r"(\d+) such devices (on one node|a node on the (\d+) nodes)", fix):
        assert match.group(3) is None or int(match.group(3)) == nodes
        more = int(match.group(1))
        found["devices a node"] = request, attrs.evolve(env, cuda_device_count=more, cuda_memory_bytes=(device,) * more)
    if match := re.search(r"give each node (\d+) GiB of host memory", fix):
        found["host memory"] = request, attrs.evolve(env, host_memory_bytes=int(match.group(1)) << 30)
    if match := re.search(r"use devices of (\d+) GiB or more", fix):
        found["device memory"] = request, attrs.evolve(env, cuda_memory_bytes=(int(match.group(1)) << 30,) * count)
    if match := re.search(r"a model of at most ([\d,]+) parameters", fix):
        assert request.model is not None
        smaller = smaller_model(request.model, int(match.group(1).replace(",", "")))
        found["biggest model"] = attrs.evolve(request, model=smaller), env
    return found
