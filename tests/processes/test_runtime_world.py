"""The runtime and the adapters in real 2-process CPU worlds: the README's loop, and Lightning, Fabric and
Accelerate built from a plan."""

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
from tests.scripts import readme_loop
from trainplan.rules import OPTION_TARGETS_OF, ProcessGroupTimeout, ThroughMesh, ThroughMeshGroups, spellings

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_loop_syncs_what_one_process_computes() -> None:
    two = tp.resolve(tp.Request(accelerator="cpu", devices=2, precision="bf16-mixed"))
    one = tp.resolve(tp.Request(accelerator="cpu", devices=1, precision="bf16-mixed"))
    assert (two.strategy.name, two.launcher, one.launcher) == ("ddp", "subprocess", "none")
    world = tp.launch_with(two, readme_loop.train, timeout=120)
    alone = tp.launch(one, readme_loop.train)[0]
    torch.manual_seed(0)
    _, targets = torch.randn(64, 8), torch.randn(64, 1)
    assert world[0] == world[1], "every rank gets the same synced values"
    for values in (world[0], alone):
        assert values["samples"] == 64
        assert values["target_mean"] == pytest.approx(targets.double().mean().item(), rel=1e-6)


def _reports(output: str) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    reports = [decoder.raw_decode(part)[0] for part in output.split("REPORT ")[1:]]
    return sorted(reports, key=lambda report: int(report["rank"]))


JOB_TIMEOUT = 77
"""The job's plan holds its DDP timeout away from the default: the joined group, Lightning and Accelerate have it."""


