"""Emitters: each emitted form, parsed back into the environment it creates, resolves to the same layout."""

from __future__ import annotations

import re
import shlex

import pytest

from trainplan import DDPOptions, Environment, Plan, Request
from trainplan.resolve import resolve
from trainplan.resolve.emit import emit_slurm, emit_torchrun, slurm_worker_line
from trainplan.spec.plan import request_from_json_text

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


def _torchrun_options(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """torchrun's `--key=value` options (and `--standalone`) and the command after them."""
    options: dict[str, str] = {}
    index = 1
    while index < len(words) and words[index].startswith("--"):
        key, _, value = words[index][2:].partition("=")
        options[key] = value
        index += 1
    return options, words[index:]


def _worker_variables(nodes: int, per_node: int, address: str) -> dict[str, str]:
    """What torchrun gives the last worker of the last node."""
    return {
        "RANK": str(nodes * per_node - 1),
        "LOCAL_RANK": str(per_node - 1),
        "GROUP_RANK": str(nodes - 1),
        "LOCAL_WORLD_SIZE": str(per_node),
        "WORLD_SIZE": str(nodes * per_node),
        "MASTER_ADDR": address,
        "MASTER_PORT": "29400",
        "TORCHELASTIC_RUN_ID": "4242",
    }


@pytest.mark.parametrize("name", list(PLANS))
def test_slurm_script_parses_back_to_the_same_plan(name: str) -> None:
    request, env = PLANS[name]
    plan = resolve(request, env)
    script = emit_slurm(plan, ["train.py", "--lr", "0.1"])
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)$", script, flags=re.MULTILINE))
    assert directives["ntasks-per-node"] == "1", "one srun task per node runs torchrun"
    words = shlex.split(slurm_worker_line(script).removeprefix("bash -c ").strip("'").split("exec ")[-1])
    options, command = _torchrun_options(words)
    assert words[0] == "torchrun" and command == ["train.py", "--lr", "0.1"]
    nodes, per_node = int(directives["nodes"]), int(options["nproc-per-node"])
    assert int(options["nnodes"]) == nodes
    if nodes == 1:
        assert "standalone" in options
    else:
        assert options["rdzv-backend"] == "c10d" and options["rdzv-endpoint"] == "$MASTER_ADDR:$MASTER_PORT"
    gpus = int(directives.get("gpus-per-node", 0))
    assert gpus >= len(plan.devices) if plan.accelerator == "cuda" else gpus == 0
    # A worker torchrun started inside the allocation: torchrun's variables beside SLURM's; everything 'auto'.
    slurm_task = {
        "SLURM_NTASKS": str(nodes),
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_NNODES": str(nodes),
        "SLURM_PROCID": str(nodes - 1),
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(nodes - 1),
        "SLURM_JOB_NAME": directives["job-name"],
        "SLURM_JOB_ID": "4242",
        "SLURM_NODELIST": f"node[1-{nodes}]",
    }
    worker = {**slurm_task, **_worker_variables(nodes, per_node, "node1")}
    inside = resolve(
        Request(accelerator=request.accelerator),
        Environment(
            cuda_device_count=len(plan.devices) if plan.accelerator == "cuda" else 0, cpu_count=8, variables=worker
        ),
    )
    same_layout(inside, plan)
    assert inside.cluster.kind == "torchelastic" and inside.cluster.global_rank == plan.world_size - 1


