"""A downstream framework adds an accelerator (with its backend) and a precision: `Rules.extend(accelerators=...,
backends=..., precisions=..., precision_recipes=...)`, the devices counted in `Environment.device_counts`.

The rule set is `tests.downstream_rules` (Ascend's NPU with HCCL, and int8 quantisation-aware training)."""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import pytest

from tests.downstream_rules import HCCL, INT8_QAT, NPU, RULES
from trainplan import (
    BUILTIN_RULES,
    AcceleratorRule,
    BackendRule,
    CustomName,
    Environment,
    Incompatible,
    InvalidRequest,
    JoinError,
    NotWrappable,
    PlanFormatError,
    PrecisionRecipe,
    PrecisionRule,
    Request,
    Unavailable,
    join,
    place_metric,
    runtime,
)
from trainplan.cli import main
from trainplan.effects.rules_loading import read_plan_text
from trainplan.parse.plan_json import plan_from_json_text
from trainplan.render.matrix import render_matrix
from trainplan.resolve import check, resolve, resolve_uncached
from trainplan.rules import UNNAMED_RULES

WITH_TORCHAO = frozenset({"torchao"})


def npus(count: int = 4, **facts: Any) -> Environment:
    return Environment(**facts).with_device_counts({NPU: count})


def test_auto_takes_the_downstream_accelerator_by_its_priority() -> None:
    plan = resolve_uncached(Request(), npus(4, cuda_device_count=2), RULES)
    assert (plan.accelerator, plan.strategy.name, plan.process_group_backend) == (NPU, "ddp", HCCL)
    assert plan.device_strings == ("npu:0", "npu:1", "npu:2", "npu:3")
    assert "order: npu > xla > cuda > mps > cpu" in plan.reasons["accelerator"]
    assert plan.metrics.device_type == "npu" and plan.metrics.reduces_on == "device"
    one = resolve_uncached(Request(accelerator=NPU, devices=[2]), npus(4), RULES)
    assert (one.strategy.name, one.device_strings, one.process_group_backend) == ("single_device", ("npu:2",), None)


def test_without_a_count_the_downstream_accelerator_is_unavailable_and_the_error_says_how_to_supply_it() -> None:
    with pytest.raises(Unavailable, match=re.escape("probe().with_device_counts({'npu': 8})")):
        resolve_uncached(Request(accelerator=NPU), Environment(cuda_device_count=2), RULES)
    assert resolve_uncached(Request(), Environment(cuda_device_count=2), RULES).accelerator == "cuda"


def test_builtin_accelerators_keep_their_own_facts() -> None:
    """`device_counts` counts the accelerators a rule set adds; CUDA is still counted by cuda_device_count, and a
    CUDA count in device_counts is refused (it would be dropped: the run would plan CPU) with the fact to write."""
    for rules in (BUILTIN_RULES, RULES):
        with pytest.raises(
            InvalidRequest, match=r"device_counts='cuda'.*Write Environment\(cuda_device_count=\.\.\.\)"
        ):
            resolve_uncached(Request(), Environment(device_counts={"cuda": 8}), rules)
    with pytest.raises(Unavailable):
        resolve_uncached(Request(accelerator="cuda"), npus(), RULES)


def test_a_count_of_an_accelerator_the_resolving_rule_set_lacks_is_refused() -> None:
    """A typo in a plugin's name, or a downstream count given to a rule set without the plugin's rows, would plan CPU
    silently: `resolve` and `check` refuse it on Environment.device_counts, naming what the rule set counts there."""
    with pytest.raises(InvalidRequest, match=r"device_counts='npu2'.*it counts 'npu' there.*Did you mean.*'npu'"):
        resolve_uncached(Request(), Environment(device_counts={"npu2": 4}), RULES)
    with pytest.raises(InvalidRequest, match=r"device_counts='npu'.*it adds no accelerator.*pass the rule set"):
        resolve_uncached(Request(), npus(), BUILTIN_RULES)
    problems = list(check(Request(), Environment(device_counts={"npu2": 4, "npu": 1}), RULES))
    assert [
        (type(problem), getattr(problem, "field", None), getattr(problem, "value", None)) for problem in problems
    ] == [(InvalidRequest, "Environment.device_counts", "npu2")]
    assert resolve_uncached(Request(), npus(), RULES).accelerator == NPU  # the rule set that adds it counts it


