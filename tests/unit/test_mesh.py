"""N-D parallel layouts (strategy `model_parallel`): the degrees, their defaults and Lightning's spelling, the mesh
arithmetic, the plan's drawing and JSON, the framework mappings, and the runtime's meshes (fakes for what needs a
world; a real one-process mesh)."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import pytest
import torch

from tests.helpers import cpu, cuda
from trainplan import (
    Environment,
    Incompatible,
    InvalidRequest,
    MeshLayout,
    ModelParallelOptions,
    NotWrappable,
    Plan,
    PlanFormatError,
    Request,
    TrainplanError,
    TrainplanWarning,
)
from trainplan import resolve as resolve_and_warn
from trainplan.effects.runtime import Runtime
from trainplan.effects.world import World
from trainplan.mapping.frameworks import (
    Encoded,
    accelerate_arguments,
    accelerate_launch_flags,
    accelerate_mesh_refusal,
    lightning_arguments,
)
from trainplan.parse.plan_json import plan_from_json_text
from trainplan.resolve import resolve
from trainplan.rules import MESH_ALIASES
from trainplan.rules.mesh import data_parallel

MESH = ModelParallelOptions
TWO_NODES = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "1"}


def mesh_plan(env: Environment, **request: Any) -> Plan:
    return resolve(Request(strategy="model_parallel", **request), env)


class TestDegrees:
    """The degrees multiply to the world size; at most one is 'auto' and takes what the others leave."""

    def test_by_default_dp_shard_takes_the_whole_world(self) -> None:
        plan = mesh_plan(cuda(8), devices=8)
        assert plan.mesh is not None and plan.mesh.sizes == {
            "pp": 1,
            "dp_replicate": 1,
            "dp_shard": 8,
            "cp": 1,
            "sp": 1,
            "tp": 1,
        }
        assert plan.reasons["mesh"] == "dp_shard='auto' took the whole world of 8 (no other degree asked for)"
        assert plan.strategy.options == MESH(dp_shard=8, given=[])  # resolved; which were written stays the request's

    def test_the_default_auto_takes_what_the_written_degrees_leave(self) -> None:
        plan = mesh_plan(cuda(4), devices=4, num_nodes=2, strategy_options=MESH(pp=2, tp=2))
        assert plan.mesh is not None and plan.mesh.shape == (2, 1, 2, 1, 1, 2)
        assert plan.reasons["mesh"] == "asked for pp=2, tp=2; dp_shard='auto' took the 2 left of the world of 8"

    def test_a_written_auto_takes_the_rest_and_the_default_one_yields(self) -> None:
        plan = mesh_plan(cuda(4), devices=4, num_nodes=2, strategy_options=MESH(dp_replicate="auto", tp=4))
        assert plan.mesh is not None and plan.mesh.sizes["dp_replicate"] == 2 and plan.mesh.sizes["dp_shard"] == 1

    def test_every_degree_written(self) -> None:
        plan = mesh_plan(cuda(4), devices=4, strategy_options=MESH(dp_shard=1, tp=4))
        assert plan.mesh is not None and plan.mesh.shape == (1, 1, 1, 1, 1, 4)
        assert plan.reasons["mesh"] == "asked for tp=4"

    def test_strategy_auto_with_mesh_options_chooses_model_parallel(self) -> None:
        plan = resolve(Request(devices=4, strategy_options=MESH(tp=2)), cuda(4))
        assert plan.strategy.name == "model_parallel" and plan.reasons["strategy"] == "'auto' with ModelParallelOptions"

    def test_one_process_is_a_mesh_of_ones(self) -> None:
        plan = mesh_plan(cpu(), accelerator="cpu", devices=1)
        assert plan.mesh is not None and plan.mesh.shape == (1, 1, 1, 1, 1, 1) and plan.launcher == "subprocess"

    @pytest.mark.parametrize("degree", [0, -1, True, 1.5, "two", 2**40])
    def test_a_degree_is_a_positive_whole_number_or_auto(self, degree: object) -> None:
        with pytest.raises(InvalidRequest) as caught:
            mesh_plan(cuda(2), devices=2, strategy_options=MESH(tp=degree))  # type: ignore[arg-type]
        assert caught.value.field == "strategy_options.tp"

    def test_config_and_command_line_spellings(self) -> None:
        request = Request.from_config(
            {"strategy": "model_parallel", "devices": 4, "strategy_options": {"tp": "2", "dp_shard": "AUTO"}}
        )
        assert request.strategy_options == MESH(tp=2, dp_shard="auto")
        plan = resolve(request, cuda(4))
        assert plan.mesh is not None and plan.mesh.shape == (1, 1, 2, 1, 1, 2)


class TestRefusalsOfferWhatRuns:
    """The degrees a refusal offers, and its example layout, keep the accelerator and precision rules and the degree
    the user asked for."""

    def test_cpu_never_offers_context_parallelism(self) -> None:
        request = Request(accelerator="cpu", devices=4, strategy_options=MESH(cp=2))
        with pytest.raises(Incompatible) as caught:
            resolve(request, cpu())
        assert "Use cp=1 there, e.g. dp_shard=4" in str(caught.value)

    def test_fp16_amp_never_offers_pipeline_stages(self) -> None:
        env = cuda(6, variables=TWO_NODES)
        request = Request(devices=6, num_nodes=2, precision="16-mixed", strategy_options=MESH(pp="auto", dp_shard=3))
        with pytest.raises(Incompatible) as caught:
            resolve(request, env)
        assert caught.value.rule == "mesh-precision" and "Use precision='bf16-mixed', or pp=1" in str(caught.value)

    def test_an_auto_degree_is_named_with_what_it_took(self) -> None:
        env = cuda(4, variables=TWO_NODES)
        with pytest.raises(Incompatible) as caught:
            resolve(Request(devices=4, num_nodes=2, strategy_options=MESH(tp="auto")), env)
        message = str(caught.value)
        assert message.startswith("tp='auto' cannot be used: tp='auto' takes what the other degrees leave, 8 of")
        assert "tp=8 needs 8 processes on one node" in message and "Use tp=4 or 2, e.g. dp_shard=2, tp=4" in message

    def test_the_example_keeps_the_degree_it_offers(self) -> None:
        env = cuda(2, variables=TWO_NODES)
        with pytest.raises(Incompatible) as caught:
            resolve(Request(devices=2, num_nodes=3, strategy_options=MESH(pp="auto", dp_shard=3)), env)
        assert "Use pp=3 or 6, e.g. pp=3, dp_shard=2" in str(caught.value)


class TestSlowLayoutsArePlannedWithTheirNumbers:
    """Groups across hosts and stages off the node boundaries run (every peer builds them), slowly: a degree written
    as a number is planned as written with a warning that gives the numbers and the layout that keeps them inside;
    a degree written 'auto' never takes such a value (TestRefusalsOfferWhatRuns)."""

    @staticmethod
    def warned(request: Request, env: Environment) -> tuple[Plan, list[str]]:
        with pytest.warns(TrainplanWarning) as caught:
            plan = resolve_and_warn(request, env)
        assert [str(warning.message) for warning in caught] == [
            f"{note.code}: {note.message}" for note in plan.notes if note.level == "warning"
        ]
        return plan, [note.message for note in plan.notes if note.code.endswith("-slow")]

    def test_tensor_groups_across_hosts_name_the_groups_and_the_links(self) -> None:
        plan, (message,) = self.warned(
            Request(devices=4, num_nodes=2, strategy_options=MESH(tp=8)), cuda(4, variables=TWO_NODES)
        )
        assert plan.mesh is not None and plan.mesh.sizes["tp"] == 8
        assert message.startswith("tp=8 on 2 node(s) × 4 processes makes 1 of 1 tensor-parallel groups span hosts")
        assert "ranks 0-7 on nodes 0 and 1, 2 of its 8 ring links crossing hosts" in message
        assert "sends 1.75× each activation's bytes over every link" in message
        assert message.endswith("to keep tensor-parallel groups inside a node: tp=4 or 2, e.g. dp_shard=2, tp=4")

    def test_context_groups_around_tensor_groups(self) -> None:
        plan, (message,) = self.warned(
            Request(devices=4, num_nodes=2, strategy_options=MESH(cp=2, tp=4)), cuda(4, variables=TWO_NODES)
        )
        assert plan.mesh is not None and plan.mesh.groups("cp")[0] == (0, 4)
        assert "4 of 4 context-parallel groups span hosts (up to 2 nodes each; ranks 0, 4 on nodes 0 and 1" in message
        assert "key/value blocks 1 time(s) around the ring" in message and "cp=1, e.g. dp_shard=2, tp=4" in message

    def test_stages_off_the_node_boundaries(self) -> None:
        env = cuda(2, variables=TWO_NODES)
        plan, (message,) = self.warned(Request(devices=2, num_nodes=3, strategy_options=MESH(pp=2)), env)
        assert plan.mesh is not None and plan.mesh.sizes["pp"] == 2 and plan.mesh.sizes["dp_shard"] == 3
        assert (
            "makes stages of 3 processes: 2 of 2 stages straddle a node boundary (stage 0: ranks 0-2 on nodes 0 "
            in (message)
        )
        assert message.endswith("to keep stages on node boundaries: pp=3 or 6, e.g. pp=3, dp_shard=2")

    def test_a_layout_inside_the_nodes_says_nothing(self) -> None:
        plan = resolve(Request(devices=4, num_nodes=2, strategy_options=MESH(tp=4, pp=2)), cuda(4, variables=TWO_NODES))
        assert not [note for note in plan.notes if note.level == "warning"]

    def test_the_plan_reads_back(self) -> None:
        plan, _ = self.warned(
            Request(devices=4, num_nodes=2, strategy_options=MESH(tp=8)), cuda(4, variables=TWO_NODES)
        )
        assert plan_from_json_text(json.dumps(plan.to_dict())) == plan


class TestLightningSpelling:
    """`data_parallel_size` / `tensor_parallel_size` (Lightning's ModelParallelStrategy) become dp_shard and tp."""

    def test_both_auto_is_lightnings_layout_with_a_note(self) -> None:
        plan = mesh_plan(cuda(4), devices=4, num_nodes=2, strategy_options=MESH(data_parallel_size="auto"))
        assert plan.mesh is not None and plan.mesh.shape == (1, 1, 2, 1, 1, 4)
        in_force = MESH(dp_shard=2, tp=4, given=["data_parallel_size"])
        assert plan.strategy.options == in_force, "the options in force are whole degrees"
        notes = [note.message for note in plan.notes if note.code == "lightning-sizes"]
        assert notes == [
            "data_parallel_size='auto', tensor_parallel_size='auto' are Lightning's ModelParallelStrategy sizes: here "
            "dp_shard=2, tp=4 ('auto' as Lightning decides it: data parallel over the 2 node(s), tensor parallel over "
            "the 4 process(es) of each); Lightning names these mesh dimensions data_parallel and tensor_parallel"
        ]

    def test_one_auto_takes_what_the_other_size_leaves(self) -> None:
        plan = mesh_plan(cuda(4), devices=4, strategy_options=MESH(data_parallel_size=2))
        assert plan.mesh is not None and (plan.mesh.size("dp_shard"), plan.mesh.size("tp")) == (2, 2)
        assert plan.reasons["mesh"] == "Lightning's data_parallel_size=2, tensor_parallel_size='auto': dp_shard=2, tp=2"

    def test_refusals_speak_lightnings_spelling(self) -> None:
        with pytest.raises(Incompatible) as caught:
            mesh_plan(
                cuda(4),
                devices=4,
                num_nodes=2,
                strategy_options=MESH(tensor_parallel_size="auto", data_parallel_size=1),
            )
        assert "tensor_parallel_size=8 needs 8 processes on one node" in str(caught.value)
        assert "Use tensor_parallel_size=4 or 2, e.g. data_parallel_size=2, tensor_parallel_size=4" in str(caught.value)

    def test_resolving_the_plans_request_again_gives_the_same_plan(self) -> None:
        env = cuda(4, variables=TWO_NODES)
        plan = mesh_plan(env, devices=4, num_nodes=2, strategy_options=MESH(tensor_parallel_size=4))
        assert resolve(plan.request, env) == plan


class TestArithmetic:
    """Rank r sits where `torch.arange(world).view(shape)` puts it (row-major), as `init_device_mesh` lays it out."""

    @pytest.mark.parametrize(
        "shape", [(1, 1, 2, 1, 1, 2), (2, 2, 1, 1, 1, 1), (2, 1, 3, 2, 1, 2), (1, 2, 2, 1, 1, 1), (1, 2, 2, 1, 2, 1)]
    )
    def test_coordinates_groups_and_data_parallel_replicas(self, shape: tuple[int, ...]) -> None:
        layout = MeshLayout(shape=shape)
        grid = torch.arange(layout.world_size).view(shape)
        positions = list(itertools.product(*(range(size) for size in shape)))
        assert [layout.coordinates(int(grid[position])) for position in positions] == positions
        assert all(layout.rank_at(position) == int(grid[position]) for position in positions)
        for axis, name in enumerate(layout.dimensions):
            groups = layout.groups(name)
            moved = grid.movedim(axis, -1).reshape(-1, shape[axis])
            assert sorted(groups) == sorted(tuple(row.tolist()) for row in moved)
            for rank in range(layout.world_size):
                assert rank in layout.group(rank, name)
        replicas = {data_parallel(layout, rank) for rank in range(layout.world_size)}
        assert replicas == {(index, shape[1] * shape[2]) for index in range(shape[1] * shape[2])}

    def test_a_negative_count_of_groups_or_members_is_refused(self) -> None:
        layout = MeshLayout(shape=(1, 1, 2, 1, 1, 2))
        for keep in ({"limit": -1}, {"members": -1}, {"limit": True}):
            with pytest.raises(ValueError, match="use 0 or more"):
                layout.groups("tp", **keep)
        assert layout.groups("tp", limit=0) == () and layout.groups("tp", limit=1, members=1) == ((0,),)

    def test_bad_ranks_and_names_say_what_fits(self) -> None:
        layout = MeshLayout(shape=(1, 1, 2, 1, 1, 2))
        with pytest.raises(IndexError, match="use 0 to 3"):
            layout.coordinates(4)
        with pytest.raises(KeyError, match="'tensor' is not a dimension"):
            layout.size("tensor")  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        "ask",
        [
            lambda layout: layout.coordinates(8),
            lambda layout: layout.coordinates(-1),
            lambda layout: layout.coordinates(1.5),
            lambda layout: layout.coordinates(True),
            lambda layout: layout.coordinates("1"),
            lambda layout: layout.coordinates(None),
            lambda layout: layout.group(0, "bogus"),
            lambda layout: layout.groups("TP"),
            lambda layout: layout.rank_at("x"),
            lambda layout: layout.rank_at((0, 0, 0, 0, "a")),
            lambda layout: layout.rank_at((0, 0, 9, 0, 0)),
            lambda layout: layout.groups("tp", limit=-1),
        ],
    )
    def test_every_accessor_refuses_with_a_trainplan_error(self, ask: Callable[[MeshLayout], object]) -> None:
        """Typed, and still the builtin kind index and mapping code catch (IndexError, KeyError, ValueError)."""
        with pytest.raises(TrainplanError) as caught:
            ask(MeshLayout(shape=(1, 1, 2, 1, 1, 2)))
        assert isinstance(caught.value, (IndexError, KeyError, ValueError))
        assert "0 to" in str(caught.value) or "dimension" in str(caught.value) or "0 or more" in str(caught.value)


