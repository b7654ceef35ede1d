"""Properties of N-D parallel layouts over degrees × layouts: a plan whose mesh keeps every rule, or a typed error
whose fix names a layout (or a precision, or a backend) that does resolve."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainplan import Environment, Incompatible, InvalidRequest, ModelParallelOptions, Plan, Request, TrainplanError
from trainplan.parse.plan_json import plan_from_json_text
from trainplan.resolve import resolve_uncached
from trainplan.rules import MESH_DIMENSIONS as MESH_RULES
from trainplan.rules.mesh import layout_violations
from trainplan.spec.names import BACKENDS, MESH_DIMENSIONS, PRECISIONS

LAYOUTS = [(1, 1), (1, 4), (2, 4), (2, 2), (4, 2), (1, 8), (2, 3), (3, 2), (3, 4)]
"""(nodes, processes per node)."""

Degree = int | str


def _outcome(request: Request, env: Environment) -> Plan | TrainplanError:
    try:
        return resolve_uncached(request, env)
    except TrainplanError as error:
        return error


def _check_plan(plan: Plan, env: Environment) -> None:
    mesh = plan.mesh
    assert mesh is not None and mesh.dimensions == MESH_DIMENSIONS
    assert mesh.world_size == plan.world_size
    violations = layout_violations(
        mesh.sizes,
        num_nodes=plan.num_nodes,
        processes_per_node=plan.processes_per_node,
        accelerator=plan.accelerator,
        backend=plan.process_group_backend,
        precision=plan.precision,
    )
    assert list(violations) == []
    per_node = plan.processes_per_node
    asked = plan.request.strategy_options
    assert isinstance(asked, ModelParallelOptions)
    warned = " ".join(note.message for note in plan.notes if note.level == "warning")
    for name in ("tp", "cp"):  # their groups stay inside one node, or the plan warns; 'auto' never spans hosts
        spans = any(len({rank // per_node for rank in group}) > 1 for group in mesh.groups(name))
        title = MESH_RULES[name].title
        assert spans == (f"{title} groups span hosts" in warned), (name, plan.notes)
        assert not (spans and getattr(asked, name) == "auto"), (name, asked)
    stage = mesh.world_size // mesh.sizes["pp"]
    straddles = mesh.sizes["pp"] > 1 and stage % per_node != 0 and per_node % stage != 0
    assert straddles == ("straddle a node boundary" in warned), plan.notes
    assert not (straddles and asked.pp == "auto")
    coordinates = {mesh.coordinates(rank) for rank in range(mesh.world_size)}
    assert len(coordinates) == mesh.world_size
    assert plan_from_json_text(json.dumps(plan.to_dict())) == plan
    assert resolve_uncached(plan.request, env) == plan


def _fixed(request: Request, env: Environment, error: TrainplanError) -> Plan:
    """The request changed as each refusal's fix says leads to a plan (a layout fix leaves the backend alone, so
    a backend refused too is the next fix), in at most three steps."""
    for _ in range(3):
        request = _follow(request, error)
        outcome = _outcome(request, env)
        if isinstance(outcome, Plan):
            assert outcome.mesh is not None
            return outcome
        error = outcome
    raise AssertionError(f"following the fixes ends in {error}")


def _check_choices(request: Request, env: Environment, error: TrainplanError) -> None:
    """Every degree a refusal offers ("Use tp=4 or 2"), written instead of the one refused, is not refused again for
    that degree: not by the accelerator or precision rules, not for its own group or stage size."""
    if not isinstance(error, Incompatible):
        return
    offered = re.match(r"Use (\w+)=(\d+(?:, \d+)*(?: or \d+)?)(?:,| there| *$)", str(error.fix))
    if offered is None:
        return
    name = offered.group(1)
    options = request.strategy_options
    assert isinstance(options, ModelParallelOptions)
    written = {field: getattr(options, field) for field in options.given}
    for degree in map(int, re.findall(r"\d+", offered.group(2))):
        changed = Request(**{**_fields(request), "strategy_options": ModelParallelOptions(**{**written, name: degree})})
        outcome = _outcome(changed, env)
        if isinstance(outcome, Incompatible) and outcome.rule in (
            "mesh-inside-node",
            "mesh-pipeline-nodes",
            "mesh-accelerator",
            "mesh-precision",
        ):
            assert outcome.values.get(name) != degree, f"{error} offers {name}={degree}, which is refused: {outcome}"


def _follow(request: Request, error: TrainplanError) -> Request:
    """The request as the error's fix says to write it."""
    assert isinstance(error, (Incompatible, InvalidRequest)), error
    fix = str(error.fix)
    options = request.strategy_options
    assert isinstance(options, ModelParallelOptions)
    example = re.search(r"e\.g\. ((?:\w+=\d+(?:, )?)+)", fix)
    if example is not None:
        degrees: dict[str, Any] = {name: int(value) for name, value in re.findall(r"(\w+)=(\d+)", example.group(1))}
        fixed = Request(
            accelerator=request.accelerator,
            strategy="model_parallel",
            devices=request.devices,
            num_nodes=request.num_nodes,
            precision=request.precision,
            process_group_backend=request.process_group_backend,
            strategy_options=ModelParallelOptions(**degrees),
        )
    elif isinstance(error, Incompatible) and error.rule == "mesh-precision":
        fixed = Request(**{**_fields(request), "precision": re.findall(r"precision='([\w-]+)'", fix)[0]})
    elif isinstance(error, Incompatible) and error.rule == "mesh-backend":
        fixed = Request(**{**_fields(request), "process_group_backend": None})
    else:
        raise AssertionError(f"the fix names no layout: {error}")
    return fixed


