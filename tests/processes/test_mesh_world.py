"""N-D parallel layouts in real 4-process CPU worlds over gloo: the mesh the runtime builds from the plan is the
plan's mesh, checked rank by rank against `torch.distributed.device_mesh` itself (coordinates and the members of
every group) and against the layout written out by hand; one world start per layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import trainplan as tp
from tests.scripts import mesh_world

pytestmark = pytest.mark.processes

NAMES = ["pp", "dp_replicate", "dp_shard", "cp", "sp", "tp"]
ROOT = Path(__file__).resolve().parents[2]


def _world(options: tp.ModelParallelOptions) -> tuple[tp.Plan, list[dict[str, Any]]]:
    plan = tp.resolve(tp.Request(accelerator="cpu", devices=4, strategy="model_parallel", strategy_options=options))
    reports = tp.launch_with(plan, mesh_world.report, timeout=120)
    return plan, [json.loads(json.dumps(report)) for report in reports]


def _check_against_torch(reports: list[dict[str, Any]], shape: list[int]) -> None:
    for rank, report in enumerate(reports):
        assert report["rank"] == rank
        assert (report["names"], report["shape"]) == (NAMES, shape)
        assert report["coordinate"] == report["plan_coordinate"], f"rank {rank}: torch and the plan disagree"
        assert report["groups"] == report["plan_groups"], f"rank {rank}: torch and the plan disagree"


def test_dp_shard_2_by_tp_2_is_torchs_mesh_and_trains() -> None:
    plan, reports = _world(tp.ModelParallelOptions(dp_shard=2, tp=2))
    assert plan.mesh is not None and plan.mesh.shape == (1, 1, 2, 1, 1, 2)
    _check_against_torch(reports, [1, 1, 2, 1, 1, 2])
    for rank, report in enumerate(reports):
        shard, column = divmod(rank, 2)
        assert report["coordinate"] == [0, 0, shard, 0, 0, column]
        assert report["groups"] == {
            "pp": [rank],
            "dp_replicate": [rank],
            "dp_shard": [column, column + 2],
            "cp": [rank],
            "sp": [rank],
            "tp": [2 * shard, 2 * shard + 1],
        }
        # The two ranks of a tensor-parallel group read the same batches; the two shards read different ones.
        assert report["data_parallel"] == [shard, 2]
        assert report["data_parallel_group"] == [column, column + 2]
        assert report["sampler"] == list(range(shard, mesh_world.SAMPLES, 2))
        assert report["fsdp_mesh"] == [["dp_shard"], [column, column + 2]]

    # One step of the model parallelized over the mesh equals one step of the whole model on the whole batch.
    inputs, targets = mesh_world.data()
    reference = mesh_world.model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    losses = []
    for shard in range(2):
        part = list(range(shard, mesh_world.SAMPLES, 2))
        losses.append(torch.nn.functional.mse_loss(reference(inputs[part]), targets[part]))
    (sum(losses) / 2).backward()  # type: ignore[union-attr]
    optimizer.step()
    for rank, report in enumerate(reports):
        assert report["loss"] == pytest.approx(losses[rank // 2].item(), rel=1e-5)
        for name, parameter in reference.named_parameters():
            assert report["parameters"][name] == pytest.approx(
                parameter.detach().flatten().tolist(), rel=1e-4, abs=1e-6
            )


def test_pp_2_by_dp_replicate_2_is_torchs_mesh() -> None:
    plan, reports = _world(tp.ModelParallelOptions(pp=2, dp_replicate=2, dp_shard=1))
    assert plan.mesh is not None and plan.mesh.shape == (2, 2, 1, 1, 1, 1)
    _check_against_torch(reports, [2, 2, 1, 1, 1, 1])
    for rank, report in enumerate(reports):
        stage, replica = divmod(rank, 2)
        assert report["coordinate"] == [stage, replica, 0, 0, 0, 0]
        assert report["groups"] == {
            "pp": [replica, replica + 2],
            "dp_replicate": [2 * stage, 2 * stage + 1],
            "dp_shard": [rank],
            "cp": [rank],
            "sp": [rank],
            "tp": [rank],
        }
        # Both stages of a pipeline read the same batches; the replicas read different ones.
        assert report["data_parallel"] == [replica, 2]
        assert report["data_parallel_group"] == [2 * stage, 2 * stage + 1]
        assert report["sampler"] == list(range(replica, mesh_world.SAMPLES, 2))
        assert report["fsdp_mesh"] == [["dp_replicate", "dp_shard"], [2 * stage, 2 * stage + 1]]
        assert "pp=2" in report["wrap_refused"] and "parallelize=fn" in report["wrap_refused"]


def _reports(output: str) -> list[list[dict[str, Any]]]:
    decoder = json.JSONDecoder()
    found = [decoder.raw_decode(part)[0] for part in output.split("REPORT ")[1:]]
    return sorted(found, key=lambda cases: int(cases[0]["rank"]))


def test_lightning_and_trainplan_agree_on_the_same_sizes() -> None:
    """Lightning's ModelParallelStrategy built with the sizes as written, Lightning's strategy built by trainplan's
    adapter from the plan, and trainplan's runtime all build their mesh in one 2-process world; where Lightning
    accepts the sizes, the three agree on the data and tensor parallel sizes, every rank's coordinates and every
    group's members. Lightning refuses two pairs with one 'auto' that trainplan plans (`model-parallel-auto`)."""
    pytest.importorskip("pytorch_lightning")
    from trainplan.rules import DIFFERENCES

    environment = {key: value for key, value in os.environ.items() if not key.startswith("TRAINPLAN_")}
    environment["PYTHONPATH"] = str(ROOT)
    flags = ["--accelerator", "cpu", "--devices", "2", "--strategy", "model_parallel"]
    result = subprocess.run(
        [sys.executable, "-m", "trainplan.cli", "launch", *flags, "--", "tests/scripts/mesh_frameworks.py"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = _reports(result.stdout)
    assert [cases[0]["rank"] for cases in ranks] == [0, 1]
    differing = {("auto", 1), (2, "auto")}
    assert "model-parallel-auto" in DIFFERENCES
    for rank, cases in enumerate(ranks):
        for case in cases:
            sizes, ours, theirs = tuple(case["sizes"]), case["trainplan"], case["lightning"]
            if "error" in theirs:
                assert sizes in differing or "error" in ours, f"{sizes}: Lightning refuses, trainplan plans {ours}"
                if sizes in differing:
                    assert "error" not in ours and ours["sizes"] == [2, 1], "'auto' takes what the other size leaves"
                continue
            assert sizes not in differing
            assert ours == {key: theirs[key] for key in ("sizes", "coordinate", "groups")}, f"{sizes} on rank {rank}"
            assert case["adapter"] == theirs, f"{sizes}: the adapter's strategy builds another mesh"
            assert case["adapter"]["arguments"] == ours["sizes"], "the adapter passes the plan's sizes"
            assert "lightning-sizes" in case["notes"]
        for case in cases:
            accelerate = case.get("accelerate")
            if accelerate is None:
                continue
            ours = case["trainplan"]
            if ours["sizes"][1] > 1:
                assert "transformers" in accelerate["missing"]
            else:
                assert accelerate["names"][0] == "dp_shard"
                assert accelerate["sizes"] == ours["sizes"][:1]
                assert (accelerate["coordinate"], accelerate["groups"]) == (ours["coordinate"][:1], ours["groups"][:1])
    assert len(ranks[0]) == 8