class TestThePlan:
    def test_this_ranks_coordinates_and_groups(self) -> None:
        env = cuda(
            4,
            variables={
                **TWO_NODES,
                "RANK": "5",
                "LOCAL_RANK": "1",
                "WORLD_SIZE": "8",
                "GROUP_RANK": "1",
                "LOCAL_WORLD_SIZE": "4",
            },
        )
        plan = mesh_plan(env, strategy_options=MESH(pp=2, tp=2))
        assert plan.global_rank == 5
        assert plan.mesh_coordinates == {"pp": 1, "dp_replicate": 0, "dp_shard": 0, "cp": 0, "sp": 0, "tp": 1}
        groups = {"pp": (1, 5), "dp_replicate": (5,), "dp_shard": (5, 7), "cp": (5,), "sp": (5,), "tp": (4, 5)}
        assert plan.mesh_groups == groups

    def test_explain_draws_nodes_by_processes_with_the_groups(self) -> None:
        env = cuda(4, variables=TWO_NODES)
        text = mesh_plan(env, devices=4, num_nodes=2, strategy_options=MESH(pp=2, tp=2)).explain()
        drawing = text[text.index("  mesh ") :]
        first = "  mesh         pp 2 × dp_replicate 1 × dp_shard 2 × cp 1 × sp 1 × tp 2 = 8 rank(s)"
        assert drawing.splitlines()[0] == first
        assert (
            "layout (node × process: ranks; [ ] a tensor-parallel group; | between pipeline stages):\n"
            "  node 0  [0 1] [2 3]   stage 0\n"
            "  node 1  [4 5] [6 7]   stage 1\n"
            "groups (the ranks that share every other coordinate):\n"
            "  pp        {0,4} {1,5} {2,6} {3,7}\n"
            "  dp_shard  {0,2} {1,3} {4,6} {5,7}\n"
            "  tp        {0,1} {2,3} {4,5} {6,7}\n"
        ) in text

    def test_explain_marks_stages_inside_a_node(self) -> None:
        text = mesh_plan(cuda(4), devices=4, strategy_options=MESH(pp=2)).explain()
        assert "  node 0  0 1 | 2 3   stages 0-1" in text

    def test_a_big_world_is_drawn_in_part(self) -> None:
        env = cuda(8, variables=TWO_NODES)
        text = mesh_plan(env, devices=8, num_nodes=1_000_000, strategy_options=MESH(pp=4, tp=8)).explain()
        assert "  … 999992 more node(s)" in text and "} … (1000000 groups)" in text
        assert "  dp_shard  {0,8,16,24,32,40,48,56,64,72,80,88,96,104,112,120,… (250000 ranks)} {1,9," in text
        assert len(text) < 5000

    def test_json_round_trip(self) -> None:
        plan = mesh_plan(cuda(4, variables=TWO_NODES), devices=4, num_nodes=2, strategy_options=MESH(pp=2, tp=2))
        data = json.loads(json.dumps(plan.to_dict()))
        dimensions = ["pp", "dp_replicate", "dp_shard", "cp", "sp", "tp"]
        pipeline = {"schedule": "1F1B", "microbatches": 2, "virtual_stages": 1}  # one microbatch per stage
        assert data["mesh"] == {
            "dimensions": dimensions,
            "shape": [2, 1, 2, 1, 1, 2],
            "ep": 1,
            "pipeline": pipeline,
            "context_parallel": {"rotate_method": "allgather", "load_balancer": "head_tail"},  # torch's defaults
            "backends": {},
        }
        assert Plan.from_dict(data) == plan

    @pytest.mark.parametrize(
        ("mutate", "words"),
        [
            (lambda data: data.update(mesh=None), "plans a device mesh"),
            (lambda data: data["mesh"].update(shape=[1, 1, 4, 1, 1, 2]), "options in force"),
            (
                lambda data: data["mesh"].update(dimensions=["tp", "pp", "dp_replicate", "dp_shard", "cp", "sp"]),
                "dimensions are",
            ),
            (lambda data: data["mesh"].update(shape=[2, 1, 2, 1]), "one size"),
        ],
    )
    def test_a_plan_read_back_keeps_the_mesh_rules(self, mutate: Any, words: str) -> None:
        data = json.loads(json.dumps(mesh_plan(cuda(4), devices=4, strategy_options=MESH(pp=2, tp=2)).to_dict()))
        mutate(data)
        with pytest.raises(PlanFormatError, match=words):
            Plan.from_dict(data)

    @pytest.mark.parametrize("spelling", ["tp", "tensor_parallel_size"])
    def test_a_plan_read_back_whose_request_asked_for_other_degrees_is_refused(self, spelling: str) -> None:
        data = json.loads(json.dumps(mesh_plan(cuda(4), devices=4, strategy_options=MESH(tp=2)).to_dict()))
        data["request"]["strategy_options"][spelling] = 4
        with pytest.raises(PlanFormatError, match=rf"request\.strategy_options\.{spelling}.*tp=2"):
            Plan.from_dict(data)

    def test_a_plan_read_back_breaking_a_rule_names_it(self) -> None:
        data = json.loads(json.dumps(mesh_plan(cuda(4), devices=4, strategy_options=MESH(tp=4)).to_dict()))
        data["mesh"]["shape"] = [1, 1, 1, 4, 1, 1]
        data["strategy"]["options"].update(cp=4, tp=1)
        data["request"]["strategy_options"].update(cp=4, tp=1)
        data["precision"] = data["request"]["precision"] = "64-true"
        with pytest.raises(PlanFormatError, match="mesh-precision"):
            Plan.from_dict(data)

    def test_other_strategies_have_no_mesh(self) -> None:
        data = json.loads(json.dumps(resolve(Request(devices=2), cuda(2)).to_dict()))
        assert data["mesh"] is None
        dimensions = ["pp", "dp_replicate", "dp_shard", "cp", "sp", "tp"]
        data["mesh"] = {"dimensions": dimensions, "shape": [1, 1, 2, 1, 1, 1]}
        with pytest.raises(PlanFormatError, match="has no device mesh"):
            Plan.from_dict(data)


