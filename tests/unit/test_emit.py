"""Emitters: each emitted form, parsed back into the environment it creates, resolves to the same layout."""

from __future__ import annotations

import re
import shlex
import subprocess
from typing import Any

import pytest
import yaml

from trainplan import DDPOptions, Environment, Incompatible, InvalidRequest, Plan, Request
from trainplan.cli import main
from trainplan.parse.plan_json import request_from_json_text
from trainplan.render.emit import emit_kubeflow, emit_slurm, emit_torchrun, slurm_worker_line
from trainplan.resolve import resolve

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
        "SLURM_STEP_ID": "0",  # an srun task (the batch script and salloc's shell have none)
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
    if plan.accelerator == "cuda" and plan.devices == tuple(range(len(plan.devices))):
        assert visible is None, "a device count pins nothing: the node's own visible GPUs stay"
    elif plan.accelerator == "cuda":
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
    # The node's workers see the GPUs the line pins, or for a count the node's own (as many as the plan uses).
    seen = len(visible.split(",")) if visible else len(plan.devices) if plan.accelerator == "cuda" else 0
    worker_env = Environment(
        cuda_device_count=seen,
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


def srun_words(script: str, **variables: str) -> list[str]:
    """The words the batch shell passes to srun when it runs `script` (srun and scontrol are stand-ins that print
    their arguments and the first node's name), after the shell expanded them with `variables`."""
    shell = "srun() { printf '%s\\n' \"$@\"; }; scontrol() { echo node1; }; source /dev/stdin"
    environment = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-2]", **variables}
    result = subprocess.run(
        ["bash", "-c", shell], input=script, env=environment, capture_output=True, text=True, timeout=30, check=True
    )
    return result.stdout.splitlines()


@pytest.mark.parametrize("name", list(PLANS))
def test_the_sbatch_asks_for_a_cpu_per_worker_and_srun_passes_them_on(name: str) -> None:
    request, env = PLANS[name]
    plan = resolve(request, env)
    script = emit_slurm(plan, ["train.py"])
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)$", script, flags=re.MULTILINE))
    # One task per node runs all of the node's workers: SLURM would otherwise give it (and bind them to) one CPU.
    assert directives["cpus-per-task"] == str(plan.processes_per_node)
    assert "a CPU each" in script
    if plan.accelerator == "cuda":
        assert int(directives["gpus-per-node"]) >= len(plan.devices), "GPU jobs keep their GPUs"
    # srun does not inherit sbatch's --cpus-per-task (SLURM 22.05+): the line passes the batch job's on.
    words = srun_words(script, SLURM_CPUS_PER_TASK="8")
    assert words[:3] == ["--kill-on-bad-exit=1", "--ntasks-per-node=1", "--cpus-per-task=8"]
    alone = srun_words(script)  # the script run by hand, outside sbatch: the plan's own count
    assert alone[2] == f"--cpus-per-task={plan.processes_per_node}"
    assert slurm_worker_line(script).split()[0] in ("torchrun", "bash")


def test_a_failing_node_stops_the_others_and_the_script_says_whose_exit_code_the_job_has() -> None:
    plan = resolve(Request(accelerator="cpu", devices=2, num_nodes=2), Environment(cpu_count=4))
    script = emit_slurm(plan, ["train.py"])
    words = srun_words(script)
    assert "--kill-on-bad-exit=1" in words[: words.index("torchrun")], "srun stops every node when one fails"
    assert "# note: the job's exit code is not the failing worker's: torchrun's 1, or 137/143 for a node" in script
    assert "--kill-on-bad-exit" not in emit_torchrun(plan) and "# note" not in emit_torchrun(plan)


