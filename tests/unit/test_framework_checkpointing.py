"""The plan's memory choice reaches the model: the runtime checkpoints the repeated blocks and shards them one unit
each, and the adapters hand both to Lightning, Fabric and Accelerate where those frameworks can carry them, refusing
by name (`framework-checkpointing`, `framework-checkpointing-blocks`) where they cannot, with the memory it costs."""

from __future__ import annotations

import functools

import pytest
import torch

import trainplan as tp
from tests.llama_like import Block, Decoder
from tests.unit.test_runtime import runtime_for
from trainplan.mapping.frameworks import (
    accelerate_arguments,
    accelerate_launch_flags,
    checkpointing_consequence,
    lightning_arguments,
    needs_checkpointing,
)


def _gpus(count: int, gib: int, **facts: object) -> tp.Environment:
    return tp.Environment(cuda_device_count=count, cpu_count=8, cuda_memory_bytes=(gib << 30,) * count, **facts)  # type: ignore[arg-type]


LONG_1B = tp.transformer_facts(parameters=1e9, layers=16, hidden=2048, sequence=8192, batch_size=4)
"""A 1B model at 8192 tokens × 4 samples: DDP needs 50.8 GiB per device, 20.9 GiB recomputing activations."""
LONG_7B = tp.transformer_facts(parameters=7e9, layers=32, hidden=4096, sequence=8192, batch_size=2)


def _plan(strategy: str, facts: tp.ModelFacts = LONG_1B, **request: object) -> tp.Plan:
    return tp.resolve(
        tp.Request(model=facts, strategy=strategy, precision="bf16-mixed", **request),  # type: ignore[arg-type]
        _gpus(8, 40, packages=frozenset({"deepspeed"})),
    )


DDP = _plan("ddp")
FSDP = _plan("fsdp", LONG_7B)
MESH = _plan("model_parallel", LONG_7B, strategy_options=tp.ModelParallelOptions(tp=2))
DEEPSPEED = _plan("deepspeed_stage_2")
ROOMY = tp.resolve(tp.Request(strategy="fsdp", devices=2), _gpus(2, 40))
"""A plan without the model's facts: no memory choice to carry."""


def _tiny() -> Decoder:
    torch.manual_seed(0)
    return Decoder(vocab=32, hidden=8, layers=3, heads=2, ffn=16)


class TestThePlansChoice:
    def test_the_plans_here_fit_only_recomputing_and_say_what_losing_it_costs(self) -> None:
        for plan in (DDP, FSDP, MESH, DEEPSPEED):
            assert needs_checkpointing(plan), plan.strategy.name
        assert not needs_checkpointing(ROOMY)
        assert checkpointing_consequence(DDP) == (
            "50.8 GiB needed per device without it vs 36.0 GiB available, 20.9 GiB with it"
        )


class TestLightningAndFabric:
    def test_fsdp_takes_the_blocks_as_its_units_and_its_checkpointing_policy(self) -> None:
        for framework in ("trainer", "fabric"):
            arguments = lightning_arguments(FSDP, framework, blocks=(Block,)).strategy.arguments
            assert arguments["auto_wrap_policy"] == {Block}
            assert arguments["activation_checkpointing_policy"] == {Block}

    def test_fsdp_without_the_blocks_class_is_refused_by_name_with_the_memory(self) -> None:
        with pytest.raises(tp.Incompatible) as refused:
            lightning_arguments(FSDP, "fabric")
        assert refused.value.rule == "framework-checkpointing-blocks"
        assert checkpointing_consequence(FSDP) in str(refused.value)
        assert "fabric_arguments(plan, blocks=MyBlock)" in str(refused.value)

    def test_ddp_and_deepspeed_cannot_carry_it_unless_the_blocks_are_checkpointed_already(self) -> None:
        for plan, strategy_class in ((DDP, "DDPStrategy"), (DEEPSPEED, "DeepSpeedStrategy")):
            with pytest.raises(tp.Incompatible) as refused:
                lightning_arguments(plan, "trainer", blocks=(Block,))
            assert refused.value.rule == "framework-checkpointing"
            message = str(refused.value)
            assert f"{strategy_class}, which has no activation checkpointing setting" in message
            assert "trainplan.checkpoint_blocks(model)" in message and "checkpointed=True" in message
            arguments = lightning_arguments(plan, "trainer", checkpointed=True).strategy.arguments
            assert "activation_checkpointing_policy" not in arguments

    def test_a_checkpointed_fsdp_model_keeps_its_units_and_gets_no_second_policy(self) -> None:
        arguments = lightning_arguments(FSDP, "fabric", blocks=(Block,), checkpointed=True).strategy.arguments
        assert arguments["auto_wrap_policy"] == {Block} and "activation_checkpointing_policy" not in arguments

    def test_a_plan_without_a_memory_choice_gets_units_only(self) -> None:
        arguments = lightning_arguments(ROOMY, "trainer", blocks=(Block,)).strategy.arguments
        assert arguments["auto_wrap_policy"] == {Block} and "activation_checkpointing_policy" not in arguments
        assert "auto_wrap_policy" not in lightning_arguments(ROOMY, "trainer").strategy.arguments

    def test_a_mesh_is_checkpointed_in_fabrics_parallelize_and_refused_by_the_trainer(self) -> None:
        assert lightning_arguments(MESH, "fabric").checkpoint_in_parallelize
        assert not lightning_arguments(MESH, "fabric", checkpointed=True).checkpoint_in_parallelize
        with pytest.raises(tp.Incompatible, match="configure_model") as refused:
            lightning_arguments(MESH, "trainer")
        assert refused.value.rule == "framework-checkpointing"

    def test_the_real_strategy_objects_carry_it(self) -> None:
        strategy = tp.fabric_arguments(FSDP, blocks=Block)["strategy"]
        assert strategy._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {Block}
        assert strategy._fsdp_kwargs["auto_wrap_policy"]._module_classes == {Block}
        trainer_strategy = tp.lightning_trainer_arguments(FSDP, blocks=(Block,))["strategy"]
        assert trainer_strategy._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {Block}

    def test_fabrics_parallelize_sees_the_blocks_checkpointed_with_their_names(self) -> None:
        seen: list[tuple[str, ...]] = []

        def parallelize(model: torch.nn.Module, mesh: object) -> torch.nn.Module:
            seen.append(tuple(name for name, _ in model.named_modules()))
            return model

        strategy = tp.fabric_arguments(MESH, parallelize=parallelize)["strategy"]
        model = _tiny()
        names = tuple(name for name, _ in model.named_modules())
        strategy._parallelize_fn(model, None)
        assert seen == [names]  # every name kept: a tensor-parallel plan still finds its layers
        assert tp.checkpoint_blocks(model) == ("layers.0", "layers.1", "layers.2")  # already: nothing added

    def test_blocks_must_be_classes_for_a_framework(self) -> None:
        with pytest.raises(tp.InvalidRequest, match="blocks="):
            tp.fabric_arguments(FSDP, blocks=lambda module: True)
        with pytest.raises(tp.InvalidRequest, match="tuple of classes"):
            tp.accelerator_arguments(FSDP, blocks=())


