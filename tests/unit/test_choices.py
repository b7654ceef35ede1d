"""What the resolver chooses when a request leaves things to it, and how it reads explicit choices."""

from __future__ import annotations

import pytest

from tests.helpers import cpu, cuda, plan_for
from trainplan import (
    DDPOptions,
    DeepSpeedOptions,
    Environment,
    FSDPOptions,
    Incompatible,
    InvalidRequest,
    ModelParallelOptions,
    Note,
    Request,
    StrategyName,
)
from trainplan.resolve import resolve, resolve_uncached


def codes(env: Environment, **request: object) -> set[str]:
    return {note.code for note in plan_for(env, **request).notes}


class TestAutoAccelerator:
    """RFC: `auto` picks the best available hardware, XLA > CUDA > MPS > CPU."""

    def test_xla_wins_over_everything(self) -> None:
        env = Environment(xla_device_count=8, cuda_device_count=2, mps_available=True)
        assert plan_for(env).accelerator == "xla"

    def test_cuda_wins_over_mps_and_cpu(self) -> None:
        assert plan_for(Environment(cuda_device_count=1, mps_available=True)).accelerator == "cuda"

    def test_mps_wins_over_cpu(self) -> None:
        assert plan_for(Environment(mps_available=True)).accelerator == "mps"

    def test_cpu_when_nothing_else(self) -> None:
        plan = plan_for(cpu())
        assert (plan.accelerator, plan.devices, plan.strategy.name) == ("cpu", (0,), "single_device")
        assert "accelerator-auto" in {note.code for note in plan.notes}

    def test_gpu_means_cuda_or_mps(self) -> None:
        assert plan_for(cuda(2), accelerator="gpu").accelerator == "cuda"
        assert plan_for(Environment(mps_available=True), accelerator="gpu").accelerator == "mps"

    def test_tpu_is_xla_with_a_deprecation_note(self) -> None:
        plan = plan_for(Environment(xla_device_count=4), accelerator="tpu")
        assert plan.accelerator == "xla"
        assert "accelerator-alias" in {note.code for note in plan.notes}


class TestDevices:
    def test_auto_takes_every_visible_gpu(self) -> None:
        assert plan_for(cuda(4)).devices == (0, 1, 2, 3)

    def test_auto_takes_one_gpu_in_a_notebook_with_a_note(self) -> None:
        plan = plan_for(cuda(4, interactive=True))
        assert plan.devices == (0,)
        assert "devices-interactive" in {note.code for note in plan.notes}

    def test_a_notebook_with_exactly_one_gpu_takes_it_without_the_notebook_note(self) -> None:
        # Nothing was left out: the note that 'auto' uses 1 of N GPUs is for N > 1 only.
        plan = plan_for(cuda(1, interactive=True))
        assert plan.devices == (0,)
        assert "devices-interactive" not in {note.code for note in plan.notes}
        assert "devices-auto" in {note.code for note in plan.notes}

    @pytest.mark.parametrize("devices", [-1, "-1"])
    def test_minus_one_is_all(self, devices: object) -> None:
        assert plan_for(cuda(3), devices=devices).devices == (0, 1, 2)

    @pytest.mark.parametrize(("devices", "expected"), [(2, (0, 1)), ("3", (0, 1, 2)), ("0,2", (0, 2)), ("1,", (1,))])
    def test_counts_and_index_strings(self, devices: object, expected: tuple[int, ...]) -> None:
        assert plan_for(cuda(4), devices=devices).devices == expected

    def test_indices_keep_their_order(self) -> None:
        assert plan_for(cuda(8), devices=[5, 2]).devices == (5, 2)
        assert plan_for(cuda(8), devices=(3,)).devices == (3,)

    def test_cpu_devices_count_processes(self) -> None:
        plan = plan_for(cpu(), accelerator="cpu", devices=3)
        assert (plan.devices, plan.processes_per_node, plan.strategy.name) == ((0, 1, 2), 3, "ddp")
        assert plan.device_strings == ("cpu", "cpu", "cpu")

    def test_more_cpu_processes_than_cpus_is_a_warning(self) -> None:
        assert "cpu-oversubscribed" in codes(Environment(cpu_count=2), accelerator="cpu", devices=4)

    def test_one_cpu_process_per_cpu_is_no_oversubscription(self) -> None:
        assert "cpu-oversubscribed" not in codes(Environment(cpu_count=4), accelerator="cpu", devices=4)
        assert "cpu-oversubscribed" in codes(Environment(cpu_count=4), accelerator="cpu", devices=5)

    def test_mps_has_one_device(self) -> None:
        plan = plan_for(Environment(mps_available=True), devices=-1)
        assert plan.devices == (0,) and plan.device_for(0) == "mps:0"

    def test_xla_takes_one_or_all_or_one_index(self) -> None:
        env = Environment(xla_device_count=8)
        assert plan_for(env, devices=1).strategy.name == "single_xla"
        assert plan_for(env, devices=8).strategy.name == "xla"
        assert plan_for(env, devices=[5]).devices == (5,)
        assert plan_for(env).devices == tuple(range(8))


