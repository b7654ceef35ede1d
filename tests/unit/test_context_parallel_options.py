"""Context parallelism's options (`ModelParallelOptions(cp_rotate_method=..., cp_load_balancer=...)`: torch's
`set_rotate_method` and `context_parallel`'s load balancer): planned into `plan.mesh.context_parallel` for cp above 1
and refused at cp=1, read back and checked by `Plan.from_dict`, shown by `explain()`, handed to torch by
`rt.context_parallel` (with a sequence the balancer cannot split refused), carried to Accelerate's
`TorchContextParallelConfig` where it has one and refused by name where not."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from tests.helpers import cuda
from tests.unit.test_mesh import runtime_for
from trainplan import Incompatible, InvalidRequest, ModelParallelOptions, Plan, PlanFormatError, Request
from trainplan.effects.runtime import NotWrappable
from trainplan.mapping.frameworks import accelerate_arguments, lightning_arguments
from trainplan.resolve import resolve
from trainplan.spec.mesh import ContextParallelLayout


def cp_plan(devices: int = 4, **options: Any) -> Plan:
    request = Request(devices=devices, strategy="model_parallel", strategy_options=ModelParallelOptions(**options))
    return resolve(request, cuda(devices))


def test_the_options_are_planned_read_back_and_explained() -> None:
    plan = cp_plan(cp=2, cp_rotate_method="alltoall", cp_load_balancer="none")
    assert plan.mesh is not None
    assert plan.mesh.context_parallel == ContextParallelLayout(rotate_method="alltoall", load_balancer="none")
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["mesh"]["context_parallel"] == {"rotate_method": "alltoall", "load_balancer": "none"}
    assert Plan.from_dict(data) == plan
    assert "context parallelism: key/value shards rotated by alltoall, sequences split in contiguous blocks" in (
        plan.explain()
    )
    default = cp_plan(cp=2)
    assert default.mesh is not None and default.mesh.context_parallel == ContextParallelLayout()
    assert "rotated by allgather, sequences split head-tail (load-balanced)" in default.explain()


@pytest.mark.parametrize(("option", "value"), [("cp_rotate_method", "alltoall"), ("cp_load_balancer", "none")])
def test_an_option_of_context_parallelism_is_refused_where_cp_is_1(option: str, value: str) -> None:
    written: dict[str, Any] = {option: value}
    with pytest.raises(Incompatible) as refused:
        cp_plan(**written)
    assert refused.value.rule == "mesh-option-unused"
    message = str(refused.value)
    assert f"{option}={value!r} is for the context-parallel groups, and cp=1" in message
    assert "context parallelism never runs" in message and f"leave {option} unset" in message


def test_a_value_torch_has_no_name_for_is_refused_by_the_row() -> None:
    with pytest.raises(InvalidRequest, match="cp_rotate_method='ring'"):
        cp_plan(cp=2, cp_rotate_method="ring")


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("rotate_method", "ring", "plan.mesh.context_parallel.rotate_method"),
        ("load_balancer", "zigzag", "plan.mesh.context_parallel.load_balancer"),
    ],
)
def test_from_dict_reads_only_torchs_names(field: str, value: str, words: str) -> None:
    data: dict[str, Any] = json.loads(json.dumps(cp_plan(cp=2).to_dict()))
    data["mesh"]["context_parallel"][field] = value
    with pytest.raises(PlanFormatError, match=words):
        Plan.from_dict(data)


def test_from_dict_refuses_the_options_at_cp_1_and_options_apart_from_the_mesh() -> None:
    data: dict[str, Any] = json.loads(json.dumps(cp_plan(tp=2).to_dict()))
    data["mesh"]["context_parallel"]["rotate_method"] = "alltoall"
    data["strategy"]["options"]["cp_rotate_method"] = "alltoall"
    with pytest.raises(PlanFormatError, match=r"mesh-option-unused \(cp_rotate_method with cp=1\)"):
        Plan.from_dict(data)
    apart: dict[str, Any] = json.loads(json.dumps(cp_plan(cp=2).to_dict()))
    apart["mesh"]["context_parallel"]["load_balancer"] = "none"
    with pytest.raises(PlanFormatError, match=r"strategy\.options"):
        Plan.from_dict(apart)


def test_the_runtime_hands_the_plans_options_to_torch() -> None:
    rt, fakes = runtime_for(cp_plan(cp=2, cp_rotate_method="alltoall"), rank=1)
    tokens, labels = torch.zeros(1, 8), torch.zeros(1, 8)
    with rt.context_parallel([tokens, labels], [1, 1]):
        pass
    assert fakes.calls[-1] == ("context_parallel", (("cp",), [(1, 8), (1, 8)], (1, 1), "alltoall", True))
    rt, fakes = runtime_for(cp_plan(cp=2, cp_load_balancer="none"), rank=0)
    with rt.context_parallel([torch.zeros(2, 6)], [1]):  # no balancer: 2 blocks of 3
        pass
    assert fakes.calls[-1] == ("context_parallel", (("cp",), [(2, 6)], (1,), "allgather", False))


@pytest.mark.parametrize(
    ("plan_options", "buffers", "seq_dims", "words"),
    [
        ({"tp": 2}, [torch.zeros(1, 8)], [1], "the plan's cp is 1"),
        ({"cp": 2}, [torch.zeros(1, 8)], [1, 1], "1 buffer(s) and 2 dimension(s)"),
        ({"cp": 2}, [torch.zeros(1, 6)], [1], "6 tokens and the head-tail load balancer cuts it into 2·cp = 4"),
        ({"cp": 2, "cp_load_balancer": "none"}, [torch.zeros(1, 5)], [1], "5 tokens and cp=2 blocks"),
    ],
)
def test_the_runtime_refuses_what_torch_would_run_wrongly_or_silently(
    plan_options: dict[str, Any], buffers: list[torch.Tensor], seq_dims: list[int], words: str
) -> None:
    rt, fakes = runtime_for(cp_plan(**plan_options), rank=0)
    with pytest.raises(NotWrappable) as refused:
        rt.context_parallel(buffers, seq_dims)
    assert words in str(refused.value)
    assert not any(call[0] == "context_parallel" for call in fakes.calls)


def test_accelerate_takes_the_rotate_method_and_refuses_the_balancer_by_name() -> None:
    plan = cp_plan(devices=2, cp=2, dp_shard=1, cp_rotate_method="alltoall")
    arguments = accelerate_arguments(plan)
    assert arguments.context_parallel == {"cp_comm_strategy": "alltoall"}
    flags = arguments.launch_flags
    assert flags[flags.index("--parallelism_config_cp_comm_strategy") + 1] == "alltoall"
    assert accelerate_arguments(cp_plan(devices=2, cp=2, dp_shard=1)).context_parallel is None, "the default"
    unbalanced = cp_plan(devices=2, cp=2, dp_shard=1, cp_load_balancer="none")
    with pytest.raises(Incompatible, match=r"strategy_options.cp_load_balancer='none'.*head-tail load balancer"):
        accelerate_arguments(unbalanced)


def test_lightning_refuses_both_by_name() -> None:
    for options in ({"cp_rotate_method": "alltoall"}, {"cp_load_balancer": "none"}):
        plan = cp_plan(devices=2, cp=2, dp_shard=1, **options)
        with pytest.raises(Incompatible) as refused:
            lightning_arguments(plan, "fabric")
        assert refused.value.rule == "option-framework"
        assert f"strategy_options.{next(iter(options))}=" in str(refused.value)