class TestAccelerate:
    def test_the_fsdp_plugin_wraps_and_checkpoints_the_blocks_classes(self) -> None:
        mapped = accelerate_arguments(FSDP, blocks=(Block,))
        assert mapped.fsdp is not None
        assert mapped.fsdp["auto_wrap_policy"] == "transformer_based_wrap"
        assert mapped.fsdp["transformer_cls_names_to_wrap"] == ["Block"]
        assert mapped.fsdp["activation_checkpointing"] is True
        assert mapped.launch_flags[-2:] == ["--fsdp_activation_checkpointing", "true"]

    def test_the_real_plugin_carries_it(self) -> None:
        plugin = tp.accelerator_arguments(FSDP, blocks=Block)["fsdp_plugin"]
        assert plugin.activation_checkpointing is True
        assert plugin.transformer_cls_names_to_wrap == ["Block"]

    def test_the_fsdp_plugin_without_the_blocks_class_is_refused(self) -> None:
        with pytest.raises(tp.Incompatible) as refused:
            accelerate_arguments(FSDP, blocks=())
        assert refused.value.rule == "framework-checkpointing-blocks"
        assert "accelerator_arguments(plan, blocks=MyBlock)" in str(refused.value)

    def test_a_plan_without_an_fsdp_plugin_is_refused_with_the_memory_it_would_take(self) -> None:
        with pytest.raises(tp.Incompatible) as refused:
            accelerate_arguments(DDP, blocks=(Block,))
        assert refused.value.rule == "framework-checkpointing"
        assert "through its FSDP plugin only" in str(refused.value)
        assert "50.8 GiB needed per device without it vs 36.0 GiB available" in str(refused.value)
        assert accelerate_arguments(DDP, checkpointed=True).fsdp is None

    def test_the_launch_flags_say_it_without_the_model(self) -> None:
        assert accelerate_launch_flags(FSDP)[-2:] == ["--fsdp_activation_checkpointing", "true"]
        assert "--fsdp_activation_checkpointing" not in accelerate_launch_flags(DDP)  # the script's Accelerator
        assert "--fsdp_activation_checkpointing" not in accelerate_launch_flags(ROOMY)