def test_a_downstream_accelerator_is_refused_by_the_builtin_rules_and_its_families() -> None:
    with pytest.raises(InvalidRequest, match="accelerator='npu'"):
        resolve_uncached(Request(accelerator=NPU), Environment())
    with pytest.raises(Incompatible, match="Use strategy='ddp', 'single_device' or 'auto' on NPUs"):
        resolve_uncached(Request(accelerator=NPU, strategy="fsdp", devices=2), npus(), RULES)


def test_the_downstream_backend_serves_its_accelerator_only() -> None:
    with pytest.raises(Incompatible, match="process_group_backend='hccl'"):
        resolve_uncached(Request(accelerator=NPU, devices=2, process_group_backend="gloo"), npus(), RULES)
    with pytest.raises(Incompatible, match="HCCL reduces NPU tensors only"):
        resolve_uncached(Request(accelerator="cpu", devices=2, process_group_backend=HCCL), npus(), RULES)
    with pytest.raises(InvalidRequest, match="process_group_backend='hccl'"):
        resolve_uncached(Request(accelerator="cpu", devices=2, process_group_backend=HCCL), Environment())


def test_a_downstream_precision_runs_where_its_row_says() -> None:
    env = npus(packages=WITH_TORCHAO)
    assert resolve_uncached(Request(accelerator="cpu", precision=INT8_QAT), env, RULES).precision == INT8_QAT
    assert resolve_uncached(Request(accelerator=NPU, devices=2, precision=INT8_QAT), env, RULES).precision == INT8_QAT
    with pytest.raises(Incompatible, match="precision='bf16-mixed'"):  # the row's `instead` for MPS
        resolve_uncached(Request(accelerator="mps", precision=INT8_QAT), npus(mps_available=True), RULES)
    with pytest.raises(Incompatible, match="torchao"):
        resolve_uncached(Request(accelerator="cpu", precision=INT8_QAT), npus(), RULES)
    with pytest.raises(Incompatible, match="strategy='dp'"):  # DataParallel's family row does not list it
        resolve_uncached(
            Request(strategy="dp", devices=2, precision=INT8_QAT),
            Environment(cuda_device_count=2, packages=WITH_TORCHAO),
            RULES,
        )


def test_loose_spellings_of_downstream_names_through_from_config_and_check() -> None:
    request = Request.from_config(
        {"accelerator": "NPU", "precision": " Int8-QAT ", "process_group_backend": "HCCL", "devices": "2"}, RULES
    )
    assert (request.accelerator, request.precision, request.process_group_backend) == (NPU, INT8_QAT, HCCL)
    assert list(check(request, npus(packages=WITH_TORCHAO), RULES)) == []
    problems = list(check(Request(accelerator=NPU, precision=INT8_QAT, devices=2), Environment(), RULES))
    assert [type(problem) for problem in problems] == [Unavailable, Incompatible]  # no NPU; no torchao
    with pytest.raises(InvalidRequest, match="int8-qat"):  # the allowed names include the downstream ones
        Request.from_config({"precision": "int4"}, RULES)


def test_a_plan_on_downstream_hardware_round_trips_with_its_rule_set() -> None:
    plan = resolve_uncached(Request(accelerator=NPU, devices=2, precision=INT8_QAT), npus(packages=WITH_TORCHAO), RULES)
    text = json.dumps(plan.to_dict())
    assert plan_from_json_text(text, RULES) == plan
    assert plan_from_json_text(text) == plan  # as far as its own facts go
    assert read_plan_text(text) == plan  # the worker's way: the recorded rule set imported
    with pytest.raises(PlanFormatError, match=r"plan\.rules"):
        plan_from_json_text(text, BUILTIN_RULES)
    unnamed = BUILTIN_RULES.extend(**_coherent())
    forged = {**resolve_uncached(Request(accelerator=NPU, devices=2), npus(), unnamed).to_dict()}
    assert forged["rules"] == UNNAMED_RULES
    del forged["rules"]  # the same plan claiming trainplan's own rules
    with pytest.raises(PlanFormatError, match="no accelerator 'npu'"):
        plan_from_json_text(json.dumps(forged))