def _fields(request: Request) -> dict[str, Any]:
    return {
        "accelerator": request.accelerator,
        "strategy": request.strategy,
        "devices": request.devices,
        "num_nodes": request.num_nodes,
        "precision": request.precision,
        "process_group_backend": request.process_group_backend,
        "strategy_options": request.strategy_options,
    }


class TestEveryLayoutOnCpu:
    """Enumerated, not sampled: pp, dp_replicate and tp from 1, 2, 3, 4 or 'auto', dp_shard left to its default or
    written, on every layout of up to 12 CPU processes. Each request is a plan that keeps the rules, or an
    `Incompatible` of a mesh rule whose example layout resolves."""

    @pytest.mark.parametrize(("nodes", "per_node"), LAYOUTS)
    def test_plan_or_a_fitting_layout(self, nodes: int, per_node: int) -> None:
        env = Environment(cpu_count=16)
        values: list[Degree] = [1, 2, 3, 4, "auto"]
        plans = refusals = 0
        for pp, replicate, tensor, shard in itertools.product(values, values, values, [None, 1, 2]):
            written: dict[str, Any] = {"pp": pp, "dp_replicate": replicate, "tp": tensor}
            if shard is not None:
                written["dp_shard"] = shard
            request = Request(
                accelerator="cpu",
                strategy="model_parallel",
                devices=per_node,
                num_nodes=nodes,
                strategy_options=ModelParallelOptions(**written),
            )
            outcome = _outcome(request, env)
            if isinstance(outcome, Plan):
                plans += 1
                _check_plan(outcome, env)
            else:
                refusals += 1
                assert isinstance(outcome, Incompatible) and outcome.rule.startswith("mesh-"), outcome
                _fixed(request, env, outcome)
                _check_choices(request, env, outcome)
        assert plans and refusals


_degree: st.SearchStrategy[Any] = st.one_of(st.sampled_from([1, 1, 2, 3, 4, 8]), st.just("auto"))


@st.composite
def mesh_requests(draw: st.DrawFn) -> tuple[Request, Environment]:
    accelerator: Any = draw(st.sampled_from(["cpu", "cuda"]))
    per_node = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    nodes = draw(st.integers(min_value=1, max_value=4))
    if draw(st.integers(min_value=0, max_value=4)) == 0:
        options = ModelParallelOptions(
            data_parallel_size=draw(_degree), tensor_parallel_size=draw(st.one_of(st.none(), _degree))
        )
    else:
        names = draw(st.lists(st.sampled_from(MESH_DIMENSIONS), unique=True, max_size=4))
        degrees: dict[str, Any] = {name: draw(_degree) for name in names}
        options = ModelParallelOptions(**degrees)
    request = Request(
        accelerator=accelerator,
        strategy="model_parallel",
        devices=per_node,
        num_nodes=nodes,
        precision=draw(st.sampled_from(PRECISIONS)),
        process_group_backend=draw(st.one_of(st.none(), st.none(), st.sampled_from(BACKENDS))),
        strategy_options=options,
    )
    variables = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"} if nodes > 1 else {}
    return request, Environment(cuda_device_count=8, cpu_count=16, variables=variables)


class TestDegreesTimesLayouts:
    """Any degrees (Lightning's spelling too) on any layout, accelerator, precision and backend: a plan that keeps
    every mesh rule, or a typed error; a mesh rule's refusal names what to write instead, and that resolves."""

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(mesh_requests())
    def test_plan_or_typed_error_naming_what_fits(self, pair: tuple[Request, Environment]) -> None:
        request, env = pair
        outcome = _outcome(request, env)
        if isinstance(outcome, Plan):
            _check_plan(outcome, env)
            return
        assert isinstance(outcome, TrainplanError)
        if isinstance(outcome, Incompatible) and outcome.rule.startswith("mesh-") and outcome.rule != "mesh-spellings":
            _fixed(request, env, outcome)
            _check_choices(request, env, outcome)
