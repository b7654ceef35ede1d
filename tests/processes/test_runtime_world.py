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


def test_lightning_fabric_and_accelerate_see_the_plan() -> None:
    pytest.importorskip("pytorch_lightning")
    pytest.importorskip("accelerate")
    flags = ["--accelerator", "cpu", "--strategy", "ddp", "--devices", "2", "--precision", "bf16-mixed"]
    flags += ["--strategy-option", "find_unused_parameters=true", "--strategy-option", "timeout_seconds=77"]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("TRAINPLAN_")}
    environment["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "trainplan.cli", "launch", *flags, "--", "tests/scripts/adapters_world.py"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = _reports(result.stdout)
    assert [report["rank"] for report in reports] == [0, 1]
    ddp = {"find_unused_parameters": True, "static_graph": False, "gradient_as_bucket_view": False}
    for rank, report in enumerate(reports):
        trainer, fabric, accelerate = report["trainer"], report["fabric"], report["accelerate"]
        assert trainer["strategy"] == "DDPStrategy" and trainer["ddp_kwargs"] == ddp and trainer["timeout"] == 77
        assert (trainer["world_size"], trainer["global_rank"], trainer["precision"]) == (2, rank, "bf16-mixed")
        assert trainer["accelerator"] == "CPUAccelerator"
        assert fabric["strategy"] == "DDPStrategy" and fabric["ddp_kwargs"] == ddp and fabric["world_size"] == 2
        assert fabric["precision"] == "MixedPrecision"
        assert accelerate["distributed_type"] == "DistributedType.MULTI_CPU"
        assert (accelerate["num_processes"], accelerate["process_index"]) == (2, rank)
        assert accelerate["mixed_precision"] == "bf16" and accelerate["ddp_kwargs"] == {"find_unused_parameters": True}


def test_a_missing_framework_is_a_typed_error_naming_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = tp.resolve(tp.Request(accelerator="cpu", devices=2))
    monkeypatch.setitem(sys.modules, "accelerate", None)
    monkeypatch.setitem(sys.modules, "accelerate.utils", None)
    with pytest.raises(tp.MissingExtra, match="pip install accelerate"):
        tp.accelerator_arguments(plan)
    one = tp.resolve(tp.Request(accelerator="cpu"))
    assert tp.accelerate_launch_flags(one)[:2] == ["--num_processes", "1"], "the flags need no Accelerate"
