"""The `trainplan` command: plan (the default), probe, matrix; errors exit 2 without a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainplan.cli import main

DOWNSTREAM = "tests.downstream_rules:RULES"


def run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    try:
        code = main(list(arguments))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_no_arguments_prints_an_explained_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--no-probe")
    assert code == 0 and "trainplan: the plan" in out and "why:" in out


def test_what_if_eight_gpus_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--no-probe", "--assume", "cuda=8", "--devices", "0,2", "--json")
    data = json.loads(out)
    assert code == 0 and data["devices"] == [0, 2] and data["strategy"]["name"] == "ddp"


@pytest.mark.parametrize("command", ["plan", "probe", "matrix", "env"])
def test_json_written_before_the_command_is_the_commands_flag(capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, out, _ = run(capsys, "--json", command, *(["--no-probe"] if command == "plan" else []))
    assert code == 0 and json.loads(out)["version"] == 1 and "error" not in json.loads(out)


def test_json_before_a_refused_command_is_an_error_record(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--json", "plan", "--no-probe", "--accelerator", "nope")
    assert code == 2 and json.loads(out)["error"]["type"] == "InvalidRequest"


def test_environment_from_file_and_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    env_file = tmp_path / "slurm.env"
    env_file.write_text(
        "# a SLURM task\nexport SLURM_NTASKS=4\nSLURM_NNODES=1\nSLURM_STEP_ID=0\nSLURM_PROCID=1\nSLURM_LOCALID=1\n"
        "SLURM_NODEID=0\nSLURM_JOB_NAME='train'\n"
    )
    code, out, _ = run(
        capsys,
        "--no-probe",
        "--assume",
        "cuda=4",
        "--env-file",
        str(env_file),
        "--set-env",
        "SLURM_NODELIST=gpu[7-8]",
        "--json",
    )
    data = json.loads(out)
    assert code == 0
    assert data["cluster"]["kind"] == "slurm" and data["cluster"]["main_address"] == "gpu7"
    assert data["launcher"] == "external" and data["cluster"]["global_rank"] == 1


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        (("--accelerator", "gpux"), "Did you mean accelerator='gpu'"),
        (("--assume", "cuda=eight"), "whole number"),
        (("--assume", "gpus=8"), "not a known fact"),
        (("--set-env", "NOVALUE"), "KEY=VALUE"),
        (("--env-file", "/nonexistent/file"), "cannot read"),
        (("--accelerator", "cuda"), "only cpu"),
    ],
)
def test_bad_input_exits_2_with_the_message(
    capsys: pytest.CaptureFixture[str], arguments: tuple[str, ...], words: str
) -> None:
    code, _, err = run(capsys, "--no-probe", *arguments)
    assert code == 2
    assert words in err and "Traceback" not in err


def test_unknown_command_suggests_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "matrx")
    assert code == 2 and "trainplan matrix" in err


def test_check_lists_every_problem(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "plan", "--no-probe", "--check", "--accelerator", "cuda", "--strategy", "fsdp", "--precision", "64"
    )
    assert code == 2 and out.count("\n- ") + out.startswith("- ") == 2


def test_probe_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "probe", "--json", "--assume", "interactive")
    facts = json.loads(out)
    assert code == 0 and facts["interactive"] is True and "start_methods" in facts


def test_matrix_comes_from_the_tables(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "matrix")
    assert code == 0 and "| `deepspeed` | deepspeed | subprocess | ✗ | ✓ | ✗ | ✗ |" in out


def test_console_script_runs_as_a_module() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainplan.cli", "--no-probe", "--devices", "0"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2 and "devices='0'" in result.stderr and "Traceback" not in result.stderr


def test_an_emitted_job_is_a_script_even_from_a_notebook(capsys: pytest.CaptureFixture[str]) -> None:
    arguments = ["--no-probe", "--assume", "cpu=4", "--assume", "interactive", "--accelerator", "cpu"]
    code, out, _ = run(
        capsys, *arguments, "--strategy", "ddp_notebook", "--devices", "2", "--emit", "torchrun", "--", "t.py"
    )
    assert code == 0 and "torchrun --standalone" in out and "# note: strategy='ddp_notebook'" in out


def test_env_file_is_read_as_a_dotenv_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text(
        'export SLURM_JOB_NAME="my job" # the job\'s name\n'
        "SLURM_JOB_PARTITION='gpu queue'\n"
        'SLURM_JOB_COMMENT="quoted \\"inner\\""\n'
        "SLURM_JOB_ACCOUNT=${ACCOUNT}\n"
        "\n# a comment\n"
    )
    code, out, _ = run(capsys, "probe", "--no-probe", "--json", "--env-file", str(env_file))
    variables = json.loads(out)["variables"]
    assert code == 0
    assert variables["SLURM_JOB_NAME"] == "my job", "the quotes and the comment are not part of the value"
    assert variables["SLURM_JOB_PARTITION"] == "gpu queue"
    assert variables["SLURM_JOB_COMMENT"] == 'quoted "inner"'
    assert variables["SLURM_JOB_ACCOUNT"] == "${ACCOUNT}", "a what-if never reads this machine's variables"


@pytest.mark.parametrize(
    ("line", "shown"), [("JUST_A_NAME", "'JUST_A_NAME'"), ('A="never closed', "'A=\"never closed'")]
)
def test_env_file_line_that_is_no_assignment_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, line: str, shown: str
) -> None:
    env_file = tmp_path / "bad.env"
    env_file.write_text(f"GOOD=1\n{line}\n")
    code, _, err = run(capsys, "probe", "--no-probe", "--env-file", str(env_file))
    assert code == 2 and f"line 2: expected KEY=VALUE, found {shown}" in err and "Traceback" not in err


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    import trainplan

    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"trainplan {trainplan.__version__}"


def test_python_dash_m_trainplan_is_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainplan", "matrix"], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0 and "| `ddp` | ddp | subprocess |" in result.stdout


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        (["launch", "--nnodes", "1:4", "x.py"], "trainplan plans a fixed number of nodes"),
        (["launch", "--nproc-per-node", "2", "--devices", "3", "x.py"], "--nproc-per-node 2 and --devices 3 disagree"),
        (["launch", "--nproc-per-node", "many", "x.py"], "write a number of processes, gpu, cpu or auto"),
        (["launch", "--standalone", "--num-nodes", "2", "--main-port", "29400", "x.py"], "--standalone runs one node"),
        (["launch", "--main-port", "70000", "x.py"], "write a free TCP port"),
        (["launch", "--node-rank", "first", "x.py"], "write this machine's rank"),
        (["launch", "--master-addr", "node0;rm", "x.py"], "write the host name or IP address of node 0"),
        (["launch", "--rdzv-backend", "zeus", "--no-python", "true"], "not a rendezvous backend"),
        (["launch", "--redirects", "7", "--no-python", "true"], "write 0 (none), 1 (stdout)"),
        (["launch", "--no-python", "-m", "x"], "--no-python and -m cannot go together"),
        (["launch", "--devices", "2", "no_such_script.py"], "No such script: 'no_such_script.py'"),
        (["launch", "--devices", "2"], "nothing to launch: name the script after the flags"),
        (["launch", "--assume", "cuda=2", "x.py"], "what-if facts cannot be run for real"),
        (["launch", "--assume", "cuda=2", "x.py"], "Use `trainplan plan --assume ...` for what-ifs"),
        (["launch", "--rules", DOWNSTREAM, "--assume", "cuda=2", "x.py"], "only the devices of an accelerator --rules"),
        (["launch", "--rules", DOWNSTREAM, "--accelerator", "npu", "x.py"], "e.g. --assume npu=8 (trainplan cannot"),
        # An accelerator the rule set adds is counted by --assume NAME=N: the plan is made, and only the script lacks.
        (["launch", "--rules", DOWNSTREAM, "--assume", "npu=2", "--accelerator", "npu", "none.py"], "No such script"),
        (["launch", "--rules", "no_such_module:RULES", "x.py"], "--rules: rules='no_such_module:RULES'"),
        (["launch", "--rdzv-conf", "garbage", "--no-python", "true"], "'garbage' is not key=value"),
        (["launch", "--timeout", "30", "--rdzv-conf", "timeout=abc", "--no-python", "true"], "is whole seconds"),
        (["launch", "--log-dir", "/proc/nope", "--no-python", "true"], "cannot be created or used as"),
        (["launch", "--rdzv-endpoint", "x:y", "x.py"], "--rdzv-endpoint x:y: the port y: write a free TCP port"),
        (["launch", "--devices", "1", "echo", "hi"], "No such script: 'echo'"),
        (["launch", "--devices", "1", "echo", "hi"], "is a program on PATH: add --no-python"),
        (["plan", "--accelerator", "cpu", "--emit", "kubeflow"], "--emit kubeflow needs --image"),
        (["plan", "--accelerator", "cpu", "--emit", "kubeflow", "--image", "i", "--job-name", "A"], "Kubernetes names"),
    ],
)
def test_launch_and_emit_refuse_what_cannot_work_before_starting_anything(
    capsys: pytest.CaptureFixture[str], arguments: list[str], words: str
) -> None:
    code, _, err = run(capsys, arguments[0], "--no-probe", *arguments[1:])
    assert code == 2 and words in err, err


def test_torchruns_spellings_name_trainplans_with_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    # Refused after the spellings were read (no GPU here), so nothing starts.
    code, _, err = run(
        capsys, "launch", "--no-probe", "--nproc_per_node", "gpu", "--nnodes", "2", "--master_addr", "h", "x.py"
    )
    assert code == 2
    assert "--nproc-per-node is torchrun's spelling; trainplan's is --devices: --devices -1 (every visible GPU)" in err
    assert "--nnodes is torchrun's spelling; trainplan's is --num-nodes" in err
    assert "--master-addr is torchrun's spelling; trainplan's is --main-address" in err


def test_nproc_per_node_auto_means_what_torchrun_means(capsys: pytest.CaptureFixture[str]) -> None:
    import os

    from trainplan.cli import _parser, _translate_torchrun_spellings

    arguments = _parser().parse_args(["launch", "--nproc-per-node", "auto", "x.py"])
    _translate_torchrun_spellings(arguments)
    # This CPU machine: one process per CPU, as `torchrun --nproc-per-node auto` starts.
    assert arguments.devices == str(os.cpu_count() or 1)
    assert "one process per CPU, as torchrun's auto" in capsys.readouterr().err


def test_nproc_per_node_auto_takes_every_gpu_where_there_are_some(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainplan import Environment, cli

    monkeypatch.setattr(cli, "_environment", lambda arguments: Environment(cuda_device_count=3, cpu_count=16))
    arguments = cli._parser().parse_args(["launch", "--nproc-per-node", "auto", "x.py"])
    cli._translate_torchrun_spellings(arguments)
    assert arguments.devices == "-1" and arguments.accelerator == "auto"


def test_launch_names_what_it_cannot_use(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[1] / "scripts" / "plain_world.py"
    afile = tmp_path / "somefile"
    afile.write_text("")
    code, _, err = run(capsys, "launch", "--no-probe", "--log-dir", str(afile), "--no-python", "true")
    assert code == 2 and "cannot be used as the log directory (it is a file)" in err, err
    code, _, err = run(capsys, "launch", "--no-probe", "--accelerator", "cpu", "--num-nodes", "2", str(script))
    assert code == 2 and "--main-port 29500" in err and "MASTER_PORT" in err, err


def test_launch_says_torch_failed_to_import_and_why(tmp_path: Path) -> None:
    # torch installed but broken (a missing libcudart is an OSError at import), not a failure to write output.
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise OSError('libcudart.so.13: cannot open shared object file')\n")
    script = tmp_path / "train.py"
    script.write_text("")
    root = Path(__file__).resolve().parents[2]
    launched = subprocess.run(
        [sys.executable, "-m", "trainplan.cli", "launch", "--no-probe", str(script)],
        env={"PYTHONPATH": f"{tmp_path}:{root / 'src'}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert launched.returncode == 2, launched.stderr
    assert "torch failed to import (OSError: libcudart.so.13" in launched.stderr, launched.stderr
    assert "cannot write the output" not in launched.stderr


def test_assumed_counts_beyond_a_machine_say_the_limit(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "--no-probe", "--rules", DOWNSTREAM, "--assume", "npu=99999999999999999999")
    assert code == 2 and "--assume npu=99999999999999999999: a node has at most 4096 devices" in err, err
    code, _, err = run(capsys, "plan", "--no-probe", "--assume", "cuda=" + "9" * 5000)
    assert code == 2 and "at most 4096 devices" in err and "(5000 digits)" in err and len(err) < 300, err
    code, _, err = run(capsys, "plan", "--no-probe", "--assume", "cpu=10000000")
    assert code == 2 and "at most 1048576 CPUs" in err, err
    code, _, err = run(capsys, "plan", "--no-probe", "--assume", "cuda=two")
    assert code == 2 and "write a whole number, e.g. --assume cuda=8" in err, err
    code, _, err = run(capsys, "plan", "--no-probe", "--rules", DOWNSTREAM, "--assume", "npu")
    assert code == 2 and "--assume npu: say how many, e.g. --assume npu=8" in err and "None" not in err, err


def test_a_downstream_accelerator_without_devices_is_counted_by_the_clis_own_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.downstream_rules import NPU, RULES
    from trainplan import Environment, Request, Unavailable
    from trainplan.resolve import resolve

    for check in ((), ("--check",)):
        code, out, err = run(capsys, "plan", *check, "--no-probe", "--rules", DOWNSTREAM, "--accelerator", "npu")
        assert code == 2 and "e.g. --assume npu=8 (trainplan cannot probe it)" in out + err
        assert "with_device_counts" not in out + err
    with pytest.raises(Unavailable) as caught:  # the library's own message names the library's spelling
        resolve(Request(accelerator=NPU), Environment(), RULES)
    assert "probe().with_device_counts({'npu': 8})" in str(caught.value)


@pytest.mark.parametrize("fact", ["gpu-memory=40GiB", "host-memory=1TiB"])
def test_plan_with_assumed_memory_and_no_model_says_the_memory_is_unused(
    capsys: pytest.CaptureFixture[str], fact: str
) -> None:
    """`plan --assume gpu-memory=40GiB` printed the plan for 8 GPUs as if the memory had not been given."""
    code, out, err = run(capsys, "plan", "--no-probe", "--assume", "cuda=8", "--assume", fact, "--json")
    assert code == 0 and json.loads(out)["strategy"]["name"] == "ddp"  # stdout stays the JSON
    assert f"note: --assume {fact} is used only with a model's facts" in err
    assert "trainplan fit --params 7e9 --gpus 8x40GiB" in err


def test_plan_without_assumed_memory_prints_no_memory_note(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = run(capsys, "plan", "--no-probe", "--assume", "cuda=8")
    assert "used only with a model" not in err


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        # a count no machine has is refused as a count, with the limit (not "neither a number nor a list")
        (("--devices", "1" + "0" * 30), "more processes or devices than any one machine has (at most 4096)"),
        (("--devices", "1," + "9" * 30), "higher indices, than any machine has (at most 4096)"),
        (("--num-nodes", "-1"), "num_nodes=-1 is not accepted: it must be at least 1"),
        (("--num-nodes", "9" * 30), "more machines than any cluster has (at most 1000000)"),
        (("--strategy", "ddp", "--strategy-option", "timeout_seconds=1e30"), "int32 milliseconds: at most 2147483"),
        (("--strategy", "ddp", "--strategy-option", "timeout_seconds=" + "9" * 30), "at most 2147483"),
        (
            ("--devices", "[0, 2]"),
            "Python's list syntax: as text, indices are separated by commas alone. Write "
            "devices='0,2' (on the command line: --devices 0,2)",
        ),
        (("--env-file", ""), "--env-file '': no path given; name the .env file"),
        (("--strategy", "dpp"), "Did you mean strategy='ddp'?"),
        (("--strategy", "ddp", "--strategy-option", "timeout=5"), "Did you mean timeout_seconds=5?"),
        (("--strategy", "ddp", "--strategy-option", "static_grph=true"), "Did you mean static_graph=True?"),
        (
            ("--strategy", "model_parallel", "--strategy-option", "pp=2", "--strategy-option", "pp_microbatches=0"),
            "Write e.g. pp_microbatches=8, or leave it unset",
        ),
    ],
)
def test_a_misleading_input_is_refused_for_what_it_is(
    capsys: pytest.CaptureFixture[str], arguments: tuple[str, ...], words: str
) -> None:
    code, _, err = run(capsys, "plan", "--no-probe", "--assume", "cpu=4", "--accelerator", "cpu", *arguments)
    assert code == 2 and words in err, err
    for misleading in ("not str", "a int", "=None.", "neither a number", "strategy_options='", "--env-file .:"):
        assert misleading not in err, err
