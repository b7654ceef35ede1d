"""Hostile input to the core, the records, the JSON readers and the CLI (reliability review, defects 15-23, 26).

Each case ends at once with a plan or a typed error whose message says what and why: no MemoryError,
OverflowError, ValueError from int(), RecursionError or AttributeError, and no traceback from the CLI.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import cpu, cuda
from trainplan import (
    ClusterEnvironmentError,
    DDPOptions,
    DeepSpeedOptions,
    Environment,
    GpuFacts,
    Incompatible,
    InvalidRequest,
    Plan,
    PlanFormatError,
    Request,
    TrainplanError,
)
from trainplan.cli import main as cli_main
from trainplan.effects import probe
from trainplan.parse.plan_json import plan_from_json_text
from trainplan.resolve import check, expand_hostlist, resolve
from trainplan.resolve.visible import visible_device_order

HUGE = "1" * 5000

SLURM_TASK = {
    "SLURM_NTASKS": "1",
    "SLURM_PROCID": "0",
    "SLURM_STEP_ID": "0",  # an srun task (the batch script and salloc's shell have none)
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NNODES": "1",
    "SLURM_JOB_NAME": "train",
}


def refused(request: Request, env: Environment) -> TrainplanError:
    with pytest.raises(TrainplanError) as caught:
        resolve(request, env)
    for problem in check(request, env):
        assert isinstance(problem, TrainplanError)
    return caught.value


class TestAbsurdSizes:
    """Defect 15: time and memory bounded by the input, not by the numbers in it."""

    @pytest.mark.parametrize("devices", [10**8, 10**12, 10**100, list(range(100_000)), "1," * 50_000])
    def test_absurd_device_counts_and_lists(self, devices: Any) -> None:
        error = refused(Request(accelerator="cpu", devices=devices), cpu())
        assert isinstance(error, InvalidRequest) and error.field == "devices"
        assert len(str(error)) < 1000, "the message shows the value cut short"

    @pytest.mark.parametrize("field", ["cuda_device_count", "xla_device_count", "cpu_count"])
    @pytest.mark.parametrize("count", [10**9, 10**29])
    def test_absurd_environment_counts(self, field: str, count: int) -> None:
        env = Environment(**{field: count})  # type: ignore[arg-type]
        for request in (Request(), Request(devices=-1)):
            error = refused(request, env)
            assert isinstance(error, InvalidRequest) and error.field == f"Environment.{field}"

    @pytest.mark.parametrize("nodes", [10**30, 2**63, 10**100])
    def test_absurd_node_counts(self, nodes: int) -> None:
        assert isinstance(refused(Request(accelerator="cpu", num_nodes=nodes), cpu()), InvalidRequest)

    def test_a_world_beyond_int32_ranks(self) -> None:
        error = refused(Request(accelerator="cpu", devices=4096, num_nodes=1_000_000, strategy="ddp"), cpu())
        assert "2147483647 ranks" in str(error)

    def test_a_started_world_of_exactly_the_int32_limit_is_planned_and_one_more_is_refused(self) -> None:
        # Only a started job reaches 2**31 - 1 ranks (a prime: no request's nodes × devices within their own limits
        # makes it): torchrun with one process on each of that many nodes.
        job = {"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        job |= {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
        limit = 2**31 - 1
        plan = resolve(Request(accelerator="cpu"), cpu(variables={**job, "WORLD_SIZE": str(limit)}))
        assert (plan.world_size, plan.num_nodes, plan.processes_per_node) == (limit, limit, 1)
        error = refused(Request(accelerator="cpu"), cpu(variables={**job, "WORLD_SIZE": str(limit + 1)}))
        assert isinstance(error, InvalidRequest) and "2147483647 ranks" in str(error)

    @pytest.mark.parametrize(
        ("nodelist", "first"),
        [
            ("n[1-99999][1-99999]", "n11"),
            (",".join(["n[1-100000]"] * 300), "n1"),
            ("n[" + ",".join(["1-100000"] * 200) + "]", "n1"),
            ("n" + "[1-99999]" * 2000, None),  # 18 KB: its first host is 2,001 characters, not a host name
            ("n" + "[1-99999]" * 40, "n" + "1" * 40),  # its longest name: 201 characters
            ("n" + "[1-99999]" * 60, None),  # names of up to 301 characters: over DNS's 253
            ("n" + "[1]" * 33000, None),  # read in one pass (each group was a copy of the rest: 2.4 s)
            ("n[0-100000]", "n0"),  # the widest range: 100,001 names
        ],
    )
    def test_huge_slurm_host_lists_are_never_expanded(self, nodelist: str, first: str | None) -> None:
        """Only the first host is built (the first number of each bracket group): bounded time and memory."""
        env = cpu(variables={**SLURM_TASK, "SLURM_NODELIST": nodelist})
        if first is None:
            with pytest.raises(ClusterEnvironmentError, match="is not a host name"):
                resolve(Request(accelerator="cpu"), env)
            return
        plan = resolve(Request(accelerator="cpu"), env)
        assert plan.cluster.main_address == first
        with pytest.raises(ValueError, match="more than 100000 hosts"):
            expand_hostlist(nodelist)

    def test_an_uneven_job_with_absurd_host_names_is_refused_before_anything_is_expanded(self) -> None:
        """An uneven layout expands the whole list (each rank's host): names of 99,985 characters, 100,000 of them,
        ran 25 s to a MemoryError traceback; a name is at most 253 characters."""
        uneven = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "3", "SLURM_PROCID": "0"}
        uneven |= {"SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "2,1"}
        for names in ("a" * 300 + "[0-9]", "a" * 99980 + "[00000-99999]"):
            env = cpu(variables={**uneven, "SLURM_JOB_NODELIST": names})
            with pytest.raises(ClusterEnvironmentError, match="SLURM_TASKS_PER_NODE") as refused:
                resolve(Request(accelerator="cpu"), env)
            # Its hosts are not names: the refusal counts the nodes instead of naming them.
            assert "2 tasks on node 0 and 1 task on node 1" in str(refused.value)
        with pytest.raises(ValueError, match="over 253 characters"):
            expand_hostlist("a" * 250 + "[1-9999]")
        assert expand_hostlist("a" * 249 + "[1-9999]")[-1] == "a" * 249 + "9999"

    def test_a_range_wider_than_the_most_hosts_is_refused_even_for_its_first_host(self) -> None:
        env = cpu(variables={**SLURM_TASK, "SLURM_NODELIST": "n[0-100001]"})
        with pytest.raises(ClusterEnvironmentError, match="implausibly large"):
            resolve(Request(accelerator="cpu"), env)

    def test_usable_gpus_are_checked_in_linear_time(self) -> None:
        env = Environment(cuda_device_count=4096, usable_cuda_devices=tuple(range(4096)))
        assert len(resolve(Request(devices=4096, select_usable_gpus=True), env).devices) == 4096


class TestLongAndForeignDigits:
    """Defects 16 and 17: digit strings past Python's limit, and digits that are not ASCII."""

    @pytest.mark.parametrize(
        "build",
        [
            lambda: Request(devices=HUGE),
            lambda: Request.from_config({"num_nodes": HUGE}),
            lambda: Request.from_config({"devices": HUGE}),
            lambda: Request.from_legacy(gpus=HUGE),
            lambda: Request(devices="²"),
            lambda: Request(devices="٣"),
        ],
    )
    def test_requests(self, build: Any) -> None:
        with pytest.raises(InvalidRequest):
            resolve(build(), cpu())

    @pytest.mark.parametrize(
        ("name", "value"),
        [("SLURM_NTASKS", HUGE), ("MASTER_PORT", HUGE), ("SLURM_NTASKS", "²"), ("SLURM_NTASKS", "٢")],
    )
    def test_cluster_variables(self, name: str, value: str) -> None:
        error = refused(Request(accelerator="cpu"), cpu(variables={**SLURM_TASK, name: value}))
        assert isinstance(error, ClusterEnvironmentError) and error.variable == name

    def test_torchrun_and_lsf_variables(self) -> None:
        torchrun = {"RANK": HUGE, "GROUP_RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "1"}
        assert isinstance(refused(Request(), cpu(variables=torchrun)), ClusterEnvironmentError)
        lsf = {"LSB_JOBID": "9" * 5000, "JSM_NAMESPACE_SIZE": "1", "JSM_NAMESPACE_RANK": "0"}
        assert isinstance(refused(Request(), cpu(variables={**lsf, "JSM_NAMESPACE_LOCAL_RANK": "0"})), TrainplanError)

    @pytest.mark.parametrize("value", ["²", "0,²", "9" * 5000, "٣"])
    def test_cuda_visible_devices_reads_ascii_digits_only(self, value: str) -> None:
        uuids = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]
        assert visible_device_order(value, uuids) in ((), (0,))

        class FourGpus:
            def gpus(self) -> list[GpuFacts]:
                return [GpuFacts(uuid=uuid) for uuid in uuids]

        env = probe(environ={"CUDA_VISIBLE_DEVICES": value}, nvml=FourGpus())
        assert env.cuda_device_count in (0, 1)


class TestRecordsAndReaders:
    """Defects 19 and 20: wrong containers, array-likes, and JSON that is not a plan."""

    @pytest.mark.parametrize("config", [None, 42, "accelerator=cpu", ["accelerator"]])
    def test_from_config_takes_a_mapping(self, config: Any) -> None:
        with pytest.raises(InvalidRequest, match="from_config takes a mapping"):
            Request.from_config(config)

    @pytest.mark.parametrize("gpus", [torch.tensor([0, 1]), torch.tensor(2), torch.zeros(0)])
    def test_from_legacy_refuses_tensors_by_name(self, gpus: Any) -> None:
        with pytest.raises(InvalidRequest, match=r"gpus|devices"):
            Request.from_legacy(gpus=gpus)

    def test_from_legacy_refuses_numpy_values_by_name(self) -> None:
        numpy = pytest.importorskip("numpy")
        for gpus in (numpy.array([0, 1]), numpy.int64(2), numpy.array([])):
            with pytest.raises(InvalidRequest):
                Request.from_legacy(gpus=gpus)

    @pytest.mark.parametrize("text", ["[" * 100_000, None, 5, "{", '{"version": 1}'])
    def test_plan_json_text(self, text: Any) -> None:
        with pytest.raises(PlanFormatError):
            plan_from_json_text(text)

    @pytest.mark.parametrize(
        ("path", "value"),
        [
            ("processes_per_node", 0),
            ("processes_per_node", -3),
            ("processes_per_node", 10**9),
            ("world_size", -1),
            ("world_size", 3),
            ("num_nodes", 0),
            ("devices", []),
            ("strategy.family", "xla"),
            ("strategy.options.timeout_seconds", "x"),
            ("cluster.main_port", 70000),
            ("cluster.main_port", -1),
            ("cluster.node_rank", -1),
            ("cluster.main_address", ""),
            ("request.devices", "garbage"),
            ("request.num_nodes", -4),
            ("cluster.global_rank", 7),
            ("launcher", "none"),
            ("launcher", "fork"),
            ("process_group_backend", "nccl"),
            ("process_group_backend", None),
            ("metrics.reduces_on", "device"),
            ("precision", "transformer-engine"),
            ("accelerator", "mps"),
            ("accelerator", "cuda"),
            ("precision", "16-mixed"),
            ("request.sync_batchnorm", True),
            ("metrics.device_type", "cuda"),
            ("metrics.cpu_values_move_for_reduction", True),
        ],
    )
    def test_plan_from_dict_checks_ranges_and_consistency(self, path: str, value: object) -> None:
        plan = resolve(Request(accelerator="cpu", devices=2), cpu())
        data = copy.deepcopy(plan.to_dict())
        *parents, key = path.split(".")
        target: Any = data
        for parent in parents:
            target = target[parent]
        target[key] = value
        with pytest.raises(PlanFormatError):
            Plan.from_dict(json.loads(json.dumps(data)))

    def test_deepspeed_stage_out_of_range_in_json(self) -> None:
        env = Environment(cuda_device_count=2, packages={"deepspeed"})
        data = resolve(Request(strategy="deepspeed", devices=2), env).to_dict()
        data["strategy"]["options"]["stage"] = 9  # type: ignore[index]
        with pytest.raises(PlanFormatError, match="stages 0 to 3"):
            Plan.from_dict(data)


class TestPresetsAndGarbage:
    """Defects 21-23: an explicit option a preset contradicts, garbage accepted, suggestions that repeat."""

    @pytest.mark.parametrize(
        ("strategy", "options"),
        [
            ("deepspeed_stage_3", DeepSpeedOptions(stage=2)),
            ("ddp_find_unused_parameters_true", DDPOptions(find_unused_parameters=False)),
        ],
    )
    def test_an_explicit_option_equal_to_the_default_still_conflicts_with_a_preset(
        self, strategy: Any, options: Any
    ) -> None:
        env = Environment(cuda_device_count=2, packages={"deepspeed"})
        with pytest.raises(Incompatible, match="already sets"):
            resolve(Request(strategy=strategy, devices=2, strategy_options=options), env)

    def test_options_a_preset_does_not_set_still_combine(self) -> None:
        env = Environment(cuda_device_count=2, packages={"deepspeed"})
        plan = resolve(Request(strategy="deepspeed_stage_3", devices=2, strategy_options=DeepSpeedOptions()), env)
        assert plan.strategy.options == DeepSpeedOptions(stage=3, given=[])

    @pytest.mark.parametrize(
        ("facts", "words"),
        [
            ({"packages": "deepspeed"}, "set of package names"),
            ({"variables": {"MASTER_ADDR": "\x00", "NODE_RANK": "0"}}, "MASTER_ADDR"),
            ({"variables": {"MASTER_ADDR": "host:1234"}}, "without a port"),
            ({"variables": {"MASTER_ADDR": "h" * 100_000}}, "MASTER_ADDR"),
            ({"variables": {"MASTER_ADDR": "node0;touch${IFS}pwned"}}, "MASTER_ADDR"),
            ({"variables": {**SLURM_TASK, "SLURM_NODELIST": "\x00"}}, "SLURM_NODELIST"),
            ({"variables": {**SLURM_TASK, "SLURM_NODELIST": "9" * 5000 + "[1-2]"}}, "SLURM_NODELIST"),
        ],
    )
    def test_garbage_facts_are_refused(self, facts: dict[str, Any], words: str) -> None:
        error = refused(Request(accelerator="cpu"), Environment(**facts))
        assert words in str(error) and len(str(error)) < 1200

    def test_a_bracketed_ipv6_main_address_is_read(self) -> None:
        plan = resolve(Request(accelerator="cpu"), cpu(variables={"MASTER_ADDR": "[::1]"}))
        assert plan.cluster.main_address == "::1"

    def test_an_absurd_timeout_is_refused(self) -> None:
        with pytest.raises(InvalidRequest, match="timeout_seconds"):
            resolve(Request(accelerator="cpu", devices=2, strategy_options=DDPOptions(timeout_seconds=10**100)), cpu())

    @pytest.mark.parametrize("field", ["sync_batchnorm", "select_usable_gpus"])
    def test_a_suggestion_never_repeats_the_refused_value(self, field: str) -> None:
        error = refused(Request(**{field: "True"}), cuda(1))  # type: ignore[arg-type]
        assert "Did you mean" not in str(error)


CLI_CASES = [
    ["plan", "--devices", "10000000000"],
    ["plan", "--no-probe", "--assume", "cuda=1000000000"],
    ["plan", "--devices", HUGE],
    ["plan", "--num-nodes", HUGE],
    ["plan", "--assume", f"cuda={HUGE}"],
    ["plan", "--strategy", "ddp", "--strategy-option", f"timeout_seconds={HUGE}"],
    ["migrate", "--gpus", HUGE],
    ["migrate", "--num-nodes", HUGE],
    ["plan", "--assume", "cuda=²"],
    ["plan", "--assume", "usable=²"],
    ["plan", "--assume", "cpu=²"],
    ["plan", "--assume", "xla=²"],
    ["plan", "--strategy", "deepspeed", "--strategy-option", "stage=²"],
    ["gpus", "²"],
    ["launch"],
    ["launch", "--"],
    [
        "plan",
        "--no-probe",
        "--num-nodes",
        "2",
        "--set-env",
        "MASTER_ADDR=node0;touch${IFS}pwned",
        "--emit",
        "torchrun",
        "--",
        "t.py",
    ],
]


@pytest.mark.parametrize("arguments", CLI_CASES, ids=[" ".join(case)[:60] for case in CLI_CASES])
def test_the_cli_answers_hostile_input_with_a_message(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli_main(arguments)
    assert caught.value.code == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error and "error" in error


def test_an_env_file_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env_file = tmp_path / "bad.env"
    env_file.write_bytes(b"SLURM_JOB_NAME=\xff\xfe\n")
    with pytest.raises(SystemExit) as caught:
        cli_main(["plan", "--env-file", str(env_file)])
    assert caught.value.code == 2 and "UTF-8" in capsys.readouterr().err


def test_cuda_visible_devices_with_foreign_digits_in_the_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "²")
    for arguments in (["plan"], ["probe", "--json"], ["gpus"]):
        assert cli_main(arguments) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_duplicate_physical_gpus_in_json() -> None:
    data = resolve(Request(devices=[0, 2]), cuda(4)).to_dict()
    data["physical_devices"] = ["2", "2"]
    with pytest.raises(PlanFormatError, match="physical_devices"):
        Plan.from_dict(data)


def test_values_whose_repr_cannot_be_made_are_refused_by_name() -> None:
    deep: Any = [0]
    for _ in range(100_000):
        deep = [deep]
    assert isinstance(refused(Request(devices=deep), cpu()), InvalidRequest)
    with pytest.raises(InvalidRequest):
        Request.from_config({"devices": deep})
    huge = DDPOptions(timeout_seconds=10**5000)
    assert isinstance(refused(Request(accelerator="cpu", strategy="ddp", strategy_options=huge), cpu()), InvalidRequest)


def test_probe_takes_a_stub_module_for_installed() -> None:
    import subprocess
    import sys

    code = (
        "import sys, types; sys.modules['deepspeed'] = types.ModuleType('deepspeed')\n"
        "import trainplan as tp; print('deepspeed' in tp.probe().packages)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout.strip() == "True", result.stderr


def test_the_effects_refuse_what_is_not_a_plan_with_its_article() -> None:
    """'launch takes a trainplan.Plan, not int' read as a typo: the effects name the kind as the rest does."""
    import trainplan as tp
    from trainplan.effects.elastic import launch_script

    for call, name in ((lambda: tp.launch(7, print), "launch"), (lambda: tp.join(7), "join")):  # type: ignore[arg-type]
        with pytest.raises(tp.TrainplanError, match=rf"^{name} takes a trainplan.Plan, not an int: build one"):
            call()
    with pytest.raises(tp.TrainplanError, match=r"launch_script takes a trainplan\.Plan, not a dict"):
        launch_script({}, ["train.py"])  # type: ignore[arg-type]


def test_stages_per_rank_no_schedule_fits_are_refused_not_a_stopiteration() -> None:
    """pp=2, pp_virtual_stages=77, pp_microbatches=77: no schedule fits, and the search for one to suggest ran dry
    (StopIteration out of resolve)."""
    import trainplan as tp

    options = tp.ModelParallelOptions(pp=2, pp_virtual_stages=77, pp_microbatches=77)
    with pytest.raises(tp.Incompatible) as refused:
        resolve(Request(accelerator="cpu", devices=2, strategy="model_parallel", strategy_options=options), cpu())
    assert refused.value.rule == "pipeline-virtual-stages"
    assert "Use pp_virtual_stages=1, or pp_schedule='Interleaved1F1B'" in str(refused.value)
