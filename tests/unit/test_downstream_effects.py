"""A downstream accelerator or precision handed on from a plan: the Lightning/Fabric/Accelerate adapters, DeepSpeed's
config, the emitted jobs (torchrun, sbatch, Kubeflow) and the worker's device binding meet a clear refusal that names
the downstream name and its rule set, or work where the rule set's rows carry what is needed
(`Rules.extend(framework_accelerators=..., kubernetes_resources=...)`); never `MissingRule`.

The rule sets are `tests.downstream_rules`: `RULES` (Ascend's NPU, HCCL, int8 QAT) and `PLUGGED` (the same, with
the frameworks' spelling of the NPU and its Kubernetes resource)."""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import pytest

from tests.downstream_rules import ASCEND_RESOURCE, INT8_QAT, NPU, PLUGGED, RULES, STATIC_DEEPSPEED
from trainplan import (
    BUILTIN_RULES,
    Environment,
    FrameworkAccelerator,
    Incompatible,
    InvalidRequest,
    Plan,
    Request,
    join,
)
from trainplan.cli import main
from trainplan.effects.adapters import (
    accelerate_launch_flags,
    accelerator_arguments,
    fabric_arguments,
    lightning_trainer_arguments,
)
from trainplan.mapping.frameworks import accelerate_arguments, deepspeed_config, lightning_arguments
from trainplan.render.emit import emit_kubeflow, emit_slurm, emit_torchrun
from trainplan.resolve import resolve_uncached
from trainplan.rules import MissingRule, Rules

WITH_TORCHAO = frozenset({"torchao"})


def npus(count: int = 4) -> Environment:
    return Environment().with_device_counts({NPU: count})


def npu_plan(rules: Rules = RULES, devices: int = 2) -> Plan:
    return resolve_uncached(Request(accelerator=NPU, strategy="ddp", devices=devices), npus(), rules)


def qat_plan() -> Plan:
    return resolve_uncached(
        Request(accelerator="cpu", strategy="ddp", devices=2, precision=INT8_QAT),
        Environment(packages=WITH_TORCHAO),
        RULES,
    )


def refused(rule: str, call: Any, *words: str) -> Incompatible:
    """`call()` is refused by `rule`, never by a missing row, and the message holds `words`."""
    with pytest.raises(Incompatible) as caught:
        call()
    assert not isinstance(caught.value, MissingRule)
    assert caught.value.rule == rule, str(caught.value)
    for word in words:
        assert word in str(caught.value), f"{word!r} not in {caught.value}"
    return caught.value


# --------------------------------------------------------------------------------------------------
# Lightning, Fabric, Accelerate


class TestFrameworks:
    """A downstream accelerator reaches a framework as its rule set spells it; without a spelling, or with a
    downstream precision no framework has a plugin for, the adapter refuses by name before importing it."""

    def test_without_a_spelling_the_adapters_name_the_accelerator_its_rule_set_and_the_row_to_add(self) -> None:
        plan = npu_plan()
        for call, framework in [
            (lambda: lightning_trainer_arguments(plan), "Lightning's Trainer"),
            (lambda: fabric_arguments(plan), "Fabric"),
            (lambda: accelerator_arguments(plan), "Accelerate"),
            (lambda: accelerate_launch_flags(plan), "Accelerate"),
        ]:
            refused(
                "framework-accelerator",
                call,
                "'npu'",
                "'tests.downstream_rules:RULES'",
                f"{framework} has no accelerator of that name",
                "RULES.extend(framework_accelerators=[FrameworkAccelerator(accelerator='npu'",
            )

    def test_a_spelling_in_the_rule_set_makes_the_adapters_work(self) -> None:
        plan = npu_plan(PLUGGED)
        arguments = lightning_trainer_arguments(plan)
        assert (arguments["accelerator"], arguments["devices"], arguments["num_nodes"]) == ("npu", [0, 1], 1)
        assert type(arguments["strategy"]).__name__ == "DDPStrategy"  # a real strategy object, with the plan's backend
        assert arguments["strategy"]._process_group_backend == "hccl"
        assert fabric_arguments(plan)["accelerator"] == "npu"
        assert accelerator_arguments(plan)["cpu"] is False
        assert accelerate_launch_flags(plan)[:4] == ["--num_processes", "2", "--num_machines", "1"]
        assert "--gpu_ids" not in accelerate_launch_flags(plan), "a count pins no devices: the node's own stay"

    def test_the_pure_mapping_given_other_rules_than_the_plans_says_which_to_pass(self) -> None:
        plan = npu_plan(PLUGGED)
        refused(
            "plan-rules",
            lambda: lightning_arguments(plan),
            "tests.downstream_rules:PLUGGED",
            "trainplan's own rules",
            "accelerator 'npu'",
        )
        assert lightning_arguments(plan, "trainer", PLUGGED).accelerator == "npu"
        assert accelerate_arguments(plan, PLUGGED).cpu is False

    def test_a_downstream_precision_has_no_framework_plugin(self) -> None:
        plan = qat_plan()
        for call, framework in [
            (lambda: lightning_trainer_arguments(plan), "Lightning's Trainer"),
            (lambda: fabric_arguments(plan), "Fabric"),
            (lambda: accelerator_arguments(plan), "Accelerate"),
        ]:
            refused(
                "framework-precision",
                call,
                "precision 'int8-qat' is a row of 'tests.downstream_rules:RULES'",
                f"{framework} has no precision of that name",
                "trainplan.runtime",
            )