@pytest.fixture(scope="module")
def adapters_world() -> list[dict[str, Any]]:
    """One 2-process `trainplan launch` world running `tests/scripts/adapters_world.py`: each rank's report."""
    pytest.importorskip("pytorch_lightning")
    pytest.importorskip("accelerate")
    flags = ["--accelerator", "cpu", "--strategy", "ddp", "--devices", "2", "--precision", "bf16-mixed"]
    flags += ["--strategy-option", "find_unused_parameters=true", "--strategy-option", f"timeout_seconds={JOB_TIMEOUT}"]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("TRAINPLAN_")}
    environment["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "trainplan.cli", "launch", *flags, "--", "tests/scripts/adapters_world.py"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = _reports(result.stdout)
    assert [report["rank"] for report in reports] == [0, 1]
    return reports


@pytest.mark.timeout(300)
def test_lightning_fabric_and_accelerate_see_the_plan(adapters_world: list[dict[str, Any]]) -> None:
    ddp = {"find_unused_parameters": True, "static_graph": False, "gradient_as_bucket_view": False}
    for rank, report in enumerate(adapters_world):
        trainer, fabric, accelerate = report["trainer"], report["fabric"], report["accelerate"]
        assert trainer["strategy"] == "DDPStrategy" and trainer["ddp_kwargs"] == ddp
        assert trainer["timeout"] == JOB_TIMEOUT
        assert (trainer["world_size"], trainer["global_rank"], trainer["precision"]) == (2, rank, "bf16-mixed")
        assert trainer["accelerator"] == "CPUAccelerator"
        assert fabric["strategy"] == "DDPStrategy" and fabric["ddp_kwargs"] == ddp and fabric["world_size"] == 2
        assert fabric["precision"] == "MixedPrecision"
        assert accelerate["distributed_type"] == "DistributedType.MULTI_CPU"
        assert (accelerate["num_processes"], accelerate["process_index"]) == (2, rank)
        assert accelerate["mixed_precision"] == "bf16" and accelerate["ddp_kwargs"] == {"find_unused_parameters": True}
        assert accelerate["timeout"] == report["process_group_timeout"] == JOB_TIMEOUT


BUILT_ELSEWHERE = {
    ("deepspeed", "lightning"): "missing",  # Lightning's DeepSpeedStrategy imports deepspeed, not installed here
}
"""Where a framework's object cannot be built on this machine: the mapping is then checked from plans alone
(`tests/unit/test_option_rows.py`)."""

DDP_MODULES = ("runtime's DDP", "Fabric's DDP", "Accelerate's DDP")
"""The DistributedDataParallel modules built in the world: the runtime's `wrap`, Fabric's `setup_module` and
Accelerate's `prepare`: every keyword an option writes is one of their attributes."""


@pytest.mark.timeout(300)
def test_every_option_reaches_the_frameworks_objects_or_is_refused_by_name(
    adapters_world: list[dict[str, Any]],
) -> None:
    """For every option row (from the rows: no list here), its witness plan and its baseline (the option at its
    default) are built into each framework's own objects in the world: where the row spells the option, each object
    built differs (a DDP module has every keyword as an attribute), or the framework refused the plan by name. A
    torch process group's timeout is the job's own: the joined group has it (`JOB_TIMEOUT`)."""
    seen = adapters_world[0]["options"]
    assert seen == adapters_world[1]["options"], "both ranks build the same objects"
    for family, rows in tp.BUILTIN_RULES.options.items():
        for row in rows:
            targets = seen[f"{family}.{row.name}"]
            assert targets, f"{family}.{row.name}: no witness plan reaches every framework"
            for target, spelling in spellings(row).items():
                if target not in OPTION_TARGETS_OF[family]:
                    assert target not in targets
                    continue
                if isinstance(spelling, ProcessGroupTimeout) and target == "torch":
                    assert family not in ("ddp",) or adapters_world[0]["process_group_timeout"] == JOB_TIMEOUT
                    continue
                built = "DeviceMesh" in targets[target]["witness"]
                if isinstance(spelling, ThroughMeshGroups) and target == "torch" and built:
                    # A dimension's group backend on CPU: gloo is the only CPU backend, so the mesh torch builds is
                    # the same with it or without; that it reaches init_device_mesh's backend_override is checked by
                    # tests/unit/test_mesh_backends.py (the seam) and test_layouts_world.py (torch's own, by hand).
                    assert "DeviceMesh" in targets[target]["baseline"], (row.name, targets[target])
                    continue
                _check_reached(f"{family}.{row.name}", target, spelling, targets[target])


def _check_reached(name: str, target: str, spelling: object, read: dict[str, Any]) -> None:
    witness, baseline = read["witness"], read["baseline"]
    named = f"strategy_options.{name.partition('.')[2]}=" in witness.get("message", "")
    if "refused" in witness and witness.get("refused") == baseline.get("refused") and not named:
        # The framework refuses this family's plans here, the option or not (Accelerate builds no mesh for CPU
        # processes): refused by name; the mapping is checked from plans alone.
        assert witness["refused"] == "accelerate-mesh" and "CPU processes" in witness["message"], (name, witness)
        return
    if "refused" in witness:  # refused for the option: naming it (or the mesh dimension it makes)
        dimension = spelling.dimension if isinstance(spelling, ThroughMesh) else None
        expected = ("lightning-mesh", "accelerate-mesh") if dimension is not None else ("option-framework",)
        assert witness["refused"] in expected, (name, target, witness)
        assert (dimension or name.partition(".")[2]) in witness["message"]
        return
    if "missing" in witness or "unbuilt" in witness:
        family = name.partition(".")[0]
        allowed = BUILT_ELSEWHERE.get((family, target)) == "missing" or isinstance(
            spelling, (ThroughMesh, ThroughMeshGroups)
        )
        assert allowed, (name, target, witness)
        return
    assert any(witness.values()), f"{name}: {target} built nothing that holds it"
    for holder, values in witness.items():  # each object built holds it (an object of another handler holds none)
        if values and "refused" not in baseline:
            same = all(baseline[holder].get(key) == value for key, value in values.items())
            assert not same, f"{name} does not reach {holder} ({target}): {values} at its default too"
    for holder in DDP_MODULES:
        assert "'<absent>'" not in witness.get(holder, {}).values(), f"{name}: {holder}'s DDP lacks {witness[holder]}"


def test_a_missing_framework_is_a_typed_error_naming_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = tp.resolve(tp.Request(accelerator="cpu", devices=2))
    monkeypatch.setitem(sys.modules, "accelerate", None)
    monkeypatch.setitem(sys.modules, "accelerate.utils", None)
    with pytest.raises(tp.MissingExtra, match="pip install accelerate"):
        tp.accelerator_arguments(plan)
    one = tp.resolve(tp.Request(accelerator="cpu"))
    assert tp.accelerate_launch_flags(one)[:2] == ["--num_processes", "1"], "the flags need no Accelerate"
