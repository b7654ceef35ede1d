"""The memory-aware choice: the arithmetic reproduces the ZeRO paper, 'auto' takes the most preferred layout that
fits, an explicit strategy is checked, and what cannot fit is refused with the arithmetic."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest

import trainplan as tp
import trainplan.cli
from tests.helpers import memory_world, ways_out
from trainplan.resolve import resolve_uncached
from trainplan.resolve.memory import estimate
from trainplan.rules.memory import MEMORY_LAYOUTS
from trainplan.spec.names import StrategyName

LAYOUTS = {layout.name: layout for layout in MEMORY_LAYOUTS}
GB = 10**9


def _model_states(parameters: float, devices: int, layout: str) -> float:
    """Model states per device (GB) of mixed-precision Adam (K = 12) under `layout`, by the rows' arithmetic."""
    count = int(parameters)
    facts = tp.ModelFacts(
        parameter_count=count,
        parameter_bytes=2 * count,
        gradient_bytes=2 * count,
        optimizer_bytes=12 * count,
        activation_bytes_per_sample=0,
    )
    item = estimate(LAYOUTS[layout], False, facts, 1, devices)
    return (item.parameters + item.gradients + item.optimizer) / GB


# Rajbhandari et al. 2020 (ZeRO), Table 1: per-device model states (GB), for Ψ and Nd; columns baseline, P_os,
# P_os+g, P_os+g+p.
ZERO_TABLE = {
    (7.5e9, 4): (120, 52.5, 41.3, 30),
    (7.5e9, 16): (120, 35.6, 21.6, 7.5),
    (7.5e9, 64): (120, 31.4, 16.6, 1.88),
    (7.5e9, 256): (120, 30.4, 15.4, 0.47),
    (7.5e9, 1024): (120, 30.1, 15.1, 0.12),
    (128e9, 4): (2048, 896, 704, 512),
    (128e9, 16): (2048, 608, 368, 128),
    (128e9, 64): (2048, 536, 284, 32),
    (128e9, 256): (2048, 518, 263, 8),
    (128e9, 1024): (2048, 513, 257, 2),
    (1e12, 4): (16000, 7000, 5500, 4000),
    (1e12, 16): (16000, 4750, 2875, 1000),
    (1e12, 64): (16000, 4187, 2218, 250),
    (1e12, 256): (16000, 4046, 2054, 62.5),
    (1e12, 1024): (16000, 4011, 2013, 15.6),
}


@pytest.mark.parametrize(("parameters", "devices"), sorted(ZERO_TABLE))
def test_the_rows_reproduce_the_zero_papers_table_within_one_percent(parameters: float, devices: int) -> None:
    ours = [_model_states(parameters, devices, layout) for layout in ("ddp", "zero1", "zero2", "fsdp")]
    for mine, published in zip(ours, ZERO_TABLE[parameters, devices], strict=True):
        assert mine == pytest.approx(published, rel=0.01, abs=0.005)  # the paper prints at most two decimals


def test_the_zero_papers_worked_example() -> None:
    """7.5B parameters, K = 12, Nd = 64: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB (the paper's §5 figures)."""
    figures = [round(_model_states(7.5e9, 64, layout), 1) for layout in ("ddp", "zero1", "zero2", "fsdp")]
    assert figures == [120.0, 31.4, 16.6, 1.9]


def _deepspeed_zero3_gpu(parameters: int, largest_layer: int, devices: int) -> int:
    """DeepSpeed's `estimate_zero3_model_states_mem_needs` without offload (its formula, written out):
    4·largest_layer + 18·Ψ / devices."""
    return 4 * largest_layer + 18 * parameters // devices


def _deepspeed_zero2_offload_gpu(parameters: int) -> int:
    """DeepSpeed's `estimate_zero2_model_states_mem_needs` with cpu_offload: 2·Ψ on the GPU."""
    return 2 * parameters


def test_zero3_model_states_are_deepspeeds_less_its_extra_fp32_gradient_partition() -> None:
    """DeepSpeed counts 18 bytes a parameter at stage 3 (the paper's 16, and 2 for an fp32 gradient partition) and 4
    bytes per parameter of the largest layer; ours is the paper's 16, and the gathered layers and root unit apart."""
    facts = tp.transformer_facts(parameters=7e9, layers=32, hidden=4096)
    per_layer = facts.largest_layer_bytes // 2
    for devices in (8, 64, 512):
        item = estimate(LAYOUTS["fsdp"], False, facts, 1, devices)
        states = item.parameters + item.gradients + item.optimizer
        deepspeed = _deepspeed_zero3_gpu(facts.parameter_count, per_layer, devices) - 4 * per_layer
        assert states / deepspeed == pytest.approx(16 / 18, rel=1e-6)


