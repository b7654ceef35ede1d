"""The rules are the decision procedure: no decision on a literal name outside the tables, every rule field read.

Both checks read the source (the AST), so they fail the moment someone writes `if accelerator == "cuda":` in the
resolver or adds a table field nothing reads.
"""

from __future__ import annotations

import ast
from pathlib import Path

import attrs
import pytest

import trainplan
from trainplan.spec import names, tables

SOURCE = Path(trainplan.__file__).parent

VOCABULARY: frozenset[str] = frozenset(
    {
        *names.ACCELERATOR_FLAGS,
        *names.STRATEGY_NAMES,
        *names.STRATEGY_FAMILIES,
        *names.LAUNCHERS,
        *names.CLUSTERS,
        *names.BACKENDS,
        *names.PRECISIONS,
    }
) - {"auto"}
"""Names a rule decides about. 'auto' is not one of them: it is the request's "decide for me"."""

DECIDING_MODULES = (
    "parse/legacy.py",
    "parse/normalise.py",
    "render/emit.py",
    "render/matrix.py",
    "resolve/cluster.py",
    "resolve/core.py",
    "resolve/mesh.py",
    "resolve/training.py",
    "resolve/world.py",
    "spec/rules.py",
)
"""Modules that decide from the rules: the pipeline, the cluster readers, the matrix, the mesh, the parsers of loose
input and old flags, the emitted jobs and the launched workers' world."""


def literal_decisions(path: Path) -> list[str]:
    """`x == "cuda"`, `x in ("cpu", "cuda")` and inline `{"ddp": ..., "fsdp": ...}` tables, as 'line: source'."""
    text = path.read_text()
    tree = ast.parse(text)
    found: list[str] = []

    def constants(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [item.value for item in node.elts if isinstance(item, ast.Constant) and isinstance(item.value, str)]
        return []

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            named = [value for operand in operands for value in constants(operand) if value in VOCABULARY]
            # The metrics store's values ('cpu', 'device') are a request field, not a rule's name.
            others = " ".join(ast.unparse(operand) for operand in operands)
            if named and "store" not in others:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Dict):
            keys = [key.value for key in node.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)]
            if len([key for key in keys if key in VOCABULARY]) >= 2:
                found.append(f"{node.lineno}: {ast.unparse(node)[:80]}")
    return found


@pytest.mark.parametrize("module", DECIDING_MODULES)
def test_no_decision_on_a_literal_name_outside_the_tables(module: str) -> None:
    assert literal_decisions(SOURCE / module) == [], f"{module} decides on literal names: move them into a row"


def test_the_check_finds_a_literal_decision() -> None:
    """The check itself can fail: the code the review quoted is found."""
    sample = SOURCE.parent / "__sample_literal__.py"
    code = 'def f(accelerator, family):\n    if accelerator == "xla":\n        return {"ddp": "ddp", "fsdp": "fsdp"}\n'
    tree_path = Path(__file__).with_name("_literal_sample.txt")
    del sample
    tree_path.write_text(code)
    try:
        found = literal_decisions(tree_path)
    finally:
        tree_path.unlink()
    assert [line.split(":")[0] for line in found] == ["2", "3"]


RULE_CLASSES = [
    value
    for value in vars(tables).values()
    if isinstance(value, type) and attrs.has(value) and value.__module__ == tables.__name__
]


def _attribute_reads() -> set[str]:
    """Every `something.name` read in trainplan outside the tables module (where rows are only written)."""
    reads: set[str] = set()
    for path in SOURCE.rglob("*.py"):
        if path.name == "tables.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                reads.add(node.attr)
    return reads


READS = _attribute_reads()


@pytest.mark.parametrize("rule_class", RULE_CLASSES, ids=lambda rule_class: rule_class.__name__)
def test_every_field_of_every_rule_has_a_reader(rule_class: type) -> None:
    unread = [field.name for field in attrs.fields(rule_class) if field.name not in READS]
    assert unread == [], f"{rule_class.__name__} fields nothing reads (read them, or remove them): {unread}"


def test_the_rule_classes_are_all_found() -> None:
    found = {rule_class.__name__ for rule_class in RULE_CLASSES}
    assert {"AcceleratorRule", "LauncherRule", "FamilyRule", "StrategyRule", "PrecisionRule", "BackendRule"} <= found
    assert {"ClusterRule", "AutoStrategyRule", "Rule", "LegacyStrategy"} <= found


def test_the_default_precision_is_written_once() -> None:
    """DEFAULT_PRECISION is the one source: the request's default and the rule set's are it."""
    assert trainplan.Request().precision == tables.DEFAULT_PRECISION == trainplan.BUILTIN_RULES.default_precision
    spelled = [
        f"{path.relative_to(SOURCE)}:{node.lineno}"
        for path in SOURCE.rglob("*.py")
        if path.name not in ("tables.py", "names.py")  # the row, and the Literal type that names every precision
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value == tables.DEFAULT_PRECISION
    ]
    assert spelled == []