@pytest.mark.parametrize("name", list(PLANS))
def test_torchrun_line_parses_back_to_the_same_plan(name: str) -> None:
    request, env = PLANS[name]
    plan = resolve(request, env)
    words = shlex.split(emit_torchrun(plan, ["train.py"]))
    assignments = {}
    while "=" in words[0]:
        key, value = words.pop(0).split("=", 1)
        assignments[key] = value
    visible = assignments.get("CUDA_VISIBLE_DEVICES")
    if plan.accelerator == "cuda":
        assert visible == ",".join(plan.physical_devices)
    options, command = _torchrun_options(words)
    assert words[0] == "torchrun" and command == ["train.py"]
    nodes, per_node = int(options["nnodes"]), int(options["nproc-per-node"])
    if nodes == 1:
        assert "standalone" in options and "master-port" not in options, "one node: a free port every run"
    else:
        assert options["rdzv-backend"] == "c10d"
        address = plan.cluster.main_address
        assert options["rdzv-endpoint"].startswith("${MASTER_ADDR:?" if address == "127.0.0.1" else f"{address}:")
    worker_env = Environment(
        cuda_device_count=len(visible.split(",")) if visible else 0,
        cpu_count=8,
        variables=_worker_variables(nodes, per_node, "node0"),
    )
    inside = resolve(Request(accelerator=request.accelerator), worker_env)
    same_layout(inside, plan)
    assert inside.cluster.kind == "torchelastic"


def test_several_nodes_without_a_port_stop_the_shell_with_a_message() -> None:
    plan = resolve(Request(accelerator="cpu", devices=2, num_nodes=2), Environment(cpu_count=4))
    line = emit_torchrun(plan)
    assert "${MASTER_PORT:?export the same free MASTER_PORT on every node}" in line
    assert "${MASTER_ADDR:?" in line


def test_a_spawn_strategy_is_emitted_as_its_script_counterpart_with_a_note() -> None:
    plan = resolve(Request(accelerator="cpu", strategy="ddp_spawn", devices=2), Environment(cpu_count=4))
    for text in (emit_torchrun(plan), emit_slurm(plan)):
        assert "# note: strategy='ddp_spawn' starts its workers from a function" in text
        assert "strategy='ddp'" in text


def test_the_request_beyond_the_layout_travels_with_the_job() -> None:
    options = DDPOptions(timeout_seconds=5)
    request = Request(accelerator="cpu", devices=2, precision="bf16-mixed", strategy_options=options)
    plan = resolve(request, Environment(cpu_count=4))
    line = shlex.split(emit_torchrun(plan, ["train.py"]))
    carried = dict(word.split("=", 1) for word in line if word.startswith("TRAINPLAN_REQUEST="))
    assert request_from_json_text(carried["TRAINPLAN_REQUEST"]) == plan.request
    assert "export TRAINPLAN_REQUEST=" in emit_slurm(plan)
    plain = resolve(Request(devices=2), Environment(cuda_device_count=2))
    assert "TRAINPLAN_REQUEST" not in emit_torchrun(plain) + emit_slurm(plain), "a layout alone travels as itself"


def test_code_given_with_dash_c_runs_through_the_interpreter() -> None:
    plan = resolve(Request(accelerator="cpu", devices=2), Environment(cpu_count=4))
    assert emit_torchrun(plan, ["-c", "print(1)"]).endswith("--no-python python -c 'print(1)'")


def test_the_scripts_own_words_are_never_expanded_by_the_shell() -> None:
    plan = resolve(Request(accelerator="cpu", devices=2, num_nodes=2), Environment(cpu_count=4))
    line = emit_torchrun(plan, ["train.py", "--p", "cost$HOME", "--t", "`echo pwned`$"])
    assert "'cost$HOME'" in line and "'`echo pwned`$'" in line
    assert shlex.split(line)[-4:] == ["--p", "cost$HOME", "--t", "`echo pwned`$"]


def test_interpreter_options_run_through_the_interpreter() -> None:
    plan = resolve(Request(accelerator="cpu", devices=2), Environment(cpu_count=4))
    assert emit_torchrun(plan, ["-u", "train.py"]).endswith("--no-python python -u train.py")


def test_the_carried_request_leaves_the_cluster_to_the_job() -> None:
    plan = resolve(Request(accelerator="cpu", devices=2, cluster="local", precision="bf16-mixed"), Environment())
    carried = dict(word.split("=", 1) for word in shlex.split(emit_torchrun(plan)) if "TRAINPLAN_REQUEST=" in word)
    assert request_from_json_text(carried["TRAINPLAN_REQUEST"]).cluster == "auto"