class TestTheRuntime:
    """rt.wrap carries out the plan's memory choice on the model's blocks, before any wrapper sees the model."""

    def test_ddp_checkpoints_the_repeated_layers(self) -> None:
        rt, fakes = runtime_for(DDP)
        model = _tiny()
        rt.wrap(model)
        assert rt.checkpointing == ("layers.0", "layers.1", "layers.2") and rt.sharding_units == ()
        assert [name for name, _ in fakes.calls] == ["place", "ddp"]
        assert tp.checkpoint_blocks(model) == rt.checkpointing  # they are checkpointed: a second call adds nothing

    def test_fsdp_shards_each_block_as_a_unit(self) -> None:
        rt, fakes = runtime_for(FSDP)
        model = _tiny()
        rt.wrap(model)
        policy = fakes.calls[-1][1]["keywords"]["auto_wrap_policy"]
        assert isinstance(policy, functools.partial)
        assert rt.sharding_units == ("layers.0", "layers.1", "layers.2") == rt.checkpointing
        units = [module for module in model.modules() if policy.keywords["lambda_fn"](module)]
        assert units == list(model.layers)  # the blocks of the model it wrapped, and nothing else
        assert not policy.keywords["lambda_fn"](_tiny().layers[0])

    def test_fsdp_without_a_memory_choice_still_shards_by_block(self) -> None:
        rt, fakes = runtime_for(ROOMY)
        rt.wrap(_tiny())
        assert rt.checkpointing == () and rt.sharding_units == ("layers.0", "layers.1", "layers.2")
        assert "auto_wrap_policy" in fakes.calls[-1][1]["keywords"]

    def test_blocks_may_be_a_class_a_tuple_or_a_function(self) -> None:
        for blocks in (Block, (Block, torch.nn.Embedding), lambda module: isinstance(module, Block)):
            rt, _ = runtime_for(DDP)
            rt.wrap(_tiny(), blocks=blocks)
            expected = ("layers.0", "layers.1", "layers.2")
            assert rt.checkpointing == (("embed", *expected) if isinstance(blocks, tuple) else expected)

    def test_a_model_without_blocks_is_refused_saying_what_to_pass(self) -> None:
        rt, _ = runtime_for(DDP)
        with pytest.raises(tp.NotWrappable) as refused:
            rt.wrap(torch.nn.Linear(4, 4))
        message = str(refused.value)
        assert "fits only with activation checkpointing (50.8 GiB needed per device without it" in message
        assert "rt.wrap(model, blocks=MyBlock)" in message

    def test_blocks_that_match_nothing_or_are_not_blocks_are_refused(self) -> None:
        rt, _ = runtime_for(DDP)
        with pytest.raises(tp.NotWrappable, match="no module matches blocks="):
            rt.wrap(_tiny(), blocks=torch.nn.Conv2d)
        with pytest.raises(tp.NotWrappable, match="a module class"):
            rt.wrap(_tiny(), blocks="layers")  # type: ignore[arg-type]

    def test_a_plan_without_a_memory_choice_checkpoints_nothing(self) -> None:
        rt, _ = runtime_for(tp.resolve(tp.Request(devices=2), _gpus(2, 40)))
        model = _tiny()
        rt.wrap(model)
        assert rt.checkpointing == () and tp.checkpoint_blocks(model) == ("layers.0", "layers.1", "layers.2")

    def test_deepspeed_points_to_checkpoint_blocks(self) -> None:
        rt, _ = runtime_for(DEEPSPEED)
        with pytest.raises(tp.NotWrappable, match=r"deepspeed\.initialize.*after trainplan\.checkpoint_blocks"):
            rt.wrap(_tiny())


class TestTheBlocks:
    def test_the_repeated_layers_are_the_longest_list_of_one_class(self) -> None:
        model = torch.nn.Sequential(
            torch.nn.Linear(2, 2), torch.nn.ModuleList([torch.nn.ReLU(), torch.nn.ReLU(), torch.nn.ReLU()])
        )
        assert list(tp.repeated_layers(model)) == ["1.0", "1.1", "1.2"]
        assert list(tp.repeated_layers(_tiny())) == ["layers.0", "layers.1", "layers.2"]
        assert tp.repeated_layers(torch.nn.Linear(2, 2)) == {}

    def test_a_match_inside_another_is_part_of_it(self) -> None:
        assert list(tp.find_blocks(_tiny(), (Block, torch.nn.Linear))) == ["layers.0", "layers.1", "layers.2", "head"]

    def test_checkpointing_keeps_names_outputs_and_gradients(self) -> None:
        plain, checkpointed = _tiny(), _tiny()
        tp.checkpoint_blocks(checkpointed)
        assert list(checkpointed.state_dict()) == list(plain.state_dict())
        tokens = torch.randint(0, 32, (2, 5))
        for model in (plain, checkpointed):
            model(tokens).float().sum().backward()
        for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters(), strict=True):
            assert a.grad is not None and b.grad is not None
            assert torch.allclose(a.grad, b.grad, atol=1e-6), name

    def test_a_model_wrapped_by_torchs_checkpoint_wrapper_is_not_checkpointed_twice(self) -> None:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

        model = _tiny()
        apply_activation_checkpointing(model, check_fn=lambda module: isinstance(module, Block))
        names = tp.checkpoint_blocks(model, Block)
        assert names == tuple(f"layers.{index}._checkpoint_wrapped_module" for index in range(3))
        from torch.distributed._composable.contract import _get_registry

        assert all("checkpoint" not in (_get_registry(model.get_submodule(name)) or {}) for name in names)

    def test_checkpoint_blocks_refuses_what_is_not_a_module(self) -> None:
        with pytest.raises(tp.NotWrappable, match=r"torch\.nn\.Module"):
            tp.checkpoint_blocks("model")  # type: ignore[arg-type]
