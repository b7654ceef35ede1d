"""Per-dimension process-group backends (`ModelParallelOptions(tp_group_backend="gloo")`, torch's
`init_device_mesh(..., backend_override=...)`): planned into `plan.mesh.backends` for a dimension whose degree is
above 1 and whose backend runs on the accelerator, read back and checked by `Plan.from_dict`, shown by `explain()`,
passed by the runtime to torch for the dimension and the peers' names for the same groups, and refused by name by
the frameworks that build their mesh without one."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import cpu, cuda
from tests.unit.test_mesh import runtime_for
from trainplan import Environment, Incompatible, InvalidRequest, ModelParallelOptions, Plan, PlanFormatError, Request
from trainplan.mapping.frameworks import accelerate_arguments, lightning_arguments
from trainplan.resolve import resolve
from trainplan.rules import MESH_ALIASES, MESH_BACKENDS
from trainplan.rules.mesh import flattened_backend
from trainplan.spec.names import GROUP_BACKENDS, MeshDimension


def mesh_plan(env: Environment, accelerator: str = "cuda", **options: Any) -> Plan:
    request = Request(
        accelerator=accelerator,  # type: ignore[arg-type]
        devices=4,
        strategy="model_parallel",
        strategy_options=ModelParallelOptions(**options),
    )
    return resolve(request, env)


def test_the_group_backends_are_the_mesh_backends() -> None:
    assert set(GROUP_BACKENDS) == set(MESH_BACKENDS.values())


def test_a_dimensions_backend_is_planned_read_back_and_explained() -> None:
    plan = mesh_plan(cuda(4), tp=2, tp_group_backend="gloo", dp_shard_group_backend="nccl")
    assert plan.mesh is not None and dict(plan.mesh.backends) == {"dp_shard": "nccl", "tp": "gloo"}
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["mesh"]["backends"] == {"dp_shard": "nccl", "tp": "gloo"}
    assert Plan.from_dict(data) == plan
    explained = plan.explain()
    assert "tp        {0,1} {2,3}   over gloo (the world: nccl)" in explained
    assert "dp_shard  {0,2} {1,3}   over nccl (the world: nccl)" in explained


def test_a_plan_without_backends_reads_back_without_the_key() -> None:
    plan = mesh_plan(cuda(4), tp=2)
    data = plan.to_dict()
    assert data["mesh"]["backends"] == {}  # type: ignore[index]
    del data["mesh"]["backends"]  # type: ignore[attr-defined]  # a plan written before backends were planned
    assert Plan.from_dict(data) == plan


@pytest.mark.parametrize(
    ("options", "rule", "words"),
    [
        ({"tp_group_backend": "gloo"}, "mesh-option-unused", ("tp=1", "no tensor-parallel groups", "Use tp=2 or more")),
        (
            {"pp_group_backend": "gloo"},
            "mesh-option-unused",
            ("pp=1", "no pipeline groups", "leave pp_group_backend unset"),
        ),
        ({"tp": 2, "tp_group_backend": "nccl"}, "mesh-group-backend", ("NCCL reduces CUDA tensors only", "'gloo'")),
    ],
)
def test_a_backend_that_cannot_be_is_refused_with_the_fix(
    options: dict[str, Any], rule: str, words: tuple[str, ...]
) -> None:
    with pytest.raises(Incompatible) as refused:
        mesh_plan(cpu(), accelerator="cpu", **options)
    assert refused.value.rule == rule
    for word in words:
        assert word in str(refused.value)


def test_a_backend_no_mesh_runs_over_and_a_dimension_that_is_none_are_refused_by_name() -> None:
    with pytest.raises(InvalidRequest, match=r"tp_group_backend='mpi'.*'nccl', 'gloo', or leave it unset \(None\)"):
        mesh_plan(cuda(4), tp=2, tp_group_backend="mpi")
    # 'none' (the CLI's text) was told "Did you mean 'None'?", and 'None' then refused as text.
    with pytest.raises(InvalidRequest) as refused:
        mesh_plan(cuda(4), tp=2, tp_group_backend="none")
    assert refused.value.suggestion is None and "Did you mean" not in str(refused.value)
    assert "or leave it unset (None)" in str(refused.value)
    config = {"strategy": "model_parallel", "strategy_options": {"tq_group_backend": "gloo"}}
    with pytest.raises(InvalidRequest, match=r"'tq_group_backend'.*'tp_group_backend'"):
        Request.from_config(config)


def _edited(plan: Plan, edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(plan.to_dict()))
    edit(data)
    return data


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda data: data["mesh"].update(backends={"tq": "gloo"}), "plan.mesh.backends"),
        (lambda data: data["mesh"].update(backends={"tp": "mpi"}), "plan.mesh.backends.tp"),
        (lambda data: data["mesh"].update(backends={}), "its backends"),
        (
            lambda data: (
                data["mesh"].update(backends={"cp": "gloo"}),
                data["strategy"]["options"].update(tp_group_backend=None, cp_group_backend="gloo"),
            ),
            "mesh-option-unused (cp=1)",
        ),
    ],
)
def test_from_dict_checks_the_backends(edit: Callable[[dict[str, Any]], None], words: str) -> None:
    plan = mesh_plan(cuda(4), tp=2, tp_group_backend="gloo")
    with pytest.raises(PlanFormatError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Plan.from_dict(_edited(plan, edit))


def test_from_dict_refuses_nccl_groups_on_cpu() -> None:
    plan = mesh_plan(cpu(), accelerator="cpu", tp=2, tp_group_backend="gloo")

    def nccl(data: dict[str, Any]) -> None:
        data["mesh"]["backends"] = {"tp": "nccl"}
        data["strategy"]["options"]["tp_group_backend"] = "nccl"

    with pytest.raises(PlanFormatError, match=r"mesh-group-backend.*CUDA tensors only"):
        Plan.from_dict(_edited(plan, nccl))


def test_the_runtime_passes_the_backends_to_torch_and_to_the_names_of_the_same_groups() -> None:
    plan = mesh_plan(cuda(4), tp=2, tp_group_backend="gloo")
    _, fakes = runtime_for(plan, rank=0)
    dimensions = ("pp", "dp_replicate", "dp_shard", "cp", "sp", "tp")
    assert fakes.calls[0] == ("device_mesh", ("cuda", (1, 1, 2, 1, 1, 2), dimensions, {"tp": "gloo"}))
    flattened = {args[1]: args[2:] for name, args in fakes.calls if name == "flatten" and isinstance(args, tuple)}
    assert flattened["tensor_parallel"] == ("gloo",), "Lightning's name for the tp groups: the same backend"
    assert flattened["dp"] == flattened["fsdp"] == flattened["world"] == (), "groups over other ranks: the world's"
    assert set(flattened) == {"dp", "world", *MESH_ALIASES}


def test_a_flattened_mesh_takes_the_backend_its_dimensions_share() -> None:
    degrees: dict[MeshDimension, int] = {"pp": 1, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "sp": 1, "tp": 2}
    one: dict[MeshDimension, str] = {"dp_replicate": "gloo"}
    both: dict[MeshDimension, str] = {"dp_replicate": "gloo", "dp_shard": "gloo"}
    apart: dict[MeshDimension, str] = {"tp": "nccl", "dp_shard": "gloo"}
    assert flattened_backend(("dp_replicate", "dp_shard"), degrees, one) is None
    assert flattened_backend(("dp_replicate", "dp_shard", "cp"), degrees, both) == "gloo", "cp=1 adds no ranks"
    assert flattened_backend(("tp",), degrees, apart) == "nccl"
    assert flattened_backend(("dp_shard", "tp"), degrees, apart) is None


def test_lightning_and_accelerate_refuse_a_backend_by_name() -> None:
    plan = mesh_plan(cuda(4), tp=2, tp_group_backend="gloo")
    for adapt in (lambda: lightning_arguments(plan, "fabric"), lambda: accelerate_arguments(plan)):
        with pytest.raises(Incompatible) as refused:
            adapt()
        assert refused.value.rule == "option-framework"
        assert "strategy_options.tp_group_backend='gloo'" in str(refused.value)
        assert "no backend_override" in str(refused.value)