def test_the_matrix_and_the_cli_show_the_downstream_rows(capsys: pytest.CaptureFixture[str]) -> None:
    matrix = render_matrix(RULES)
    assert "| strategy | family | launcher | cpu | cuda | mps | xla | npu | needs |" in matrix
    assert "| `int8-qat` | ✓ | ✓ | ✗ | ✗ | ✓ | `torchao` package |" in matrix
    assert "| npu |" not in render_matrix()
    arguments = ["plan", "--no-probe", "--rules", "tests.downstream_rules:RULES", "--assume", "npu=4"]
    assert main([*arguments, "--precision", "INT8-QAT", "--assume", "package=torchao", "--devices", "2"]) == 0
    out = capsys.readouterr().out
    assert "npu:0, npu:1" in out and "hccl" in out and "int8-qat" in out
    with pytest.raises(SystemExit):
        main(["plan", "--no-probe", "--assume", "npu=4"])  # without --rules, 'npu' is no fact
    assert "it is not a known fact" in capsys.readouterr().err


@pytest.mark.parametrize("counts", [{NPU: -1}, {NPU: True}, {NPU: "4"}, {3: 4}, "npu=4"])
def test_device_counts_of_the_wrong_shape_are_refused_by_name(counts: object) -> None:
    env = attrs.evolve(Environment(), device_counts=counts)  # type: ignore[arg-type]  # the wrong shape on purpose
    with pytest.raises(InvalidRequest, match=r"Environment\.device_counts"):
        resolve(Request(), env, RULES)


def test_with_device_counts_adds_to_the_counts_and_the_memo_tells_true_from_one() -> None:
    env = Environment().with_device_counts({NPU: 2}).with_device_counts({"hpu": 1})
    assert dict(env.device_counts) == {"hpu": 1, NPU: 2} and hash(env) == hash(npus(2).with_device_counts({"hpu": 1}))
    assert resolve(Request(accelerator=NPU), npus(1), RULES).devices == (0,)
    with pytest.raises(InvalidRequest, match="device_counts"):
        resolve(Request(accelerator=NPU), attrs.evolve(Environment(), device_counts={NPU: True}), RULES)


class FakeDevices:
    """A `DeviceBinder` that records what it is asked to bind (this machine has no NPU)."""

    def __init__(self) -> None:
        self.bound: list[tuple[str, int]] = []

    def bind(self, device_type: str, index: int) -> None:
        self.bound.append((device_type, index))


def test_the_worker_binds_a_downstream_device_through_the_seam_or_names_the_rule() -> None:
    plan = resolve_uncached(Request(accelerator=NPU, devices=[3]), npus(4), RULES)
    devices = FakeDevices()
    with join(plan, devices=devices) as world:
        assert world.device == "npu:3"
    assert devices.bound == [("npu", 3)]
    with pytest.raises(JoinError, match=r"'npu' \(a row of the rule set tests\.downstream_rules:RULES\).*torch_npu"):
        join(plan)  # torch's own binder: this torch knows no 'npu' device type


def test_the_runtime_reads_a_downstream_precisions_recipe_from_the_plans_rule_set() -> None:
    import torch

    plan = resolve_uncached(Request(accelerator="cpu", precision=INT8_QAT), npus(packages=WITH_TORCHAO), RULES)
    with runtime(plan) as rt:  # the plan names tests.downstream_rules:RULES: imported
        assert (rt.autocast_dtype, rt.parameter_dtype, rt.grad_scaler) == (torch.bfloat16, torch.float32, None)
        with rt.autocast():
            assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    unnamed = BUILTIN_RULES.extend(precisions=[QAT_OFF_NPU], precision_recipes=[QAT_RECIPE], families=[SINGLE_WITH_QAT])
    plan = resolve_uncached(Request(accelerator="cpu", precision=INT8_QAT), Environment(packages=WITH_TORCHAO), unnamed)
    with pytest.raises(NotWrappable, match="runtime"):
        runtime(plan)
    with runtime(plan, rules=unnamed) as rt:
        assert rt.autocast_dtype == torch.bfloat16


