"""Scaling out on existing engines: a plan written as a torchrun command line or a SLURM batch script.

Pure: text from a plan. The SLURM script's environment, once srun runs the tasks, is recognised by the
resolver as the same layout (a test parses each emitted form back and checks it against the plan).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from trainplan.spec.plan import Plan

DEFAULT_SCRIPT: tuple[str, ...] = ("train.py",)


def _script(command: Sequence[str]) -> str:
    return shlex.join(command or DEFAULT_SCRIPT)


def _python(command: Sequence[str]) -> str:
    command = tuple(command) or DEFAULT_SCRIPT
    if command[0].endswith(".py") or command[0] == "-m":
        return "python " + shlex.join(command)
    return shlex.join(command)


def emit_torchrun(plan: Plan, command: Sequence[str] = ()) -> str:
    """The torchrun command line that starts this plan's processes on one node (run it on every node)."""
    port = plan.cluster.main_port if plan.cluster.main_port is not None else 29500
    parts = [
        "torchrun",
        f"--nnodes={plan.num_nodes}",
        f"--nproc-per-node={plan.processes_per_node}",
    ]
    if plan.num_nodes > 1:
        address = plan.cluster.main_address
        if address in ("127.0.0.1", "localhost", "::1"):
            address = "${MASTER_ADDR}"  # the plan knows no shared address: the host of node 0, set on every node
        parts += ["--node-rank=${NODE_RANK}", f"--master-addr={address}"]
    parts.append(f"--master-port={port}")
    environment = ""
    if plan.accelerator == "cuda":
        environment = f"CUDA_VISIBLE_DEVICES={','.join(str(index) for index in plan.devices)} "
    return environment + " ".join(parts) + " " + _script(command)


def emit_slurm(plan: Plan, command: Sequence[str] = ()) -> str:
    """An sbatch script: nodes, tasks per node (one per process), GPUs per node, and the srun line."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --nodes={plan.num_nodes}",
        f"#SBATCH --ntasks-per-node={plan.processes_per_node}",
    ]
    if plan.accelerator == "cuda":
        lines.append(f"#SBATCH --gpus-per-node={len(plan.devices)}")
    lines.append("#SBATCH --job-name=train")
    lines += [
        "",
        "# One task per process; trainplan (or Lightning) reads SLURM_PROCID, SLURM_LOCALID and SLURM_NODEID,",
        "# and meets on the first node of SLURM_NODELIST at 15000 + the job id's last four digits.",
        f"srun {_python(command)}",
    ]
    return "\n".join(lines)
