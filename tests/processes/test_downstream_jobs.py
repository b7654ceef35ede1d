"""A downstream framework's strategy, run for real on CPU over gloo: `trainplan launch --rules` starts it and its
workers read the plan back with the same rule set (handed to them by the launcher); an emitted torchrun line carries
the rule set (TRAINPLAN_RULES) and `trainplan.resolve()` inside the job uses it once the script imported it (the
variable alone is refused); a cluster manager the rule set adds is detected, planned and launched. Neither child has
the project on PYTHONPATH: the rule set's module is found in the current directory, as `--rules` finds it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import trainplan as tp
from tests.downstream_rules import CHECKPOINT_IO, PBS, RULES
from tests.helpers import child_environment
from trainplan.render.emit import emit_torchrun
from trainplan.resolve import resolve

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "tests/scripts/downstream_world.py"


def _environment() -> dict[str, str]:
    environment = child_environment(PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    environment.pop("PYTHONPATH")  # the rule set's module must be found in the current directory
    return {**environment, "PET_LOCAL_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}


def _reports(output: str) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    return sorted(
        (decoder.raw_decode(part)[0] for part in output.split("REPORT ")[1:]), key=lambda report: report["rank"]
    )


def _check(reports: list[dict[str, Any]], precision: str) -> None:
    assert [report["rank"] for report in reports] == [0, 1]
    for report in reports:
        assert report["strategy"] == CHECKPOINT_IO and "static_graph=True" in report["options"]  # the row's preset
        assert report["rules"] == "tests.downstream_rules:RULES" and report["backend"] == "gloo"
        assert report["world_size"] == 2 and report["sum"] == 3.0 and report["precision"] == precision
        assert report["cluster"] == "local"


def test_trainplan_launch_runs_a_downstream_strategy_and_its_workers_read_the_plan_with_that_rule_set() -> None:
    command = [sys.executable, "-m", "trainplan.cli", "launch", "--rules", "tests.downstream_rules:RULES"]
    flags = ["--accelerator", "cpu", "--devices", "2", "--strategy", CHECKPOINT_IO, SCRIPT]
    done = subprocess.run(
        [*command, *flags], cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=90, check=False
    )
    assert done.returncode == 0, done.stderr
    _check(_reports(done.stdout), "32-true")


def test_trainplan_launch_runs_under_a_cluster_manager_the_rule_set_adds() -> None:
    """Inside a PBS-like job (one process per node, which `trainplan launch` runs), the launcher probes the rule
    set's cluster variables, plans its cluster, and its workers read that plan back from JSON with the rule set."""
    command = [sys.executable, "-m", "trainplan.cli", "launch", "--rules", "tests.downstream_rules:PBS_RULES"]
    flags = ["--accelerator", "cpu", "--devices", "2", "--strategy", CHECKPOINT_IO, SCRIPT]
    job = {"PBS_JOBID": "4321.pbs01", "PBS_NODENUM": "0", "PBS_NUM_NODES": "1", "PBS_MOM_HOST": "127.0.0.1"}
    done = subprocess.run(
        [*command, *flags],
        cwd=ROOT,
        env={**_environment(), **job},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    reports = _reports(done.stdout)
    assert [report["rank"] for report in reports] == [0, 1]
    for report in reports:
        assert (report["cluster"], report["rules"]) == (PBS, "tests.downstream_rules:PBS_RULES")
        assert report["strategy"] == CHECKPOINT_IO and report["world_size"] == 2 and report["sum"] == 3.0


_JOB_CODE = """
import json, trainplan as tp
try:
    tp.resolve()
except tp.InvalidRequest as error:  # the variable names the rule set; the job's script imports it
    print("NOT IMPORTED", error)
import tests.downstream_rules
try:
    tp.resolve()
except tp.Unavailable as error:
    print("REFUSED", error)
plan = tp.resolve(env=tp.probe().with_device_counts({"npu": 2}))
print("REPORT " + json.dumps({"rank": plan.cluster.global_rank, "accelerator": plan.accelerator, "rules": plan.rules,
      "strategy": plan.strategy.name, "devices": list(plan.devices), "launcher": plan.launcher}))
"""


def test_an_emitted_torchrun_line_carries_the_rule_set_and_the_job_resolves_with_it() -> None:
    # all "auto" but for the count --assume npu=2 gave: the job must plan the NPU, never quietly the CPU.
    plan = resolve(tp.Request(), tp.Environment(cpu_count=2).with_device_counts({"npu": 2}), RULES)
    line = emit_torchrun(plan, ["train.py"]).splitlines()
    assert line[0].startswith("# note: the job plans accelerator 'npu' of tests.downstream_rules:RULES")
    variables = dict(word.split("=", 1) for word in shlex.split(line[1]) if word.startswith("TRAINPLAN_"))
    assert variables["TRAINPLAN_RULES"] == "tests.downstream_rules:RULES"
    # One worker of the job as torchrun starts it (its variables), on a node whose probe cannot count NPUs.
    torchrun = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0"}
    torchrun |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job"}
    job = subprocess.run(
        [sys.executable, "-c", _JOB_CODE],
        cwd=ROOT,
        env={**_environment(), **variables, **torchrun},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert job.returncode == 0, job.stderr
    assert "NOT IMPORTED" in job.stdout and "import tests.downstream_rules and give rules=" in job.stdout
    assert "REFUSED Asked for accelerator='npu'" in job.stdout  # without the count: said, not planned on the CPU
    (report,) = _reports(job.stdout)
    assert report == {
        "rank": 1,
        "accelerator": "npu",
        "rules": "tests.downstream_rules:RULES",
        "strategy": "ddp",
        "devices": [0, 1],
        "launcher": "external",
    }