def test_the_runtime_refuses_a_rule_set_other_than_the_plans_as_reading_it_back_does() -> None:
    plan = resolve_uncached(Request(accelerator="cpu", precision=INT8_QAT), Environment(packages=WITH_TORCHAO), RULES)
    other = BUILTIN_RULES.extend(
        precisions=[QAT_OFF_NPU], precision_recipes=[QAT_RECIPE], families=[SINGLE_WITH_QAT], name="other.rules:RULES"
    )
    for rules, named in ((other, "'other.rules:RULES'"), (BUILTIN_RULES, "'another one'")):
        message = rf"rules=.*made from the rule set 'tests\.downstream_rules:RULES', and is run with {named}"
        with pytest.raises(InvalidRequest, match=message):
            runtime(plan, rules=rules)
        with pytest.raises(PlanFormatError, match=r"made from the rule set 'tests\.downstream_rules:RULES'"):
            plan_from_json_text(json.dumps(plan.to_dict()), rules)  # the same refusal, reading the plan back


NPU_ROW = RULES.accelerators[NPU]
HCCL_ROW = RULES.backends[HCCL]
QAT_ROW = RULES.precisions[INT8_QAT]
QAT_RECIPE = RULES.precision_recipes[INT8_QAT]
DDP = BUILTIN_RULES.families["ddp"]
DDP_WITH_NPU = attrs.evolve(DDP, accelerators=DDP.accelerators | {NPU})
SINGLE = BUILTIN_RULES.families["single_device"]
SINGLE_WITH_NPU = attrs.evolve(SINGLE, accelerators=SINGLE.accelerators | {NPU})  # what 'auto' runs on one NPU
DDP_WITH_QAT = attrs.evolve(DDP, precisions=DDP.precisions | {INT8_QAT})
SINGLE_WITH_QAT = attrs.evolve(BUILTIN_RULES.families["single_device"], precisions=DDP.precisions | {INT8_QAT})
QAT_OFF_NPU = attrs.evolve(QAT_ROW, accelerators=frozenset({"cpu", "cuda"}))
FP32_ON_NPU = RULES.precisions["32-true"]
MESH_ON_NPU = attrs.evolve(BUILTIN_RULES.families["model_parallel"], accelerators=frozenset({NPU}))
IPU = CustomName("ipu")  # an accelerator no rule set has


def _npu(**changes: Any) -> AcceleratorRule:
    return attrs.evolve(NPU_ROW, **changes)