def test_zero2_offload_keeps_deepspeeds_two_bytes_a_parameter_on_the_device() -> None:
    facts = tp.transformer_facts(parameters=7e9, layers=32, hidden=4096)
    item = estimate(LAYOUTS["zero2_offload"], False, facts, 1, 8)
    assert item.parameters + item.gradients + item.optimizer == _deepspeed_zero2_offload_gpu(facts.parameter_count)
    assert item.host == -(-(facts.gradient_bytes) // 8) + -(-(facts.optimizer_bytes) // 8)


def _gpus(count: int, gib: int, nodes: int = 1, **facts: object) -> tp.Environment:
    return tp.Environment(cuda_device_count=count, cuda_memory_bytes=(gib << 30,) * count, **facts)  # type: ignore[arg-type]


SEVEN_B = tp.transformer_facts(parameters=7e9, layers=32, hidden=4096)


def test_7b_on_8_by_40gb_takes_fsdp_and_shows_why_ddp_does_not_fit() -> None:
    plan = tp.resolve(tp.Request(model=SEVEN_B, precision="bf16-mixed"), _gpus(8, 40))
    assert plan.strategy.name == "fsdp"
    assert plan.memory is not None and plan.memory.chosen == "fsdp"
    verdicts = {(item.layout, item.checkpointing): item.verdict for item in plan.memory.candidates}
    assert verdicts["ddp", False].startswith("needs 134.3 GiB")
    assert verdicts["fsdp", False] == "chosen"
    assert "→ fsdp" in plan.explain()


def test_a_small_model_stays_on_ddp_and_a_single_gpu_on_single_device() -> None:
    small = tp.transformer_facts(parameters=1e8, layers=12, hidden=768, sequence=1024)
    assert tp.resolve(tp.Request(model=small), _gpus(8, 40)).strategy.name == "ddp"
    assert tp.resolve(tp.Request(model=small), _gpus(1, 40)).strategy.name == "single_device"


def test_deepspeed_installed_makes_zero2_preferred_over_fsdp() -> None:
    thirteen = tp.transformer_facts(parameters=3e9, layers=32, hidden=2560, sequence=2048)
    env = attrs.evolve(_gpus(8, 40), packages={"deepspeed"})
    plan = tp.resolve(tp.Request(model=thirteen, precision="bf16-mixed"), env)
    assert plan.memory is not None
    assert plan.memory.chosen in {"zero1", "zero2"}
    assert plan.strategy.name.startswith("deepspeed_stage_")


def test_two_nodes_take_hsdp_before_fsdp() -> None:
    env = _gpus(8, 40).with_variables({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "0"})
    plan = tp.resolve(tp.Request(model=SEVEN_B, num_nodes=2, precision="bf16-mixed"), env)
    assert plan.strategy.name == "fsdp"
    assert plan.strategy.options == tp.FSDPOptions(sharding_strategy="HYBRID_SHARD")


def test_a_long_sequence_takes_checkpointing_or_tensor_parallelism_when_fsdp_alone_does_not_fit() -> None:
    long = tp.transformer_facts(parameters=7e9, layers=32, hidden=4096, sequence=8192, batch_size=2)
    plan = tp.resolve(tp.Request(model=long, precision="bf16-mixed"), _gpus(8, 40))
    assert plan.memory is not None
    chosen = plan.memory.estimate
    assert chosen is not None and chosen.total <= plan.memory.budget_bytes
    assert plan.strategy.name == "model_parallel" and plan.mesh is not None and plan.mesh.sizes["tp"] > 1


def test_the_plans_estimate_is_the_chosen_candidate_with_its_checkpointing() -> None:
    # 7B at batch 16 fits 8 x 40 GiB only recomputing: the layout is a candidate twice, and the plan's estimate (what
    # the runtime reads to turn checkpointing on) is the one chosen, not the first of that name.
    batch = tp.transformer_facts(parameters=7e9, layers=32, hidden=4096, batch_size=16)
    memory = tp.resolve(tp.Request(model=batch, precision="bf16-mixed"), _gpus(8, 40)).memory
    assert memory is not None and memory.chosen == "tp2_fsdp"
    chosen = memory.estimate
    assert chosen is not None and chosen.verdict == "chosen" and chosen.checkpointing and memory.checkpointing
    assert chosen.total <= memory.budget_bytes
    without = next(item for item in memory.candidates if (item.layout, item.checkpointing) == ("tp2_fsdp", False))
    assert not without.fits


def test_an_explicit_strategy_that_fits_only_recomputing_says_so() -> None:
    batch = tp.transformer_facts(parameters=7e9, layers=32, hidden=4096, batch_size=4)
    memory = tp.resolve(tp.Request(model=batch, strategy="fsdp"), _gpus(8, 40)).memory
    assert memory is not None and [item.verdict == "chosen" for item in memory.candidates] == [False, True]
    assert memory.estimate is memory.candidates[1] and memory.checkpointing


def test_tensor_parallelism_divides_the_backwards_temporaries() -> None:
    # Measured in a tp=2 x dp_shard=2 gloo world (tests/processes/test_memory_world.py): each rank's temporaries are
    # its shard's, as its activations are.
    facts = attrs.evolve(SEVEN_B, temporary_bytes=8 << 30)
    whole = estimate(LAYOUTS["fsdp"], False, facts, 1, 8)
    split = estimate(LAYOUTS["tp4_fsdp"], False, facts, 1, 8)
    assert (whole.temporaries, split.temporaries) == (8 << 30, 2 << 30)
    assert estimate(LAYOUTS["ddp"], False, facts, 1, 8).temporaries == (8 << 30) + facts.gradient_bytes  # + buckets


@pytest.mark.parametrize(
    ("good", "bad", "field"),
    [
        (tp.Request(model=SEVEN_B), tp.Request(model=attrs.evolve(SEVEN_B, batch_size=True)), "model.batch_size"),
        (
            tp.Request(model=SEVEN_B, memory_policy=tp.MemoryPolicy(offload=True)),
            tp.Request(model=SEVEN_B, memory_policy=tp.MemoryPolicy(offload=1)),  # type: ignore[arg-type]
            "memory_policy.offload",
        ),
    ],
)
def test_the_resolve_cache_tells_a_bool_from_an_int_inside_the_memory_records(
    good: tp.Request, bad: tp.Request, field: str
) -> None:
    # True == 1 and both hash alike: resolved after an equal, well-typed request, the wrong one is still refused.
    assert good == bad and hash(good) == hash(bad)
    tp.resolve(good, _gpus(8, 40))
    with pytest.raises(tp.InvalidRequest) as refused:
        tp.resolve(bad, _gpus(8, 40))
    assert refused.value.field == field


def test_without_checkpointing_or_offload_allowed_the_refusal_says_what_to_change() -> None:
    policy = tp.MemoryPolicy(activation_checkpointing=False, offload=False)
    with pytest.raises(tp.Incompatible) as refused:
        tp.resolve(tp.Request(model=tp.transformer_facts(parameters=70e9), memory_policy=policy), _gpus(8, 40))
    message = str(refused.value)
    assert refused.value.rule == "memory-nothing-fits"
    assert "the closest, tp4_fsdp" in message and "per device (parameters" in message
    assert (
        "use 6 nodes like this one (num_nodes=6, 8 such device(s) each: 48 devices)" in message
        and "allow MemoryPolicy(activation_checkpointing=True)" in message
    )


def test_70b_on_one_24gb_gpu_is_refused_naming_the_devices_it_needs() -> None:
    env = _gpus(1, 24, host_memory_bytes=64 << 30)
    with pytest.raises(
        tp.Incompatible, match=r"fits no layout on 1 device\(s\) of 24.0 GiB.*To fit it: use \d+ nodes like this one"
    ):
        tp.resolve(tp.Request(model=tp.transformer_facts(parameters=70e9)), env)


def test_an_explicit_strategy_that_does_not_fit_names_the_layouts_that_do() -> None:
    with pytest.raises(tp.Incompatible) as refused:
        tp.resolve(tp.Request(model=SEVEN_B, strategy="ddp"), _gpus(8, 40))
    assert refused.value.rule == "memory-strategy-too-big"
    assert "strategy 'ddp' will not fit: 130.4 GiB" in str(refused.value)  # with checkpointing: the step's peak
    assert "These fit: fsdp," in str(refused.value)


def test_an_explicit_strategy_that_fits_carries_its_estimate() -> None:
    plan = tp.resolve(tp.Request(model=SEVEN_B, strategy="fsdp"), _gpus(8, 40))
    assert plan.memory is not None and plan.memory.chosen == "fsdp"
    assert [item.verdict for item in plan.memory.candidates] == ["chosen", "fits"]


def test_an_explicit_mesh_is_checked_with_its_tensor_parallel_degree() -> None:
    request = tp.Request(model=SEVEN_B, strategy="model_parallel", strategy_options=tp.ModelParallelOptions(tp=4))
    plan = tp.resolve(request, _gpus(8, 40))
    assert plan.memory is not None and plan.memory.chosen == "tp4_fsdp"
    assert plan.memory.candidates[0].tensor_parallel == 4


def test_without_the_devices_memory_the_model_is_noted_and_not_checked() -> None:
    plan = tp.resolve(tp.Request(model=SEVEN_B), tp.Environment(cuda_device_count=8))
    assert plan.memory is None and plan.strategy.name == "ddp"
    assert "memory-unknown" in [note.code for note in plan.notes]


def test_a_plan_with_its_memory_round_trips_through_json() -> None:
    plan = tp.resolve(tp.Request(model=SEVEN_B, memory_policy=tp.MemoryPolicy(headroom=0.2)), _gpus(8, 40))
    assert tp.Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_a_plan_saved_before_model_facts_had_a_hidden_size_is_read_as_not_known() -> None:
    plan = tp.resolve(tp.Request(model=SEVEN_B), _gpus(8, 40))
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["request"]["model"].pop("hidden_size") == SEVEN_B.hidden_size
    read = tp.Plan.from_dict(data)
    assert read.request.model is not None and read.request.model.hidden_size == 0
    assert (read.strategy, read.memory) == (plan.strategy, plan.memory)
    data["request"]["model"].pop("layer_count")  # a field every saved plan has is still required
    with pytest.raises(tp.PlanFormatError, match="layer_count"):
        tp.Plan.from_dict(data)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (tp.Request(model=attrs.evolve(SEVEN_B, parameter_count=0)), "model.parameter_count"),
        (tp.Request(model=attrs.evolve(SEVEN_B, optimizer_bytes=-1)), "model.optimizer_bytes"),
        (tp.Request(model=attrs.evolve(SEVEN_B, batch_size=True)), "model.batch_size"),
        (tp.Request(model=7e9), "model"),  # type: ignore[arg-type]
        (tp.Request(memory_policy=tp.MemoryPolicy(headroom=1.0)), "memory_policy.headroom"),
    ],
)
def test_wrong_facts_are_refused_by_name(request_: tp.Request, field: str) -> None:
    with pytest.raises(tp.InvalidRequest) as refused:
        tp.resolve(request_, _gpus(8, 40))
    assert refused.value.field == field