# --------------------------------------------------------------------------------------------------
# DeepSpeed's config


def test_deepspeed_reads_a_downstream_precisions_recipe_from_the_rule_set_given() -> None:
    deepspeed = RULES.families["deepspeed"]
    rules = RULES.extend(families=[attrs.evolve(deepspeed, precisions=deepspeed.precisions | {INT8_QAT})])
    plan = resolve_uncached(
        Request(accelerator="cpu", strategy=STATIC_DEEPSPEED, devices=2, precision=INT8_QAT),
        Environment(packages=WITH_TORCHAO | {"deepspeed"}),
        rules,
    )
    config = deepspeed_config(plan, rules=rules)
    assert config["zero_optimization"] == {"stage": 1}
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}  # the recipe's bfloat16
    refused("plan-rules", lambda: deepspeed_config(plan), "an unnamed rule set", "precision 'int8-qat'")


# --------------------------------------------------------------------------------------------------
# Emitted jobs


class TestEmitted:
    """torchrun needs nothing of the row; sbatch reads its `slurm_gpus`; a PyTorchJob needs a Kubernetes resource,
    which a downstream row carries through `Rules.extend(kubernetes_resources=...)`."""

    def test_torchrun_starts_the_downstream_workers(self) -> None:
        line = emit_torchrun(npu_plan(), ["train.py"])
        assert "--nproc-per-node=2" in line and "CUDA_VISIBLE_DEVICES" not in line

    def test_sbatch_reads_the_downstream_row_of_the_rule_set_given(self) -> None:
        script = emit_slurm(npu_plan(), ["train.py"], rules=RULES)
        assert "#SBATCH --nodes=1" in script and "--gpus-per-node" not in script  # SLURM allocates no GPUs for it
        refused("plan-rules", lambda: emit_slurm(npu_plan(), ["train.py"]), "tests.downstream_rules:RULES", "'npu'")

    def test_kubeflow_asks_for_the_resource_the_row_names_or_says_how_to_name_one(self) -> None:
        refused(
            "kubeflow-resource",
            lambda: emit_kubeflow(npu_plan(), ["train.py"], image="img", rules=RULES),
            "'npu' is a row of 'tests.downstream_rules:RULES'",
            "RULES.extend(kubernetes_resources={'npu': 'vendor.com/device'})",
        )
        manifest = emit_kubeflow(npu_plan(PLUGGED), ["train.py"], image="img", rules=PLUGGED)
        assert f'{ASCEND_RESOURCE}: "2"' in manifest
        refused(
            "kubeflow-accelerator",
            lambda: emit_kubeflow(
                resolve_uncached(Request(accelerator="mps"), Environment(mps_available=True), PLUGGED),
                ["train.py"],
                image="img",
                rules=PLUGGED,
            ),
            "'mps'",
        )

    def test_every_emitted_job_carries_the_rule_set_and_the_downstream_accelerator(self) -> None:
        plan = npu_plan(PLUGGED)
        request = '"accelerator":"npu"'  # the accelerator travels as chosen, never re-decided
        line = emit_torchrun(plan, ["train.py"])
        assert "TRAINPLAN_RULES=tests.downstream_rules:PLUGGED " in line and request in line
        script = emit_slurm(plan, ["train.py"], rules=PLUGGED)
        assert "export TRAINPLAN_RULES=tests.downstream_rules:PLUGGED" in script
        manifest = emit_kubeflow(plan, ["train.py"], image="img", rules=PLUGGED)
        assert '- name: "TRAINPLAN_RULES"\n' in manifest and '"tests.downstream_rules:PLUGGED"' in manifest
        for text in (line, script, manifest):  # what the job needs that trainplan cannot give it, said plainly
            assert "# note: the job plans accelerator 'npu'" in text and "with_device_counts({'npu': 2})" in text
        # An all-"auto" request that planned the NPU from its count still carries the accelerator.
        auto = resolve_uncached(Request(), npus(), RULES)
        assert auto.accelerator == NPU and '"accelerator":"npu"' in emit_torchrun(auto)
        # trainplan's own plans carry no rule set, and a downstream plan on built-in hardware no note.
        builtin = resolve_uncached(Request(accelerator="cpu", devices=2), Environment(cpu_count=2))
        assert "TRAINPLAN_RULES" not in emit_torchrun(builtin) + emit_slurm(builtin)
        assert "# note" not in emit_torchrun(qat_plan()) and "TRAINPLAN_RULES=" in emit_torchrun(qat_plan())

    def test_a_downstream_notebook_strategy_runs_as_its_own_script_counterpart(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        flags = ["plan", "--no-probe", "--assume", "cpu=4", "--rules", "tests.downstream_rules:RULES", "--devices", "2"]
        assert (
            main([*flags, "--strategy", "ddp_custom_checkpoint_io_notebook", "--emit", "torchrun", "--", "t.py"]) == 0
        )
        note, line = capsys.readouterr().out.splitlines()
        assert "runs it as strategy='ddp_custom_checkpoint_io'" in note
        assert '"strategy":"ddp_custom_checkpoint_io"' in line and "_notebook" not in line.partition("notes")[0]

    def test_a_plan_of_an_unnamed_rule_set_cannot_travel(self) -> None:
        unnamed = RULES.extend()  # no name=: nothing inside a job could import it
        plan = resolve_uncached(Request(accelerator="cpu", devices=2), Environment(cpu_count=2), unnamed)
        jobs = {
            "torchrun line": lambda: emit_torchrun(plan, ["train.py"]),
            "sbatch script": lambda: emit_slurm(plan, ["train.py"], rules=unnamed),
            "PyTorchJob": lambda: emit_kubeflow(plan, ["train.py"], image="img", rules=unnamed),
        }
        for job, emit in jobs.items():
            refused("emit-unnamed-rules", emit, f"so the {job} could not import it", "name='package.module:RULES'")

    def test_the_cli_emits_with_the_rule_set_it_was_given(self, capsys: pytest.CaptureFixture[str]) -> None:
        flags = ["plan", "--no-probe", "--assume", "npu=4", "--accelerator", "npu", "--devices", "2"]
        job = ["--emit", "kubeflow", "--image", "img", "--", "train.py"]
        assert main([*flags, "--rules", "tests.downstream_rules:PLUGGED", *job]) == 0
        assert ASCEND_RESOURCE in capsys.readouterr().out
        with pytest.raises(SystemExit) as exited:
            main([*flags, "--rules", "tests.downstream_rules:RULES", *job])
        assert exited.value.code == 2 and "names no Kubernetes resource" in capsys.readouterr().err
        assert main([*flags, "--rules", "tests.downstream_rules:RULES", "--emit", "slurm", "--", "train.py"]) == 0
        assert "--gpus-per-node" not in capsys.readouterr().out


# --------------------------------------------------------------------------------------------------
# The worker's device


class FakeDevices:
    """A `DeviceBinder` that records what it is asked to bind (this machine has no GPU)."""

    def __init__(self) -> None:
        self.bound: list[tuple[str, int]] = []

    def bind(self, device_type: str, index: int) -> None:
        self.bound.append((device_type, index))


def test_a_worker_binds_its_device_where_the_accelerators_row_says() -> None:
    """`AcceleratorRule.binds_device`: CUDA's row binds (torch.cuda.set_device through the seam), a downstream row
    binds by default, the CPU's does not."""
    assert [rule.binds_device for rule in BUILTIN_RULES.accelerators.values()] == [False, True, False, False]
    assert RULES.accelerators[NPU].binds_device
    cuda = resolve_uncached(Request(accelerator="cuda", devices=[1]), Environment(cuda_device_count=2))
    devices = FakeDevices()
    with join(cuda, devices=devices) as world:
        assert world.device == "cuda:1"
    assert devices.bound == [("cuda", 1)]
    cpu = resolve_uncached(Request(accelerator="cpu"), Environment())
    with join(cpu, devices=devices):
        pass
    assert devices.bound == [("cuda", 1)]


# --------------------------------------------------------------------------------------------------
# The rows a downstream rule set adds


NPU_SPELLING = PLUGGED.framework_accelerators[NPU]


def _spelled(**changes: Any) -> FrameworkAccelerator:
    """The NPU's spelling with some fields replaced (wrong types included: what a framework might pass)."""
    return attrs.evolve(NPU_SPELLING, **changes)


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ({"framework_accelerators": [_spelled(accelerator="cuda")]}, "a built-in accelerator's"),
        ({"framework_accelerators": [_spelled(accelerator="ipu")]}, "Write one of: 'npu'"),
        ({"framework_accelerators": [NPU_SPELLING, NPU_SPELLING]}, "two rows of one call"),
        ({"framework_accelerators": [_spelled(lightning="")]}, "Lightning plugin registers"),
        ({"framework_accelerators": [_spelled(lightning_devices="all")]}, "how Lightning takes"),
        ({"framework_accelerators": [_spelled(accelerate_cpu=True)]}, "not the host's"),
        ({"framework_accelerators": [_spelled(accelerate_processes=1)]}, "True or False"),
        ({"framework_accelerators": [RULES.accelerators[NPU]]}, "each row is a FrameworkAccelerator"),
        ({"kubernetes_resources": {"cuda": "nvidia.com/gpu"}}, "a built-in accelerator's"),
        (
            {"kubernetes_resources": {NPU: "Ascend910"}},
            "domain/name. Write e.g. 'huawei.com/Ascend910' (what `kubectl describe node` lists under Allocatable).",
        ),
        ({"kubernetes_resources": {NPU: 2}}, "domain/name"),
        ({"kubernetes_resources": [NPU]}, "not a list"),
    ],
)
def test_extend_refuses_incoherent_framework_and_kubernetes_rows(arguments: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(words)):
        RULES.extend(**arguments)


