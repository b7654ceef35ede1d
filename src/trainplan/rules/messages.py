"""Incompatibility rules (the reason and fix of every refusal, as data) and the deliberate differences from PyTorch
Lightning's connector (each also stated in docs/migrating.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

import attrs

# The ids by topic, several to a line (kept as written: one a line would run to sixty).
# fmt: off
RefusalId = Literal[
    # strategies and their options
    "strategy-accelerator", "options-accelerator", "strategy-package", "strategy-nodes", "strategy-device-count",
    "strategy-options", "strategy-preset", "deepspeed-offload-stage", "option-framework",
    # launchers, backends, precisions
    "fork-unavailable", "fork-after-cuda", "interactive-launcher", "backend-accelerator", "backend-without-group",
    "precision-accelerator", "precision-strategy", "precision-package",
    # clusters and started jobs
    "cluster-world-size", "cluster-rank-range", "cluster-main-address", "cluster-one-process-per-node",
    "slurm-batch-step", "job-layout-unknown", "job-gpus", "job-device-selection", "nested-launch", "multi-node-port",
    # devices, old flags, emitted jobs, plans
    "usable-with-indices", "usable-needs-cuda", "legacy-conflict", "legacy-removed", "kubeflow-accelerator",
    "emit-unnamed-rules", "kubeflow-resource", "plan-rules", "sync-batchnorm-device", "metric-stateful-cpu",
    # frameworks
    "framework-accelerator", "framework-precision", "sync-batchnorm-framework", "accelerate-cpu-processes",
    "accelerate-main-address",
    "deepspeed-config", "deepspeed-count", "lightning-trainer-strategy", "lightning-strategy", "accelerate-precision",
    "accelerate-strategy", "lightning-mesh", "lightning-precision", "fabric-parallelize", "accelerate-mesh",
    "framework-checkpointing", "framework-checkpointing-blocks",
    # device meshes
    "mesh-product", "mesh-remainder", "mesh-autos", "mesh-spellings", "mesh-inside-node", "mesh-pipeline-nodes",
    "mesh-accelerator", "mesh-backend", "mesh-precision", "mesh-expert", "mesh-exclusive", "pipeline-virtual-stages",
    "pipeline-microbatches", "mesh-option-unused", "mesh-group-backend",
    # memory
    "memory-nothing-fits", "memory-strategy-too-big", "memory-precision",
]
"""Every refusal's id, a row of `RULES` each: the refusal helpers take one, so a type checker catches a misspelt id."""
# fmt: on


@attrs.frozen(kw_only=True)
class Rule:
    """A named rejection (its id is its key in `RULES`). `reason` and `fix` are templates filled with the values
    involved."""

    reason: str
    fix: str