def test_zero_device_memory_is_a_wrong_fact() -> None:
    with pytest.raises(tp.InvalidRequest, match="cuda_memory_bytes"):
        tp.resolve(tp.Request(model=SEVEN_B), _gpus(8, 0))


def test_trainplan_fit_answers_the_7b_question_with_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert tp.cli.main(["fit", "--params", "7e9", "--layers", "32", "--hidden", "4096", "--gpus", "8x40GiB"]) == 0
    out = capsys.readouterr().out
    assert "choice: fsdp FSDPOptions() on 8 GPU(s)" in out
    assert "→ fsdp " in out and "needs 134.3 GiB > 36.0 GiB" in out


def test_trainplan_fit_reads_a_model_cards_count(capsys: pytest.CaptureFixture[str]) -> None:
    # "7B" is seven billion parameters, as model cards write it (it was read as 7 bytes: 7 parameters, ddp)
    assert tp.cli.main(["fit", "--params", "7B", "--layers", "32", "--hidden", "4096", "--gpus", "8x40GiB"]) == 0
    assert "choice: fsdp FSDPOptions() on 8 GPU(s)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "count"),
    [("7e9", 7 * 10**9), ("7B", 7 * 10**9), ("1.3b", 1_300_000_000), ("350M", 350 * 10**6), ("125k", 125_000)],
)
def test_parameter_counts_are_read_as_model_cards_write_them(text: str, count: int) -> None:
    from trainplan.parse.memory import parse_count

    assert parse_count(text) == count


