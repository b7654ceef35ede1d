"""The layouts mixture-of-experts and long-context training use, in one real 4-process CPU world over gloo
(dp_shard=2 × tp=2 with ep=2; dp_shard=4 with ep=4, pp=2 × dp_shard=2 and sp=2 × dp_shard=2 built in the same
world): every rank's dense and expert coordinates and group members equal what torch's `init_device_mesh` builds by
hand and what the plan says; `rt.mesh` answers Lightning's and torchtitan's names; parallelize functions written for
either run unchanged; a tiny mixture of 4 experts split over ep=4, a 2-stage pipeline and an attention layer split
over sp (Ulysses) have the loss and gradients of one process."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

import trainplan as tp
from tests.scripts import layouts_world, mesh_world

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def reports() -> list[dict[str, Any]]:
    options = tp.ModelParallelOptions(dp_shard=2, tp=2, ep=2)
    plan = tp.resolve(tp.Request(accelerator="cpu", devices=4, strategy="model_parallel", strategy_options=options))
    assert plan.mesh is not None and (plan.mesh.shape, plan.mesh.ep) == ((1, 1, 2, 1, 1, 2), 2)
    found = tp.launch_with(plan, layouts_world.report, timeout=240)
    return [json.loads(json.dumps(report)) for report in found]


@pytest.mark.parametrize("layout", ["own", "dp_shard_4_ep_4", "pp_2_dp_shard_2", "sp_2_dp_shard_2", "tp_over_gloo"])
def test_dense_and_expert_meshes_are_the_ones_torch_builds_by_hand(reports: list[dict[str, Any]], layout: str) -> None:
    for rank, report in enumerate(reports):
        assert report["rank"] == rank
        for mesh in ("dense", "expert"):
            seen = report[layout][mesh]
            assert seen["coordinate"] == seen["by_hand"] == seen["plan"], f"rank {rank}, {layout} {mesh} mesh"
            assert seen["groups"] == seen["groups_by_hand"] == seen["plan_groups"], f"rank {rank}, {layout} {mesh}"
        assert report[layout]["expert"]["names"] == ["pp", "dp_replicate", "efsdp", "ep"]


def test_a_dimensions_backend_reaches_its_groups_and_the_names_for_them(reports: list[dict[str, Any]]) -> None:
    """tp_group_backend='gloo' is passed to init_device_mesh as backend_override (the groups above equal torch's built
    by hand with it) and to the flattened names that stand for the tp groups alone (Lightning's tensor_parallel); on CPU
    gloo is the world's backend too, so the GPU script checks a gloo tp group inside an NCCL world."""
    for rank, report in enumerate(reports):
        seen = report["tp_over_gloo"]
        assert seen["backends"]["tp"] == seen["alias_backends"]["tensor_parallel"] == "gloo"
        pair = rank - rank % 2
        assert seen["tp_sum"] == float(pair + 1 + pair + 2), "an all-reduce runs over the tp group"


def test_expert_groups_follow_torchtitan(reports: list[dict[str, Any]]) -> None:
    """ep groups are neighbouring ranks of the dp_shard × cp × tp region; efsdp the ranks ep apart."""
    for rank, report in enumerate(reports):
        assert report["own"]["expert"]["groups"]["ep"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert report["own"]["expert"]["groups"]["efsdp"] == [rank % 2, rank % 2 + 2]
        assert report["dp_shard_4_ep_4"]["expert"]["groups"]["ep"] == [0, 1, 2, 3]
        assert report["dp_shard_4_ep_4"]["expert"]["groups"]["efsdp"] == [rank]


def test_rt_mesh_answers_the_peers_names(reports: list[dict[str, Any]]) -> None:
    for rank, report in enumerate(reports):
        shard_group, tensor_group = [rank % 2, rank % 2 + 2], [rank - rank % 2, rank - rank % 2 + 1]
        expected = {name: shard_group for name in ("batch", "fsdp", "dp_shard_cp", "loss", "dp_cp")}
        expected.update(data_parallel=shard_group, tensor_parallel=tensor_group)
        assert report["peer_names"] == expected
        assert report["own"]["aliases"] == expected


def test_with_sp_the_peers_names_fold_the_sequence_ranks_as_torchtitan_folds_cp(
    reports: list[dict[str, Any]],
) -> None:
    """sp=2 × dp_shard=2 (rank = 2 · shard + position along sp): the names FSDP and the loss reduce over hold all
    four ranks (the two shards and, in each, the two sp ranks that hold the same parameters), `batch` only the ranks
    that read different batches, `tensor_parallel` each rank alone; groups written by hand."""
    for rank, report in enumerate(reports):
        every, shards = [0, 1, 2, 3], [rank % 2, rank % 2 + 2]
        expected = {name: every for name in ("fsdp", "dp_shard_cp", "loss", "dp_cp", "data_parallel")}
        expected.update(batch=shards, tensor_parallel=[rank])
        assert report["sp_2_dp_shard_2"]["aliases"] == expected, f"rank {rank}"


def test_with_sp_fsdp_over_the_peers_names_gives_every_rank_the_mean_gradient(reports: list[dict[str, Any]]) -> None:
    """Each of the 4 ranks feeds its own tokens to one linear layer sharded over `fsdp`, `dp_shard_cp` or
    `data_parallel`: every rank (sp ranks of one shard hold the same parameters) ends with the mean over the 4 ranks'
    gradients of one process, not the mean over its shard's ranks alone."""
    inputs = [layouts_world.token_shard(rank // 2, rank % 2) for rank in range(4)]
    expected = (sum(tokens.sum(dim=0) for tokens in inputs) / 4).tolist()  # type: ignore[union-attr]
    for rank, report in enumerate(reports):
        for name in layouts_world.SHARDED_NAMES:
            assert report["sp_sharded_grads"][name] == pytest.approx(expected, rel=1e-5), f"rank {rank}: {name}"


def test_rt_mesh_answers_the_expert_names_with_the_expert_meshs_groups(reports: list[dict[str, Any]]) -> None:
    """torchtitan's `efsdp` and `ep` (dp_shard=2 × tp=2, ep=2): rt.mesh[name] is rt.expert_mesh[name]'s group."""
    for rank, report in enumerate(reports):
        pair = [rank - rank % 2, rank - rank % 2 + 1]
        assert report["expert_names"] == {"ep": [pair, pair], "efsdp": [[rank % 2, rank % 2 + 2]] * 2}


@pytest.mark.parametrize("written_for", ["lightning", "torchtitan"])
def test_a_peers_parallelize_function_runs_unchanged(reports: list[dict[str, Any]], written_for: str) -> None:
    inputs, targets = mesh_world.data()
    reference = mesh_world.model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    losses = [torch.nn.functional.mse_loss(reference(inputs[shard::2]), targets[shard::2]) for shard in range(2)]
    (sum(losses) / 2).backward()  # type: ignore[union-attr]
    optimizer.step()
    for rank, report in enumerate(reports):
        assert report[written_for]["loss"] == pytest.approx(losses[rank // 2].item(), rel=1e-5)
        for name, parameter in reference.named_parameters():
            assert report[written_for]["parameters"][name] == pytest.approx(
                parameter.detach().flatten().tolist(), rel=1e-4, abs=1e-6
            )


def test_four_experts_over_ep_4_match_one_process(reports: list[dict[str, Any]]) -> None:
    router, experts = layouts_world.moe_parts()
    inputs, targets = layouts_world.moe_data()
    output = layouts_world.moe_output(router, dict(enumerate(experts)), inputs)
    loss = torch.nn.functional.mse_loss(output, targets)
    loss.backward()  # type: ignore[no-untyped-call]
    expected = {f"router.{name}": p for name, p in router.named_parameters()}
    expected.update(
        {f"experts.{index}.{name}": p for index, expert in enumerate(experts) for name, p in expert.named_parameters()}
    )
    held: list[int] = []
    for rank, report in enumerate(reports):
        moe = report["moe"]
        assert moe["experts"] == [rank], "each of the 4 ranks holds one expert"
        held += moe["experts"]
        assert moe["loss"] == pytest.approx(loss.item(), rel=1e-5)
        for name, grad in moe["grads"].items():
            reference = expected[name].grad
            assert reference is not None
            assert grad == pytest.approx(reference.flatten().tolist(), rel=1e-5, abs=1e-6), f"rank {rank}: {name}"
    assert sorted(held) == list(range(layouts_world.EXPERTS))


def test_a_two_stage_pipeline_under_torchs_1f1b_has_one_process_loss_and_gradients(
    reports: list[dict[str, Any]],
) -> None:
    inputs, targets = mesh_world.data()
    for shard in range(2):
        reference = mesh_world.model()
        loss = torch.nn.functional.mse_loss(reference(inputs[shard::2]), targets[shard::2])
        loss.backward()  # type: ignore[no-untyped-call]
        first, last = reports[shard]["pipeline"], reports[shard + 2]["pipeline"]  # pp is outermost: ranks 2 apart
        assert (first["stage"], last["stage"]) == (0, 1)
        assert first["schedule"] == last["schedule"] == "Schedule1F1B"
        assert first["pp_group"] == last["pp_group"] == [shard, shard + 2]
        assert first["loss"] is None and last["loss"] == pytest.approx(loss.item(), rel=1e-5)
        expected = {name: p.grad for name, p in reference.named_parameters()}
        seen = {
            **{k: v for k, v in first["grads"].items()},
            **{str(int(k[0]) + 2) + k[1:]: v for k, v in last["grads"].items()},
        }
        assert seen.keys() == expected.keys()
        for name, grad in seen.items():
            reference_grad = expected[name]
            assert reference_grad is not None
            assert grad == pytest.approx(reference_grad.flatten().tolist(), rel=1e-5, abs=1e-6), name
    assert all("stage_indices=(0,)" in report["own_pipeline"] for report in reports), "pp=1: every rank is stage 0"


def test_an_attention_layer_split_over_sp_has_one_process_loss_and_gradients(reports: list[dict[str, Any]]) -> None:
    """sp=2 × dp_shard=2: sp groups are neighbouring ranks, FSDP's mesh (`rt.fsdp_mesh`) folds sp into dp_shard as
    `dp_shard_sp`, and Ulysses' two all-to-alls give each shard's loss and the mean loss's gradients."""
    qkv, out = layouts_world.attention_parts()
    inputs, targets = layouts_world.attention_data()
    batch = layouts_world.BATCH
    losses = [
        torch.nn.functional.mse_loss(
            layouts_world.attention(qkv, out, inputs[s * batch : (s + 1) * batch]), targets[s * batch : (s + 1) * batch]
        )
        for s in range(2)
    ]
    (sum(losses) / 2).backward()  # type: ignore[union-attr]
    expected = {f"qkv.{name}": p.grad for name, p in qkv.named_parameters()}
    expected.update({f"out.{name}": p.grad for name, p in out.named_parameters()})
    for rank, report in enumerate(reports):
        seen = report["ulysses"]
        assert seen["sp_group"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert (seen["fsdp_group"], seen["fsdp_names"]) == ([0, 1, 2, 3], ["dp_shard_sp"])
        assert seen["loss"] == pytest.approx(losses[rank // 2].item(), rel=1e-5)
        assert seen["grads"].keys() == expected.keys()
        for name, grad in seen["grads"].items():
            reference = expected[name]
            assert reference is not None
            assert grad == pytest.approx(reference.flatten().tolist(), rel=1e-5, abs=1e-6), f"rank {rank}: {name}"
