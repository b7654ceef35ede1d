# mypy: disallow-any-expr
"""What a downstream type checker sees. Checked by mypy (`make typecheck`), never executed.

- `resolve(...)` is a `Plan`, and its parts have precise types;
- a misspelt literal is rejected (each `type: ignore[...]` below must be needed: `warn_unused_ignores`
  turns an accepted wrong value into an error);
- no public name is `Any` (this file is checked with `disallow_any_expr`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import assert_type

from torch.distributed.device_mesh import DeviceMesh

import trainplan
from trainplan import (
    AcceleratorName,
    BackendName,
    DDPOptions,
    Environment,
    LauncherName,
    Plan,
    PrecisionName,
    Request,
    StrategyName,
    TrainplanError,
)

plan = trainplan.resolve(Request(accelerator="gpu", strategy="ddp", devices=2))
assert_type(plan, Plan)
assert_type(trainplan.resolve(Request(), Environment(cuda_device_count=2)), Plan)
assert_type(plan.accelerator, AcceleratorName | trainplan.CustomName)
# A built-in name or a downstream rule set's (`CustomName`): resolve may be given an extended rule set.
assert_type(plan.strategy.name, StrategyName | trainplan.CustomName)
assert_type(plan.devices, tuple[int, ...])
assert_type(plan.world_size, int)
assert_type(plan.launcher, LauncherName)
assert_type(plan.process_group_backend, BackendName | trainplan.CustomName | None)
assert_type(plan.precision, PrecisionName | trainplan.CustomName)
assert_type(plan.device_for(0), str)
assert_type(plan.to_dict(), dict[str, object])
assert_type(Plan.from_dict({}), Plan)
assert_type(trainplan.check(Request()), Iterator[TrainplanError])
assert_type(trainplan.probe(), Environment)
assert_type(plan.physical_devices, tuple[str, ...])
assert_type(plan.physical_device_for(0), str)
with trainplan.join(plan) as world:
    assert_type(world, trainplan.World)
    assert_type(world.rank, int)
    assert_type(world.device, str)
    assert_type(world.backend, BackendName | trainplan.CustomName | None)
with trainplan.runtime(plan) as rt:
    assert_type(rt, trainplan.Runtime)
    assert_type(rt.rank, int)
    assert_type(rt.world_size, int)
    assert_type(rt.is_main, bool)
    assert_type(rt.metric_store().compute(), dict[str, trainplan.PlainValue])
    assert_type(rt.mesh, DeviceMesh)
    assert_type(rt.submesh("tp"), DeviceMesh)
    assert_type(rt.fsdp_mesh, DeviceMesh)
    assert_type(rt.data_parallel_rank, int)
    rt.submesh("tensor")  # type: ignore[arg-type]
assert_type(plan.mesh, trainplan.MeshLayout | None)
assert_type(plan.mesh_coordinates, dict[trainplan.MeshDimension, int] | None)
Request(strategy="model_parallel", strategy_options=trainplan.ModelParallelOptions(dp_shard="auto", tp=2))
trainplan.ModelParallelOptions(tp="half")  # type: ignore[arg-type]
assert_type(trainplan.accelerate_launch_flags(plan), list[str])
Request(num_nodes="auto")
Request(num_nodes="all")  # type: ignore[arg-type]

Request(accelerator="gpux")  # type: ignore[arg-type]
Request(strategy="ddp_spwn")  # type: ignore[arg-type]
# A downstream strategy has a typed path: its CustomName (a bare string is still refused above).
CUSTOM = trainplan.CustomName("ddp_custom_checkpoint_io")
RULES = trainplan.BUILTIN_RULES.extend(
    strategies=[trainplan.StrategyRule(name=CUSTOM, family="ddp", launcher="subprocess")]
)
assert_type(trainplan.resolve(Request(strategy=CUSTOM), Environment(), RULES), Plan)
trainplan.StrategyRule(name=CUSTOM, family="ddpx", launcher="subprocess")  # type: ignore[arg-type]
# So do a downstream accelerator, backend and precision: their CustomNames, while bare strings stay refused.
NPU, HCCL, QAT = trainplan.CustomName("npu"), trainplan.CustomName("hccl"), trainplan.CustomName("int8-qat")
Request(accelerator=NPU, process_group_backend=HCCL, precision=QAT)
Request(accelerator="npu")  # type: ignore[arg-type]
Request(precision="int8-qat")  # type: ignore[arg-type]
assert_type(trainplan.Environment().with_device_counts({NPU: 8}).device_counts["npu"], int)
trainplan.BackendRule(name="hccl", description="", accelerators=frozenset(), needs_device_tensors=True, why_not={})  # type: ignore[arg-type]
Request(precision="bf17")  # type: ignore[arg-type]
Request(process_group_backend="ncl")  # type: ignore[arg-type]
Request(cluster="sge")  # type: ignore[arg-type]
Request(metrics_store="gpu")  # type: ignore[arg-type]
Request(devices=1.5)  # type: ignore[arg-type]
Request(strategy_options=DDPOptions(find_unused_parameters="yes"))  # type: ignore[arg-type]
Request("cpu")  # type: ignore[call-arg]

public_names = (
    trainplan.Request,
    trainplan.Environment,
    trainplan.Plan,
    trainplan.ClusterInfo,
    trainplan.StrategyChoice,
    trainplan.MetricPlacement,
    trainplan.MetricSlot,
    trainplan.Note,
    trainplan.DDPOptions,
    trainplan.FSDPOptions,
    trainplan.DeepSpeedOptions,
    trainplan.ModelParallelOptions,
    trainplan.MeshLayout,
    trainplan.TrainplanError,
    trainplan.InvalidRequest,
    trainplan.Incompatible,
    trainplan.Unavailable,
    trainplan.ClusterEnvironmentError,
    trainplan.PlanFormatError,
    trainplan.MissingRule,
    trainplan.resolve,
    trainplan.check,
    trainplan.probe,
    trainplan.place_metric,
    trainplan.join,
    trainplan.World,
    trainplan.JoinError,
    trainplan.WorldMismatch,
    trainplan.NestedLaunch,
    trainplan.NotInWorld,
)