@pytest.mark.parametrize("text", ["", "7GiB", "7GB", "0", "0.4", "-7B", "1e99", "seven"])
def test_what_is_no_parameter_count_is_none(text: str) -> None:
    from trainplan.parse.memory import parse_count

    assert parse_count(text) is None


@pytest.mark.parametrize("flags", [["--params", "7GiB", "--gpus", "8x40GiB"], ["--params", "7B", "--gpus", "8x40"]])
def test_trainplan_fit_refuses_a_count_written_as_a_size_and_a_size_without_its_unit(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        tp.cli.main(["fit", *flags])
    assert exited.value.code == 2
    wrong = f"--params {flags[1]}: write" if flags[1] == "7GiB" else f"--gpus {flags[3].partition('x')[2]}: write"
    assert wrong in capsys.readouterr().err


def test_trainplan_fit_refuses_what_fits_nowhere_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        tp.cli.main(["fit", "--params", "70e9", "--gpus", "1x24GiB", "--host-memory", "64GiB"])
    assert exited.value.code == 2
    assert "fits no layout on 1 device(s) of 24.0 GiB" in capsys.readouterr().err


def test_assumed_gpu_memory_feeds_the_plan_commands_memory_check(capsys: pytest.CaptureFixture[str]) -> None:
    env = tp.cli._environment(
        tp.cli._parser().parse_args(["plan", "--no-probe", "--assume", "gpu-memory=40GiB", "--assume", "cuda=8"])
    )
    assert env.cuda_memory_bytes == (40 << 30,) * 8


@pytest.mark.parametrize(
    ("text", "size"),
    [("40GiB", 40 << 30), ("40G", 40 << 30), ("40GB", 40 * 10**9), ("512MiB", 512 << 20), ("7e9", 7 * 10**9)],
)
def test_sizes_are_read_as_people_write_them(text: str, size: int) -> None:
    from trainplan.parse.memory import parse_bytes

    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["", "forty", "0GiB", "-1G", "1e99", "40", "512"])