class TestFrameworks:
    """The mesh's sizes go to Lightning's ModelParallelStrategy and Accelerate's ParallelismConfig; what either
    cannot hold is refused, naming what would be lost."""

    def test_lightning_gets_its_two_sizes(self) -> None:
        plan = mesh_plan(cuda(4), devices=4, precision="bf16-mixed", strategy_options=MESH(tp=2, timeout_seconds=60))
        strategy = lightning_arguments(plan).strategy
        assert strategy.class_name == "ModelParallelStrategy"
        assert strategy.arguments == {
            "data_parallel_size": 2,
            "tensor_parallel_size": 2,
            "timeout": Encoded(60, "timedelta"),
            "process_group_backend": "nccl",
        }

    @pytest.mark.parametrize(
        ("options", "words"),
        [
            (MESH(pp=2), r"pipeline dimension \(pp=2\) would be lost"),
            (MESH(dp_replicate=2, dp_shard=2), "dp_replicate=2 × dp_shard=2 would become one data_parallel dimension"),
        ],
    )
    def test_lightning_cannot_hold_pipelines_or_replicas_of_shards(
        self, options: ModelParallelOptions, words: str
    ) -> None:
        with pytest.raises(Incompatible, match=words):
            lightning_arguments(mesh_plan(cuda(4), devices=4, strategy_options=options))

    def test_lightning_runs_its_own_precisions(self) -> None:
        plan = mesh_plan(cuda(4), devices=4, precision="16-mixed")
        with pytest.raises(Incompatible, match="runs precision '16-true', '32-true', 'bf16-mixed', 'bf16-true' only"):
            lightning_arguments(plan)

    def test_accelerate_gets_the_parallelism_config_and_fsdp2(self) -> None:
        plan = mesh_plan(cuda(4), devices=4, num_nodes=2, precision="bf16-mixed", strategy_options=MESH(dp_replicate=2))
        mapped = accelerate_arguments(plan)
        assert mapped.parallelism == {"dp_replicate_size": 2, "dp_shard_size": 4, "cp_size": 1, "tp_size": 1}
        assert mapped.fsdp == {"fsdp_version": 2}
        flags = mapped.launch_flags
        assert "--use_parallelism_config" in flags and "--multi_gpu" not in flags
        assert flags[flags.index("--parallelism_config_dp_shard_size") + 1] == "4"
        assert flags[flags.index("--fsdp_version") + 1] == "2"
        tensor_only = accelerate_launch_flags(mesh_plan(cuda(4), devices=4, strategy_options=MESH(tp=4)))
        assert "--multi_gpu" in tensor_only and "--use_fsdp" not in tensor_only

    @pytest.mark.parametrize(
        ("options", "words"),
        [
            (MESH(pp=2), "no pipeline dimension"),
            (MESH(dp_replicate=2, dp_shard=1, tp=2), "not with plain replicas"),
        ],
    )
    def test_accelerate_refuses_what_it_cannot_hold(self, options: ModelParallelOptions, words: str) -> None:
        with pytest.raises(Incompatible, match=words):
            accelerate_arguments(mesh_plan(cuda(4), devices=4, strategy_options=options))

    def test_accelerate_builds_no_mesh_for_cpu_processes(self) -> None:
        import trainplan as tp

        plan = mesh_plan(cpu(), accelerator="cpu", devices=2)
        refusal = accelerate_mesh_refusal(plan)
        assert refusal is not None and "several CPU processes" in str(refusal)
        with pytest.raises(Incompatible, match="several CPU processes"):
            tp.accelerator_arguments(plan)
        assert accelerate_mesh_refusal(mesh_plan(cuda(2), devices=2)) is None

    def test_the_adapters_build_real_objects(self) -> None:
        pytest.importorskip("accelerate")
        pytest.importorskip("lightning_fabric")
        import trainplan as tp

        plan = mesh_plan(cuda(4), devices=4, num_nodes=2, strategy_options=MESH(dp_replicate=2))
        config = tp.accelerate_parallelism_config(plan)
        assert (config.dp_replicate_size, config.dp_shard_size, config.tp_size, config.cp_size) == (2, 4, 1, 1)
        arguments = tp.accelerator_arguments(plan)
        assert arguments["fsdp_plugin"].fsdp_version == 2 and arguments["parallelism_config"].dp_replicate_size == 2
        sharded = mesh_plan(cuda(4), devices=4, num_nodes=2)
        with pytest.raises(Incompatible, match="fabric_arguments\\(plan, parallelize=fn\\)"):
            tp.fabric_arguments(sharded)
        strategy = tp.fabric_arguments(sharded, parallelize=lambda model, mesh: model)["strategy"]
        assert type(strategy).__name__ == "ModelParallelStrategy"
        assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (8, 1)
        with pytest.raises(tp.TrainplanError, match="has none"):
            tp.fabric_arguments(resolve(Request(devices=2), cuda(2)), parallelize=lambda model, mesh: model)


