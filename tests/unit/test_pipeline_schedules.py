"""The pipeline record (`ModelParallelOptions.pp_schedule`, `pp_microbatches`, `pp_virtual_stages`): torch's
schedules by their own names, each with the rules torch's classes enforce, planned into `plan.mesh.pipeline`; the
stages a rank holds as torch's schedules place them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from torch.distributed.pipelining.schedules import get_schedule_class

from trainplan import Environment, Incompatible, ModelParallelOptions, Plan, PlanFormatError, Request
from trainplan.resolve import resolve
from trainplan.rules import PIPELINE_SCHEDULE_RULES
from trainplan.rules.mesh import stage_indices
from trainplan.spec.mesh import PipelineLayout
from trainplan.spec.names import PIPELINE_SCHEDULES


def pipeline_plan(**options: object) -> Plan:
    request = Request(
        accelerator="cpu",
        devices=4,
        strategy="model_parallel",
        strategy_options=ModelParallelOptions(**{"pp": 2, **options}),  # type: ignore[arg-type]
    )
    return resolve(request, Environment(cpu_count=4))


def test_every_schedule_is_torchs_own_and_has_a_row() -> None:
    assert set(PIPELINE_SCHEDULE_RULES) == set(PIPELINE_SCHEDULES)
    for name in PIPELINE_SCHEDULES:
        assert get_schedule_class(name).__name__ == f"Schedule{name}"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, ("1F1B", 2, 1)),
        ({"pp_microbatches": 4}, ("1F1B", 4, 1)),
        ({"pp_schedule": "GPipe", "pp_microbatches": 1}, ("GPipe", 1, 1)),
        ({"pp_schedule": "Interleaved1F1B"}, ("Interleaved1F1B", 4, 2)),
        (
            {"pp_schedule": "InterleavedZeroBubble", "pp_virtual_stages": 3, "pp_microbatches": 8},
            ("InterleavedZeroBubble", 8, 3),
        ),
        ({"pp_schedule": "ZBVZeroBubble"}, ("ZBVZeroBubble", 4, 2)),
    ],
)
def test_a_pipeline_is_planned_with_its_microbatches_and_stages(
    options: dict[str, object], expected: tuple[str, int, int]
) -> None:
    plan = pipeline_plan(**options)
    assert plan.mesh is not None
    pipeline = plan.mesh.pipeline
    assert (pipeline.schedule, pipeline.microbatches, pipeline.virtual_stages) == expected
    assert Plan.from_dict(plan.to_dict()) == plan


@pytest.mark.parametrize(
    ("options", "rule", "words"),
    [
        ({"pp_microbatches": 1}, "pipeline-microbatches", "Use pp_microbatches=2"),
        ({"pp_schedule": "Interleaved1F1B", "pp_virtual_stages": 1}, "pipeline-virtual-stages", "pp_virtual_stages=2"),
        ({"pp_schedule": "ZBVZeroBubble", "pp_virtual_stages": 3}, "pipeline-virtual-stages", "exactly 2 stages"),
        ({"pp_schedule": "GPipe", "pp_virtual_stages": 2}, "pipeline-virtual-stages", "one stage per rank"),
        ({"pp_schedule": "Interleaved1F1B", "pp_microbatches": 5}, "pipeline-microbatches", "Use pp_microbatches=4"),
    ],
)
def test_a_pipeline_torch_would_refuse_is_refused_with_the_numbers(
    options: dict[str, object], rule: str, words: str
) -> None:
    with pytest.raises(Incompatible) as refused:
        pipeline_plan(**options)
    assert refused.value.rule == rule and words in str(refused.value)


@pytest.mark.parametrize(
    ("option", "value"),
    [("pp_schedule", "GPipe"), ("pp_microbatches", 4), ("pp_virtual_stages", 2), ("pp_schedule", "Interleaved1F1B")],
)
def test_a_pipeline_option_is_refused_where_pp_is_1_as_the_context_parallel_ones_are(
    option: str, value: object
) -> None:
    with pytest.raises(Incompatible) as refused:
        pipeline_plan(**{option: value, "pp": 1})
    assert refused.value.rule == "mesh-option-unused"
    assert refused.value.values == {f"strategy_options.{option}": value, "pp": 1}
    message = str(refused.value)
    assert f"{option}={value!r} is for the pipeline groups, and pp=1" in message
    assert "no schedule runs" in message and f"Use pp=2 or more with it, or leave {option} unset" in message


def test_the_default_schedule_written_at_pp_1_is_no_option_at_all() -> None:
    plan = pipeline_plan(pp=1, pp_schedule="1F1B")
    assert plan.mesh is not None and plan.mesh.pipeline == PipelineLayout()


@pytest.mark.parametrize(
    ("options", "field", "value"),
    [
        ({}, "microbatches", 5),  # the options leave microbatches unset: one per stage, 2
        ({"pp_schedule": "Interleaved1F1B", "pp_microbatches": 4}, "virtual_stages", 3),  # unset: the fewest, 2
        ({"pp_schedule": "Interleaved1F1B"}, "virtual_stages", 1),
    ],
)
def test_from_dict_derives_the_pipeline_record_from_the_options_it_left_unset(
    options: dict[str, object], field: str, value: int
) -> None:
    data: dict[str, Any] = json.loads(json.dumps(pipeline_plan(**options).to_dict()))
    data["mesh"]["pipeline"][field] = value
    with pytest.raises(PlanFormatError, match=rf"plan\.mesh\.pipeline .*the record says .*{field}={value}"):
        Plan.from_dict(data)


def test_from_dict_refuses_a_pipeline_option_at_pp_1() -> None:
    data: dict[str, Any] = json.loads(json.dumps(pipeline_plan(pp=1).to_dict()))
    data["strategy"]["options"]["pp_microbatches"] = 4
    with pytest.raises(PlanFormatError, match=r"mesh-option-unused \(pp_microbatches with pp=1\)"):
        Plan.from_dict(data)


def test_the_stages_a_rank_holds_follow_the_schedules_style() -> None:
    assert [stage_indices("1F1B", rank, 4, 1) for rank in range(4)] == [(0,), (1,), (2,), (3,)]
    assert [stage_indices("Interleaved1F1B", rank, 2, 3) for rank in range(2)] == [(0, 2, 4), (1, 3, 5)]
    assert [stage_indices("ZBVZeroBubble", rank, 2, 2) for rank in range(2)] == [(0, 3), (1, 2)]


FOUR = Environment(cpu_count=4)


def test_explain_shows_the_pipeline_as_it_runs_with_the_defaults_it_took() -> None:
    """Interleaved1F1B's virtual stages and microbatches were worked out but never shown by explain()."""
    options = ModelParallelOptions(pp=2, pp_schedule="Interleaved1F1B")
    plan = resolve(Request(strategy="model_parallel", accelerator="cpu", devices=4, strategy_options=options), FOUR)
    text = plan.explain()
    assert "  pipeline     Interleaved1F1B, 2 stage(s) per rank (4 in all), 4 microbatch(es) per step" in text
    assert "defaults taken: pp_virtual_stages=2 (the fewest Interleaved1F1B takes), pp_microbatches=4" in text
    written = ModelParallelOptions(pp=2, pp_schedule="Interleaved1F1B", pp_virtual_stages=2, pp_microbatches=8)
    plan = resolve(Request(strategy="model_parallel", accelerator="cpu", devices=4, strategy_options=written), FOUR)
    assert "8 microbatch(es) per step\n                 why: as asked" in plan.explain()


def test_explain_never_shows_the_records_bookkeeping() -> None:
    """`given=[...]` (which options were written, part of the record's value) showed in the plan's text."""
    options = ModelParallelOptions(pp=2, pp_microbatches=3)
    plan = resolve(Request(strategy="model_parallel", accelerator="cpu", devices=4, strategy_options=options), FOUR)
    assert "given" in repr(plan.strategy.options)  # the repr rebuilds the value
    assert "ModelParallelOptions(pp=2, dp_shard=2, pp_microbatches=3)" in plan.explain()
    assert "given" not in plan.explain()
    preset = resolve(Request(strategy="ddp_find_unused_parameters_true", accelerator="cpu", devices=2), FOUR)
    assert "given" not in preset.explain() and "find_unused_parameters=True" in preset.explain()