def test_what_is_no_size_is_none(text: str) -> None:
    from trainplan.parse.memory import parse_bytes

    assert parse_bytes(text) is None


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--params", "1e400"], "--params 1e400: write the parameter count"),
        (["--params", "1e16"], "at most 1e15"),
        (["--params", "7e9", "--layers", "0"], "--layers 0: write a whole number"),
        (["--params", "7e9", "--hidden", "-1"], "--hidden -1: write a whole number"),
        (["--params", "7e9", "--sequence", "99999999999999999999"], "--sequence 99999999999999999999"),
    ],
)
def test_fit_refuses_absurd_shapes_by_their_flag(
    capsys: pytest.CaptureFixture[str], flags: list[str], words: str
) -> None:
    from trainplan.cli import main

    with pytest.raises(SystemExit) as exit:
        main(["fit", *flags, "--gpus", "8x40GiB"])
    assert exit.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("field", ["layers", "hidden", "sequence", "batch_size"])
def test_transformer_facts_refuses_a_shape_below_one_typed(field: str) -> None:
    import trainplan as tp

    with pytest.raises(tp.InvalidRequest, match=f"{field}=0 is not accepted"):
        tp.transformer_facts(parameters=7e9, **{field: 0})  # type: ignore[arg-type]


def test_small_sizes_print_in_a_unit_that_shows_the_difference() -> None:
    """A 20 MiB device printed '0.0 GiB (0.0 GiB each ...) ... 0.0 GiB a node > 0.0 GiB': every size now prints in
    the largest unit it reaches, and the explain table in the unit of a device's memory."""
    small = tp.transformer_facts(parameters=3e6, layers=2, hidden=256, sequence=128)
    env = tp.Environment(cuda_device_count=1, cuda_memory_bytes=(20 << 20,), host_memory_bytes=30 << 20)
    with pytest.raises(tp.Incompatible) as refused:
        tp.resolve(tp.Request(model=small), env)
    message = str(refused.value)
    assert "0.0 GiB" not in message
    assert "1 device(s) of 20.0 MiB (18.0 MiB each" in message
    assert "host memory: 45.8 MiB a node > 27.0 MiB (30.0 MiB less 10% headroom)" in message
    hundred_mib = tp.Environment(cuda_device_count=1, cuda_memory_bytes=(100 << 20,))
    explained = tp.resolve(tp.Request(model=small), hundred_mib).explain()
    assert "memory per device (MiB): 100.0 a device, budget 90.0" in explained


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ((36 << 30) + (40 << 20), 36 << 30, ("36.04 GiB", "36.00 GiB")),  # one decimal would print them alike
        (36 << 30, 36 << 30, ("36.0 GiB", "36.0 GiB")),
        (5 << 20, 3 << 10, ("5.0 MiB", "0.0 MiB")),  # one unit for both: the larger's
        ((1 << 30) + 1, 1 << 30, ("1,073,741,825 bytes", "1,073,741,824 bytes")),  # past six decimals: bytes
        (1000, 999, ("1,000 bytes", "999 bytes")),
    ],
)
def test_two_compared_sizes_print_apart(first: int, second: int, expected: tuple[str, str]) -> None:
    from trainplan.spec.sizes import compared

    assert compared(first, second) == expected


GIB = 1 << 30
SEVENTY_B = tp.transformer_facts(parameters=70e9)


@pytest.mark.parametrize(
    ("request_", "env", "kinds"),
    [
        # The review's case: on 1 x 24 GB the advice was "use 19 devices", on 19 it was "use 114", and so on, because
        # the offload's host memory is a node's: 19 devices fit only as 19 nodes, each with its own 64 GiB.
        pytest.param(
            tp.Request(model=SEVENTY_B),
            memory_world(1, 24 * GIB, 64 * GIB),
            {"nodes", "devices a node", "host memory", "device memory", "biggest model"},
            id="70b-1x24gb-host-binds",
        ),
        pytest.param(
            tp.Request(model=SEVENTY_B),
            memory_world(19, 24 * GIB, 64 * GIB),
            {"nodes", "devices a node", "host memory", "device memory", "biggest model"},
            id="70b-19x24gb-host-binds",
        ),
        pytest.param(
            tp.Request(model=SEVENTY_B, memory_policy=tp.MemoryPolicy(activation_checkpointing=False, offload=False)),
            memory_world(8, 40 * GIB, None),
            {"nodes", "device memory", "biggest model"},
            id="70b-8x40gb-no-offload",
        ),
        pytest.param(
            tp.Request(model=SEVENTY_B, num_nodes=2, memory_policy=tp.MemoryPolicy(offload=False)),
            memory_world(8, 80 * GIB, 2 << 40),
            {"nodes", "device memory", "biggest model"},
            id="70b-2x8x80gb-no-offload",
        ),
        pytest.param(
            tp.Request(
                model=tp.transformer_facts(parameters=13e9, batch_size=4), memory_policy=tp.MemoryPolicy(offload=False)
            ),
            memory_world(1, 24 * GIB, None),
            {"nodes", "device memory", "biggest model"},
            id="13b-1x24gb-batch-4",
        ),
        pytest.param(
            tp.Request(model=tp.transformer_facts(parameters=3e6, layers=2, hidden=256, sequence=128)),
            memory_world(1, 20 << 20, 30 << 20),
            {"nodes", "host memory", "device memory", "biggest model"},
            id="3m-1x20mib-host-binds",
        ),
    ],
)
def test_every_way_out_of_a_refusal_fits_when_followed(
    request_: tp.Request, env: tp.Environment, kinds: set[str]
) -> None:
    """Each "To fit it" change, its numbers written into the request or the node, resolves to a plan that fits."""
    with pytest.raises(tp.Incompatible) as refused:
        resolve_uncached(request_, env)
    assert refused.value.rule == "memory-nothing-fits"
    found = ways_out(str(refused.value), request_, env)
    assert kinds <= set(found), str(refused.value)
    for kind, (request, node) in found.items():
        plan = resolve_uncached(request, node)
        assert plan.memory is not None and plan.memory.estimate is not None, kind


