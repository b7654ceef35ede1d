"""The layering contract: the core (spec, rules, parse, resolve, mapping, render) is pure and torch-free, spec imports
nothing above it, no module imports itself back through others; `import trainplan` skips torch."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import pytest

import trainplan

PACKAGE = Path(trainplan.__file__).parent
FORBIDDEN_IN_CORE = {
    "torch",
    "trainplan.effects",
    "trainplan.cli",
    "os",
    "sys",
    "time",
    "datetime",
    "random",
    "subprocess",
    "multiprocessing",
    "socket",
    "platform",
    "threading",
    "signal",
    "ctypes",
    "importlib",
}


def imported_modules(path: Path) -> set[str]:
    """What a module imports when it runs (an import under `if TYPE_CHECKING:` only names types for the checker)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
    return names


CORE = ("spec", "rules", "parse", "resolve", "mapping", "render")


def test_core_modules_import_nothing_impure() -> None:
    offenders = []
    for layer in CORE:
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            module = str(path.relative_to(PACKAGE))
            for name in imported_modules(path):
                if any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN_IN_CORE):
                    offenders.append(f"{module} imports {name}")
                if layer == "spec" and name.startswith("trainplan.") and not name.startswith("trainplan.spec"):
                    offenders.append(f"{module} imports {name}")  # the records reach up only through spec.entry
    assert offenders == []


def test_no_module_imports_itself_back() -> None:
    """No import cycle anywhere in trainplan (imports under `if TYPE_CHECKING:` never run, so they close none)."""
    import grimp

    graph = grimp.build_graph("trainplan", exclude_type_checking_imports=True)
    edges = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for imported in sorted(edges.get(module, ())):
            if state.get(imported) == 1:
                cycles.append([*path[path.index(imported) :], imported])
            elif imported in edges and imported not in state:
                visit(imported)
        path.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)
    assert cycles == [], " ; ".join(" -> ".join(cycle) for cycle in cycles)


def test_import_trainplan_does_not_import_torch() -> None:
    code = "import sys, trainplan, trainplan.cli\nassert 'torch' not in sys.modules, sorted(sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr


def test_public_functions_are_not_shadowed_by_their_modules() -> None:
    code = (
        "import trainplan.effects.probing, trainplan.effects.launching, trainplan\n"
        "from trainplan.effects import probe, launch\n"
        "assert callable(probe) and callable(launch), (probe, launch)\n"
        "assert callable(trainplan.probe) and callable(trainplan.launch) and callable(trainplan.resolve)\n"
        "assert 'launch' in dir(trainplan)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr


def test_import_trainplan_leaves_the_effects_unloaded() -> None:
    code = "import sys, trainplan\nassert 'trainplan.effects.launching' not in sys.modules\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr


def test_import_trainplan_builds_nothing_until_a_name_is_used() -> None:
    """`import trainplan` loads the face alone (and the records' entry-point seam): no record, rule set or attrs."""
    code = (
        "import sys, trainplan\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('trainplan'))\n"
        "assert loaded == ['trainplan', 'trainplan._version', 'trainplan.spec', 'trainplan.spec.entry'], loaded\n"
        "assert 'attrs' not in sys.modules and 'attr' not in sys.modules\n"
        "assert trainplan.Request().accelerator == 'auto' and trainplan.Plan.__name__ == 'Plan'\n"
        "assert callable(trainplan.resolve) and trainplan.BUILTIN_RULES.strategies\n"
        "import trainplan.resolve\n"  # the subpackage, imported after the face: the face's function stays
        "assert callable(trainplan.resolve) and trainplan.resolve.__module__ == 'trainplan'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("argv", "unloaded"),
    [
        (
            [],
            (
                "trainplan.effects.elastic",
                "trainplan.effects.launching",
                "trainplan.effects.report",
                "dotenv",
                "trainplan.effects.rules_loading",  # the --rules loader: only with --rules
                "trainplan.parse.legacy",  # the legacy bridge: migrate and Request.from_legacy
                "trainplan.parse.plan_json",  # the JSON wire format: --json and Plan.to_dict
                "trainplan.resolve.mesh",  # the device mesh: a model_parallel plan
            ),
        ),
        (["plan", "--json"], ("trainplan.effects.elastic", "trainplan.parse.legacy", "trainplan.resolve.mesh")),
        (["matrix"], ("trainplan.effects.elastic", "trainplan.effects.report", "trainplan.render.emit")),
        (["migrate", "--gpus", "2"], ("trainplan.effects.elastic", "trainplan.render.matrix")),
    ],
)
def test_the_cli_imports_only_the_subcommand_it_runs(argv: list[str], unloaded: tuple[str, ...]) -> None:
    code = (
        "import contextlib, io, sys\n"
        "from trainplan.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main({argv!r}) == 0\n"
        f"loaded = sorted(set({unloaded!r}) & set(sys.modules))\n"
        "assert loaded == [], loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_cli_builds_the_flags_of_the_subcommand_it_runs_alone() -> None:
    """Every subcommand is listed (`trainplan --help`, "invalid choice"), but only the running one gets its flags."""
    from trainplan.cli import SUBCOMMANDS, _parser

    def flags(parser: argparse.ArgumentParser) -> dict[str, int]:
        (commands,) = (action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
        return {name: len(subparser._actions) for name, subparser in commands.choices.items()}

    everything = flags(_parser())
    assert sorted(everything) == sorted(SUBCOMMANDS)
    for running in SUBCOMMANDS:
        built = flags(_parser(command=running))
        assert built[running] == everything[running]
        assert {name: count for name, count in built.items() if name != running} == dict.fromkeys(
            set(SUBCOMMANDS) - {running}, 1
        ), running  # the others have their -h alone
