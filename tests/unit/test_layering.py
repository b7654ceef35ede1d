"""The layering contract: the core (spec, parse, resolve, render) is pure and torch-free; `import trainplan` skips
torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
    return names


SPEC_ENTRY_POINTS = {
    ("spec/request.py", "trainplan.parse"),
    ("spec/plan.py", "trainplan.parse.plan_json"),
    ("spec/plan.py", "trainplan.render.explain"),
}
"""The only imports from spec upwards: the records' own entry points (`Request.from_config`, `.from_legacy`, a plan
read back) hand their class to the parsers, which never import the records; `Plan.explain()` calls its renderer."""


def test_core_modules_import_nothing_impure() -> None:
    offenders = []
    for layer in ("spec", "parse", "resolve", "render"):
        for path in sorted((PACKAGE / layer).glob("*.py")):
            module = str(path.relative_to(PACKAGE))
            for name in imported_modules(path):
                if any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN_IN_CORE):
                    offenders.append(f"{module} imports {name}")
                if (
                    layer == "spec"
                    and name.startswith("trainplan.")
                    and not name.startswith("trainplan.spec")
                    and (module, name) not in SPEC_ENTRY_POINTS
                ):
                    offenders.append(f"{module} imports {name}")
    assert offenders == []


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