def _coherent(**rows: Any) -> dict[str, Any]:
    """The NPU rows that hold together, with some replaced."""
    given: dict[str, Any] = {
        "accelerators": [NPU_ROW],
        "backends": [HCCL_ROW],
        "families": [DDP_WITH_NPU, SINGLE_WITH_NPU],
        "precisions": [FP32_ON_NPU],
    }
    return {**given, **rows}


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        (_coherent(accelerators=[NPU_ROW, NPU_ROW]), "two rows of one call"),
        (_coherent(accelerators=[_npu(name=CustomName("cuda"))]), "already has that name"),
        (_coherent(accelerators=[_npu(name=CustomName("gpu"))]), "already has that name"),
        (_coherent(accelerators=[_npu(name=CustomName("tpu"))]), "already has that name"),
        (_coherent(accelerators=[_npu(name=CustomName("Ascend NPU"))]), "lowercase letters"),
        (_coherent(accelerators=[_npu(count_fact="cuda_device_count")]), "framework supplies the count"),
        (_coherent(accelerators=[_npu(takes_indices=False)]), "its devices are indexed"),
        (_coherent(accelerators=[_npu(host=True)]), "not the host's CPUs"),
        (_coherent(accelerators=[_npu(probes_usable=True)]), "NVIDIA's driver only"),
        (_coherent(accelerators=[_npu(visibility_variable="ASCEND_RT_VISIBLE_DEVICES")]), "through the plan"),
        (_coherent(accelerators=[_npu(device_counts="one", counts_why="")]), "says why"),
        (_coherent(accelerators=[_npu(device_counts="some")]), "it is one of"),
        (_coherent(accelerators=[_npu(device_type="NPU device")]), "torch device type"),
        (_coherent(accelerators=[_npu(interactive_auto_devices=0)]), "positive number"),
        (_coherent(accelerators=[_npu(auto_priority=3)]), "'cuda' has that priority too"),
        (_coherent(accelerators=[_npu(auto_priority=True)]), "whole number"),
        (_coherent(accelerators=[_npu(default_backend="hcc")]), "no such backend"),
        (_coherent(backends=[]), "no such backend"),
        (_coherent(accelerators=[_npu(default_backend="gloo")]), "backend 'gloo' does not reduce 'npu' tensors"),
        (_coherent(families=[]), "no family lists the accelerator"),
        (_coherent(precisions=[]), "no precision runs on it"),
        # A row under a built-in backend's name replaces it (as a family's does): the set must still hold together.
        (
            _coherent(backends=[HCCL_ROW, attrs.evolve(HCCL_ROW, name=CustomName("nccl"))]),
            "backend 'nccl' does not reduce 'cuda' tensors",
        ),
        (
            _coherent(backends=[attrs.evolve(HCCL_ROW, accelerators=frozenset({NPU, CustomName("ipu")}))]),
            "no such accelerator",
        ),
        (
            _coherent(
                families=[DDP_WITH_NPU, attrs.evolve(RULES.families["model_parallel"], accelerators=frozenset({NPU}))]
            ),
            "a device mesh's collectives",
        ),
        ({"precisions": [attrs.evolve(QAT_ROW, name=CustomName("bf16"))]}, "already has that name"),
        ({"precisions": [attrs.evolve(QAT_ROW, name=CustomName("16"))]}, "already has that name"),
        ({"precisions": [attrs.evolve(QAT_ROW, name=CustomName("Int8 QAT"))]}, "hyphens too"),
        ({"precisions": [QAT_OFF_NPU], "families": [DDP_WITH_QAT]}, "Add precision_recipes"),
        ({"precision_recipes": [attrs.evolve(QAT_RECIPE, name="bf16-mixed")]}, "runtime's own"),
        ({"precision_recipes": [QAT_RECIPE]}, "runtime's own"),  # a recipe without its precision
        ({"precisions": [QAT_OFF_NPU], "precision_recipes": [QAT_RECIPE]}, "no family lists the precision"),
        (
            {
                "precisions": [attrs.evolve(QAT_ROW, accelerators=frozenset(), why_not={}, instead={})],
                "precision_recipes": [QAT_RECIPE],
                "families": [DDP_WITH_QAT],
            },
            "it runs on no accelerator",
        ),
        ({"accelerators": "npu"}, "not a str"),
        ({"backends": [NPU_ROW]}, "each row is a BackendRule"),
        ({"precision_recipes": [QAT_ROW]}, "each row is a PrecisionRecipe"),
    ],
)
def test_extend_refuses_incoherent_hardware_and_precision_rows(arguments: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(words)):
        BUILTIN_RULES.extend(**arguments)


def test_extend_takes_the_coherent_rows_and_leaves_the_builtin_set_alone() -> None:
    rules = BUILTIN_RULES.extend(**_coherent())
    assert resolve_uncached(Request(devices=2), npus(), rules).accelerator == NPU
    assert NPU not in BUILTIN_RULES.accelerators and HCCL not in BUILTIN_RULES.backends
    assert INT8_QAT not in BUILTIN_RULES.precisions and INT8_QAT not in BUILTIN_RULES.precision_recipes
    assert type(QAT_RECIPE) is PrecisionRecipe and type(QAT_ROW) is PrecisionRule and type(HCCL_ROW) is BackendRule


def test_metrics_on_downstream_hardware_are_placed_from_the_plan_alone() -> None:
    """HCCL takes device tensors: a CPU-stored value moves to the NPU to be reduced; a stateful metric cannot."""
    plan = resolve_uncached(Request(accelerator=NPU, devices=2), npus(2), RULES)
    slot = place_metric(plan, "tensor", store_on_cpu=True)
    assert (slot.store_device, slot.reduce_device, slot.moves_for_reduction) == ("cpu", "npu:0", True)
    with pytest.raises(Incompatible, match="hccl"):
        place_metric(plan, "stateful", store_on_cpu=True)