def test_when_host_memory_binds_the_refusal_says_so_with_its_numbers() -> None:
    with pytest.raises(tp.Incompatible) as refused:
        resolve_uncached(tp.Request(model=SEVENTY_B), memory_world(1, 24 * GIB, 64 * GIB))
    fix = str(refused.value).split("To fit it: ")[1]
    assert fix.startswith("use 19 nodes like this one (num_nodes=19, 1 such device(s) and 64.0 GiB of host memory")
    assert "give each node 1159 GiB of host memory (64.0 GiB here)" in fix
    assert "a model of at most 3,800,000,000 parameters" in fix


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        (("device_bytes",), -5, "plan.memory.device_bytes"),
        (("device_bytes",), 0, "plan.memory.device_bytes"),
        (("budget_bytes",), 2**63 - 1, "plan.memory.budget_bytes"),
        (("budget_bytes",), (40 << 30) + 1, "plan.memory.budget_bytes"),  # more than the device holds
        (("host_bytes",), -1, "plan.memory.host_bytes"),
        (("chosen",), "nope", "plan.memory.chosen"),
        (("policy", "headroom"), 1e308, "plan.memory.policy.headroom"),
        (("policy", "headroom"), -0.5, "plan.memory.policy.headroom"),
        (("candidates", 0, "parameters"), -1, "plan.memory.candidates[0].parameters"),
        (("candidates", 3, "step"), 2**63 - 1, "plan.memory.candidates[3].step"),
        (("candidates", 0, "tensor_parallel"), 0, "plan.memory.candidates[0].tensor_parallel"),
    ],
)
def test_a_plans_memory_block_out_of_range_is_a_plan_format_error_at_its_path(
    path: tuple[str | int, ...], value: object, where: str
) -> None:
    """Plan.from_dict took negative bytes, a budget past the device, a chosen layout no candidate has and a headroom of
    1e308, and explain() then printed nonsense from them."""
    plan = tp.resolve(tp.Request(model=SEVEN_B), _gpus(8, 40, host_memory_bytes=1 << 40))
    data = json.loads(json.dumps(plan.to_dict()))
    target = data["memory"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(tp.PlanFormatError) as refused:
        tp.Plan.from_dict(data)
    assert refused.value.path == where


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"layer_count": 10**10}, "model.layer_count", "blocks cannot share"),
        ({"largest_layer_bytes": SEVEN_B.parameter_bytes}, "model.largest_layer_bytes", "parts of the parameters"),
        (
            {"layer_input_bytes_per_sample": SEVEN_B.activation_bytes_per_sample + 1},
            "model.layer_input_bytes_per_sample",
            "more than every activation saved",
        ),
        ({"hidden_size": 1000}, "model.hidden_size", "does not divide layer_input_bytes_per_sample"),
        ({"dtype": "bf16"}, "model.dtype", "Did you mean model.dtype='bfloat16'?"),
        ({"dtype": "anything at all"}, "model.dtype", "one of float32, bfloat16"),
    ],
)
def test_facts_that_cannot_all_be_true_are_refused_naming_the_field(
    change: dict[str, Any], field: str, says: str
) -> None:
    """ModelFacts took any dtype text, 10^10 blocks of a 7B model and a block as large as the whole model."""
    with pytest.raises(tp.InvalidRequest) as refused:
        tp.resolve(tp.Request(model=attrs.evolve(SEVEN_B, **change)), _gpus(8, 40))
    assert refused.value.field == field and says in str(refused.value)
    assert refused.value.fix  # and what to write instead


def test_tensor_parallel_that_does_not_divide_the_hidden_size_is_not_a_candidate() -> None:
    odd = tp.transformer_facts(parameters=13e9, layers=40, hidden=5124)  # 5124 = 4 × 1281: tp 2 and 4, not 8
    plan = tp.resolve(tp.Request(model=odd), _gpus(8, 40))
    assert plan.memory is not None
    verdicts = {item.layout: item.verdict for item in plan.memory.candidates if not item.checkpointing}
    assert verdicts["tp8_fsdp"] == "not allowed: tp=8 does not divide the hidden size 5124"
    assert not verdicts["tp4_fsdp"].startswith("not allowed")
    assert SEVEN_B.hidden_size == 4096  # transformer_facts states it


