"""Sequence parallelism (`sp`: DeepSpeed Ulysses, Accelerate's `sp_size`): a mesh dimension between `cp` and `tp`,
exclusive with `cp` (a row of `rules.MESH_EXCLUSIONS`), whose groups belong inside a node; its ranks are folded into
FSDP's shards and the expert region; Lightning and Accelerate refuse it by name. The real 4-process world is
tests/processes/test_layouts_world.py's."""

from __future__ import annotations

import pytest

import trainplan
from tests.helpers import cpu, cuda
from tests.unit.test_mesh import TWO_NODES, runtime_for
from trainplan import Incompatible, ModelParallelOptions, Request, TrainplanWarning
from trainplan.mapping.frameworks import accelerate_arguments, lightning_arguments
from trainplan.resolve import resolve
from trainplan.rules import MESH_ALIASES, MESH_DIMENSIONS, MESH_EXCLUSIONS
from trainplan.spec.names import MESH_DIMENSIONS as NAMES


def sequence_plan(**degrees: object) -> trainplan.Plan:
    options = ModelParallelOptions(**degrees)  # type: ignore[arg-type]
    return resolve(Request(accelerator="cpu", devices=4, strategy="model_parallel", strategy_options=options), cpu())


def test_sp_sits_between_cp_and_tp_as_in_accelerates_mesh() -> None:
    assert NAMES == ("pp", "dp_replicate", "dp_shard", "cp", "sp", "tp")
    assert MESH_DIMENSIONS["sp"].accelerate_size == "sp_size" and MESH_DIMENSIONS["sp"].lightning_size is None


def test_sp_groups_are_neighbouring_ranks_and_read_the_same_batches() -> None:
    plan = sequence_plan(sp=2, dp_shard=2)
    assert plan.mesh is not None and plan.mesh.sizes["sp"] == 2
    assert [plan.mesh.group(rank, "sp") for rank in range(4)] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert plan.mesh.groups("dp_shard") == ((0, 2), (1, 3))
    assert plan.reasons["mesh"] == "asked for dp_shard=2, sp=2"


def test_sp_and_cp_exclude_each_other_as_a_row() -> None:
    assert [exclusion.dimensions for exclusion in MESH_EXCLUSIONS] == [("cp", "sp")]
    with pytest.raises(Incompatible) as caught:
        resolve(Request(devices=4, strategy_options=ModelParallelOptions(cp=2, sp=2)), cuda(4))
    assert caught.value.rule == "mesh-exclusive" and caught.value.values == {"sp": 2, "cp": 2}
    assert "Accelerate's ParallelismConfig refuses them together" in str(caught.value)


def test_the_expert_region_includes_the_sequence_ranks() -> None:
    plan = sequence_plan(sp=2, tp=2, ep=4)
    assert plan.mesh is not None and plan.mesh.expert.sizes == {"pp": 1, "dp_replicate": 1, "efsdp": 1, "ep": 4}
    with pytest.raises(Incompatible, match=r"dp_shard · cp · sp · tp = 2 \(dp_shard=1 × cp=1 × sp=2 × tp=1\)"):
        resolve(Request(accelerator="cpu", devices=2, strategy_options=ModelParallelOptions(sp=2, ep=4)), cpu())


def test_sp_groups_across_hosts_are_planned_with_a_warning() -> None:
    request = Request(devices=2, num_nodes=2, strategy_options=ModelParallelOptions(sp=4))
    with pytest.warns(TrainplanWarning, match="sp=4 on 2 node\\(s\\) × 2 processes makes 1 of 1 sequence-parallel"):
        plan = trainplan.resolve(request, cuda(2, variables=TWO_NODES))
    (note,) = [note for note in plan.notes if note.code == "mesh-inside-node-slow"]
    assert "Ulysses sends 3/4 of each rank's activations to the other ranks" in note.message
    assert note.message.endswith("sp=2, e.g. dp_shard=2, sp=2")
    with pytest.raises(Incompatible, match="sp=4 needs 4 processes on one node"):
        resolve(Request(devices=2, num_nodes=2, strategy_options=ModelParallelOptions(sp="auto")), cuda(2))


def test_fsdp_shards_over_the_sequence_ranks_too() -> None:
    rt, fakes = runtime_for(sequence_plan(sp=2, dp_shard=2), rank=1)
    assert ("flatten", (("dp_shard", "cp", "sp"), "dp_shard_sp")) in fakes.calls
    assert rt.fsdp_mesh.mesh_dim_names == ("dp_shard_sp",)
    assert rt.data_parallel_size == 2 and rt.data_parallel_rank == 0


def test_the_peers_names_fold_the_sequence_ranks_in_where_they_fold_the_context_ranks() -> None:
    """sp's ranks read the same batch and hold the same parameters, as cp's do: every peer name that flattens cp
    (torchtitan's fsdp, dp_shard_cp, loss, dp_cp; Lightning's data_parallel, which its parallelize functions give
    fully_shard) flattens sp too, and `batch` (the ranks that read different batches) neither."""
    folded = {name for name, dimensions in MESH_ALIASES.items() if "cp" in dimensions}
    assert folded == {name for name, dimensions in MESH_ALIASES.items() if "sp" in dimensions}
    assert folded == {"fsdp", "dp_shard_cp", "loss", "dp_cp", "data_parallel"}
    assert MESH_ALIASES["batch"] == ("dp_replicate", "dp_shard")
    assert MESH_ALIASES["fsdp"] == ("dp_shard", "cp", "sp")
    _, fakes = runtime_for(sequence_plan(sp=2, dp_shard=2), rank=1)
    assert ("flatten", (("dp_shard", "cp", "sp"), "fsdp")) in fakes.calls


def test_lightning_and_accelerate_refuse_sp_by_name() -> None:
    plan = sequence_plan(sp=2, dp_shard=2)
    with pytest.raises(Incompatible, match=r"its sequence-parallel dimension \(sp=2\) would be lost"):
        lightning_arguments(plan)
    with pytest.raises(Incompatible, match="Accelerate runs sp_size only inside its DeepSpeed engine"):
        accelerate_arguments(plan)


def test_accelerate_never_gets_an_sp_size_it_may_not_know() -> None:
    plan = resolve(Request(devices=4, strategy_options=ModelParallelOptions(dp_shard=2, tp=2)), cuda(4))
    parallelism = accelerate_arguments(plan).parallelism
    assert parallelism is not None and "sp_size" not in parallelism