# --------------------------------------------------------------------------------------------------
# The runtime


class FakeMesh:
    def __init__(self, names: tuple[str, ...]) -> None:
        self.mesh_dim_names = names

    def __getitem__(self, names: str | tuple[str, ...]) -> FakeMesh:
        return FakeMesh((names,) if isinstance(names, str) else names)


class MeshWrappers:
    """Records the meshes and the sharding the runtime asks for."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def place(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None) -> torch.nn.Module:
        self.calls.append(("place", (str(device), dtype)))
        return model

    def data_parallel(self, model: torch.nn.Module, device_ids: list[int]) -> torch.nn.Module:
        raise AssertionError("not for a mesh")

    def ddp(self, model: torch.nn.Module, device_ids: list[int] | None, keywords: object) -> torch.nn.Module:
        raise AssertionError("not for a mesh")

    def fsdp(self, model: torch.nn.Module, device: torch.device, keywords: object) -> torch.nn.Module:
        raise AssertionError("not for a mesh")

    def sync_batchnorm(self, model: torch.nn.Module) -> torch.nn.Module:
        raise AssertionError("not for a mesh")

    def device_mesh(
        self, device_type: str, shape: tuple[int, ...], names: tuple[str, ...], backends: Mapping[str, str]
    ) -> Any:
        self.calls.append(("device_mesh", (device_type, shape, names, *([dict(backends)] if backends else []))))
        return FakeMesh(names)

    def flatten(self, mesh: Any, names: tuple[str, ...], name: str, backend: str | None) -> Any:
        self.calls.append(("flatten", (names, name, *([backend] if backend is not None else []))))
        return FakeMesh((name,))

    def unflatten(self, mesh: Any, shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
        self.calls.append(("unflatten", (shape, names)))
        return FakeMesh(names)

    def fully_shard(self, model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
        self.calls.append(("fully_shard", mesh.mesh_dim_names))
        return model

    def context_parallel(
        self,
        mesh: Any,
        buffers: tuple[torch.Tensor, ...],
        seq_dims: tuple[int, ...],
        no_restore: tuple[torch.Tensor, ...],
        rotate_method: str,
        load_balance: bool,
    ) -> AbstractContextManager[None]:
        shapes = [tuple(buffer.shape) for buffer in buffers]
        self.calls.append(("context_parallel", (mesh.mesh_dim_names, shapes, seq_dims, rotate_method, load_balance)))
        return contextlib.nullcontext()


def runtime_for(plan: Plan, rank: int) -> tuple[Runtime, MeshWrappers]:
    world = World(
        plan=plan,
        rank=rank,
        local_rank=rank % plan.processes_per_node,
        device=plan.device_for(0),
        created=False,
        timeout_seconds=60,
    )
    fakes = MeshWrappers()
    return Runtime(plan, world, wrappers=fakes), fakes


class TestRuntime:
    def test_the_mesh_is_built_with_the_plans_names_and_shape(self) -> None:
        plan = mesh_plan(cuda(8), devices=8, strategy_options=MESH(dp_replicate=2, cp=2, tp=2))
        rt, fakes = runtime_for(plan, rank=5)
        dimensions = ("pp", "dp_replicate", "dp_shard", "cp", "sp", "tp")
        assert fakes.calls == [
            ("device_mesh", ("cuda", (1, 2, 1, 2, 1, 2), dimensions)),
            ("flatten", (("dp_replicate", "dp_shard"), "dp")),
            *(("flatten", (flattened, alias)) for alias, flattened in MESH_ALIASES.items()),
            ("flatten", (dimensions, "world")),
            ("unflatten", ((1, 2, 4, 1), ("pp", "dp_replicate", "efsdp", "ep"))),
        ]
        assert MESH_ALIASES["dp_shard_cp"] == ("dp_shard", "cp", "sp")
        assert rt.expert_mesh.mesh_dim_names == ("pp", "dp_replicate", "efsdp", "ep")
        assert rt.fsdp_mesh.mesh_dim_names == ("dp_replicate", "dp_shard_cp")
        assert rt.data_parallel_mesh.mesh_dim_names == ("dp",)
        assert rt.submesh("tp", "pp").mesh_dim_names == ("pp", "tp"), "in the mesh's order"
        assert (rt.data_parallel_rank, rt.data_parallel_size) == (1, 2)
        sampler = rt.sampler(range(8))
        assert (sampler.num_replicas, sampler.rank) == (2, 1), "ranks of one replica read the same batches"

    def test_data_parallelism_alone_is_sharded_without_a_function(self) -> None:
        rt, fakes = runtime_for(mesh_plan(cuda(4), devices=4, precision="bf16-true"), rank=0)
        rt.wrap(torch.nn.Linear(2, 2))
        assert fakes.calls[-2:] == [("place", ("cuda:0", torch.bfloat16)), ("fully_shard", ("dp_shard",))]

    def test_a_parallelize_function_gets_the_mesh(self) -> None:
        rt, fakes = runtime_for(mesh_plan(cuda(4), devices=4, strategy_options=MESH(tp=2)), rank=3)
        seen: list[object] = []

        def parallelize(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
            seen.append(mesh)
            return model

        rt.wrap(torch.nn.Linear(2, 2), parallelize=parallelize)
        assert seen == [rt.mesh] and fakes.calls[-1][0] == "place"

    def test_refusals_say_what_to_do(self) -> None:
        rt, _ = runtime_for(mesh_plan(cuda(4), devices=4, strategy_options=MESH(tp=2)), rank=0)
        with pytest.raises(NotWrappable, match="parallelize=fn"):
            rt.wrap(torch.nn.Linear(2, 2))
        with pytest.raises(NotWrappable, match="not the model"):
            rt.wrap(torch.nn.Linear(2, 2), parallelize=lambda model, mesh: None)  # type: ignore[arg-type,return-value]
        with pytest.raises(NotWrappable, match="'tensor' is not one of them"):
            rt.submesh("tensor")  # type: ignore[arg-type]
        plain, _ = runtime_for(resolve(Request(devices=2), cuda(2)), rank=0)
        with pytest.raises(NotWrappable, match="has no device mesh"):
            plain.mesh  # noqa: B018
        with pytest.raises(NotWrappable, match="has none"):
            plain.wrap(torch.nn.Linear(2, 2), parallelize=lambda model, mesh: model)
        batchnorm, _ = runtime_for(mesh_plan(cuda(2), devices=2, sync_batchnorm=True), rank=0)
        with pytest.raises(NotWrappable, match=r"process_group=rt\.data_parallel_mesh\.get_group"):
            batchnorm.wrap(torch.nn.Linear(2, 2))

    def test_a_mesh_runtime_after_leaving_says_to_keep_one_open(self) -> None:
        rt, _ = runtime_for(mesh_plan(cuda(4), devices=4, strategy_options=MESH(tp=2)), rank=0)
        rt.leave()
        with pytest.raises(NotWrappable) as caught:
            rt.wrap(torch.nn.Linear(2, 2))
        assert "one runtime per process" in str(caught.value) and "keep it open" in str(caught.value)
        assert "Start a new one" not in str(caught.value)

    def test_one_process_gets_a_real_mesh_and_leaves_no_group(self) -> None:
        from torch import distributed

        plan = mesh_plan(cpu(), accelerator="cpu", devices=1)
        world = World(plan=plan, rank=0, local_rank=0, device="cpu", created=False, timeout_seconds=60)
        rt = Runtime(plan, world)
        try:
            assert rt.mesh.shape == (1, 1, 1, 1, 1, 1)
            assert rt.mesh.mesh_dim_names == ("pp", "dp_replicate", "dp_shard", "cp", "sp", "tp")
            model = rt.wrap(torch.nn.Linear(2, 1))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            rt.step(model(torch.ones(3, 2)).sum(), optimizer)
        finally:
            rt.leave()
        assert not distributed.is_initialized()


class TestCommandLine:
    def run(self, capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
        from trainplan.cli import main

        try:
            code = main(list(arguments))
        except SystemExit as exit_:
            code = int(exit_.code or 0)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    def test_plan_draws_the_mesh(self, capsys: pytest.CaptureFixture[str]) -> None:
        flags = ["plan", "--no-probe", "--assume", "cpu=8", "--accelerator", "cpu", "--devices", "4"]
        flags += ["--strategy", "model_parallel", "--strategy-option", "tp=2", "--strategy-option", "dp_shard=auto"]
        code, out, _ = self.run(capsys, *flags)
        assert code == 0 and "  node 0  [0 1] [2 3]" in out and "  dp_shard  {0,2} {1,3}" in out

    def test_lightning_spelling_as_json(self, capsys: pytest.CaptureFixture[str]) -> None:
        flags = ["plan", "--no-probe", "--assume", "cuda=4", "--devices", "4", "--strategy", "model_parallel"]
        code, out, _ = self.run(capsys, *flags, "--strategy-option", "tensor_parallel_size=4", "--json")
        data = json.loads(out)
        assert code == 0 and data["mesh"]["shape"] == [1, 1, 1, 1, 1, 4]
        assert data["request"]["strategy_options"]["tensor_parallel_size"] == 4

    def test_a_repeated_option_is_refused_naming_both(self, capsys: pytest.CaptureFixture[str]) -> None:
        flags = ["plan", "--no-probe", "--accelerator", "cpu", "--devices", "4", "--strategy", "model_parallel"]
        code, _, err = self.run(capsys, *flags, "--strategy-option", "tp=2", "--strategy-option", "tp=4")
        assert code == 2 and "'tp=2'" in err and "'tp=4'" in err and "give each option once" in err

    def test_degrees_without_a_strategy_plan_a_mesh(self, capsys: pytest.CaptureFixture[str]) -> None:
        # strategy='auto' with a mesh's degrees runs model_parallel (as it does with ModelParallelOptions itself)
        flags = ["plan", "--no-probe", "--accelerator", "cpu", "--devices", "4", "--strategy-option", "tp=2"]
        code, out, err = self.run(capsys, *flags, "--json")
        assert code == 0 and json.loads(out)["strategy"]["name"] == "model_parallel", err
        code, _, err = self.run(capsys, *flags, "--strategy-option", "stage=3")  # no family auto takes has both
        assert code == 2 and "strategy_options=" in err and "Name the strategy too" in err

    def test_a_refusal_exits_2_naming_the_layout_that_fits(self, capsys: pytest.CaptureFixture[str]) -> None:
        flags = ["plan", "--no-probe", "--assume", "cuda=4", "--devices", "4", "--strategy-option", "tp=8"]
        code, _, err = self.run(capsys, *flags, "--strategy", "model_parallel")
        assert code == 2 and "they multiply to 8 (tp=8)" in err and "e.g. tp=4" in err