def test_the_memory_a_fix_names_is_the_first_whole_gib_from_the_need_that_fits() -> None:
    """The host or device memory "To fit it" names: the need rounded up to a whole GiB, or the next few, as fits."""
    from trainplan.resolve.memory import _whole_gib_that_fits

    gib = 1 << 30
    assert _whole_gib_that_fits(5 * gib + 1, lambda size: True) == 6 * gib
    assert _whole_gib_that_fits(5 * gib + 1, lambda size: size >= 8 * gib) == 8 * gib
    assert _whole_gib_that_fits(5 * gib + 1, lambda size: size >= 10 * gib) is None  # only a few are tried


def test_an_unwritten_precision_takes_the_one_the_facts_were_built_for() -> None:
    # the request's default is 32-true; planned at it with bf16-mixed facts, fsdp "fit" at 31.3 GiB, while facts
    # built for 32-true need 49.6 GiB under fsdp and tp2_fsdp is the first that fits
    plan = resolve_uncached(tp.Request(model=SEVEN_B), _gpus(8, 40))
    assert plan.precision == "bf16-mixed" and plan.memory is not None and plan.memory.chosen == "fsdp"
    (note,) = [note for note in plan.notes if note.code == "precision-from-model"]
    assert note.level == "info" and "'bf16-mixed'" in note.message
    fp32 = tp.transformer_facts(parameters=7e9, layers=32, hidden=4096, precision="32-true")
    plan = resolve_uncached(tp.Request(model=fp32), _gpus(8, 40))
    assert plan.precision == "32-true" and plan.memory is not None and plan.memory.chosen == "tp2_fsdp"
    verdicts = {(item.layout, item.checkpointing): item.verdict for item in plan.memory.candidates}
    assert verdicts["fsdp", False].startswith("needs 49.6 GiB")
    assert "precision-from-model" not in [note.code for note in plan.notes]


def test_a_written_precision_other_than_the_facts_is_refused_naming_both() -> None:
    with pytest.raises(tp.Incompatible) as refused:
        resolve_uncached(tp.Request(model=SEVEN_B, precision="32-true"), _gpus(8, 40))
    assert refused.value.rule == "memory-precision"
    message = str(refused.value)
    assert "precision='32-true' was asked for" in message and "built for 'bf16-mixed'" in message
    assert "transformer_facts(..., precision='32-true')" in message


def test_the_resolve_cache_tells_a_written_precision_from_the_default() -> None:
    # Request(precision="32-true") equals Request() (the default), but only the first writes it
    planned = tp.resolve(tp.Request(model=SEVEN_B), _gpus(8, 40))
    assert planned.precision == "bf16-mixed"
    with pytest.raises(tp.Incompatible, match="built for 'bf16-mixed'"):
        tp.resolve(tp.Request(model=SEVEN_B, precision="32-true"), _gpus(8, 40))


def test_facts_written_by_hand_say_no_precision_and_take_the_requests() -> None:
    facts = attrs.evolve(SEVEN_B, precision=None)
    assert resolve_uncached(tp.Request(model=facts, precision="32-true"), _gpus(8, 40)).precision == "32-true"
    with pytest.raises(tp.InvalidRequest) as refused:
        wrong = attrs.evolve(SEVEN_B, precision="bf17")  # type: ignore[arg-type]
        resolve_uncached(tp.Request(model=wrong), _gpus(8, 40))
    assert refused.value.field == "model.precision"


def test_a_plan_saved_before_model_facts_had_a_precision_reads_it_as_not_said() -> None:
    plan = tp.resolve(tp.Request(model=SEVEN_B, precision="bf16-mixed"), _gpus(8, 40))
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["request"]["model"].pop("precision") == "bf16-mixed"
    read = tp.Plan.from_dict(data)
    assert read.request.model is not None and read.request.model.precision is None
    assert (read.strategy, read.memory, read.precision) == (plan.strategy, plan.memory, plan.precision)


def test_the_host_verdict_prints_the_room_the_check_used() -> None:
    # it printed "57.9 GiB a node > 64.0 GiB" while the check compared with 64 GiB less the headroom
    env = memory_world(1, 24 * GIB, 64 * GIB)
    with pytest.raises(tp.Incompatible) as refused:
        resolve_uncached(tp.Request(model=SEVENTY_B), env)
    assert "a node > 57.6 GiB (64.0 GiB less 10% headroom)" in str(refused.value)