RULES: Final[Mapping[RefusalId, Rule]] = {
    "strategy-accelerator": Rule(
        reason="strategy {strategy!r} runs on {supported}, not {accelerator!r}: {why}",
        fix="{fix}",
    ),
    "options-accelerator": Rule(
        reason=(
            "strategy='auto' with {options} chose strategy {strategy!r}, which runs on {supported}, not "
            "{accelerator!r}: {why}"
        ),
        fix="Drop strategy_options to run on {accelerator!r}, or keep them and use accelerator={supported}",
    ),
    "strategy-package": Rule(
        reason="strategy {strategy!r} needs the {package!r} package, which is not installed",
        fix="Install it (`pip install {package}`) or choose another strategy, e.g. strategy='ddp'",
    ),
    "strategy-nodes": Rule(
        reason="strategy {strategy!r} runs in a single process, which cannot span {num_nodes} nodes",
        fix="Use strategy='ddp' for several nodes, or num_nodes=1",
    ),
    "strategy-device-count": Rule(
        reason="strategy {strategy!r} drives exactly one device, but {count} devices were selected",
        fix="Use strategy='ddp' (or 'auto') for several devices, or select one device, e.g. devices=1",
    ),
    "strategy-options": Rule(
        reason="strategy_options of type {given} do not fit strategy {strategy!r}, which takes {expected}",
        fix="{fix}",
    ),
    "strategy-preset": Rule(
        reason="strategy {strategy!r} already sets {field}={preset!r}, but strategy_options say {field}={given!r}",
        fix="Use the base strategy {base!r} with strategy_options, or drop the conflicting option",
    ),
    "deepspeed-offload-stage": Rule(
        reason="DeepSpeed offloads parameters only at ZeRO stage 3, but stage {stage} was asked for",
        fix="Use DeepSpeedOptions(stage=3, offload_parameters=True), or offload_parameters=False",
    ),
    "option-framework": Rule(
        reason="{framework} cannot express {option}={value!r}: {why}",
        fix="Leave {option} at its default ({default!r}) to run with {framework}, or run the plan where the "
        "option reaches (its row in rules.options says where)",
    ),
    "fork-unavailable": Rule(
        reason="strategy {strategy!r} forks this process, and this platform offers only {methods}",
        fix="Use strategy={instead!r}",
    ),
    "fork-after-cuda": Rule(
        reason=(
            "strategy {strategy!r} forks this process, and CUDA is already initialised here; "
            "a forked child cannot use CUDA after that"
        ),
        fix=(
            "Use strategy={instead!r}, or make sure nothing touches CUDA before the fork "
            "(find_usable_cuda_devices() is safe: it never initialises CUDA)"
        ),
    ),
    "interactive-launcher": Rule(
        reason=(
            "strategy {strategy!r} would {launcher_description}, which an interactive session "
            "(notebook, REPL) cannot do"
        ),
        fix="Use strategy={instead!r}, or run the code as a script",
    ),
    "backend-accelerator": Rule(
        reason="process_group_backend={backend!r} cannot serve accelerator {accelerator!r}: {why}",
        fix="Use process_group_backend={instead!r} (the default for {accelerator!r}), or leave it unset",
    ),
    "backend-without-group": Rule(
        reason="strategy {strategy!r} runs one process and creates no process group, so a backend has no effect",
        fix="Remove process_group_backend, or use a multi-process strategy such as 'ddp'",
    ),
    "precision-accelerator": Rule(
        reason="precision={precision!r} is not available on accelerator {accelerator!r}: {why}",
        fix="Use precision={instead!r}",
    ),
    "precision-strategy": Rule(
        reason=(
            "precision={precision!r}{runs_as} is not supported by strategy {strategy!r}, which accepts {supported}"
        ),
        fix="Use one of {supported}",
    ),
    "precision-package": Rule(
        reason="precision={precision!r} needs the {package!r} package, which is not installed",
        fix="Install it (`pip install {package}`), or use precision='bf16-mixed'",
    ),
    "cluster-world-size": Rule(
        reason=(
            "{cluster} started {started} ({detail}), but the request asks for num_nodes={nodes} × "
            "{processes_per_node} processes per node = {world_size}"
        ),
        fix="{fix}",
    ),
    "cluster-rank-range": Rule(
        reason="{what} {value} is outside the plan's {limit_name} of {limit}",
        fix="{fix}",
    ),
    "cluster-main-address": Rule(
        reason="{cluster} spans {nodes} nodes ({detail}) but gives no main address for them to meet at",
        fix="{fix}",  # the cluster's own (`JobVariables.main_address_fix`): how its processes are given one
    ),
    "cluster-one-process-per-node": Rule(
        reason="{cluster} runs one process per pod, but {processes_per_node} processes per node were asked for",
        fix="Use devices=1 (one device per pod), and raise the number of pods (num_nodes) instead",
    ),
    "usable-with-indices": Rule(
        reason="select_usable_gpus picks GPUs itself, but devices={devices!r} already names them",
        fix="Give a count instead (devices=2), or drop select_usable_gpus and keep the indices",
    ),
    "usable-needs-cuda": Rule(
        reason="select_usable_gpus picks CUDA GPUs, but the accelerator is {accelerator!r}",
        fix="Use accelerator='cuda' (or 'gpu'), or drop select_usable_gpus",
    ),
    "legacy-conflict": Rule(
        reason="{first} and {second} both set {what}{how}",
        fix="Keep one of them: {fix}",
    ),
    "legacy-removed": Rule(
        reason="{reason}",
        fix="{fix}",
    ),
    "slurm-batch-step": Rule(
        reason=(
            "this process is the batch script of SLURM job {SLURM_JOB_ID} (SLURM_PROCID is set but not "
            "SLURM_STEP_ID), not one of the job's {tasks} tasks: nothing starts the others, so the world "
            "it would join never forms"
        ),
        fix=(
            "Start the script with srun inside the batch script (srun --kill-on-bad-exit=1 python train.py), or ask "
            "for one node and "
            "one task (#SBATCH --nodes=1 --ntasks=1) and let trainplan start the processes (trainplan launch "
            "train.py)"
        ),
    ),
    "job-layout-unknown": Rule(
        reason=(
            "{cluster} started {world_size} processes ({detail}) but does not say how many run on each node, so "
            "devices='auto' cannot take the job's layout"
        ),
        fix="Ask for the job's layout explicitly: devices=<processes per node>, num_nodes=<nodes>",
    ),
    "job-gpus": Rule(
        reason=(
            "{cluster} started {processes_per_node} processes on this node, one GPU each, but only {visible} "
            "GPU(s) are visible to this process"
        ),
        fix=(
            "Make every GPU the node's processes use visible to each of them (CUDA_VISIBLE_DEVICES, SLURM "
            "--gpus-per-node rather than --gpus-per-task), or start {visible} process(es) per node"
        ),
    ),
    "job-device-selection": Rule(
        reason=("this job was started on devices {selected} ({variable}), and devices={devices} names other ones"),
        fix="Write devices='auto' inside the job (it takes the job's GPUs), or devices={selected}",
    ),
    "nested-launch": Rule(
        reason=(
            "this process is rank {rank} of a world of {world} that {started_by} started, and the plan's "
            "launcher {launcher!r} would start {world_size} more workers from it: a second world inside the first"
        ),
        fix=(
            "Resolve the plan inside the job (trainplan.resolve() takes the job's layout, launcher 'external'); "
            "trainplan.launch then runs the function here, in the existing world"
        ),
    ),
    "multi-node-port": Rule(
        reason=(
            "num_nodes={num_nodes} with no main port: each node would choose its own free port, and the nodes "
            "would never meet"
        ),
        fix=(
            "Give every node the same main port and address: `trainplan launch --main-port 29500 --main-address "
            "node0`, or export MASTER_PORT=29500 and MASTER_ADDR on every node before launching"
        ),
    ),
    "kubeflow-accelerator": Rule(
        reason=(
            "a Kubeflow PyTorchJob's pods get their devices from Kubernetes, which schedules {supported}, not "
            "{accelerator!r}"
        ),
        fix="Plan for accelerator='cpu' or 'cuda' to emit a PyTorchJob, or use {accelerator!r}'s own launcher",
    ),
    "emit-unnamed-rules": Rule(
        reason=(
            "the plan was made from a rule set without a name, so the {job} could not import it: "
            "trainplan.resolve() inside the job would plan with trainplan's own rules"
        ),
        fix=(
            "Give the rule set the name it is importable as where it is built, "
            "extend(..., name='package.module:RULES'), and plan again"
        ),
    ),
    "kubeflow-resource": Rule(
        reason=(
            "accelerator {accelerator!r} is a row of {rules}, which names no Kubernetes resource for its devices, "
            "so a PyTorchJob's pods could not ask for them"
        ),
        fix=(
            "Name the resource its device plugin advertises: {rules_builder}.extend(kubernetes_resources="
            "{{{accelerator!r}: 'vendor.com/device'}}), or plan for accelerator='cpu' or 'cuda'"
        ),
    ),
    "framework-accelerator": Rule(
        reason=(
            "accelerator {accelerator!r} is a row of {rules}, which says nothing of how {framework} spells it: "
            "{framework} has no accelerator of that name unless a plugin registers one"
        ),
        fix=(
            "Add the spelling the plugin registers: {rules_builder}.extend(framework_accelerators=["
            "FrameworkAccelerator(accelerator={accelerator!r}, lightning=..., lightning_devices='indices', "
            "accelerate_cpu=False, accelerate_gpu_ids=False, accelerate_processes=True)]), or build "
            "{framework}'s arguments by hand"
        ),
    ),
    "framework-precision": Rule(
        reason=(
            "precision {precision!r} is a row of {rules}; {framework} has no precision of that name (its "
            "precision plugins are the built-in precisions)"
        ),
        fix=(
            "Run the plan's loop through trainplan.runtime, which reads the precision's recipe, or give "
            "{framework} your own precision plugin and plan with one of {supported} for the adapter"
        ),
    ),
    "plan-rules": Rule(
        reason=(
            "the plan was made from {plan_rules}, and the rules given here ({given}) have no row for its {what} "
            "{value!r}"
        ),
        fix="Pass the plan's own rule set as rules= ({how})",
    ),
    "sync-batchnorm-device": Rule(
        reason="torch's SyncBatchNorm synchronises batch statistics across CUDA devices only, not {accelerator!r}",
        fix="Drop sync_batchnorm (each process then normalises its own batch), or run on CUDA GPUs",
    ),
    "sync-batchnorm-framework": Rule(
        reason="{framework} has no sync_batchnorm setting, so the plan's sync_batchnorm=True would be lost",
        fix="Convert the model before handing it over: torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)",
    ),
    "accelerate-cpu-processes": Rule(
        reason="`accelerate launch` starts several CPU processes only through MPI (--mpirun_hostfile)",
        fix="Start the processes with trainplan launch or torchrun, and build the Accelerator inside each one",
    ),
    "accelerate-main-address": Rule(
        reason=(
            "`accelerate launch` on {nodes} nodes needs the host of node 0 (--main_process_ip), and the plan was made "
            "without one: every node would look for node 0 on its own loopback, 127.0.0.1"
        ),
        fix=(
            "Make the plan where the nodes' meeting point is known: export MASTER_ADDR=<the host of node 0>, "
            "MASTER_PORT=<a free port> and NODE_RANK on every node, or resolve inside the cluster's job (srun, a "
            "PyTorchJob)"
        ),
    ),
    "deepspeed-config": Rule(
        reason="only a DeepSpeed plan has a DeepSpeed config",
        fix="Resolve a plan with strategy='deepspeed' (or a deepspeed_stage_* preset)",
    ),
    "deepspeed-count": Rule(reason="{name} counts samples or steps", fix="Write {name}=1 or more"),
    "lightning-trainer-strategy": Rule(
        reason="Lightning's Trainer registers no {strategy_class} (only Fabric does)",
        fix="Run the plan with Fabric (trainplan.fabric_arguments(plan)), or use strategy={instead!r} with the Trainer",
    ),
    "lightning-strategy": Rule(
        reason="Lightning has no strategy for it (Lightning 2.0 removed DataParallel)",
        fix="Use strategy='ddp' (one process per GPU), which Lightning and trainplan both run",
    ),
    "accelerate-precision": Rule(
        reason="Accelerate has no mode that casts the whole model; its mixed_precision is no, fp16, bf16 or fp8",
        fix="Use precision='32-true' with Accelerate and cast the model yourself, or a '-mixed' precision",
    ),
    "accelerate-strategy": Rule(
        reason="{why}",
        fix="Use strategy={instead!r} with Accelerate",
    ),
    "memory-nothing-fits": Rule(
        reason=(
            "a model of {parameters} parameters fits no layout on {world} device(s) of {device} ({budget} each after "
            "the policy's {headroom} headroom): the closest, {closest}, takes {needed} per device ({breakdown}) and "
            "{verdict}"
        ),
        fix="{fix}",
    ),
    "memory-strategy-too-big": Rule(
        reason=(
            "strategy {strategy!r} will not fit: {needed} needed per rank{how} ({breakdown}), {budget} per device "
            "after the policy's {headroom} headroom"
        ),
        fix="{fix}",
    ),
    "memory-precision": Rule(
        reason=(
            "precision={precision!r} was asked for, but the model's facts were built for {facts!r}: their bytes a "
            "parameter, gradients, optimizer states and activations are {facts!r}'s, and no single factor turns "
            "them into another precision's (mixed precision keeps fp32 master weights, activations change width "
            "layer by layer)"
        ),
        fix=(
            "Build the facts for it (transformer_facts(..., precision={precision!r}); a measured module: build it "
            "in that precision's dtype), or leave precision unwritten to plan at the facts' {facts!r}"
        ),
    ),
    "mesh-product": Rule(
        reason=(
            "the parallel degrees multiply to {product} ({spelled}), but the world has {world_size} processes "
            "({layout})"
        ),
        fix=("Use degrees whose product is {world_size}, e.g. {fitting}, or leave one of them 'auto' to take the rest"),
    ),
    "mesh-remainder": Rule(
        reason=(
            "{auto}='auto' takes what the other degrees leave, but they multiply to {product} ({spelled}), which "
            "does not divide the world of {world_size} processes ({layout})"
        ),
        fix="Use degrees that divide {world_size}, e.g. {fitting}",
    ),
    "mesh-autos": Rule(
        reason="{names} say 'auto', but only one degree can take what the others leave",
        fix="Write numbers for all but one of them, e.g. {fitting}",
    ),
    "mesh-spellings": Rule(
        reason="Lightning's sizes ({lightning}) and trainplan's degrees ({degrees}) both describe the mesh",
        fix="Keep one spelling: {suggestion}",
    ),
    "mesh-inside-node": Rule(
        reason="{took}{what} needs {needed} processes on one node ({why}); {shortfall}",
        fix="Use {choices}, e.g. {fitting}",
    ),
    "mesh-pipeline-nodes": Rule(
        reason=(
            "{took}'auto' keeps pipeline stages on node boundaries, each stage holding whole nodes or sharing a "
            "node with whole stages, but {dimension}={degree} makes stages of {stage} processes on {num_nodes} "
            "nodes of {processes_per_node}"
        ),
        fix="Use {choices}, e.g. {fitting}",
    ),
    "mesh-accelerator": Rule(
        reason="{took}{dimension}={degree} does not run on {accelerator!r}: {why}",
        fix="Use {dimension}=1 there, e.g. {fitting}, or run on {supported}",
    ),
    "mesh-backend": Rule(
        reason=(
            "a device mesh on {accelerator!r} runs over {allowed!r}, the backend torch's FSDP2 and DTensor are "
            "built on, not {backend!r}"
        ),
        fix="Use process_group_backend={allowed!r}, or leave it unset",
    ),
    "mesh-precision": Rule(
        reason="{took}{dimension}={degree} does not run with precision={precision!r}: {why}",
        fix="Use precision={instead!r}, or {dimension}=1",
    ),
    "mesh-expert": Rule(
        reason=(
            "ep={ep} splits the experts over ranks borrowed from {region_names} = {region} ({region_spelled}), as "
            "torchtitan's ParallelDims does, and {ep} does not divide {region}"
        ),
        fix="Use ep={choices} (a divisor of {region})",
    ),
    "mesh-exclusive": Rule(
        reason="{took}{dimension}={degree} cannot be used with {other}={other_degree}: {why}",
        fix="Use {dimension}=1 or {other}=1, e.g. {fitting}",
    ),
    "mesh-option-unused": Rule(
        reason="{option}={value!r} is for the {title} groups, and {dimension}={degree}: {why}",
        fix="Use {dimension}=2 or more with it, or leave {option} unset",
    ),
    "mesh-group-backend": Rule(
        reason="{option}={backend!r} asks for {backend!r} groups on {accelerator!r}: {why}",
        fix="Use {option}={choices}, or leave it unset (the world's {world!r})",
    ),
    "pipeline-virtual-stages": Rule(
        reason="pp_schedule={schedule!r} with pp_virtual_stages={virtual_stages}: {why}",
        fix="Use pp_virtual_stages={fit_virtual}, or pp_schedule={other!r}",
    ),
    "pipeline-microbatches": Rule(
        reason=(
            "pp_schedule={schedule!r} with {microbatches} microbatch(es) over {stages} stage(s) (pp={pp} × "
            "pp_virtual_stages={virtual_stages}): {why}"
        ),
        fix="Use pp_microbatches={fit_microbatches}, or leave it unset (one per stage)",
    ),
    "lightning-mesh": Rule(
        reason=("Lightning's ModelParallelStrategy has one data-parallel and one tensor-parallel dimension, so {lost}"),
        fix="{fix}",
    ),
    "lightning-precision": Rule(
        reason="Lightning's {strategy_class} runs precision {supported} only",
        fix="Use one of them with Lightning, or run the plan's loop through trainplan.runtime",
    ),
    "fabric-parallelize": Rule(
        reason=(
            "Fabric's ModelParallelStrategy applies the mesh through a function it calls with the model and the "
            "device mesh, and none was given"
        ),
        fix="Pass it: fabric_arguments(plan, parallelize=fn), where fn(model, device_mesh) returns the model",
    ),
    "accelerate-mesh": Rule(reason="{why}", fix="{fix}"),
    # The memory choice reaches a framework or is refused: a layout that fits only by recomputing activations
    # would run out of memory without it.
    "framework-checkpointing": Rule(
        reason=(
            "the plan's layout {layout} fits only with activation checkpointing ({consequence}), and {framework} {why}"
        ),
        fix=(
            "Checkpoint the model's repeated blocks before handing it over, trainplan.checkpoint_blocks(model) (or "
            "blocks=MyBlock), and say so: {call}(plan, checkpointed=True)"
        ),
    ),
    "framework-checkpointing-blocks": Rule(
        reason=(
            "the plan's layout {layout} fits only with activation checkpointing ({consequence}), and {framework} "
            "checkpoints the layers of the classes it is given: none was given"
        ),
        fix="Pass the class of the model's repeated block (a transformer layer): {call}(plan, blocks=MyBlock)",
    ),
    "metric-stateful-cpu": Rule(
        reason=(
            "a stateful metric object kept on CPU cannot be reduced with backend {backend!r}: its states are "
            "reduced by the metric itself, on the device its tensors live on, and {backend!r} only takes "
            "{device_type} tensors; moving them to the device and back would mean patching the metric"
        ),
        fix="Keep stateful metrics on the device (store_on_cpu=False), or log the plain value instead",
    ),
}

