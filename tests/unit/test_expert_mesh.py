"""Expert parallelism with torchtitan's semantics (`ParallelDims`): `ep` is borrowed from `dp_shard × cp × tp`,
divides it, and adds nothing to the world; the expert mesh is `pp × dp_replicate × efsdp × ep`. torchtitan's own MoE
layouts replayed as what-if plans; `dp_shard=-1` read as 'auto'; `rt.mesh`'s peer names are rows."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from tests.helpers import cpu, cuda
from trainplan import Environment, Incompatible, InvalidRequest, ModelParallelOptions, Plan, PlanFormatError, Request
from trainplan.mapping.frameworks import accelerate_arguments, lightning_arguments
from trainplan.resolve import resolve
from trainplan.rules import EXPERT_REGION, MESH_ALIASES
from trainplan.spec.mesh import MeshLayout
from trainplan.spec.names import EXPERT_DIMENSIONS, MESH_DIMENSIONS, MESH_NAMES

NODES_OF_8 = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "0"}


def mesh_plan(env: Environment, **request: Any) -> Plan:
    return resolve(Request(strategy="model_parallel", **request), env)


def torchtitan_plan(nodes: int, per_node: int, **degrees: int) -> Plan:
    """torchtitan's defaults: dp_shard=-1, every other degree 1."""
    options = ModelParallelOptions(**{"dp_shard": -1, **degrees})  # type: ignore[arg-type]
    return mesh_plan(cuda(per_node, variables=NODES_OF_8), devices=per_node, num_nodes=nodes, strategy_options=options)


class TestTorchtitanLayouts:
    """torchtitan's deepseek_v3 configs (torchtitan/models/deepseek_v3/config_registry.py) on its own world sizes."""

    def test_deepseek_v3_16b_ep_8_on_4_nodes_of_8(self) -> None:
        plan = torchtitan_plan(4, 8, ep=8)
        assert plan.mesh is not None and plan.mesh.sizes["dp_shard"] == 32 and plan.mesh.ep == 8
        assert plan.mesh.expert.sizes == {"pp": 1, "dp_replicate": 1, "efsdp": 4, "ep": 8}
        assert plan.mesh.expert.group(13, "ep") == tuple(range(8, 16)), "neighbouring ranks: one node"
        assert plan.mesh.expert.group(13, "efsdp") == (5, 13, 21, 29)
        assert "torchtitan-auto" in {note.code for note in plan.notes}

    def test_deepseek_v3_671b_ep_2(self) -> None:
        plan = torchtitan_plan(8, 8, ep=2)
        assert plan.mesh is not None and plan.mesh.expert.sizes["efsdp"] == 32

    @pytest.mark.parametrize(
        ("degrees", "region", "offered"),
        [({"ep": 3}, 32, "ep=4, 2 or 8"), ({"ep": 64}, 32, "ep=32, 16 or 8"), ({"tp": 2, "ep": 3}, 32, "ep=4, 2 or 8")],
    )
    def test_an_ep_that_does_not_divide_the_region_is_refused_with_the_numbers(
        self, degrees: dict[str, int], region: int, offered: str
    ) -> None:
        with pytest.raises(Incompatible) as refused:
            torchtitan_plan(4, 8, **degrees)
        assert refused.value.rule == "mesh-expert"
        message = str(refused.value)
        assert f"ep={degrees['ep']} splits" in message and f"= {region} (" in message and offered in message

    def test_every_divisor_of_the_region_is_planned_and_every_other_ep_refused(self) -> None:
        for tensor, ep in itertools.product((1, 2, 4), range(1, 17)):
            region = 16  # 2 nodes of 8: dp_shard · tp is the world
            try:
                plan = torchtitan_plan(2, 8, tp=tensor, ep=ep)
            except Incompatible as refusal:
                assert region % ep and refusal.rule == "mesh-expert"
                continue
            assert region % ep == 0 and plan.mesh is not None
            assert math.prod(plan.mesh.expert.shape) == plan.world_size