def test_without_the_host_memory_offload_is_not_checked_and_not_chosen() -> None:
    # 70B on one 24 GiB GPU chose fsdp_offload + ckpt, needing 1043 GiB of host memory nobody had stated
    one_24gb = _gpus(1, 24)
    with pytest.raises(tp.Incompatible) as refused:
        resolve_uncached(tp.Request(model=SEVENTY_B), one_24gb)
    message = str(refused.value)
    assert "host memory not known: not checked (1043.1 GiB a node to offload)" in message
    assert "state each node's host memory (Environment(host_memory_bytes=...), --host-memory 1TiB)" in message
    with_host = resolve_uncached(tp.Request(model=SEVENTY_B), attrs.evolve(one_24gb, host_memory_bytes=2 << 40))
    assert with_host.memory is not None and with_host.memory.chosen == "fsdp_offload"


def test_an_explicit_offload_strategy_without_the_host_memory_is_taken_with_a_warning() -> None:
    plan = resolve_uncached(tp.Request(model=SEVENTY_B, strategy="fsdp_cpu_offload"), _gpus(1, 24))
    assert plan.memory is not None and plan.memory.chosen == "fsdp_offload"
    (note,) = [note for note in plan.notes if note.code == "memory-host-not-checked"]
    assert note.level == "warning" and "1043.1 GiB a node" in note.message


def test_trainplan_fit_without_host_memory_chooses_no_offload(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        tp.cli.main(["fit", "--params", "70B", "--gpus", "1x24GiB"])
    assert exited.value.code == 2
    assert "host memory not known" in capsys.readouterr().err


def test_an_explicit_strategy_refused_says_its_breakdown_is_with_checkpointing() -> None:
    with pytest.raises(tp.Incompatible) as refused:
        resolve_uncached(tp.Request(model=SEVEN_B, strategy="ddp"), _gpus(8, 40))
    assert "130.4 GiB needed per rank even with activation checkpointing (" in str(refused.value)


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp_fork", "ddp_find_unused_parameters_true", "ddp_notebook"])
def test_every_ddp_flavour_is_checked_by_ddps_arithmetic(strategy: StrategyName) -> None:
    # they gave plan.memory=None with no note: DDP's replicas, however the processes start
    with pytest.raises(tp.Incompatible) as refused:
        resolve_uncached(tp.Request(model=SEVEN_B, strategy=strategy), _gpus(8, 80))
    assert f"strategy {strategy!r} will not fit: 130.4 GiB" in str(refused.value)
    small = tp.transformer_facts(parameters=1e8, layers=12, hidden=768, sequence=1024)
    plan = resolve_uncached(tp.Request(model=small, strategy=strategy), _gpus(8, 80))
    assert plan.memory is not None and plan.memory.chosen == "ddp" and plan.memory.estimate is not None


def test_deepspeed_stage_3_offload_is_checked_by_the_offload_row() -> None:
    env = _gpus(8, 80, host_memory_bytes=2 << 40, packages=frozenset({"deepspeed"}))
    plan = resolve_uncached(tp.Request(model=SEVEN_B, strategy="deepspeed_stage_3_offload"), env)
    assert plan.memory is not None and plan.memory.chosen == "zero3_offload"
    assert plan.memory.estimate is not None and plan.memory.estimate.host > 0


@pytest.mark.parametrize("strategy", ["dp", "deepspeed"])
def test_a_strategy_with_no_arithmetic_says_its_memory_was_not_checked(strategy: StrategyName) -> None:
    env = _gpus(8, 80, packages=frozenset({"deepspeed"}))
    plan = resolve_uncached(tp.Request(model=SEVEN_B, strategy=strategy), env)
    assert plan.memory is None
    (note,) = [note for note in plan.notes if note.code == "memory-not-checked"]
    assert note.level == "warning" and f"memory not checked for strategy {strategy!r}" in note.message


def test_trainplan_fit_says_why_a_strategy_was_not_checked(capsys: pytest.CaptureFixture[str]) -> None:
    # it printed "the GPUs' memory is not known: pass --gpus 8x40GiB" with --gpus 8x80GiB given
    assert tp.cli.main(["fit", "--params", "7e9", "--gpus", "8x80GiB", "--strategy", "dp"]) == 0
    out = capsys.readouterr().out
    assert "memory not checked: no arithmetic for strategy 'dp'" in out and "not known" not in out


def test_trainplan_fit_without_the_gpus_memory_is_an_error_naming_the_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # on a machine without GPUs it exited 0 with a single_device non-answer
    monkeypatch.setattr(trainplan.cli, "probe", tp.Environment)
    with pytest.raises(SystemExit) as exited:
        tp.cli.main(["fit", "--params", "7B"])
    assert exited.value.code == 2
    assert "pass the GPUs as --gpus NxSIZE" in capsys.readouterr().err


def test_the_shape_rule_for_a_named_size_is_the_one_its_docstring_states() -> None:
    facts = tp.transformer_facts(parameters=7e9)
    assert (facts.layer_count, facts.hidden_size) == (33, 4224)
    assert "7B: h 4224, L 33" in " ".join((tp.transformer_facts.__doc__ or "").split())