# --------------------------------------------------------------------------------------------------
# Deliberate differences from PyTorch Lightning's connector (each also stated in docs/migrating.md).

DIFFERENCES: Final[Mapping[str, str]] = {
    "srun-task-of-a-shell-job": (
        "An srun task of a job named 'bash' or 'interactive' (srun bash -c ..., salloc ... srun python train.py): "
        "Lightning takes the name for an interactive allocation and plans every task alone (world 1 each, N "
        "independent trainings); trainplan reads SLURM_STEP_ID and SLURM_PROCID, which only srun tasks carry, and "
        "joins the job's world, keeping the alone plan for salloc's own shell (neither variable set)."
    ),
    "ddp-under-cluster-with-spawn": (
        "ddp_spawn / ddp_fork / ddp_notebook inside SLURM, torchrun or trainplan launch: Lightning starts extra "
        "processes inside each task; trainplan runs the process as the strategy's script counterpart "
        "(strategy='ddp'), joining the world the job started, with a note, so the same script runs under every "
        "launcher."
    ),
    "cluster-world-size": (
        "A cluster whose world disagrees with num_nodes × devices: trainplan refuses it while planning, naming "
        "both numbers and the launch line that fits; Lightning's connector accepts it (its SLURM environment "
        "checks --ntasks-per-node only later, when the strategy sets up, and torchrun's world size not at all)."
    ),
    "torchelastic-visible-devices": (
        "Under torchrun with one visible GPU, Lightning skips its check that the requested GPUs exist; "
        "trainplan refuses device indices this process cannot see, since it could not use them."
    ),
    "torchelastic-without-group-rank": (
        "A torchelastic worker without GROUP_RANK (RANK and TORCHELASTIC_RUN_ID set, as some launchers start them): "
        "Lightning's TorchElasticEnvironment takes node rank 0 on every node; trainplan takes RANK // "
        "LOCAL_WORLD_SIZE, since torchelastic numbers ranks node after node, and refuses, naming GROUP_RANK, a "
        "worker whose LOCAL_RANK is not RANK % LOCAL_WORLD_SIZE (its node is unknown)."
    ),
    "interactive-under-cluster": (
        "A notebook or REPL inside a SLURM or torchrun job with strategy='ddp': Lightning refuses it because "
        "its script launcher is not interactive-compatible; trainplan accepts it, since the cluster started "
        "the processes and nothing is re-run."
    ),
    "strategy-dp": (
        "strategy='dp': trainplan plans torch.nn.DataParallel (one process, several GPUs); Lightning 2.0 removed it."
    ),
    "single-device-strategy": (
        "strategy='single_device': Lightning's registered strategy ignores devices= and num_nodes= (it uses "
        "the first device, on one node); trainplan uses the device asked for, and refuses several devices or "
        "nodes, pointing to strategy='ddp'."
    ),
    "backend-on-single-process": (
        "process_group_backend with a single-process strategy: Lightning ignores it; trainplan refuses it, since "
        "it can have no effect."
    ),
    "mps-ddp": (
        "strategy='ddp' with accelerator='mps': Lightning refuses DDP-family strategies only when MPS is "
        "available; trainplan refuses the pair on any machine, and lets accelerator='cpu' use DDP on a Mac."
    ),
    "kubeflow-detected": (
        "A Kubeflow PyTorchJob pod (KUBERNETES_PORT with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT) is detected "
        "as a started job; Lightning detects it only when asked for (its KubeflowEnvironment cannot detect itself), "
        "so there each pod would plan a world of its own."
    ),
    "torch-env-detected": (
        "A process with torch's env:// variables and no cluster manager's (RANK, WORLD_SIZE and LOCAL_RANK without "
        "TORCHELASTIC_RUN_ID or GROUP_RANK: DeepSpeed's launcher, torch.distributed.launch --use_env, a hand-written "
        "wrapper): Lightning's LightningEnvironment takes LOCAL_RANK for processes created externally and ignores "
        "WORLD_SIZE and RANK (its world is num_nodes × devices, its node NODE_RANK, else GROUP_RANK, else 0); "
        "trainplan plans the world the variables state (cluster 'torch_env'), takes the node from NODE_RANK, "
        "GROUP_RANK, else RANK // LOCAL_WORLD_SIZE, and refuses, naming the variable, a process whose node is unknown "
        "or whose ranks disagree."
    ),
    "auto-adopts-job": (
        "devices='auto' and num_nodes='auto' inside a started job (torchrun, srun, mpirun, jsrun, trainplan "
        "launch): trainplan takes the layout the job started (its processes per node and nodes); Lightning "
        "counts the visible devices (all GPUs, or one CPU process) and defaults to one node, so a job whose "
        "layout differs fails later, or silently runs a different world."
    ),
    "fork-after-cuda": (
        "A fork-based strategy after CUDA was initialised: Lightning finds out at launch; trainplan refuses the "
        "plan when the environment says CUDA is initialised already."
    ),
    "model-parallel-auto": (
        "ModelParallelStrategy with one size 'auto': Lightning takes data parallel = the nodes and tensor parallel = "
        "the processes per node whatever the other size says, and fails unless they multiply to the world size; "
        "trainplan's 'auto' takes what the other size leaves (the same sizes wherever Lightning succeeds)."
    ),
    "model-parallel-default": (
        "strategy='model_parallel' without sizes: Lightning's ModelParallelStrategy() makes tensor parallelism span "
        "each node; trainplan shards data over every process (dp_shard='auto', torchtitan's default), since tensor "
        "parallelism needs a function that knows the model's layers. Lightning's spelling with both sizes 'auto' "
        "gives Lightning's layout."
    ),
    "model-parallel-precision": (
        "ModelParallelStrategy's precisions: Lightning runs 32-true, bf16-mixed, bf16-true and 16-true; trainplan "
        "also plans 16-mixed, with data parallelism alone (replicas and shards: not with pipeline stages, nor with "
        "tensor or context parallelism, where torch's GradScaler can make the ranks of one group disagree on skipping "
        "a step; use bf16-mixed there), and 64-true except with context parallelism. The Lightning adapter refuses "
        "what Lightning cannot run."
    ),
    "deepspeed-cpu": (
        "DeepSpeed on accelerator='cpu': Lightning's connector accepts it (DeepSpeed has a CPU accelerator); "
        "trainplan's deepspeed rows run on CUDA only, since its ZeRO offload and precision paths are planned and "
        "tested for CUDA devices. A framework that runs DeepSpeed on CPU extends the rule set with a deepspeed row "
        "that lists 'cpu' (tests/downstream_rules.py does)."
    ),
    "xla-fsdp-trainer": (
        "strategy='xla_fsdp': Fabric registers it (XLAFSDPStrategy, torch_xla's FSDP) and the Trainer does not, so "
        "Lightning's Trainer refuses the name; trainplan plans it (XLA devices, torch_xla's launcher, 32-true, "
        "16-true or bf16-true), fabric_arguments builds it, and lightning_trainer_arguments refuses it, pointing to "
        "strategy='xla'. Fabric also turns strategy='fsdp' on a TPU into xla_fsdp; trainplan refuses fsdp on XLA "
        "and names xla_fsdp."
    ),
}