class TestAutoStrategy:
    def test_one_device_is_single_device(self) -> None:
        plan = plan_for(cuda(1))
        assert (plan.strategy.name, plan.launcher, plan.process_group_backend) == ("single_device", "none", None)
        assert plan.cluster.global_rank == 0

    def test_several_devices_is_ddp_by_subprocess(self) -> None:
        plan = plan_for(cuda(2))
        assert (plan.strategy.name, plan.launcher, plan.process_group_backend) == ("ddp", "subprocess", "nccl")
        assert plan.strategy.options == DDPOptions()

    def test_several_nodes_is_ddp_even_with_one_device(self) -> None:
        plan = plan_for(cuda(1), num_nodes=2)
        assert (plan.strategy.name, plan.world_size) == ("ddp", 2)

    def test_several_devices_in_a_notebook_forks(self) -> None:
        plan = plan_for(cuda(2, interactive=True), devices=2)
        assert (plan.strategy.name, plan.launcher) == ("ddp_fork", "fork")


class TestStrategyOptions:
    def test_presets_fill_the_options(self) -> None:
        """A preset's values are in force; which options were written stays the request's (none here)."""
        plan = plan_for(cuda(2), strategy="ddp_find_unused_parameters_true")
        assert plan.strategy.options == DDPOptions(find_unused_parameters=True, given=[])
        env = cuda(2, packages={"deepspeed"})
        plan = plan_for(env, strategy="deepspeed_stage_3_offload")
        expected = DeepSpeedOptions(stage=3, offload_optimizer=True, offload_parameters=True, given=[])
        assert plan.strategy.options == expected
        offload = plan_for(cuda(2), strategy="fsdp_cpu_offload").strategy.options
        assert offload == FSDPOptions(cpu_offload=True, given=[])

    def test_options_combine_with_a_preset_they_do_not_contradict(self) -> None:
        plan = plan_for(
            cuda(2), strategy="ddp_find_unused_parameters_true", strategy_options=DDPOptions(static_graph=True)
        )
        assert plan.strategy.options == DDPOptions(
            find_unused_parameters=True, static_graph=True, given=["static_graph"]
        )

    def test_deepspeed_defaults_to_stage_two(self) -> None:
        plan = plan_for(cuda(2, packages={"deepspeed"}), strategy="deepspeed")
        assert plan.strategy.options == DeepSpeedOptions(stage=2, given=[])


class TestPrecision:
    @pytest.mark.parametrize(
        ("given", "canonical"), [(64, "64-true"), (32, "32-true"), (16, "16-mixed"), ("bf16", "bf16-mixed")]
    )
    def test_aliases_normalise_with_a_deprecation_note(self, given: object, canonical: str) -> None:
        plan = plan_for(cuda(1), precision=given)
        assert plan.precision == canonical
        assert "precision-alias" in {note.code for note in plan.notes}

    def test_fp16_amp_on_cpu_falls_back_to_bf16_with_a_warning(self) -> None:
        plan = plan_for(cpu(), precision="16-mixed")
        assert plan.precision == "bf16-mixed"
        assert any(note.code == "precision-fallback" and note.level == "warning" for note in plan.notes)

    def test_transformer_engine_with_its_package(self) -> None:
        assert plan_for(cuda(1, packages={"transformer_engine"}), precision="transformer-engine").precision == (
            "transformer-engine"
        )


