"""From plan to loop without processes: precision recipes, DeepSpeed's config, the framework mappings, and the
runtime's wrapping of every strategy family (the CUDA-only ones through what-if plans and fake wrappers)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh

import trainplan
from tests.helpers import cpu, cuda
from trainplan import (
    DDPOptions,
    DeepSpeedOptions,
    Environment,
    FSDPOptions,
    Incompatible,
    InvalidRequest,
    NotWrappable,
    Plan,
    Request,
)
from trainplan.effects.runtime import Runtime
from trainplan.effects.world import JoinError, World
from trainplan.mapping.frameworks import (
    Encoded,
    accelerate_arguments,
    accelerate_launch_flags,
    deepspeed_config,
    framework_sync_batchnorm,
    lightning_arguments,
    needs_grad_scaler,
    precision_recipe,
)
from trainplan.resolve import resolve
from trainplan.rules import PRECISIONS

DEEPSPEED = cuda(4, packages={"deepspeed"})


class FakeWrappers:
    """Records what the runtime asks for; builds nothing that needs a GPU."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def place(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None) -> torch.nn.Module:
        self.calls.append(("place", {"device": str(device), "dtype": dtype}))
        return model.to(dtype=dtype) if dtype is not None else model

    def data_parallel(self, model: torch.nn.Module, device_ids: list[int]) -> torch.nn.Module:
        self.calls.append(("data_parallel", {"device_ids": device_ids}))
        return model

    def ddp(
        self, model: torch.nn.Module, device_ids: list[int] | None, keywords: Mapping[str, object]
    ) -> torch.nn.Module:
        self.calls.append(("ddp", {"device_ids": device_ids, "keywords": dict(keywords)}))
        return model

    def fsdp(self, model: torch.nn.Module, device: torch.device, keywords: Mapping[str, object]) -> torch.nn.Module:
        self.calls.append(("fsdp", {"device": str(device), "keywords": dict(keywords)}))
        return model

    def sync_batchnorm(self, model: torch.nn.Module) -> torch.nn.Module:
        self.calls.append(("sync_batchnorm", {}))
        return model

    def device_mesh(
        self, device_type: str, shape: tuple[int, ...], names: tuple[str, ...], backends: Mapping[str, str]
    ) -> DeviceMesh:
        raise AssertionError("only a model_parallel plan has a device mesh (tests/unit/test_mesh.py)")

    def flatten(self, mesh: DeviceMesh, names: tuple[str, ...], name: str, backend: str | None) -> DeviceMesh:
        raise AssertionError("only a model_parallel plan has a device mesh (tests/unit/test_mesh.py)")

    def unflatten(self, mesh: DeviceMesh, shape: tuple[int, ...], names: tuple[str, ...]) -> DeviceMesh:
        raise AssertionError("only a model_parallel plan has a device mesh (tests/unit/test_mesh.py)")

    def fully_shard(self, model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
        raise AssertionError("only a model_parallel plan has a device mesh (tests/unit/test_mesh.py)")

    def context_parallel(
        self,
        mesh: DeviceMesh,
        buffers: tuple[torch.Tensor, ...],
        seq_dims: tuple[int, ...],
        no_restore: tuple[torch.Tensor, ...],
        rotate_method: str,
        load_balance: bool,
    ) -> AbstractContextManager[None]:
        raise AssertionError("only a model_parallel plan has a device mesh (tests/unit/test_mesh.py)")


def runtime_for(plan: Plan, local_rank: int = 0) -> tuple[Runtime, FakeWrappers]:
    """A runtime for a what-if plan, as if joined (the world is written by hand: no process group, no GPU)."""
    world = World(
        plan=plan,
        rank=local_rank,
        local_rank=local_rank,
        device=plan.device_for(local_rank),
        created=False,
        timeout_seconds=1800,
    )
    fakes = FakeWrappers()
    return Runtime(plan, world, wrappers=fakes), fakes


class TestPrecision:
    @pytest.mark.parametrize("precision", sorted(PRECISIONS))
    def test_every_precision_has_a_recipe(self, precision: str) -> None:
        env = cuda(2, packages={"transformer_engine"})
        plan = resolve(Request(precision=precision, devices=1), env)  # type: ignore[arg-type]
        recipe = precision_recipe(plan)
        assert (recipe.autocast_dtype is None) == (not precision.endswith("-mixed"))

    def test_only_fp16_amp_on_cuda_scales_the_loss(self) -> None:
        assert needs_grad_scaler(resolve(Request(precision="16-mixed"), cuda(1)))
        assert not needs_grad_scaler(resolve(Request(precision="bf16-mixed"), cuda(1)))
        assert not needs_grad_scaler(resolve(Request(precision="16-mixed", accelerator="cpu"), cpu()))

    @pytest.mark.parametrize(
        ("precision", "autocast", "parameters", "scaler"),
        [
            ("bf16-mixed", torch.bfloat16, torch.float32, False),
            ("16-mixed", torch.float16, torch.float32, True),
            ("bf16-true", None, torch.bfloat16, False),
            ("64-true", None, torch.float64, False),
        ],
    )
    def test_the_runtime_builds_the_recipe(
        self, precision: str, autocast: torch.dtype | None, parameters: torch.dtype, scaler: bool
    ) -> None:
        plan = resolve(Request(precision=precision, devices=2), cuda(2))  # type: ignore[arg-type]
        rt, fakes = runtime_for(plan)
        assert (rt.autocast_dtype, rt.parameter_dtype, rt.grad_scaler is not None) == (autocast, parameters, scaler)
        rt.wrap(torch.nn.Linear(2, 2))
        assert fakes.calls[0] == ("place", {"device": "cuda:0", "dtype": None if autocast else parameters})

    def test_autocast_on_cpu_computes_in_bfloat16(self) -> None:
        rt, _ = runtime_for(resolve(Request(accelerator="cpu", precision="bf16-mixed"), cpu()))
        with rt.autocast():
            out = torch.nn.Linear(4, 4)(torch.ones(2, 4))
        assert out.dtype == torch.bfloat16


class TestWrapping:
    """Every strategy family: what the runtime builds, from the plan alone."""

    def test_one_device_is_moved(self) -> None:
        rt, fakes = runtime_for(resolve(Request(devices=[1]), cuda(2)))
        rt.wrap(torch.nn.Linear(2, 2))
        assert [name for name, _ in fakes.calls] == ["place"] and fakes.calls[0][1]["device"] == "cuda:1"

    def test_dp_is_data_parallel_over_the_plans_gpus(self) -> None:
        rt, fakes = runtime_for(resolve(Request(strategy="dp", devices=[0, 2]), cuda(4)))
        rt.wrap(torch.nn.Linear(2, 2))
        assert fakes.calls[1] == ("data_parallel", {"device_ids": [0, 2]})

    def test_ddp_on_cuda_has_device_ids_and_the_options(self) -> None:
        options = DDPOptions(find_unused_parameters=True, static_graph=True)
        plan = resolve(Request(devices=2, strategy_options=options, sync_batchnorm=True), cuda(2))
        rt, fakes = runtime_for(plan, local_rank=1)
        rt.wrap(torch.nn.Linear(2, 2))
        assert [name for name, _ in fakes.calls] == ["place", "sync_batchnorm", "ddp"]
        keywords = {"find_unused_parameters": True, "static_graph": True, "gradient_as_bucket_view": False}
        assert fakes.calls[2][1] == {"device_ids": [1], "keywords": keywords}

    def test_ddp_on_cpu_has_no_device_ids(self) -> None:
        rt, fakes = runtime_for(resolve(Request(accelerator="cpu", devices=2), cpu()))
        rt.wrap(torch.nn.Linear(2, 2))
        assert fakes.calls[-1][0] == "ddp" and fakes.calls[-1][1]["device_ids"] is None

    def test_fsdp_takes_the_sharding_and_offload(self) -> None:
        options = FSDPOptions(sharding_strategy="SHARD_GRAD_OP", cpu_offload=True)
        rt, fakes = runtime_for(resolve(Request(strategy="fsdp", devices=2, strategy_options=options), cuda(2)))
        rt.wrap(torch.nn.Linear(2, 2))
        keywords = {
            "sharding_strategy": Encoded("SHARD_GRAD_OP", "ShardingStrategy"),
            "cpu_offload": Encoded(True, "CPUOffload"),
        }
        assert fakes.calls[-1] == ("fsdp", {"device": "cuda:0", "keywords": keywords})  # no mesh: not HYBRID_SHARD

    def test_deepspeed_gets_its_config_and_a_pointer(self) -> None:
        options = DeepSpeedOptions(stage=3, offload_optimizer=True, offload_parameters=True, offload_device="nvme")
        plan = resolve(
            Request(strategy="deepspeed", devices=2, strategy_options=options, precision="bf16-mixed"), DEEPSPEED
        )
        rt, _ = runtime_for(plan)
        with pytest.raises(NotWrappable, match=r"deepspeed\.initialize"):
            rt.wrap(torch.nn.Linear(2, 2))
        config = rt.deepspeed_config(micro_batch_size=4)
        assert config["zero_optimization"] == {
            "stage": 3,
            "offload_optimizer": {"device": "nvme", "pin_memory": True, "nvme_path": "/local_nvme"},
            "offload_param": {"device": "nvme", "pin_memory": True, "nvme_path": "/local_nvme"},
        }
        assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
        assert config["train_micro_batch_size_per_gpu"] == 4
        with pytest.raises(Incompatible, match="micro_batch_size"):
            deepspeed_config(plan, micro_batch_size=0)
        with pytest.raises(Incompatible, match="only a DeepSpeed plan"):
            deepspeed_config(resolve(Request(devices=2), cuda(2)))

    def test_xla_and_transformer_engine_point_elsewhere(self) -> None:
        xla = resolve(Request(accelerator="xla", devices=8), Environment(xla_device_count=8))
        engine = resolve(Request(precision="transformer-engine"), cuda(1, packages={"transformer_engine"}))
        for plan, words in ((xla, "torch_xla"), (engine, "fp8_autocast")):
            world = World(plan=plan, rank=0, local_rank=0, device="cpu", created=False, timeout_seconds=1)
            with pytest.raises(NotWrappable, match=words):
                Runtime(plan, world, wrappers=FakeWrappers()).wrap(torch.nn.Linear(2, 2))


class TestFrameworkMappings:
    def test_lightning_keeps_every_ddp_option(self) -> None:
        options = DDPOptions(find_unused_parameters=True, gradient_as_bucket_view=True, timeout_seconds=60)
        plan = resolve(Request(strategy="ddp_spawn", devices=[0, 3], strategy_options=options), cuda(4))
        mapped = lightning_arguments(plan)
        assert (mapped.accelerator, mapped.devices, mapped.precision) == ("cuda", [0, 3], "32-true")
        assert mapped.strategy.class_name == "DDPStrategy"
        assert mapped.strategy.arguments == {
            "find_unused_parameters": True,
            "static_graph": False,
            "gradient_as_bucket_view": True,
            "timeout": Encoded(60, "timedelta"),
            "start_method": "spawn",
            "process_group_backend": "nccl",
        }

    def test_lightning_fsdp_and_deepspeed(self) -> None:
        fsdp = resolve(Request(strategy="fsdp_cpu_offload", devices=2), cuda(2))
        assert lightning_arguments(fsdp).strategy.arguments["cpu_offload"] is True
        deepspeed = resolve(Request(strategy="deepspeed_stage_3_offload", devices=2), DEEPSPEED)
        arguments = lightning_arguments(deepspeed).strategy.arguments
        assert (arguments["stage"], arguments["offload_parameters"]) == (3, True)

    def test_lightning_has_no_data_parallel(self) -> None:
        with pytest.raises(Incompatible, match="removed DataParallel"):
            lightning_arguments(resolve(Request(strategy="dp", devices=2), cuda(2)))

    def test_accelerate_arguments_and_launch_flags(self) -> None:
        options = DDPOptions(find_unused_parameters=True, timeout_seconds=90)
        plan = resolve(Request(devices=[0, 2], precision="16-mixed", strategy_options=options), cuda(4))
        mapped = accelerate_arguments(plan)
        assert (mapped.cpu, mapped.mixed_precision) == (False, "fp16")
        assert mapped.ddp["find_unused_parameters"] is True and mapped.process_group["timeout"] == Encoded(
            90, "timedelta"
        )
        flags = mapped.launch_flags
        assert flags[:6] == ["--num_processes", "2", "--num_machines", "1", "--mixed_precision", "fp16"]
        assert "--multi_gpu" in flags and flags[flags.index("--gpu_ids") + 1] == "0,2"
        deepspeed = accelerate_arguments(resolve(Request(strategy="deepspeed_stage_3_offload", devices=2), DEEPSPEED))
        assert deepspeed.deepspeed == {
            "zero_stage": 3,
            "offload_optimizer_device": "cpu",
            "offload_param_device": "cpu",
        }
        assert " ".join(deepspeed.launch_flags).endswith(
            "--use_deepspeed --zero_stage 3 --offload_optimizer_device cpu --offload_param_device cpu"
        )
        fsdp = accelerate_arguments(resolve(Request(strategy="fsdp_cpu_offload", devices=2), cuda(2)))
        assert fsdp.fsdp == {"reshard_after_forward": "FULL_SHARD", "cpu_offload": True}
        assert " ".join(fsdp.launch_flags).endswith(
            "--use_fsdp --fsdp_reshard_after_forward FULL_SHARD --fsdp_offload_params true"
        )

    def test_accelerate_launch_refuses_several_cpu_processes(self) -> None:
        with pytest.raises(Incompatible, match="mpirun_hostfile"):
            accelerate_launch_flags(resolve(Request(accelerator="cpu", devices=2), cpu()))
        assert accelerate_launch_flags(resolve(Request(accelerator="cpu"), cpu())) == [
            "--num_processes",
            "1",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--cpu",
        ]

    def test_hybrid_shard_meshes_nodes_by_processes(self) -> None:
        options = FSDPOptions(sharding_strategy="HYBRID_SHARD")
        variables = {"MASTER_ADDR": "head", "MASTER_PORT": "29500", "NODE_RANK": "0"}
        plan = resolve(
            Request(strategy="fsdp", devices=2, num_nodes=2, strategy_options=options), cuda(2, variables=variables)
        )
        assert lightning_arguments(plan).strategy.arguments["device_mesh"] == (2, 2)
        rt, fakes = runtime_for(plan)
        rt.wrap(torch.nn.Linear(2, 2))
        assert fakes.calls[-1][1]["keywords"]["device_mesh"] == Encoded((2, 2), "DeviceMesh")

    def test_fsdp_fp16_scales_with_the_sharded_scaler(self) -> None:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        rt, _ = runtime_for(resolve(Request(strategy="fsdp", devices=2, precision="16-mixed"), cuda(2)))
        assert isinstance(rt.grad_scaler, ShardedGradScaler)

    def test_xla_on_all_cores_is_a_count_for_lightning(self) -> None:
        plan = resolve(Request(accelerator="xla", devices=8), Environment(xla_device_count=8))
        assert lightning_arguments(plan).devices == 8

    def test_xla_fsdp_is_fabrics_and_refused_by_the_trainer_and_accelerate(self) -> None:
        """Fabric registers `xla_fsdp` (XLAFSDPStrategy, built from its name where torch_xla lives); the Trainer
        and Accelerate have no counterpart: each is refused with the strategy it runs instead."""
        import trainplan as tp

        plan = resolve(Request(accelerator="tpu", strategy="xla_fsdp", devices=8), Environment(xla_device_count=8))
        assert (plan.strategy.family, plan.launcher, plan.world_size, plan.process_group_backend) == (
            "xla_fsdp",
            "xla",
            8,
            "xla",
        )
        mapped = lightning_arguments(plan)
        assert (mapped.accelerator, mapped.devices, mapped.strategy.class_name) == ("tpu", 8, "XLAFSDPStrategy")
        assert tp.fabric_arguments(plan)["strategy"] == "xla_fsdp"
        with pytest.raises(Incompatible, match="Trainer registers no XLAFSDPStrategy") as trainer:
            tp.lightning_trainer_arguments(plan)
        assert trainer.value.rule == "lightning-trainer-strategy" and "strategy='xla'" in str(trainer.value)
        with pytest.raises(Incompatible, match="Accelerate has no XLA FSDP") as accelerate:
            accelerate_arguments(plan)
        assert "strategy='xla'" in str(accelerate.value)
        for other in ("xla", "single_xla"):  # the Trainer has those: only xla_fsdp is refused
            devices = 8 if other == "xla" else 1
            xla = resolve(Request(accelerator="xla", strategy=other, devices=devices), Environment(xla_device_count=8))
            assert tp.lightning_trainer_arguments(xla)["strategy"] == other

    def test_xla_fsdp_takes_the_xla_precisions_only(self) -> None:
        env = Environment(xla_device_count=8)
        for precision in ("32-true", "16-true", "bf16-true"):
            assert resolve(Request(strategy="xla_fsdp", precision=precision), env).precision == precision
        with pytest.raises(Incompatible):
            resolve(Request(strategy="xla_fsdp", precision="bf16-mixed"), env)
        with pytest.raises(Incompatible, match="xla_fsdp"):
            resolve(Request(accelerator="xla", strategy="fsdp"), env)
        with pytest.raises(Incompatible, match="strategy='fsdp' on CUDA"):
            resolve(Request(accelerator="cuda", strategy="xla_fsdp", devices=2), cuda(2))

    def test_sync_batchnorm_is_never_lost(self) -> None:
        with pytest.raises(Incompatible, match="SyncBatchNorm synchronises batch statistics across CUDA"):
            resolve(Request(accelerator="cpu", devices=2, sync_batchnorm=True), cpu())
        plan = resolve(Request(devices=2, sync_batchnorm=True), cuda(2))
        assert lightning_arguments(plan).sync_batchnorm is True
        for framework in ("Fabric", "Accelerate"):
            with pytest.raises(Incompatible, match=f"{framework} has no sync_batchnorm setting"):
                framework_sync_batchnorm(plan, framework)

    @pytest.mark.parametrize("precision", ["16-true", "bf16-true", "64-true"])
    def test_accelerate_has_no_true_half_precision(self, precision: str) -> None:
        plan = resolve(Request(precision=precision, devices=1), cuda(1))  # type: ignore[arg-type]
        with pytest.raises(Incompatible, match="casts the whole model"):
            accelerate_arguments(plan)


class TestRefusals:
    """What a loop can get wrong is a typed error with the fix, never a raw torch error."""

    def test_wrap_takes_a_module(self) -> None:
        rt, _ = runtime_for(resolve(Request(accelerator="cpu"), cpu()))
        for thing in (None, lambda x: x, torch.zeros(2)):
            with pytest.raises(NotWrappable, match=r"takes a torch\.nn\.Module"):
                rt.wrap(thing)  # type: ignore[arg-type]

    def test_a_model_is_wrapped_once(self) -> None:
        """Wrapping twice would all-reduce every gradient twice: an already-wrapped model, or one this runtime
        wrapped before, is refused."""
        rt, _ = runtime_for(resolve(Request(accelerator="cpu"), cpu()))
        model = torch.nn.Linear(2, 2)
        wrapped = rt.wrap(model)
        for again in (model, wrapped):
            with pytest.raises(NotWrappable, match="takes the bare model once"):
                rt.wrap(again)
        with pytest.raises(NotWrappable, match="already a DataParallel"):
            rt.wrap(torch.nn.DataParallel(torch.nn.Linear(2, 2)))

    def test_a_rule_set_that_is_not_one_is_refused_by_name(self) -> None:
        plan = resolve(Request(accelerator="cpu"), cpu())
        with pytest.raises(InvalidRequest, match=r"the runtime takes a trainplan\.Rules, not an int"):
            trainplan.runtime(plan, rules=5)  # type: ignore[arg-type]

    def test_a_cuda_plan_on_a_torch_without_cuda_is_a_join_error(self) -> None:
        plan = resolve(Request(accelerator="cuda", devices=1), cuda(1))
        with pytest.raises(JoinError, match=r"drives cuda:0 on this process, and torch .* sees no cuda device"):
            trainplan.runtime(plan)

    def test_step_takes_a_scalar_loss_that_requires_grad(self) -> None:
        rt, _ = runtime_for(resolve(Request(accelerator="cpu"), cpu()))
        optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        for loss in (torch.tensor(1.0), torch.ones(2, requires_grad=True), 1.0):
            with pytest.raises(NotWrappable, match="scalar loss"):
                rt.step(loss, optimizer)  # type: ignore[arg-type]

    def test_a_runtime_after_leaving_says_so(self) -> None:
        rt, _ = runtime_for(resolve(Request(accelerator="cpu"), cpu()))
        rt.leave()
        for use in (lambda: rt.wrap(torch.nn.Linear(2, 2)), rt.barrier, rt.__enter__):
            with pytest.raises(NotWrappable, match="after leaving the world"):
                use()

    def test_step_takes_an_optimizer_and_sampler_a_sized_dataset(self) -> None:
        rt, _ = runtime_for(resolve(Request(accelerator="cpu"), cpu()))
        loss = torch.nn.Linear(2, 1)(torch.ones(1, 2)).sum()
        with pytest.raises(NotWrappable, match="optimizer"):
            rt.step(loss, None)  # type: ignore[arg-type]
        with pytest.raises(NotWrappable, match="a dataset with a length"):
            rt.sampler(5)  # type: ignore[arg-type]