def test_the_sbatch_job_has_the_name_asked_for_and_only_a_slurm_job_name() -> None:
    plan = resolve(Request(accelerator="cpu", devices=2), Environment(cpu_count=4))
    assert re.findall(r"^#SBATCH --job-name=(.*)$", emit_slurm(plan), flags=re.MULTILINE) == ["train"]
    named = emit_slurm(plan, ["train.py"], name="llm-7b_v2.1+x")
    assert re.findall(r"^#SBATCH --job-name=(.*)$", named, flags=re.MULTILINE) == ["llm-7b_v2.1+x"]
    hostile = ["", "my job", "a\n#SBATCH --nodes=99", "x;rm", "$(id)", "`id`", "a|b", "-x", ".x", "a" * 129, "naïve"]
    for name in hostile:
        with pytest.raises(InvalidRequest, match="a SLURM job name is letters, digits") as caught:
            emit_slurm(plan, name=name)
        assert "--job-name train-llm" in str(caught.value)


def test_the_cli_names_the_sbatch_job(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["plan", "--no-probe", "--assume", "cpu=4", "--accelerator", "cpu", "--devices", "2"]
    assert main([*flags, "--emit", "slurm", "--job-name", "llm", "--", "train.py"]) == 0
    assert "\n#SBATCH --job-name=llm\n" in capsys.readouterr().out
    assert main([*flags, "--emit", "slurm", "--", "train.py"]) == 0
    assert "\n#SBATCH --job-name=train\n" in capsys.readouterr().out
    refusals = {
        ("--emit", "slurm", "--job-name", "my job", "--", "train.py"): "a SLURM job name is letters, digits",
        ("--emit", "torchrun", "--job-name", "llm", "--", "train.py"): "--emit torchrun has no job name to set",
        ("--job-name", "llm"): "a plan has no job name to set",
    }
    for arguments, message in refusals.items():
        with pytest.raises(SystemExit) as exited:
            main([*flags, *arguments])
        assert exited.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "--emit kubeflow and --emit slurm: the PyTorchJob's or the SLURM job's name" in " ".join(
        capsys.readouterr().out.split()
    )


# --------------------------------------------------------------------------------------------------
# Kubeflow: the manifest read back into the environment the training operator gives each pod


def operator_environment(manifest: dict[str, Any], replica: str, index: int) -> dict[str, str]:
    """What the Kubeflow training operator (kubeflow.org/v1, v1.7+) and the kubelet put in a pod's environment:
    the container's own env, then MASTER_ADDR/PORT (the master's service and its `pytorchjob-port`), WORLD_SIZE
    (pods × nprocPerNode), RANK (the pod's index: the master 0, worker i is i + 1), PET_* for torchrun, and
    the cluster's KUBERNETES_PORT."""
    spec = manifest["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    container = replicas[replica]["template"]["spec"]["containers"][0]
    master = replicas["Master"]["template"]["spec"]["containers"][0]
    (port,) = [entry["containerPort"] for entry in master["ports"] if entry["name"] == "pytorchjob-port"]
    pods = sum(int(entry["replicas"]) for entry in replicas.values())
    per_pod = int(spec["nprocPerNode"])
    rank = index + (1 if replica == "Worker" else 0)
    environment = {entry["name"]: entry["value"] for entry in container.get("env", [])}
    environment.update(
        PYTHONUNBUFFERED="1",
        MASTER_ADDR=f"{manifest['metadata']['name']}-master-0",
        MASTER_PORT=str(port),
        PET_MASTER_ADDR=f"{manifest['metadata']['name']}-master-0",
        PET_MASTER_PORT=str(port),
        WORLD_SIZE=str(pods * per_pod),
        RANK=str(rank),
        PET_NPROC_PER_NODE=str(per_pod),
        PET_NODE_RANK=str(rank),
        PET_NNODES=str(pods),
        KUBERNETES_PORT="tcp://10.96.0.1:443",
    )
    return environment


def kubelet_command(container: dict[str, Any], environment: dict[str, str]) -> list[str]:
    """The container's command with `$(VAR)` expanded from its environment, as the kubelet does: `$$` is one `$`
    (so `$$(X)` stays `$(X)`), and a reference to a variable the pod does not have is kept as written."""

    def expand(found: re.Match[str]) -> str:
        if found.group(0) == "$$":
            return "$"
        return environment.get(found.group(1), found.group(0))

    return [re.sub(r"\$\$|\$\((\w+)\)", expand, word) for word in container["command"]]


def pods(manifest: dict[str, Any]) -> list[tuple[str, int]]:
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    return [
        (kind, index)
        for kind in ("Master", "Worker")
        if kind in replicas
        for index in range(replicas[kind]["replicas"])
    ]


KUBEFLOW_PLANS = {
    "cpu, one process per pod, 3 pods": (Request(accelerator="cpu", num_nodes=3), Environment(cpu_count=8)),
    "4 gpus per pod, 2 pods, bf16": (
        Request(devices=4, num_nodes=2, precision="bf16-mixed"),
        Environment(cuda_device_count=4),
    ),
    "one gpu per pod, 2 pods": (Request(devices=1, num_nodes=2, strategy="ddp"), Environment(cuda_device_count=1)),
    "cpu, 2 processes, one pod": (Request(accelerator="cpu", devices=2), Environment(cpu_count=8)),
}


@pytest.mark.parametrize("name", list(KUBEFLOW_PLANS))
def test_the_kubeflow_manifest_resolves_the_same_layout_in_every_pod(name: str) -> None:
    request, env = KUBEFLOW_PLANS[name]
    plan = resolve(request, env)
    text = emit_kubeflow(plan, ["train.py", "--lr", "0.1"], image="ghcr.io/me/train:1.0", name="llm")
    manifest = yaml.safe_load(text)
    assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert len(pods(manifest)) == plan.num_nodes and manifest["spec"]["nprocPerNode"] == str(plan.processes_per_node)
    for kind, index in pods(manifest):
        container = manifest["spec"]["pytorchReplicaSpecs"][kind]["template"]["spec"]["containers"][0]
        assert container["name"] == "pytorch" and container["image"] == "ghcr.io/me/train:1.0"
        limits = container.get("resources", {}).get("limits", {})
        assert limits == ({"nvidia.com/gpu": str(len(plan.devices))} if plan.accelerator == "cuda" else {})
        pod = operator_environment(manifest, kind, index)
        command = kubelet_command(container, pod)
        gpus = len(plan.devices) if plan.accelerator == "cuda" else 0
        carried = pod.get("TRAINPLAN_REQUEST")
        inside_request = request_from_json_text(carried) if carried else Request()  # what tp.resolve() reads
        if plan.processes_per_node == 1:
            # The pod runs the script itself: trainplan detects the Kubeflow pod.
            assert command == ["python", "train.py", "--lr", "0.1"]
            inside = resolve(inside_request, Environment(cuda_device_count=gpus, cpu_count=8, variables=pod))
            same_layout(inside, plan)
            assert inside.cluster.kind == "kubeflow" and inside.cluster.global_rank == int(pod["RANK"])
            assert inside.precision == plan.precision and inside.strategy.name == plan.strategy.name
            continue
        # Several processes per pod: torchrun in the pod, its numbers from the operator's variables.
        options, script = _torchrun_options(command)
        assert command[0] == "torchrun" and script == ["train.py", "--lr", "0.1"]
        node, per_pod = int(options["node-rank"]), int(options["nproc-per-node"])
        assert (int(options["nnodes"]), per_pod) == (plan.num_nodes, plan.processes_per_node)
        assert node == int(pod["RANK"]) and options["master-addr"] == "llm-master-0"
        for local_rank in range(per_pod):
            worker = {  # torchrun's static rendezvous: the node rank as given, ranks node × per_pod + local
                **pod,
                "RANK": str(node * per_pod + local_rank),
                "LOCAL_RANK": str(local_rank),
                "GROUP_RANK": str(node),
                "LOCAL_WORLD_SIZE": str(per_pod),
                "WORLD_SIZE": str(plan.num_nodes * per_pod),
                "MASTER_ADDR": options["master-addr"],
                "MASTER_PORT": options["master-port"],
                "TORCHELASTIC_RUN_ID": "none",
            }
            inside = resolve(inside_request, Environment(cuda_device_count=gpus, cpu_count=8, variables=worker))
            same_layout(inside, plan)
            assert inside.cluster.kind == "torchelastic" and inside.global_rank == node * per_pod + local_rank
            assert inside.precision == plan.precision


def test_a_kubeflow_manifest_needs_an_image_a_kubernetes_name_and_cpus_or_nvidia_gpus() -> None:
    plan = resolve(Request(accelerator="cpu", num_nodes=2), Environment(cpu_count=8))
    for image in ("", "my image", "img\n- evil"):
        with pytest.raises(InvalidRequest, match="image="):
            emit_kubeflow(plan, image=image)
    for name in ("Train", "-x", "a" * 60, "x_y"):
        with pytest.raises(InvalidRequest, match="Kubernetes names"):
            emit_kubeflow(plan, image="img", name=name)
    mps = resolve(Request(accelerator="mps"), Environment(mps_available=True))
    with pytest.raises(Incompatible, match="schedules 'cpu' and 'cuda', not 'mps'") as caught:
        emit_kubeflow(mps, image="img")
    assert caught.value.rule == "kubeflow-accelerator"


def test_the_scripts_words_in_a_manifest_are_data_not_yaml() -> None:
    plan = resolve(Request(accelerator="cpu", num_nodes=2), Environment(cpu_count=8))
    words = ["train.py", "--note", 'a: "b"\n- c', "--x", "#not a comment", "--n", "3"]
    manifest = yaml.safe_load(emit_kubeflow(plan, words, image="img"))
    container = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", *words], "every word a string, exactly as given"


def test_a_manifest_keeps_the_scripts_dollar_words_refuses_no_script_and_says_it_cannot_choose_gpus() -> None:
    plan = resolve(Request(accelerator="cpu", num_nodes=2), Environment(cpu_count=8))
    words = ["train.py", "--tag", "$(RANK)-$(date)", "--cost", "$5"]
    manifest = yaml.safe_load(emit_kubeflow(plan, words, image="img"))
    for kind, index in pods(manifest):
        container = manifest["spec"]["pytorchReplicaSpecs"][kind]["template"]["spec"]["containers"][0]
        assert kubelet_command(container, operator_environment(manifest, kind, index)) == ["python", *words]
    with pytest.raises(InvalidRequest, match="none was named"):
        emit_kubeflow(plan, image="img")
    picked = resolve(Request(devices=[0, 2], strategy="ddp"), Environment(cuda_device_count=4))
    text = emit_kubeflow(picked, ["train.py"], image="img")
    assert "the plan chose GPUs 0, 2 by index; a pod cannot choose physical GPUs" in text
    assert yaml.safe_load(text)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0][
        "resources"
    ] == {"limits": {"nvidia.com/gpu": "2"}}
    assert "by index" not in emit_kubeflow(
        resolve(Request(devices=2), Environment(cuda_device_count=4)), ["t.py"], image="i"
    )


def test_a_pytorchjob_meets_on_the_plans_port_else_on_the_training_operators_default() -> None:
    def ports(plan: Plan) -> set[int]:
        manifest = yaml.safe_load(emit_kubeflow(plan, ["train.py"], image="img"))
        return {
            entry["containerPort"]
            for kind, _ in pods(manifest)
            for entry in manifest["spec"]["pytorchReplicaSpecs"][kind]["template"]["spec"]["containers"][0]["ports"]
            if entry["name"] == "pytorchjob-port"
        }

    # The Kubeflow training operator's default master port is 23456 (its `pytorchjob-port`).
    assert ports(resolve(Request(accelerator="cpu", num_nodes=2), Environment(cpu_count=8))) == {23456}
    given = Environment(cpu_count=8, variables={"MASTER_PORT": "29600"})
    assert ports(resolve(Request(accelerator="cpu", num_nodes=2), given)) == {29600}


def _through_the_operators_models(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest read into the Kubeflow training operator's own PyTorchJob model (its SDK, generated from the
    operator's API; required fields and types checked) and written back: a key it does not know is dropped."""
    import json as json_module

    api_client = pytest.importorskip("kubeflow.training.api_client")

    class Response:
        data = json_module.dumps(manifest)

    client = api_client.ApiClient()
    job = client.deserialize(Response(), "KubeflowOrgV1PyTorchJob")
    written: dict[str, Any] = client.sanitize_for_serialization(job)
    return written


@pytest.mark.parametrize("name", list(KUBEFLOW_PLANS))
def test_the_kubeflow_manifest_is_what_the_operators_own_models_read(name: str) -> None:
    request, env = KUBEFLOW_PLANS[name]
    plan = resolve(request, env)
    words = ["train.py", "--lr", "0.1"]
    documents = list(yaml.safe_load_all(emit_kubeflow(plan, words, image="ghcr.io/me/train:1.0", name="llm")))
    assert len(documents) == 1
    assert _through_the_operators_models(documents[0]) == documents[0], "every key is one the operator's API has"


def test_the_operators_models_would_catch_a_misspelt_key() -> None:
    plan = resolve(*KUBEFLOW_PLANS[next(iter(KUBEFLOW_PLANS))])
    manifest = yaml.safe_load(emit_kubeflow(plan, ["train.py"], image="img"))
    manifest["spec"]["pytorchReplicaSpec"] = manifest["spec"].pop("pytorchReplicaSpecs")
    with pytest.raises(ValueError, match="pytorch_replica_specs"):
        _through_the_operators_models(manifest)
    manifest = yaml.safe_load(emit_kubeflow(plan, ["train.py"], image="img"))
    manifest["spec"]["runPolicy"]["cleanupPolicy"] = "All"
    assert _through_the_operators_models(manifest) != manifest


def test_the_manifest_carries_characters_beyond_the_basic_plane_as_yaml_reads_them() -> None:
    # JSON's surrogate pair (\ud83d\ude00) reads back in YAML as two lone surrogates: YAML's \U escape is used.
    plan = resolve(*KUBEFLOW_PLANS[next(iter(KUBEFLOW_PLANS))])
    command = ["train.py", "é ü 中 😀", "\u2028", "\x7f"]
    text = emit_kubeflow(plan, command, image="img")
    assert all(line.isascii() for line in text.splitlines() if not line.startswith("#")), "the document is ASCII"
    (manifest,) = yaml.safe_load_all(text)
    container = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["command"][-len(command) :] == command


@pytest.mark.parametrize("form", ["torchrun", "slurm", "kubeflow"])
def test_an_emitted_job_needs_the_script_it_runs(capsys: pytest.CaptureFixture[str], form: str) -> None:
    """`--emit torchrun` without a script printed a job that ran `train.py`, a name the user never wrote."""
    image = ["--image", "img"] if form == "kubeflow" else []
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--no-probe", "--assume", "cpu=2", "--accelerator", "cpu", "--emit", form, *image])
    error = capsys.readouterr().err
    assert exited.value.code == 2 and "after --, e.g. trainplan plan --emit" in error and "-- train.py" in error


def test_a_word_that_is_not_utf8_is_emitted_as_its_own_bytes_or_refused_for_a_pod() -> None:
    """`-- train.py $'\\xff'`: the operating system gives the byte as a surrogate escape; the CLI wrote it as the six
    characters '\\udcff', so the emitted job ran a different argument, silently."""
    import sys

    for emit in ("torchrun", "slurm"):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "trainplan",
                "plan",
                "--accelerator",
                "cpu",
                "--emit",
                emit,
                "--",
                "train.py",
                b"\xff",
            ],
            capture_output=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert b"train.py '\xff'" in result.stdout and b"udcff" not in result.stdout
    with pytest.raises(InvalidRequest, match="not UTF-8") as refused:
        emit_kubeflow(resolve(Request(accelerator="cpu"), Environment(cpu_count=2)), ["train.py", "\udcff"], image="i")
    assert refused.value.fix == "Rename the file or write the argument in UTF-8 text"