class TestTheExpertMesh:
    def test_ep_borrows_ranks_and_does_not_multiply_the_world(self) -> None:
        plan = mesh_plan(
            cpu(), accelerator="cpu", devices=4, strategy_options=ModelParallelOptions(dp_shard=2, tp=2, ep=2)
        )
        assert plan.mesh is not None and plan.world_size == 4 and plan.mesh.shape == (1, 1, 2, 1, 1, 2)
        assert "ep=2 splits the experts over 2 of the 4 ranks of dp_shard × cp × sp × tp" in plan.reasons["mesh"]

    def test_the_expert_mesh_is_the_dense_region_regrouped(self) -> None:
        """For every small layout, the ranks of an ep group and an efsdp group together make exactly the ranks of a
        dense dp_shard × cp × tp block, and pp and dp_replicate groups are the dense mesh's."""
        for shape in itertools.product((1, 2), (1, 2), (1, 2, 4), (1, 2), (1, 2)):
            region = math.prod(shape[2:])
            for ep in (d for d in range(1, region + 1) if region % d == 0):
                mesh = MeshLayout(shape=shape, ep=ep)
                for rank in range(mesh.world_size):
                    block = {
                        other
                        for other in range(mesh.world_size)
                        if mesh.coordinates(other)[:2] == mesh.coordinates(rank)[:2]
                    }
                    ep_group, efsdp_group = mesh.expert.group(rank, "ep"), mesh.expert.group(rank, "efsdp")
                    assert {a - rank + b for a in ep_group for b in efsdp_group} == block
                    assert mesh.expert.group(rank, "pp") == mesh.group(rank, "pp")
                    assert mesh.expert.group(rank, "dp_replicate") == mesh.group(rank, "dp_replicate")

    def test_the_plan_round_trips_its_expert_degree(self) -> None:
        plan = mesh_plan(cpu(), accelerator="cpu", devices=4, strategy_options=ModelParallelOptions(ep=4))
        assert Plan.from_dict(plan.to_dict()) == plan
        data = plan.to_dict()
        data["mesh"]["ep"] = 3  # type: ignore[index]
        with pytest.raises(PlanFormatError, match="ep"):
            Plan.from_dict(data)

    @pytest.mark.parametrize("value", [0, -1, "auto", 2.0, True])
    def test_ep_is_a_whole_number_of_ranks(self, value: object) -> None:
        with pytest.raises(InvalidRequest, match=r"strategy_options\.ep"):
            mesh_plan(cpu(), accelerator="cpu", devices=4, strategy_options=ModelParallelOptions(ep=value))  # type: ignore[arg-type]

    def test_frameworks_without_an_expert_dimension_refuse_it_by_name(self) -> None:
        plan = mesh_plan(cuda(4), devices=4, strategy_options=ModelParallelOptions(ep=2))
        for build in (lambda: lightning_arguments(plan, "fabric"), lambda: accelerate_arguments(plan)):
            with pytest.raises(Incompatible, match=r"ep=2.*rt\.expert_mesh"):
                build()


class TestTorchtitanAuto:
    def test_dp_shard_minus_one_is_auto_with_a_note(self) -> None:
        plan = mesh_plan(cpu(), accelerator="cpu", devices=4, strategy_options=ModelParallelOptions(dp_shard=-1, tp=2))
        assert plan.mesh is not None and plan.mesh.sizes["dp_shard"] == 2
        assert [note.message for note in plan.notes if note.code == "torchtitan-auto"] == [
            "dp_shard=-1 is torchtitan's spelling of dp_shard='auto': it takes what the other degrees leave"
        ]
        assert Plan.from_dict(plan.to_dict()) == plan

    def test_a_config_files_minus_one_text_is_read_as_the_command_line_reads_it(self) -> None:
        for text in ("-1", " -1 "):
            request = Request.from_config({"strategy": "model_parallel", "strategy_options": {"dp_shard": text}})
            assert isinstance(request.strategy_options, ModelParallelOptions)
            assert request.strategy_options.dp_shard == -1
        with pytest.raises(InvalidRequest, match=r"strategy_options\.tp=-2 is not accepted"):
            Request.from_config({"strategy": "model_parallel", "strategy_options": {"tp": "-2"}})

    @pytest.mark.parametrize("name", ["pp", "dp_replicate", "cp", "tp"])
    def test_only_dp_shard_reads_minus_one(self, name: str) -> None:
        with pytest.raises(InvalidRequest, match=rf"strategy_options\.{name}"):
            mesh_plan(cpu(), accelerator="cpu", devices=4, strategy_options=ModelParallelOptions(**{name: -1}))  # type: ignore[arg-type]


def test_the_names_rt_mesh_answers_are_the_rows() -> None:
    """Every typed mesh name is a dense dimension, an expert dimension, `dp` or a peer's alias of dense dimensions."""
    assert set(MESH_NAMES) == {*MESH_DIMENSIONS, *EXPERT_DIMENSIONS, "dp", *MESH_ALIASES}
    assert all(set(dimensions) <= set(MESH_DIMENSIONS) for dimensions in MESH_ALIASES.values())
    assert set(EXPERT_REGION) <= set(MESH_DIMENSIONS)