def test_a_resource_named_twice_is_refused_and_the_builtin_rows_stay_alone() -> None:
    with pytest.raises(InvalidRequest, match="names its resource already"):
        PLUGGED.extend(kubernetes_resources={NPU: ASCEND_RESOURCE})
    assert NPU not in RULES.framework_accelerators and NPU not in RULES.kubernetes_resources
    assert NPU not in BUILTIN_RULES.kubernetes_resources and type(NPU_SPELLING) is FrameworkAccelerator
    assert json.loads(json.dumps(npu_plan(PLUGGED).to_dict()))["rules"] == "tests.downstream_rules:PLUGGED"


class TestInsideTheJob:
    """`trainplan.resolve()` inside an emitted job decides the carried request with the rule set the job names."""

    def test_the_carried_rule_set_decides_the_carried_request(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import trainplan as tp
        from trainplan.parse.plan_json import request_to_dict

        carried = request_to_dict(Request(strategy=tp.CustomName("ddp_custom_checkpoint_io"), devices=2))
        monkeypatch.setenv("TRAINPLAN_RULES", "tests.downstream_rules:RULES")
        monkeypatch.setenv("TRAINPLAN_REQUEST", json.dumps(carried))
        plan = tp.resolve(env=Environment(cpu_count=2))
        assert plan.strategy.name == "ddp_custom_checkpoint_io" and plan.rules == "tests.downstream_rules:RULES"
        assert tp.resolve(env=Environment(cpu_count=2), rules=RULES).strategy.name == "ddp_custom_checkpoint_io"
        with pytest.raises(InvalidRequest) as other:  # another rule set than the job's is never taken silently
            tp.resolve(env=Environment(cpu_count=2), rules=PLUGGED)
        assert "emitted for the rule set 'tests.downstream_rules:RULES'" in str(other.value)
        monkeypatch.setenv("TRAINPLAN_RULES", "no_such_framework.rules:RULES")
        with pytest.raises(InvalidRequest) as missing:
            tp.resolve(env=Environment(cpu_count=2))
        assert "TRAINPLAN_RULES='no_such_framework.rules:RULES'" in str(missing.value)
        assert "'no_such_framework.rules' is not imported in this process" in str(missing.value)