class TestBackendAndMetrics:
    def test_defaults_per_accelerator(self) -> None:
        assert plan_for(cuda(2)).process_group_backend == "nccl"
        assert plan_for(cpu(), devices=2).process_group_backend == "gloo"
        assert plan_for(Environment(xla_device_count=4)).process_group_backend == "xla"

    def test_gloo_may_serve_cuda(self) -> None:
        plan = plan_for(cuda(2), process_group_backend="gloo")
        assert plan.process_group_backend == "gloo"
        assert plan.metrics.reduces_on == "where_stored"

    def test_nccl_moves_cpu_stored_values_to_the_device(self) -> None:
        plan = plan_for(cuda(2), metrics_store="cpu")
        assert plan.metrics.reduces_on == "device" and plan.metrics.cpu_values_move_for_reduction
        assert "moved to the cuda device" in plan.metrics.explanation

    def test_one_process_reduces_nothing(self) -> None:
        assert plan_for(cuda(1)).metrics.reduces_on == "nowhere"

    def test_sync_batchnorm_on_one_process_is_noted(self) -> None:
        assert "sync-batchnorm-no-effect" in codes(cuda(1), sync_batchnorm=True)

    def test_sync_batchnorm_on_a_one_process_ddp_plan_is_noted_even_on_cpu(self) -> None:
        # DDP has a process group, but a world of one has nothing to synchronise with: a warning, not the
        # CUDA-only refusal that a world of several CPU processes gets.
        plan = plan_for(cpu(), accelerator="cpu", strategy="ddp", devices=1, sync_batchnorm=True)
        assert (plan.strategy.family, plan.world_size) == ("ddp", 1)
        assert ("sync-batchnorm-no-effect", "warning") in {(note.code, note.level) for note in plan.notes}
        with pytest.raises(Incompatible) as caught:
            plan_for(cpu(), accelerator="cpu", strategy="ddp", devices=2, sync_batchnorm=True)
        assert caught.value.rule == "sync-batchnorm-device"


class TestDeterminism:
    def test_same_request_same_environment_equal_plans(self) -> None:
        request = Request(strategy="ddp_spawn", devices="0,1", precision=16)
        assert resolve(request, cuda(2)) == resolve(request, cuda(2))

    def test_resolving_the_plans_request_again_gives_the_same_plan(self) -> None:
        plan = resolve(Request(devices="0,1", precision="bf16", accelerator="gpu"), cuda(2))
        assert resolve(plan.request, cuda(2)) == plan
        assert plan.request.devices == (0, 1) and plan.request.precision == "bf16-mixed"


class TestMemo:
    """resolve is pure, so it is memoised; the memo must never confuse values that compare equal."""

    def test_true_is_not_one(self) -> None:
        assert plan_for(cuda(2), devices=1).devices == (0,)
        with pytest.raises(InvalidRequest):
            plan_for(cuda(2), devices=True)
        with pytest.raises(InvalidRequest):
            plan_for(cuda(2), devices=(True,))

    def test_true_is_not_one_among_the_indices(self) -> None:
        """(1,) == (True,) and they hash alike: the memo keys the indices' types too."""
        assert plan_for(cuda(2), devices=(1,)).devices == (1,)
        with pytest.raises(InvalidRequest, match="devices"):
            plan_for(cuda(2), devices=(True,))

    def test_notes_are_part_of_the_key(self) -> None:
        note = Note(code="legacy", level="deprecation", message="old flag")
        plain = resolve(Request(devices=1), cuda(2))
        noted = resolve(Request(devices=1, notes=(note,)), cuda(2))
        assert note not in plain.notes and note in noted.notes

    def test_which_options_were_written_is_part_of_the_value(self) -> None:
        """Records that differ only in which options were written are different values (unequal, hashed apart), so
        equal requests resolve equally: the default dp_shard='auto' yields to a written tp='auto' while two written
        'auto's are refused; a preset takes an option left alone and refuses one written otherwise."""
        one = ModelParallelOptions(tp="auto")
        two = ModelParallelOptions(tp="auto", dp_shard="auto")
        assert one != two and Request(devices=4, strategy_options=one) != Request(devices=4, strategy_options=two)
        assert len({one, two, ModelParallelOptions(tp="auto")}) == 2
        assert resolve(Request(devices=4, strategy_options=one), cuda(4)).strategy.name == "model_parallel"
        with pytest.raises(Incompatible, match="both say 'auto'"):
            resolve(Request(devices=4, strategy_options=two), cuda(4))
        preset: StrategyName = "ddp_find_unused_parameters_true"
        left, written = DDPOptions(), DDPOptions(find_unused_parameters=False)
        assert left != written and hash(left) != hash(written)
        plan = resolve(Request(strategy=preset, devices=2, strategy_options=left), cuda(2))
        assert plan.strategy.options == DDPOptions(find_unused_parameters=True, given=[])
        with pytest.raises(Incompatible, match="already sets find_unused_parameters=True"):
            resolve(Request(strategy=preset, devices=2, strategy_options=written), cuda(2))
        again = resolve(Request(strategy=preset, devices=2, strategy_options=plan.strategy.options), cuda(2))
        assert again.strategy.options == plan.strategy.options, "a plan's options handed on resolve the same"

    def test_unhashable_garbage_is_still_an_invalid_request(self) -> None:
        with pytest.raises(InvalidRequest):
            plan_for(cuda(2), devices={"a": 1})

    def test_memoised_equals_uncached(self) -> None:
        request = Request(strategy="ddp_spawn", devices=2)
        assert resolve(request, cuda(2)) == resolve_uncached(request, cuda(2))
