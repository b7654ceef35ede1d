"""Emitters: each emitted form, parsed back into the environment it creates, resolves to the same layout."""

from __future__ import annotations

import re
import shlex

import pytest

from trainplan import Environment, Plan, Request
from trainplan.resolve import resolve
from trainplan.resolve.emit import emit_slurm, emit_torchrun

PLANS = {
    "one node, 4 gpus": (Request(devices=4), Environment(cuda_device_count=4)),
    "two nodes, 2 of 4 gpus": (Request(devices=[1, 3], num_nodes=2), Environment(cuda_device_count=4)),
    "cpu, 3 processes, 2 nodes": (
        Request(accelerator="cpu", devices=3, num_nodes=2),
        Environment(cpu_count=8, variables={"MASTER_ADDR": "head"}),
    ),
}


def same_layout(emitted: Plan, original: Plan) -> None:
    assert (emitted.num_nodes, emitted.processes_per_node, emitted.world_size) == (
        original.num_nodes,
        original.processes_per_node,
        original.world_size,
    )
    assert (emitted.accelerator, emitted.strategy.family, emitted.process_group_backend) == (
        original.accelerator,
        original.strategy.family,
        original.process_group_backend,
    )
    assert emitted.launcher == "external" and emitted.cluster.creates_processes


@pytest.mark.parametrize("name", list(PLANS))
def test_slurm_script_parses_back_to_the_same_plan(name: str) -> None:
    request, env = PLANS[name]
    plan = resolve(request, env)
    script = emit_slurm(plan, ["train.py", "--lr", "0.1"])
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)$", script, flags=re.MULTILINE))
    assert script.splitlines()[-1] == "srun python train.py --lr 0.1"
    nodes, per_node = int(directives["nodes"]), int(directives["ntasks-per-node"])
    gpus = int(directives.get("gpus-per-node", 0))
    if plan.accelerator == "cuda":
        assert gpus == len(plan.devices)
    last_task = {
        "SLURM_NTASKS": str(nodes * per_node),
        "SLURM_NTASKS_PER_NODE": str(per_node),
        "SLURM_NNODES": str(nodes),
        "SLURM_PROCID": str(nodes * per_node - 1),
        "SLURM_LOCALID": str(per_node - 1),
        "SLURM_NODEID": str(nodes - 1),
        "SLURM_JOB_NAME": directives["job-name"],
        "SLURM_JOB_ID": "4242",
        "SLURM_NODELIST": f"node[1-{nodes}]",
    }
    task_env = Environment(cuda_device_count=gpus, cpu_count=8, variables=last_task)
    # Inside the allocation the GPUs are renumbered from 0, so the request counts them.
    task_request = Request(accelerator=request.accelerator, devices=per_node, num_nodes=nodes)
    emitted = resolve(task_request, task_env)
    same_layout(emitted, plan)
    assert emitted.cluster.global_rank == plan.world_size - 1 and emitted.cluster.main_address == "node1"


@pytest.mark.parametrize("name", list(PLANS))
def test_torchrun_line_parses_back_to_the_same_plan(name: str) -> None:
    request, env = PLANS[name]
    plan = resolve(request, env)
    words = shlex.split(emit_torchrun(plan, ["train.py"]))
    visible = None
    if words[0].startswith("CUDA_VISIBLE_DEVICES="):
        visible = words.pop(0).split("=", 1)[1]
        assert visible == ",".join(str(index) for index in plan.devices)
    assert words[0] == "torchrun" and words[-1] == "train.py"
    substitutions = {"${NODE_RANK}": "1", "${MASTER_ADDR}": "node0"}
    options = dict(substitutions.get(word, word)[2:].split("=", 1) for word in words[1:-1])
    options = {key: substitutions.get(value, value) for key, value in options.items()}
    nodes, per_node = int(options["nnodes"]), int(options["nproc-per-node"])
    torchrun_env = {
        "RANK": str(nodes * per_node - 1),
        "LOCAL_RANK": str(per_node - 1),
        "GROUP_RANK": str(nodes - 1),
        "LOCAL_WORLD_SIZE": str(per_node),
        "WORLD_SIZE": str(nodes * per_node),
        "MASTER_ADDR": options.get("master-addr", "127.0.0.1"),
        "MASTER_PORT": options["master-port"],
    }
    worker_env = Environment(
        cuda_device_count=len(visible.split(",")) if visible else 0, cpu_count=8, variables=torchrun_env
    )
    emitted = resolve(Request(accelerator=request.accelerator, devices=per_node, num_nodes=nodes), worker_env)
    same_layout(emitted, plan)
    assert emitted.cluster.kind == "torchelastic"
