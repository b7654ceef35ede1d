"""Each subcommand's --help has a description and two examples, and every example runs as written (those that
start workers are parsed by the same parser); shell completion answers for bash, zsh and fish through argcomplete."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from tests.helpers import child_environment
from trainplan.cli import COMMAND_HELP, COMPLETION_SHELLS, SUBCOMMANDS, _parser, main


def test_every_subcommand_has_a_description_and_two_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert set(COMMAND_HELP) == set(SUBCOMMANDS)
    for name in SUBCOMMANDS:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        text = capsys.readouterr().out
        description, examples = COMMAND_HELP[name]
        assert " ".join(description.split()[:6]) in " ".join(text.split()), name
        assert len(examples) >= 2 and "examples:" in text
        assert all(f"  {example}" in text for example in examples), name


EXAMPLES = [example for _, examples in COMMAND_HELP.values() for example in examples]


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_runs_as_written(
    example: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    words = shlex.split(example.split(" > ", maxsplit=1)[0])
    if words[0] == "eval":
        words = shlex.split(words[1].removeprefix("$(").removesuffix(")"))
    assert words[0] == "trainplan"
    if words[1] == "launch":  # it would start workers: the parser takes it as written
        arguments = _parser().parse_args(words[1:])
        assert arguments.script
        return
    monkeypatch.chdir(os.path.dirname(__file__))
    assert main(words[1:]) == 0, example
    assert capsys.readouterr().out.strip()


@pytest.mark.parametrize("shell", COMPLETION_SHELLS)
def test_completion_code_for_each_shell(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", shell]) == 0
    code = capsys.readouterr().out
    assert "trainplan" in code and "_ARGCOMPLETE" in code
    if shell == "bash":
        subprocess.run(["bash", "-n"], input=code, text=True, check=True)


@pytest.mark.parametrize(
    ("line", "wanted"),
    [
        ("trainplan la", "launch"),
        ("trainplan plan --prec", "--precision"),
        ("trainplan plan --precision bf", "bf16-mixed"),
        ("trainplan plan --strategy fsdp_", "fsdp_cpu_offload"),
        ("trainplan launch --accelerator c", "cuda"),
        ("trainplan plan --cluster sl", "slurm"),
    ],
)
def test_the_shell_gets_completions(line: str, wanted: str) -> None:
    read, write = os.pipe()
    environment = child_environment(
        _ARGCOMPLETE="1", _ARGCOMPLETE_IFS="\v", COMP_LINE=line, COMP_POINT=str(len(line)), COMP_TYPE="9"
    )
    code = f"import os; os.dup2({write}, 8); from trainplan.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", code], env=environment, pass_fds=(write,), capture_output=True, timeout=60, check=False
    )
    os.close(write)
    with os.fdopen(read) as answers:
        completions = answers.read().split("\v")
    assert result.returncode == 0, result.stderr
    assert wanted in [completion.strip() for completion in completions]
