"""Machine readers: every `--json` output carries `version` and validates against the JSON Schema the package ships
(`trainplan/schemas/`); an error, a flag argparse refuses and `--check`'s problems are records on stdout too, with
their typed fields, and the exit code is the one the text form has."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import Any

import attrs
import jsonschema
import pytest

from trainplan.cli import main
from trainplan.render.records import JSON_VERSION, plain
from trainplan.spec.gpus import GpuStatus


def schema(name: str) -> dict[str, Any]:
    text = importlib.resources.files("trainplan").joinpath(f"schemas/{name}.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    jsonschema.Draft202012Validator.check_schema(loaded)
    return loaded


def run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, Any, str]:
    try:
        code = main(list(arguments))
    except SystemExit as exit:  # a refusal exits as the text form does
        code = int(exit.code or 0)
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("plan", ("plan", "--no-probe", "--assume", "cuda=8", "--devices", "0,2", "--json")),
        (
            "plan",
            (
                "plan",
                "--no-probe",
                "--assume",
                "cuda=8",
                "--strategy-option",
                "tp=2",
                "--strategy",
                "model_parallel",
                "--devices",
                "8",
                "--json",
            ),
        ),
        ("plan", ("fit", "--params", "7e9", "--gpus", "8x40GiB", "--json")),  # its memory table
        ("probe", ("probe", "--no-probe", "--json")),
        ("migrate", ("migrate", "--gpus", "2", "--accelerator", "ddp", "--json")),
        ("gpus", ("gpus", "--json")),
        ("env", ("env", "--json")),
        ("problems", ("plan", "--no-probe", "--check", "--json")),
        ("matrix", ("matrix", "--json")),
        ("version", ("--version", "--json")),
        ("version", ("--json", "--version")),
        ("completion", ("completion", "fish", "--json")),
        ("completion", ("--json", "completion", "bash")),
    ],
)
def test_every_json_output_is_versioned_and_valid(
    capsys: pytest.CaptureFixture[str], name: str, arguments: tuple[str, ...]
) -> None:
    code, record, _ = run(capsys, *arguments)
    assert code == 0 and record["version"] == JSON_VERSION
    jsonschema.validate(record, schema(name))


def test_a_gpu_record_fits_its_schema() -> None:
    status = GpuStatus(
        index=0,
        uuid="GPU-1",
        name="H200",
        memory_total=1,
        memory_used=0,
        usable=False,
        reason="busy",
        checked_by="nvml",
    )
    jsonschema.validate({"version": 1, "gpus": [plain(attrs.asdict(status))]}, schema("gpus"))


@pytest.mark.parametrize(
    ("arguments", "kind", "fields"),
    [
        (("plan", "--no-probe", "--devices", "x", "--json"), "InvalidRequest", {"field": "devices", "value": "x"}),
        (
            ("plan", "--no-probe", "--assume", "cuda=2", "--precision", "64-true", "--strategy", "fsdp", "--json"),
            "Incompatible",
            {"rule": "precision-strategy"},
        ),
        (("plan", "--bogus", "--json"), "UsageError", {"command": "trainplan plan", "value": "--bogus"}),
        (
            ("plan", "--stratgy", "ddp", "--json"),
            "UsageError",
            {"command": "trainplan plan", "value": "--stratgy", "suggestion": "--strategy"},
        ),
        (("launch", "--monitor-interval", "5", "--json", "x.py"), "UsageError", {"command": "trainplan launch"}),
        (("plan", "--emit", "torchrn", "--json"), "UsageError", {"command": "trainplan plan"}),
        (("frobnicate", "--json"), "UsageError", {"value": "frobnicate", "suggestion": None}),
        (("--json", "matrx"), "UsageError", {"value": "matrx", "suggestion": "`trainplan matrix`"}),
        (("gpus", "x", "--json"), "CliError", {}),
    ],
)
def test_an_error_is_a_record_on_stdout_with_the_same_exit_code(
    capsys: pytest.CaptureFixture[str], arguments: tuple[str, ...], kind: str, fields: dict[str, object]
) -> None:
    code, record, err = run(capsys, *arguments)
    assert code == 2 and record["exit_code"] == 2 and err == ""
    jsonschema.validate(record, schema("error"))
    assert record["error"]["type"] == kind and record["error"]["message"]
    assert fields.items() <= record["error"].items()
    # The same command without --json: the text form, the same code.
    plain_arguments = [word for word in arguments if word != "--json"]
    with pytest.raises(SystemExit) as exit:
        main(plain_arguments)
    assert exit.value.code == 2
    text = capsys.readouterr().err
    # one line, one prefix: "trainplan: error: trainplan plan has no flag ...", never "trainplan: error: trainplan:"
    assert text.startswith("trainplan: error: ") and text.count("trainplan:") == 1 and text.count("\n") == 1
    assert record["error"]["message"] in text


def test_the_version_and_the_completion_as_records_say_what_the_text_says(capsys: pytest.CaptureFixture[str]) -> None:
    import trainplan

    assert run(capsys, "--version", "--json")[1]["trainplan"] == trainplan.__version__
    code, record, _ = run(capsys, "completion", "zsh", "--json")
    assert code == 0 and record["shell"] == "zsh"
    assert main(["completion", "zsh"]) == 0
    assert capsys.readouterr().out == record["script"] + "\n"


def test_json_written_with_a_value_still_asks_for_a_record(capsys: pytest.CaptureFixture[str]) -> None:
    code, record, _ = run(capsys, "plan", "--no-probe", "--json=yes")
    assert code == 2 and record["error"]["type"] == "UsageError" and "--json" in record["error"]["message"]


def test_check_lists_every_problem_as_a_record(capsys: pytest.CaptureFixture[str]) -> None:
    arguments = ("plan", "--no-probe", "--accelerator", "cuda", "--precision", "64-true", "--strategy", "fsdp")
    code, record, _ = run(capsys, *arguments, "--check", "--json")
    assert code == 2
    jsonschema.validate(record, schema("problems"))
    assert [problem["type"] for problem in record["problems"]] == ["Unavailable", "Incompatible"]
    assert record["problems"][1]["values"] == {"precision": "64-true", "strategy": "fsdp"}
    bad = run(capsys, "plan", "--no-probe", "--devices", "x", "--check", "--json")[1]
    assert bad["problems"][0]["field"] == "devices"


def test_dir_of_the_package_lists_the_public_names_only() -> None:
    import trainplan

    names = [name for name in dir(trainplan) if name in trainplan.__all__ or not name.startswith("__")]
    assert names == sorted(trainplan.__all__)
    for leaked in ("Iterator", "TYPE_CHECKING", "annotations", "importlib", "_LAZY"):
        assert leaked not in dir(trainplan)


def test_gpus_short_under_json_is_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, record, _ = run(capsys, "gpus", "4097", "--json", "--timeout", "5")  # more than any machine has
    assert code == 2 and "error" in record and "gpus" not in record  # json.loads read exactly one document


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        (("plan", "--no-probe", "--json", "--emit", "torchrun", "--", "x.py"), "--json and --emit torchrun"),
        (("launch", "--json", "--devices", "x", "x.py"), "devices='x' is not accepted"),
    ],
)
def test_what_cannot_be_printed_together_or_run_is_a_record(
    capsys: pytest.CaptureFixture[str], arguments: tuple[str, ...], words: str
) -> None:
    code, record, _ = run(capsys, *arguments)
    assert code == 2 and words in record["error"]["message"]


def test_a_closed_stdout_is_said_on_stderr_with_exit_2() -> None:
    import os
    import subprocess
    import sys

    from tests.helpers import child_environment

    for arguments in (["plan", "--json"], ["env"], ["matrix"]):
        result = subprocess.run(  # `trainplan ... >&-`: the command starts with no stdout at all
            [sys.executable, "-m", "trainplan.cli", *arguments],
            stderr=subprocess.PIPE,
            text=True,
            env=child_environment(),
            timeout=60,
            check=False,
            preexec_fn=lambda: os.close(1),
        )
        assert result.returncode == 2 and "stdout is closed" in result.stderr, arguments


def test_a_launch_with_its_stdout_closed_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    """docs/cli.md: every command started with `>&-` says so and exits 2. A launch ran its workers, dropped all they
    printed without a word, and exited 0."""
    import os
    import subprocess
    import sys

    from tests.helpers import child_environment

    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\nprint('hello')\n")
    result = subprocess.run(
        [sys.executable, "-m", "trainplan.cli", "launch", "--accelerator", "cpu", "--devices", "1", str(script)],
        stderr=subprocess.PIPE,
        text=True,
        env=child_environment(),
        timeout=120,
        check=False,
        preexec_fn=lambda: os.close(1),
    )
    assert result.returncode == 2 and "stdout is closed" in result.stderr, result.stderr
    assert not marker.exists()


def test_check_and_emit_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["plan", "--no-probe", "--check", "--emit", "slurm", "--", "x.py"])
    assert exit.value.code == 2 and "--check and --emit slurm" in capsys.readouterr().err
