"""One table-driven test per rule: the exact error type, the rule id, and key words of the message.

Each case is (request, environment, error type, rule id or None, words the message must contain).
A meta-test checks that every rule in `rules.RULES` is exercised here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import LAUNCHED_1_OF_2, SLURM_2x4, TORCHRUN_2x2, cpu, cuda
from tests.unit.test_legacy import CONFLICTS as LEGACY_CONFLICTS
from trainplan import (
    CustomName,
    DDPOptions,
    DeepSpeedOptions,
    Environment,
    FSDPOptions,
    Incompatible,
    InvalidRequest,
    ModelParallelOptions,
    Request,
    TrainplanError,
    Unavailable,
)
from trainplan.resolve import check, place_metric, resolve, resolve_uncached
from trainplan.resolve.memory import transformer_facts
from trainplan.rules import (
    FORK_STRATEGY_FOR,
    LAUNCHERS,
    RULES,
    SCRIPT_STRATEGY_FOR,
    SPAWN_STRATEGY_FOR,
    STRATEGIES,
    StrategyRule,
)
from trainplan.rules.strategies import counterparts
from trainplan.spec import ClusterEnvironmentError

Case = tuple[dict[str, Any], Environment, type[TrainplanError], str | None, tuple[str, ...]]

CASES: dict[str, Case] = {
    # accelerator availability
    "cuda absent": ({"accelerator": "cuda"}, cpu(), Unavailable, None, ("accelerator='cuda'", "only cpu", "auto")),
    "gpu absent": ({"accelerator": "gpu"}, cpu(), Unavailable, None, ("accelerator='gpu'", "only cpu")),
    "mps absent": ({"accelerator": "mps"}, cuda(2), Unavailable, None, ("accelerator='mps'", "cuda (2 devices)")),
    "tpu absent": ({"accelerator": "tpu"}, cuda(1), Unavailable, None, ("accelerator='xla'",)),
    "cuda hidden": (
        {"accelerator": "cuda"},
        cpu(variables={"CUDA_VISIBLE_DEVICES": ""}),
        Unavailable,
        None,
        ("CUDA_VISIBLE_DEVICES hides",),
    ),
    # devices
    "too many gpus": ({"devices": 4}, cuda(2), Unavailable, None, ("devices=4", "2 visible", "at most devices=2")),
    "index beyond": ({"devices": [0, 3]}, cuda(2), Unavailable, None, ("device index 3", "indices 0 to 1")),
    "mps two": ({"accelerator": "mps", "devices": 2}, Environment(mps_available=True), Unavailable, None, ("one MPS",)),
    "xla three of eight": (
        {"accelerator": "xla", "devices": 3},
        Environment(xla_device_count=8),
        InvalidRequest,
        None,
        ("one device or on all 8",),
    ),
    "xla two indices": (
        {"accelerator": "xla", "devices": [0, 1]},
        Environment(xla_device_count=8),
        InvalidRequest,
        None,
        ("one device index",),
    ),
    "cpu indices": ({"accelerator": "cpu", "devices": [0, 1]}, cpu(), InvalidRequest, None, ("no device indices",)),
    "cpu all": ({"accelerator": "cpu", "devices": -1}, cpu(), InvalidRequest, None, ("counts the processes",)),
    # strategy × accelerator
    "fsdp on cpu": (
        {"accelerator": "cpu", "strategy": "fsdp", "devices": 2},
        cpu(),
        Incompatible,
        "strategy-accelerator",
        ("fsdp", "'cuda'", "accelerator='cuda'"),
    ),
    "ddp on mps": (
        {"accelerator": "mps", "strategy": "ddp"},
        Environment(mps_available=True),
        Incompatible,
        "strategy-accelerator",
        ("MPS", "accelerator='cpu'"),
    ),
    "dp on cpu": (
        {"accelerator": "cpu", "strategy": "dp"},
        cpu(),
        Incompatible,
        "strategy-accelerator",
        ("DataParallel",),
    ),
    "xla strategy on cuda": (
        {"accelerator": "cuda", "strategy": "xla"},
        cuda(2),
        Incompatible,
        "strategy-accelerator",
        ("XLA devices",),
    ),
    "ddp on xla": (
        {"accelerator": "xla", "strategy": "ddp"},
        Environment(xla_device_count=8),
        Incompatible,
        "strategy-accelerator",
        ("strategy='xla'",),
    ),
    "deepspeed missing": (
        {"strategy": "deepspeed", "devices": 2},
        cuda(2),
        Incompatible,
        "strategy-package",
        ("deepspeed", "pip install deepspeed"),
    ),
    "dp two nodes": ({"strategy": "dp", "num_nodes": 2}, cuda(2), Incompatible, "strategy-nodes", ("2 nodes",)),
    "single device with two": (
        {"strategy": "single_device", "devices": 2},
        cuda(2),
        Incompatible,
        "strategy-device-count",
        ("exactly one device", "2 devices"),
    ),
    "options of another family": (
        {"strategy": "ddp", "devices": 2, "strategy_options": FSDPOptions()},
        cuda(2),
        Incompatible,
        "strategy-options",
        ("FSDPOptions", "DDPOptions"),
    ),
    "options for single device": (
        {"strategy": "single_device", "strategy_options": DDPOptions()},
        cuda(1),
        Incompatible,
        "strategy-options",
        ("no options",),
    ),
    "preset contradicted": (
        {
            "strategy": "ddp_find_unused_parameters_false",
            "devices": 2,
            "strategy_options": DDPOptions(find_unused_parameters=True),
        },
        cuda(2),
        Incompatible,
        "strategy-preset",
        ("find_unused_parameters=False", "'ddp'"),
    ),
    "parameter offload below stage 3": (
        {"strategy": "deepspeed", "strategy_options": DeepSpeedOptions(stage=2, offload_parameters=True)},
        cuda(2, packages={"deepspeed"}),
        Incompatible,
        "deepspeed-offload-stage",
        ("stage 3", "stage 2"),
    ),
    # launchers
    "fork without fork": (
        {"strategy": "ddp_fork", "devices": 2},
        cuda(2, start_methods=("spawn",)),
        Incompatible,
        "fork-unavailable",
        ("ddp_spawn",),
    ),
    "fork after cuda": (
        {"strategy": "ddp_notebook", "devices": 2},
        cuda(2, cuda_initialized=True),
        Incompatible,
        "fork-after-cuda",
        ("already initialised", "ddp_spawn", "find_usable_cuda_devices"),
    ),
    "ddp in notebook": (
        {"strategy": "ddp", "devices": 2},
        cuda(2, interactive=True),
        Incompatible,
        "interactive-launcher",
        ("interactive", "ddp_notebook"),
    ),
    "spawn in notebook": (
        {"strategy": "ddp_spawn", "devices": 2},
        cuda(2, interactive=True),
        Incompatible,
        "interactive-launcher",
        ("ddp_notebook",),
    ),
    "fsdp in notebook": (
        {"strategy": "fsdp", "devices": 2},
        cuda(2, interactive=True),
        Incompatible,
        "interactive-launcher",
        ("as a script",),
    ),
    # backends
    "nccl on cpu": (
        {"accelerator": "cpu", "strategy": "ddp", "devices": 2, "process_group_backend": "nccl"},
        cpu(),
        Incompatible,
        "backend-accelerator",
        ("NCCL", "'gloo'"),
    ),
    "xla backend on cuda": (
        {"strategy": "ddp", "devices": 2, "process_group_backend": "xla"},
        cuda(2),
        Incompatible,
        "backend-accelerator",
        ("'nccl'",),
    ),
    "backend without group": (
        {"strategy": "single_device", "process_group_backend": "gloo"},
        cpu(),
        Incompatible,
        "backend-without-group",
        ("no process group",),
    ),
    # precision
    "double on mps": (
        {"accelerator": "mps", "precision": "64-true"},
        Environment(mps_available=True),
        Incompatible,
        "precision-accelerator",
        ("float64", "'32-true'"),
    ),
    "double on xla": (
        {"accelerator": "xla", "precision": "64-true"},
        Environment(xla_device_count=8),
        Incompatible,
        "precision-accelerator",
        ("32-true, 16-true and bf16-true", "Use precision='32-true'"),
    ),
    "mixed on xla": (
        {"accelerator": "xla", "precision": "16-mixed"},
        Environment(xla_device_count=8),
        Incompatible,
        "precision-accelerator",
        ("'16-true'",),
    ),
    "transformer engine on cpu": (
        {"accelerator": "cpu", "precision": "transformer-engine"},
        cpu(),
        Incompatible,
        "precision-accelerator",
        ("NVIDIA GPUs",),
    ),
    "double with fsdp": (
        {"strategy": "fsdp", "devices": 2, "precision": 64},
        cuda(2),
        Incompatible,
        "precision-strategy",
        ("'fsdp'", "'32-true'"),
    ),
    "transformer engine missing": (
        {"precision": "transformer-engine"},
        cuda(1),
        Incompatible,
        "precision-package",
        ("transformer_engine",),
    ),
    # clusters
    "slurm tasks per node": (
        {"devices": 2, "num_nodes": 2},
        cuda(4, variables=SLURM_2x4),
        Incompatible,
        "cluster-world-size",
        ("SLURM_NTASKS=8", "--ntasks-per-node=2", "devices=4, num_nodes=2"),
    ),
    "torchrun world": (
        {"devices": 4},
        cuda(4, variables=TORCHRUN_2x2),
        Incompatible,
        "cluster-world-size",
        ("WORLD_SIZE=4", "--nproc-per-node=4"),
    ),
    "node rank beyond": (
        {"accelerator": "cpu", "strategy": "ddp", "devices": 2, "num_nodes": 2},
        cpu(variables={"NODE_RANK": "2", "MASTER_ADDR": "h0"}),
        Incompatible,
        "cluster-rank-range",
        ("NODE_RANK", "num_nodes"),
    ),
    "mpi nodes without address": (
        {"accelerator": "cpu", "strategy": "ddp", "devices": 2, "num_nodes": 2},
        cpu(
            variables={
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_RANK": "2",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            }
        ),
        Incompatible,
        "cluster-main-address",
        ("MASTER_ADDR",),
    ),
    "kubeflow two per pod": (
        {"accelerator": "cpu", "strategy": "ddp", "devices": 2, "num_nodes": 2, "cluster": "kubeflow"},
        cpu(
            variables={
                "KUBERNETES_PORT": "tcp://10.0.0.1:443",
                "MASTER_ADDR": "master",
                "MASTER_PORT": "23456",
                "WORLD_SIZE": "4",
                "RANK": "1",
            }
        ),
        Incompatible,
        "cluster-one-process-per-node",
        ("one process per pod", "devices=1"),
    ),
    # inside a started job
    "job without a layout": (
        {"accelerator": "cpu"},
        cpu(variables={"PMI_SIZE": "4", "PMI_RANK": "1"}),
        Incompatible,
        "job-layout-unknown",
        ("MPI started 4 processes", "devices=<processes per node>"),
    ),
    "slurm batch script without srun": (
        {},
        cpu(variables={key: value for key, value in SLURM_2x4.items() if key != "SLURM_STEP_ID"}),
        Incompatible,
        "slurm-batch-step",
        (
            "batch script of SLURM job 1234567",
            "not one of the job's 8 tasks",
            "srun --kill-on-bad-exit=1 python train.py",
        ),
    ),
    "job with fewer gpus than processes": (
        {},
        cuda(1, variables=TORCHRUN_2x2),
        Incompatible,
        "job-gpus",
        ("Torchrun started 2 processes", "only 1 GPU", "--gpus-per-node"),
    ),
    "job started on other gpus": (
        {"devices": [0, 1]},
        cuda(2, variables={**LAUNCHED_1_OF_2, "CUDA_VISIBLE_DEVICES": "0,2", "TRAINPLAN_SELECTED_DEVICES": "0,2"}),
        Incompatible,
        "job-device-selection",
        ("started on devices [0, 2]", "devices='auto'"),
    ),
    "kubeflow asked for, absent": ({"cluster": "kubeflow"}, cpu(), Unavailable, None, ("cluster='kubeflow'",)),
    "slurm garbage rank": (
        {"devices": 4, "num_nodes": 2},
        cuda(4, variables={**SLURM_2x4, "SLURM_PROCID": "five"}),
        ClusterEnvironmentError,
        None,
        ("SLURM_PROCID", "whole number"),
    ),
    "slurm rank beyond world": (
        {"devices": 4, "num_nodes": 2},
        cuda(4, variables={**SLURM_2x4, "SLURM_PROCID": "8"}),
        ClusterEnvironmentError,
        None,
        ("SLURM_PROCID", "SLURM_NTASKS=8"),
    ),
    "port out of range": (
        {"devices": 4, "num_nodes": 2},
        cuda(4, variables={**SLURM_2x4, "MASTER_PORT": "99999"}),
        ClusterEnvironmentError,
        None,
        ("MASTER_PORT", "65535"),
    ),
    "torchrun missing address": (
        {"devices": 2, "num_nodes": 2},
        cuda(2, variables={key: value for key, value in TORCHRUN_2x2.items() if key != "MASTER_ADDR"}),
        ClusterEnvironmentError,
        None,
        ("MASTER_ADDR", "torchrun"),
    ),
    # the auto_select_gpus bridge
    "usable with indices": (
        {"devices": [0, 1], "select_usable_gpus": True},
        cuda(2, usable_cuda_devices=(0, 1)),
        Incompatible,
        "usable-with-indices",
        ("already names them",),
    ),
    "usable on cpu": (
        {"accelerator": "cpu", "select_usable_gpus": True},
        cpu(),
        Incompatible,
        "usable-needs-cuda",
        ("'cpu'",),
    ),
    # device meshes (strategy model_parallel): every refusal names the numbers and a layout that fits. A layout whose
    # groups span hosts is planned with a warning (tests/unit/test_mesh.py); 'auto' never takes one.
    "mesh tp auto beyond a node": (
        {"devices": 4, "num_nodes": 2, "strategy_options": ModelParallelOptions(tp="auto")},
        cuda(4),
        Incompatible,
        "mesh-inside-node",
        ("tp=8 needs 8 processes on one node", "'auto' keeps tensor-parallel", "this node has 4", "Use tp=4 or 2"),
    ),
    "mesh cp auto around tp beyond a node": (
        {"devices": 4, "num_nodes": 2, "strategy_options": ModelParallelOptions(cp="auto", tp=4)},
        cuda(4),
        Incompatible,
        "mesh-inside-node",
        ("cp=2 × tp=4 needs 8 processes", "around the tensor-parallel groups", "Use cp=1", "e.g. dp_shard=2, tp=4"),
    ),
    "mesh product": (
        {"devices": 4, "strategy_options": ModelParallelOptions(dp_shard=4, tp=2)},
        cuda(4),
        Incompatible,
        "mesh-product",
        ("multiply to 8 (dp_shard=4 × tp=2)", "the world has 4 processes", "e.g. dp_shard=2, tp=2"),
    ),
    "mesh remainder": (
        {"devices": 4, "num_nodes": 3, "strategy_options": ModelParallelOptions(pp=5)},
        cuda(4),
        Incompatible,
        "mesh-remainder",
        ("dp_shard='auto' takes what the other degrees leave", "does not divide the world of 12", "e.g. pp=3"),
    ),
    "mesh two autos": (
        {"devices": 4, "strategy_options": ModelParallelOptions(tp="auto", dp_shard="auto")},
        cuda(4),
        Incompatible,
        "mesh-autos",
        ("dp_shard and tp both say 'auto'", "e.g. dp_shard=4"),
    ),
    "mesh both spellings": (
        {"devices": 4, "strategy_options": ModelParallelOptions(tp=2, tensor_parallel_size=2)},
        cuda(4),
        Incompatible,
        "mesh-spellings",
        ("Lightning's sizes", "trainplan's degrees (tp=2)", "Keep one spelling"),
    ),
    "mesh auto stage across a node boundary": (
        {"devices": 3, "num_nodes": 2, "strategy_options": ModelParallelOptions(pp="auto", dp_shard=2)},
        cuda(3),
        Incompatible,
        "mesh-pipeline-nodes",
        ("pp=3 makes stages of 2 processes on 2 nodes of 3", "Use pp=2 or 6", "e.g. pp=2, dp_shard=3"),
    ),
    "mesh sequence and context parallelism together": (
        {"devices": 4, "strategy_options": ModelParallelOptions(cp=2, sp=2)},
        cuda(4),
        Incompatible,
        "mesh-exclusive",
        ("sp=2 cannot be used with cp=2", "both split each sequence", "Use sp=1 or cp=1", "e.g. dp_shard=2, cp=2"),
    ),
    "mesh expert degree not dividing the region": (
        {"accelerator": "cpu", "devices": 4, "strategy_options": ModelParallelOptions(dp_shard=2, tp=2, ep=3)},
        cpu(),
        Incompatible,
        "mesh-expert",
        ("ep=3 splits the experts", "= 4 (dp_shard=2 × cp=1 × sp=1 × tp=2)", "Use ep=4 or 2"),
    ),
    "pipeline 1F1B with fewer microbatches than stages": (
        {"accelerator": "cpu", "devices": 4, "strategy_options": ModelParallelOptions(pp=4, pp_microbatches=2)},
        cpu(),
        Incompatible,
        "pipeline-microbatches",
        ("2 microbatch(es) over 4 stage(s)", "Schedule1F1B", "Use pp_microbatches=4"),
    ),
    "pipeline interleaved with one stage per rank": (
        {
            "accelerator": "cpu",
            "devices": 4,
            "strategy_options": ModelParallelOptions(pp=2, pp_schedule="Interleaved1F1B", pp_virtual_stages=1),
        },
        cpu(),
        Incompatible,
        "pipeline-virtual-stages",
        ("pp_virtual_stages=1", "several stages per rank", "Use pp_virtual_stages=2"),
    ),
    "mesh backend of a dimension of degree 1": (
        {"accelerator": "cpu", "devices": 4, "strategy_options": ModelParallelOptions(tp_group_backend="gloo")},
        cpu(),
        Incompatible,
        "mesh-option-unused",
        (
            "tp_group_backend='gloo' is for the tensor-parallel groups, and tp=1",
            "makes no tensor-parallel groups",
            "Use tp=2",
        ),
    ),
    "mesh backend of a dimension that cannot run on the accelerator": (
        {"accelerator": "cpu", "devices": 4, "strategy_options": ModelParallelOptions(tp=2, tp_group_backend="nccl")},
        cpu(),
        Incompatible,
        "mesh-group-backend",
        ("tp_group_backend='nccl' asks for 'nccl' groups on 'cpu'", "CUDA tensors only", "Use tp_group_backend='gloo'"),
    ),
    "mesh context parallel on cpu": (
        {"accelerator": "cpu", "devices": 4, "strategy_options": ModelParallelOptions(cp=2)},
        cpu(),
        Incompatible,
        "mesh-accelerator",
        ("cp=2 does not run on 'cpu'", "no ring variant", "e.g. dp_shard=4", "run on 'cuda'"),
    ),
    "mesh over mpi": (
        {"accelerator": "cpu", "devices": 4, "process_group_backend": "mpi", "strategy": "model_parallel"},
        cpu(),
        Incompatible,
        "mesh-backend",
        ("runs over 'gloo'", "not 'mpi'", "process_group_backend='gloo'"),
    ),
    "mesh pipeline with fp16 amp": (
        {"devices": 4, "precision": "16-mixed", "strategy_options": ModelParallelOptions(pp=2)},
        cuda(4),
        Incompatible,
        "mesh-precision",
        ("pp=2 does not run with precision='16-mixed'", "stages would skip different steps", "'bf16-mixed'"),
    ),
    "mesh tensor parallel with fp16 amp": (
        {"devices": 4, "precision": "16-mixed", "strategy_options": ModelParallelOptions(tp=2)},
        cuda(4),
        Incompatible,
        "mesh-precision",
        ("tp=2 does not run with precision='16-mixed'", "disagree on skipping a step", "'bf16-mixed'"),
    ),
    "mesh context parallel with fp16 amp": (
        {"devices": 4, "precision": "16-mixed", "strategy_options": ModelParallelOptions(cp=2)},
        cuda(4),
        Incompatible,
        "mesh-precision",
        ("cp=2 does not run with precision='16-mixed'", "first DTensor gradient", "'bf16-mixed'"),
    ),
    "mesh options on a mac": (
        {"strategy_options": ModelParallelOptions()},
        Environment(mps_available=True),
        Incompatible,
        "options-accelerator",
        (
            "with ModelParallelOptions chose strategy 'model_parallel'",
            "MPS has no device mesh",
            "Drop strategy_options",
        ),
    ),
    "mesh on mps": (
        {"accelerator": "mps", "strategy": "model_parallel"},
        Environment(mps_available=True),
        Incompatible,
        "strategy-accelerator",
        ("MPS has no device mesh", "accelerator='cpu'"),
    ),
    "mesh degree zero": (
        {"devices": 4, "strategy_options": ModelParallelOptions(tp=0)},
        cuda(4),
        InvalidRequest,
        None,
        ("strategy_options.tp=0", "whole number of ranks", "'auto'"),
    ),
    # bad values
    "misspelt accelerator": ({"accelerator": "gpux"}, cpu(), InvalidRequest, None, ("Did you mean", "'gpu'")),
    "misspelt strategy": ({"strategy": "ddp_spwn"}, cpu(), InvalidRequest, None, ("'ddp_spawn'",)),
    "zero devices": ({"devices": 0}, cpu(), InvalidRequest, None, ("zero devices",)),
    "zero string": ({"devices": "0"}, cpu(), InvalidRequest, None, ("zero devices",)),
    "empty list": ({"devices": []}, cuda(2), InvalidRequest, None, ("empty list",)),
    "bool devices": ({"devices": True}, cuda(2), InvalidRequest, None, ("bool",)),
    "float devices": ({"devices": 1.5}, cuda(2), InvalidRequest, None, ("float",)),
    "negative devices": ({"devices": -2}, cuda(2), InvalidRequest, None, ("negative count",)),
    "duplicate indices": ({"devices": [1, 1]}, cuda(2), InvalidRequest, None, ("more than once",)),
    "garbage string": ({"devices": "two"}, cuda(2), InvalidRequest, None, ("neither a number",)),
    "nodes zero": ({"num_nodes": 0}, cpu(), InvalidRequest, None, ("at least 1",)),
    "precision 8": ({"precision": 8}, cpu(), InvalidRequest, None, ("64, 32 and 16",)),
    # memory
    "70b on one 24gb gpu": (
        {"model": transformer_facts(parameters=70e9)},
        cuda(1, cuda_memory_bytes=(24 << 30,), host_memory_bytes=64 << 30),
        Incompatible,
        "memory-nothing-fits",
        ("fits no layout on 1 device(s) of 24.0 GiB", "To fit it: use 19 nodes like this one (num_nodes=19"),
    ),
    "7b under ddp on 40gb": (
        {"model": transformer_facts(parameters=7e9, layers=32, hidden=4096), "strategy": "ddp"},
        cuda(8, cuda_memory_bytes=(40 << 30,) * 8),
        Incompatible,
        "memory-strategy-too-big",
        ("strategy 'ddp' will not fit", "These fit: fsdp"),
    ),
    "precision other than the facts'": (
        {"model": transformer_facts(parameters=7e9), "precision": "32-true"},
        cuda(8, cuda_memory_bytes=(40 << 30,) * 8),
        Incompatible,
        "memory-precision",
        ("built for 'bf16-mixed'", "precision='32-true'", "leave precision unwritten"),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rule_rejects_with_reason_and_fix(name: str) -> None:
    request, env, error_type, rule, words = CASES[name]
    with pytest.raises(error_type) as caught:
        resolve(Request(**request), env)
    assert type(caught.value) is error_type
    if rule is not None:
        assert isinstance(caught.value, Incompatible)
        assert caught.value.rule == rule
    for word in words:
        assert word in str(caught.value), f"{word!r} not in {caught.value}"


@pytest.mark.parametrize(
    ("variables", "hides"),
    [({}, False), ({"CUDA_VISIBLE_DEVICES": "-1"}, True), ({"CUDA_VISIBLE_DEVICES": "0"}, False)],
)
def test_absent_cuda_blames_the_visibility_variable_only_when_it_hides_every_gpu(
    variables: dict[str, str], hides: bool
) -> None:
    with pytest.raises(Unavailable) as caught:
        resolve(Request(accelerator="cuda"), cpu(variables=variables))
    assert ("(CUDA_VISIBLE_DEVICES hides every GPU)" in str(caught.value)) is hides


def test_every_rule_in_the_table_is_exercised() -> None:
    exercised = {case[3] for case in CASES.values() if case[3] is not None}
    for old, _, _ in LEGACY_CONFLICTS.values():
        try:
            Request.from_legacy(**old)
        except Incompatible as error:
            exercised.add(error.rule)
        except TrainplanError:
            pass
    exercised |= _world_rules() | _training_rules() | _emit_rules() | _downstream_rules()
    assert exercised | {"metric-stateful-cpu"} == set(RULES)


def _training_rules() -> set[str]:
    """The rules `mapping.frameworks` applies when a plan becomes torch or framework objects."""
    from trainplan.effects.adapters import fabric_arguments
    from trainplan.mapping.frameworks import (
        accelerate_arguments,
        accelerate_launch_flags,
        accelerate_mesh_refusal,
        deepspeed_config,
        framework_sync_batchnorm,
        lightning_arguments,
    )

    deepspeed = resolve(Request(strategy="deepspeed", devices=2), cuda(2, packages={"deepspeed"}))
    dp = resolve(Request(strategy="dp", devices=2), cuda(2))
    xla_fsdp = resolve(Request(strategy="xla_fsdp"), Environment(xla_device_count=8))
    attempts: list[Callable[[], object]] = [
        lambda: deepspeed_config(dp),
        lambda: deepspeed_config(deepspeed, micro_batch_size=0),
        lambda: lightning_arguments(dp),
        lambda: lightning_arguments(xla_fsdp, "trainer"),
        lambda: accelerate_arguments(resolve(Request(precision="bf16-true"), cuda(1))),
        lambda: accelerate_arguments(dp),
        lambda: accelerate_launch_flags(resolve(Request(accelerator="cpu", devices=2), cpu())),
        lambda: accelerate_launch_flags(resolve(Request(devices=2, num_nodes=2), cuda(2))),
        lambda: framework_sync_batchnorm(resolve(Request(devices=2, sync_batchnorm=True), cuda(2)), "Fabric"),
        lambda: resolve(Request(accelerator="cpu", devices=2, sync_batchnorm=True), cpu()),
    ]
    mesh = ModelParallelOptions
    pipeline = resolve(Request(devices=4, strategy_options=mesh(pp=2)), cuda(4))
    hybrid = resolve(Request(devices=4, strategy_options=mesh(dp_replicate=2, dp_shard=2)), cuda(4))
    replicas_and_tp = resolve(Request(devices=4, strategy_options=mesh(dp_replicate=2, dp_shard=1, tp=2)), cuda(4))
    fp16 = resolve(Request(devices=4, precision="16-mixed", strategy="model_parallel"), cuda(4))
    on_cpu = resolve(Request(accelerator="cpu", devices=2, strategy="model_parallel"), cpu())
    attempts += [
        lambda: lightning_arguments(pipeline),
        lambda: lightning_arguments(hybrid),
        lambda: lightning_arguments(fp16),
        lambda: accelerate_arguments(pipeline),
        lambda: accelerate_arguments(replicas_and_tp),
        lambda: _raise(accelerate_mesh_refusal(on_cpu)),
        lambda: fabric_arguments(on_cpu),
    ]
    recomputing = transformer_facts(parameters=1e9, layers=16, hidden=2048, sequence=8192, batch_size=4)
    gpus = cuda(8, cuda_memory_bytes=(40 << 30,) * 8)
    ddp_recomputing = resolve(Request(model=recomputing, strategy="ddp"), gpus)
    fsdp_recomputing = resolve(Request(model=recomputing, strategy="fsdp"), gpus)
    attempts += [
        lambda: lightning_arguments(ddp_recomputing, "trainer"),  # DDPStrategy has no checkpointing setting
        lambda: lightning_arguments(fsdp_recomputing, "fabric"),  # FSDPStrategy needs the blocks' classes
    ]
    rules = set()
    for attempt in attempts:
        with pytest.raises(Incompatible) as caught:
            attempt()
        rules.add(caught.value.rule)
    return rules


def _raise(error: TrainplanError | None) -> None:
    if error is not None:
        raise error


def _emit_rules() -> set[str]:
    """The rules the emitters apply to a plan (`render.emit`)."""
    from tests.downstream_rules import RULES as DOWNSTREAM
    from trainplan.render.emit import emit_kubeflow

    with pytest.raises(Incompatible) as caught:
        emit_kubeflow(resolve(Request(accelerator="mps"), Environment(mps_available=True)), image="img")
    with pytest.raises(Incompatible) as unnamed:  # a rule set without a name cannot travel to the job
        emit_kubeflow(resolve(Request(), Environment(), DOWNSTREAM.extend()), ["train.py"], image="img")
    return {caught.value.rule, unnamed.value.rule}


def _downstream_rules() -> set[str]:
    """The rules that refuse a downstream accelerator or precision on its way to a framework or a PyTorchJob (the
    cases themselves: `tests/unit/test_downstream_effects.py`)."""
    from tests.downstream_rules import INT8_QAT, NPU, RULES
    from trainplan.mapping.frameworks import accelerate_arguments, lightning_arguments
    from trainplan.render.emit import emit_kubeflow

    npu = resolve(Request(accelerator=NPU, devices=2), Environment().with_device_counts({NPU: 2}), RULES)
    qat = resolve(Request(accelerator="cpu", precision=INT8_QAT), Environment(packages={"torchao"}), RULES)
    unsynced = DDPOptions(extra={"init_sync": False})  # an option the rule set adds, which Accelerate cannot express
    ddp = resolve(Request(accelerator="cpu", devices=2, strategy_options=unsynced), cpu(), RULES)
    attempts: list[Callable[[], object]] = [
        lambda: lightning_arguments(npu, "fabric", RULES),
        lambda: lightning_arguments(npu),
        lambda: lightning_arguments(qat, "fabric", RULES),
        lambda: emit_kubeflow(npu, ["train.py"], image="img", rules=RULES),
        lambda: accelerate_arguments(ddp, RULES),
    ]
    rules = set()
    for attempt in attempts:
        with pytest.raises(Incompatible) as caught:
            attempt()
        rules.add(caught.value.rule)
    assert rules == {
        "framework-accelerator",
        "plan-rules",
        "framework-precision",
        "kubeflow-resource",
        "option-framework",
    }
    return rules


def _world_rules() -> set[str]:
    """The rules `mapping.workers` applies to a plan before starting its workers (not `resolve` itself)."""
    from trainplan.mapping.workers import nested_launch, unlaunchable

    spawn = resolve(Request(accelerator="cpu", strategy="ddp_spawn", devices=2), cpu())
    nested = nested_launch(spawn, TORCHRUN_2x2)
    two_nodes = resolve(Request(accelerator="cpu", strategy="ddp", devices=2, num_nodes=2), cpu())
    apart = unlaunchable(two_nodes)
    assert nested is not None and "rank 3 of a world of 4 that torchelastic started" in str(nested)
    assert apart is not None and "MASTER_PORT" in str(apart)
    assert nested_launch(spawn, {}) is None and unlaunchable(spawn) is None
    return {nested.rule, apart.rule}


def test_every_precision_a_mesh_dimension_refuses_is_exercised() -> None:
    from trainplan.rules import MESH_DIMENSIONS

    refused = {(name, precision) for name, rule in MESH_DIMENSIONS.items() for precision in rule.precisions_refused}
    exercised: set[tuple[str, object]] = set()
    for request, _env, _, rule, _ in CASES.values():
        options = request.get("strategy_options")
        if rule == "mesh-precision" and isinstance(options, ModelParallelOptions):
            exercised |= {(name, request["precision"]) for name, degree in options.degrees.items() if degree != 1}
    # 64-true with cp is refused on CPU by the accelerator first; test_mesh checks it through Plan.from_dict.
    assert exercised | {("cp", "64-true")} >= refused


def test_check_lists_every_mesh_rule_a_layout_breaks() -> None:
    request = Request(devices=4, precision="16-mixed", strategy_options=ModelParallelOptions(pp=2, tp=2))
    problems = list(check(request, cuda(4)))
    assert [(problem.rule, dict(problem.values)) for problem in problems if isinstance(problem, Incompatible)] == [
        ("mesh-precision", {"pp": 2, "precision": "16-mixed"}),
        ("mesh-precision", {"tp": 2, "precision": "16-mixed"}),
    ]
    with pytest.raises(Incompatible, match="pp=2 does not run"):
        resolve(request, cuda(4))


def test_every_incompatible_message_names_the_values_and_a_fix() -> None:
    for request, env, error_type, _, _ in CASES.values():
        if error_type is not Incompatible:
            continue
        with pytest.raises(Incompatible) as caught:
            resolve(Request(**request), env)
        error = caught.value
        assert error.fix and error.fix in str(error)
        for key, value in error.values.items():
            assert f"{key}={value!r}" in str(error)


def test_stateful_metric_on_cpu_under_nccl_is_rejected_with_the_reason() -> None:
    plan = resolve(Request(strategy="ddp", devices=2), cuda(2))
    with pytest.raises(Incompatible) as caught:
        place_metric(plan, "stateful", store_on_cpu=True)
    assert caught.value.rule == "metric-stateful-cpu"
    assert "'nccl'" in str(caught.value) and "store_on_cpu=False" in str(caught.value)


def test_check_lists_every_problem_while_resolve_raises_the_first() -> None:
    request = Request(accelerator="cuda", strategy="fsdp", precision="64-true", devices=3)
    problems = list(check(request, cpu()))
    assert [type(problem) for problem in problems] == [Unavailable, Incompatible]
    with pytest.raises(Unavailable):
        resolve(request, cpu())


def test_check_reports_each_bad_field() -> None:
    request = Request(accelerator="gpux", devices=0, num_nodes=-1)  # type: ignore[arg-type]
    problems = list(check(request, cpu()))
    assert {problem.field for problem in problems if isinstance(problem, InvalidRequest)} == {
        "accelerator",
        "devices",
        "num_nodes",
    }


def test_check_is_empty_for_a_good_request() -> None:
    assert list(check(Request(strategy="ddp", devices=2), cuda(2))) == []


@pytest.mark.parametrize(
    ("request_value", "env_value", "field"),
    [("cpu", cpu(), "request"), (Request(), "env", "env"), (None, None, "request")],
)
def test_wrong_record_types_are_invalid_requests(request_value: object, env_value: object, field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        resolve(request_value, env_value)  # type: ignore[arg-type]
    assert caught.value.field == field


@pytest.mark.parametrize("usable", [(0, 0), (2,), (True,), (-1,)])
def test_usable_devices_that_are_not_distinct_visible_indices_are_refused(usable: tuple[int, ...]) -> None:
    env = cuda(2, usable_cuda_devices=usable)
    with pytest.raises(InvalidRequest, match="usable devices are distinct visible CUDA indices") as caught:
        resolve_uncached(Request(), env)
    assert caught.value.field == "Environment.usable_cuda_devices"
    assert [problem.field for problem in check(Request(), env) if isinstance(problem, InvalidRequest)] == [
        "Environment.usable_cuda_devices"
    ]


def test_the_counterpart_maps_are_derived_from_the_strategy_rows() -> None:
    """A counterpart is the strategy of the same family and preset with the other launcher: derived from the rows,
    the tables are the ones that were written by hand."""
    assert FORK_STRATEGY_FOR == {
        "ddp": "ddp_notebook",
        "ddp_find_unused_parameters_true": "ddp_notebook_find_unused_parameters_true",
        "ddp_find_unused_parameters_false": "ddp_notebook_find_unused_parameters_false",
        "ddp_spawn": "ddp_notebook",
        "ddp_spawn_find_unused_parameters_true": "ddp_notebook_find_unused_parameters_true",
        "ddp_spawn_find_unused_parameters_false": "ddp_notebook_find_unused_parameters_false",
    }
    assert SPAWN_STRATEGY_FOR == {
        "ddp_fork": "ddp_spawn",
        "ddp_fork_find_unused_parameters_true": "ddp_spawn_find_unused_parameters_true",
        "ddp_fork_find_unused_parameters_false": "ddp_spawn_find_unused_parameters_false",
        "ddp_notebook": "ddp_spawn",
        "ddp_notebook_find_unused_parameters_true": "ddp_spawn_find_unused_parameters_true",
        "ddp_notebook_find_unused_parameters_false": "ddp_spawn_find_unused_parameters_false",
    }
    assert SCRIPT_STRATEGY_FOR == {
        "ddp_spawn": "ddp",
        "ddp_spawn_find_unused_parameters_true": "ddp_find_unused_parameters_true",
        "ddp_spawn_find_unused_parameters_false": "ddp_find_unused_parameters_false",
        "ddp_fork": "ddp",
        "ddp_fork_find_unused_parameters_true": "ddp_find_unused_parameters_true",
        "ddp_fork_find_unused_parameters_false": "ddp_find_unused_parameters_false",
        "ddp_notebook": "ddp",
        "ddp_notebook_find_unused_parameters_true": "ddp_find_unused_parameters_true",
        "ddp_notebook_find_unused_parameters_false": "ddp_find_unused_parameters_false",
    }
    # The derivation reads the rows: a forked FSDP would be suggested for fsdp, and a preset tells two apart.
    forked = {
        **STRATEGIES,
        CustomName("fsdp_fork"): StrategyRule(name=CustomName("fsdp_fork"), family="fsdp", launcher="fork"),
    }
    derived = counterparts(
        forked, LAUNCHERS, source=lambda row: not row.interactive_compatible, target=lambda row: row.forks
    )
    assert derived["fsdp"] == "fsdp_fork" and "fsdp_cpu_offload" not in derived
