"""`tp.accelerate_launch_flags` is checked by the tool it targets: every flag set the adapter emits is parsed by
Accelerate's own `launch_command_parser`, validated as `accelerate launch` validates (`_validate_launch_command`),
and turned into the workers' environment by the launcher `accelerate launch` would pick for it."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import cpu, cuda
from trainplan import (
    DDPOptions,
    Environment,
    FSDPOptions,
    Incompatible,
    ModelParallelOptions,
    Request,
    accelerate_launch_flags,
)
from trainplan.resolve import resolve

MESH = ModelParallelOptions

# Every layout family the Accelerate adapter takes, on one node and on two, with the precisions it maps.
LAYOUTS: list[tuple[str, dict[str, Any]]] = [
    ("one GPU", {"devices": 1}),
    ("ddp", {"devices": 4, "strategy": "ddp"}),
    ("ddp options", {"devices": 2, "strategy": "ddp", "strategy_options": DDPOptions(find_unused_parameters=True)}),
    ("ddp bf16", {"devices": 4, "strategy": "ddp", "precision": "bf16-mixed"}),
    ("ddp fp16", {"devices": 2, "strategy": "ddp", "precision": "16-mixed"}),
    ("ddp two nodes", {"devices": 4, "num_nodes": 2, "strategy": "ddp"}),
    ("fsdp", {"devices": 4, "strategy": "fsdp"}),
    ("fsdp options", {"devices": 4, "strategy": "fsdp", "strategy_options": FSDPOptions(cpu_offload=True)}),
    ("deepspeed", {"devices": 2, "strategy": "deepspeed"}),
    ("mesh shards", {"devices": 4, "strategy": "model_parallel"}),
    ("mesh hsdp", {"devices": 4, "num_nodes": 2, "strategy_options": MESH(dp_replicate=2)}),
    ("mesh tp x fsdp", {"devices": 4, "strategy_options": MESH(dp_shard=2, tp=2)}),
    ("mesh cp", {"devices": 4, "strategy_options": MESH(dp_shard=2, cp=2), "precision": "bf16-mixed"}),
    ("mesh tensor only", {"devices": 4, "strategy_options": MESH(tp=4)}),
    ("mesh replicas only", {"devices": 4, "strategy_options": MESH(dp_replicate=4, dp_shard=1)}),
]


def _plan_flags(request: dict[str, Any], env: Environment) -> list[str]:
    if "strategy_options" in request and "strategy" not in request:
        request = {**request, "strategy": "model_parallel"}
    return accelerate_launch_flags(resolve(Request(accelerator="cuda", **request), env))


@pytest.fixture
def accelerate_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    launch = pytest.importorskip("accelerate.commands.launch")
    # No user's `accelerate config` file takes part: the flags alone must be enough.
    monkeypatch.setattr(launch, "default_config_file", str(tmp_path / "absent.yaml"))
    yield launch


def _validated(launch: Any, flags: list[str]) -> argparse.Namespace:
    parser = launch.launch_command_parser()
    arguments = parser.parse_args([*flags, "train.py"])
    validated, _, _ = launch._validate_launch_command(arguments)
    return validated  # type: ignore[no-any-return]


@pytest.mark.parametrize(("name", "request_fields"), LAYOUTS, ids=[name for name, _ in LAYOUTS])
def test_accelerate_launch_accepts_every_flag_set(
    accelerate_launch: Any, name: str, request_fields: dict[str, Any]
) -> None:
    from accelerate.utils import launch as launching

    nodes = request_fields.get("num_nodes", 1)
    env = cuda(request_fields["devices"], packages={"deepspeed"})
    if nodes > 1:
        env = _two_nodes(env)
    flags = _plan_flags(request_fields, env)
    arguments = _validated(accelerate_launch, flags)
    assert arguments.num_processes == request_fields["devices"] * nodes
    # The launcher accelerate launch picks builds the workers' environment from these flags without complaint.
    if arguments.use_deepspeed:
        arguments.deepspeed_fields_from_accelerate_config = ""  # as launch_command sets it without a config file
        launching.prepare_deepspeed_cmd_env(arguments)
    elif arguments.use_fsdp or arguments.multi_gpu:
        environment = launching.prepare_multi_gpu_env(arguments)
        if "--use_parallelism_config" in flags:
            assert environment["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    else:
        launching.prepare_simple_launcher_cmd_env(arguments)


def _two_nodes(env: Environment) -> Environment:
    # What-if: node 1 of two, its address and port given as torchrun's multi-node flags would give them.
    return env.with_variables({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "1"})


def test_a_mesh_with_nothing_to_shard_launches_as_multi_gpu(accelerate_launch: Any) -> None:
    flags = _plan_flags({"devices": 4, "strategy_options": MESH(tp=4)}, cuda(4))
    assert "--multi_gpu" in flags
    assert not any(flag.startswith(("--use_parallelism_config", "--parallelism_config_")) for flag in flags)
    assert "--use_fsdp" not in flags


def test_the_real_rule_refused_the_old_flags(accelerate_launch: Any) -> None:
    # What the adapter emitted before: Accelerate's own check refuses it, so the test above can fail.
    old = ["--num_processes", "4", "--num_machines", "1", "--mixed_precision", "no", "--gpu_ids", "0,1,2,3"]
    old += ["--multi_gpu", "--use_parallelism_config", "--parallelism_config_tp_size", "4"]
    with pytest.raises(ValueError, match="use_parallelism_config"):
        _validated(accelerate_launch, old)


def test_several_cpu_processes_stay_refused() -> None:
    with pytest.raises(Incompatible):
        accelerate_launch_flags(resolve(Request(accelerator="cpu", devices=2), cpu()))


def test_two_nodes_planned_without_a_main_address_are_refused_with_the_fix() -> None:
    plan = resolve(Request(accelerator="cuda", devices=2, num_nodes=2), cuda(2))
    assert plan.cluster.main_address == "127.0.0.1"  # the plan's own default: each node's loopback
    with pytest.raises(Incompatible) as refused:
        accelerate_launch_flags(plan)
    assert refused.value.rule == "accelerate-main-address" and refused.value.values == {"num_nodes": 2}
    assert "--main_process_ip" in refused.value.reason and "export MASTER_ADDR=" in refused.value.fix
    # Given the host of node 0 (as the refusal says), the same request launches, at that address.
    flags = accelerate_launch_flags(resolve(Request(accelerator="cuda", devices=2, num_nodes=2), _two_nodes(cuda(2))))
    assert flags[flags.index("--main_process_ip") + 1] == "10.0.0.1"


def test_the_accelerator_objects_carry_no_stray_default_nor_deprecated_argument() -> None:
    import warnings

    import trainplan as tp

    pytest.importorskip("accelerate")
    one = tp.accelerator_arguments(resolve(Request(accelerator="cpu"), cpu()))
    assert not [handler for handler in one["kwargs_handlers"] if type(handler).__name__ == "InitProcessGroupKwargs"]
    fsdp = resolve(
        Request(
            accelerator="cuda",
            devices=2,
            strategy="fsdp",
            strategy_options=FSDPOptions(sharding_strategy="SHARD_GRAD_OP"),
        ),
        cuda(2),
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*deprecated.*")
        plugin = tp.accelerator_arguments(fsdp)["fsdp_plugin"]
    assert plugin.reshard_after_forward.name == "SHARD_GRAD_OP"


@pytest.mark.parametrize(
    ("devices", "visible", "pinned"),
    [
        (4, "4,5,6,7", None),  # a count: the GPUs the scheduler made visible stay
        ([1, 3], "4,5,6,7", "5,7"),  # a selection: physical GPUs, as accelerate launch pins them as written
        ([0, 2], None, "0,2"),
    ],
)
def test_gpu_ids_name_physical_gpus_and_only_for_a_selection(
    devices: Any, visible: str | None, pinned: str | None
) -> None:
    variables = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    env = Environment(cuda_device_count=4, cpu_count=8, variables=variables)
    flags = accelerate_launch_flags(resolve(Request(accelerator="cuda", devices=devices), env))
    assert (flags[flags.index("--gpu_ids") + 1] if "--gpu_ids" in flags else None) == pinned
