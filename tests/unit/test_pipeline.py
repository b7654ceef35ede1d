"""The resolver is a recipe of named steps over one draft (`trainplan.resolve.pipeline.STEPS`), each step a module of
`resolve/steps/`, each function short enough to read at once; `check` runs the same steps and goes on past every
step that refuses, from that step's neutral choice, with no try block of its own per step."""

from __future__ import annotations

import ast
from pathlib import Path

import attrs
import pytest

import trainplan
from trainplan import Environment, Request, TrainplanError
from trainplan.resolve import check, pipeline
from trainplan.resolve.draft import Draft
from trainplan.resolve.memory import transformer_facts
from trainplan.spec.options import FSDPOptions, ModelParallelOptions

RESOLVE = Path(trainplan.__file__).parent / "resolve"
LONGEST = 60


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text())
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_function_in_resolve_is_over_60_lines() -> None:
    long = [
        f"{path.relative_to(RESOLVE.parent)}:{function.lineno} {function.name} "
        f"({(function.end_lineno or function.lineno) - function.lineno + 1} lines)"
        for path in sorted(RESOLVE.rglob("*.py"))
        for function in _functions(path)
        if (function.end_lineno or function.lineno) - function.lineno + 1 > LONGEST
    ]
    assert long == [], f"split these into named parts: {long}"


def test_the_length_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{index} = {index}\n" for index in range(LONGEST))
    sample = tmp_path / "sample.py"
    sample.write_text(f"def long():\n{body}")
    (function,) = _functions(sample)
    assert (function.end_lineno or 0) - function.lineno + 1 == LONGEST + 1


def test_every_step_module_is_a_named_step_of_the_recipe() -> None:
    names = [step.name for step in pipeline.STEPS]
    assert len(names) == len(set(names))
    modules = {step.run.__module__.rsplit(".", 1)[-1] for step in pipeline.STEPS}
    files = {path.stem for path in (RESOLVE / "steps").glob("*.py")} - {"__init__", "plan"}  # plan: resolve's end
    assert files == modules


def test_only_the_recipe_catches_a_steps_refusal() -> None:
    """One try block runs every step (the runner); inside the steps, only normalising catches, one field's row at a
    time (a refused field takes its row's default)."""

    def tries(node: ast.AST) -> int:
        return sum(isinstance(each, ast.Try) for each in ast.walk(node))

    steps = {path.name: tries(ast.parse(path.read_text())) for path in sorted((RESOLVE / "steps").glob("*.py"))}
    assert {name: count for name, count in steps.items() if count} == {"normalise.py": 1}
    (runner,) = [function for function in _functions(RESOLVE / "pipeline.py") if function.name == "_run"]
    assert tries(runner) == 1


TORCHRUN_OF_FOUR = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "0",
    "TORCHELASTIC_RUN_ID": "x",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}

GOES_ON: dict[str, tuple[Request, Environment, str]] = {
    "cluster": (
        Request(cluster="slurm", accelerator="cpu", devices=2, strategy="ddp", process_group_backend="nccl"),
        Environment(),
        "backend-accelerator",
    ),
    "accelerator": (
        Request(accelerator="cuda", strategy="fsdp", precision="64-true"),
        Environment(),
        "precision-strategy",
    ),
    "devices": (
        Request(accelerator="cpu", devices=[0, 1], strategy="ddp", process_group_backend="nccl"),
        Environment(),
        "backend-accelerator",
    ),
    "options": (
        Request(
            accelerator="cpu", devices=2, strategy="ddp", strategy_options=FSDPOptions(), process_group_backend="nccl"
        ),
        Environment(),
        "backend-accelerator",
    ),
    "launcher": (
        Request(accelerator="cpu", devices=2, strategy="ddp_fork", process_group_backend="nccl"),
        Environment(start_methods=("spawn",)),
        "backend-accelerator",
    ),
    "placement": (
        Request(accelerator="cpu", devices=1, num_nodes=1, strategy="ddp", process_group_backend="nccl"),
        Environment(variables=TORCHRUN_OF_FOUR),
        "backend-accelerator",
    ),
    "backend": (
        Request(
            accelerator="cpu", devices=2, strategy="ddp", process_group_backend="nccl", precision="transformer-engine"
        ),
        Environment(),
        "precision-accelerator",
    ),
    "precision": (
        Request(
            accelerator="cpu",
            devices=2,
            strategy="model_parallel",
            precision="transformer-engine",
            strategy_options=ModelParallelOptions(tp=3),
        ),
        Environment(),
        "mesh-remainder",
    ),
    "memory": (
        # facts that say no precision of their own: the request's is theirs
        Request(model=attrs.evolve(transformer_facts(parameters=70e9), precision=None), precision="transformer-engine"),
        Environment(cuda_device_count=1, cuda_memory_bytes=(24 << 30,), host_memory_bytes=64 << 30),
        "precision-package",
    ),
}
"""For each step that refuses: a request it refuses, on its environment, and the refusal of a later step that
`check` lists too (so `check` went on past the first)."""


def test_every_refusing_step_has_a_case() -> None:
    assert set(GOES_ON) == {step.name for step in pipeline.STEPS if step.instead is not None} - {"arguments"}


@pytest.mark.parametrize("name", sorted(GOES_ON))
def test_check_goes_on_past_a_step_that_refuses(name: str) -> None:
    request, env, later = GOES_ON[name]
    problems = list(check(request, env))
    draft = Draft(request=request, env=env, rules=trainplan.BUILTIN_RULES, collecting=False)
    refused_by, first = "", None
    for step in pipeline.STEPS:  # resolve's way: the first problem is raised, here in the step named
        try:
            step.run(draft)
        except TrainplanError as error:
            refused_by, first = step.name, error
            break
    assert refused_by == name
    assert repr(problems[0]) == repr(first)
    assert later in [getattr(problem, "rule", None) for problem in problems[1:]], problems


def test_check_lists_a_wrong_argument_and_nothing_after_it() -> None:
    problems = list(check("cpu", Environment()))  # type: ignore[arg-type]  # the wrong type, on purpose
    assert [getattr(problem, "field", None) for problem in problems] == ["request"]
