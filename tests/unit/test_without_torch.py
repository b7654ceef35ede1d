"""The planner installs without torch: every planning command works where torch cannot be imported, and every
part that needs torch says so with `MissingExtra` naming `trainplan[torch]`, never a raw ModuleNotFoundError.

A throwaway virtual environment would take minutes; instead each check runs in a fresh interpreter whose
`sitecustomize` puts `sys.modules["torch"] = None`, which is what Python itself does for a module that cannot
be imported: `import torch` (and `import torch.distributed`, and any package that imports torch) raises
ModuleNotFoundError(name="torch"), and `importlib.util.find_spec("torch")` answers None, as on a machine
without torch. The child processes that launches would start inherit the blocker through PYTHONPATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BLOCKER = textwrap.dedent(
    """
    import sys
    for name in ("torch", "torchmetrics", "pytorch_lightning", "lightning_fabric", "lightning", "accelerate"):
        sys.modules[name] = None  # as if not installed: import raises ModuleNotFoundError, find_spec gives None
    """
)

CLI = "import sys; from trainplan.cli import main; raise SystemExit(main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def without_torch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a process in which torch (and the frameworks built on it) cannot be imported."""
    folder = tmp_path_factory.mktemp("no-torch")
    (folder / "sitecustomize.py").write_text(BLOCKER)
    (folder / "train.py").write_text("print('never run')\n")
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("TRAINPLAN_", "SLURM_"))}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), environment.get("PYTHONPATH")]))
    environment["CUDA_VISIBLE_DEVICES"] = ""
    environment["TRAINPLAN_TEST_FOLDER"] = str(folder)
    return environment


def run(environment: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=environment["TRAINPLAN_TEST_FOLDER"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_blocker_really_blocks_torch(without_torch: dict[str, str]) -> None:
    code = (
        "import importlib.util\n"
        "assert importlib.util.find_spec('torch') is None\n"
        "try:\n    import torch.distributed\nexcept ModuleNotFoundError as error:\n"
        "    print('blocked', error.name.partition('.')[0])\n"
    )
    result = run(without_torch, sys.executable, "-c", code)
    assert result.returncode == 0 and result.stdout.strip() == "blocked torch", result.stderr


PLANNING_COMMANDS = [
    (),
    ("plan", "--json"),
    ("plan", "--assume", "cuda=8", "--strategy", "ddp", "--devices", "0,2,5", "--precision", "bf16-mixed"),
    ("plan", "--check", "--accelerator", "cuda", "--strategy", "fsdp", "--precision", "64"),
    ("plan", "--assume", "cuda=4", "--devices", "0,2", "--emit", "torchrun", "--", "train.py"),
    ("plan", "--assume", "cuda=4", "--devices", "4", "--num-nodes", "2", "--emit", "slurm", "--", "train.py"),
    ("probe",),
    ("probe", "--json"),
    ("matrix",),
    ("migrate", "--gpus", "2", "--accelerator", "ddp", "--precision", "16"),
    ("gpus",),
    ("gpus", "--json"),
    ("env",),
    ("env", "--json"),
    ("--version",),
]


def test_every_planning_command_works_without_torch(without_torch: dict[str, str]) -> None:
    # One interpreter for all of them (an interpreter start per command would be most of this test's time); each
    # command must leave torch unimported and end as it does with torch: 0, or 2 for --check's problems.
    code = textwrap.dedent(
        f"""
        import contextlib, io, sys
        from trainplan.cli import main
        for command in {PLANNING_COMMANDS!r}:
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(list(command))
                except SystemExit as exit_:
                    code = exit_.code
            expected = 2 if "--check" in command else 0
            assert code == expected, (command, code, err.getvalue())
            assert out.getvalue().strip(), (command, "printed nothing")
            assert sys.modules.get("torch") is None, command
            print("ok", *command)
        """
    )
    result = run(without_torch, sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("ok") == len(PLANNING_COMMANDS)


def test_env_says_torch_is_not_installed(without_torch: dict[str, str]) -> None:
    result = run(without_torch, sys.executable, "-m", "trainplan", "env")
    assert result.returncode == 0, result.stderr
    assert "- torch: not installed" in result.stdout and "trainplan[torch]" in result.stdout


def test_trainplan_launch_names_the_extra(without_torch: dict[str, str]) -> None:
    result = run(
        without_torch, sys.executable, "-c", CLI, "launch", "--accelerator", "cpu", "--devices", "2", "--", "train.py"
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "needs torch, which is not installed" in result.stderr and "pip install 'trainplan[torch]'" in result.stderr
    assert "Traceback" not in result.stderr and "never run" not in result.stdout


LIBRARY = textwrap.dedent(
    """
    import sys
    import trainplan as tp

    def need_extra(call, *args):
        try:
            call(*args)
        except tp.MissingExtra as error:
            assert error.framework == "torch" and "pip install 'trainplan[torch]'" in str(error), error
            assert isinstance(error, ImportError) and isinstance(error, tp.TrainplanError)
            return str(error)
        raise AssertionError(f"{call.__name__} did not refuse")

    def six() -> int:
        return 6

    one = tp.resolve(tp.Request(accelerator="cpu", devices=1))
    two = tp.resolve(tp.Request(accelerator="cpu", strategy="ddp_spawn", devices=2))

    # A one-process store of Python numbers needs no torch.
    store = tp.metric_store(one)
    store.log("loss", 1.0, weight=1)
    store.log("loss", 2.0, weight=3)
    store.log("tokens", 10, reduce="sum")
    store.log("best", 0.5, reduce="max")
    assert store.compute() == {"best": 0.5, "loss": 1.75, "tokens": 10}, store.compute()
    assert store.compute(sync=False) == store.compute()

    # One process inline needs no torch either: its world has no process group.
    assert tp.launch(one, six) == [6]
    with tp.join(one) as world:
        assert world.world_size == 1

    # Everything that needs torch says so, before anything starts.
    print(need_extra(tp.launch, two, six))
    store = tp.metric_store(two)
    store.log("loss", 1.0)
    need_extra(store.compute)
    need_extra(tp.runtime, one)
    need_extra(tp.fabric_arguments, one)
    need_extra(tp.lightning_trainer_arguments, one)
    need_extra(tp.accelerator_arguments, one)
    cuda = tp.resolve(tp.Request(accelerator="cuda", devices=1), tp.Environment(cuda_device_count=1))
    need_extra(tp.join, cuda)
    assert sys.modules.get("torch") is None
    print("LIBRARY OK")
    """
)


def test_the_library_without_torch(without_torch: dict[str, str]) -> None:
    script = Path(without_torch["TRAINPLAN_TEST_FOLDER"]) / "library.py"
    script.write_text(LIBRARY)
    result = run(without_torch, sys.executable, str(script))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.rstrip().endswith("LIBRARY OK")
    assert "trainplan.launch (starting 2 workers that join one process group) needs torch" in result.stdout
