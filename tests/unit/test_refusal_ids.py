"""Every refusal id is typed and every template fills: `RefusalId` names exactly the rows of `rules.RULES`, and at
each place a refusal is built from a literal id, the values and fields passed name every placeholder of its reason
and fix, so no template raises KeyError at run time (tests/unit/test_rules.py reaches every row through resolve)."""

from __future__ import annotations

import ast
import string
from pathlib import Path
from typing import get_args

import pytest

import trainplan
from trainplan.rules import RULES, RefusalId, Rule

SOURCE = Path(trainplan.__file__).parent

BUILDERS: dict[str, tuple[int, frozenset[str]]] = {
    "incompatible": (1, frozenset()),
    "refuse": (1, frozenset({"world_size", "layout", "fitting"})),  # resolve.mesh._World.refuse
}
"""The functions that build a refusal from an id: where their values mapping sits, and the fields they add."""


BY_ID: dict[str, Rule] = dict(RULES.items())
"""The rows by their id as the code spells it (a string, until it is checked to be a row's)."""


def placeholders(rule: Rule) -> set[str]:
    """The names the reason and fix templates of a refusal read."""
    parsed = [*string.Formatter().parse(rule.reason), *string.Formatter().parse(rule.fix)]
    return {field.split(".")[0].split("[")[0] for _, field, _, _ in parsed if field}


def _dict_keys(node: ast.expr | None, scope: ast.AST) -> set[str] | None:
    """The keys of a dict literal, or of the dict literal a name of the scope was last bound to; None if unknown."""
    if isinstance(node, ast.Name):
        bound = [
            statement.value
            for statement in ast.walk(scope)
            if isinstance(statement, ast.Assign)
            and any(isinstance(target, ast.Name) and target.id == node.id for target in statement.targets)
        ]
        node = bound[-1] if bound else None
    if isinstance(node, ast.Dict) and all(isinstance(key, ast.Constant) for key in node.keys):
        return {str(key.value) for key in node.keys if isinstance(key, ast.Constant)}
    return None


def built_refusals(tree: ast.Module) -> list[tuple[int, str, set[str] | None]]:
    """(line, id, the names passed) for each refusal built from a literal id; the names are None where a mapping of
    unknown keys is passed (`**fields`, or a values mapping built elsewhere)."""
    found: dict[int, tuple[int, str, set[str] | None]] = {}
    scopes = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:  # a nested function's calls are found again in it: the innermost scope's reading stands
        for call in ast.walk(scope):
            if not isinstance(call, ast.Call) or not call.args:
                continue
            function = call.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            first = call.args[0]
            if name not in BUILDERS or not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            position, added = BUILDERS[name]
            keys = _dict_keys(call.args[position], scope) if len(call.args) > position else set()
            named = {keyword.arg for keyword in call.keywords if keyword.arg is not None}
            spread = any(keyword.arg is None for keyword in call.keywords)
            passed = None if spread or keys is None else keys | named | added
            if keys is None and not spread:
                passed = named | added  # the values' keys unknown: the fields alone must name what they do not
            found[id(call)] = (call.lineno, first.value, passed)
    return sorted(found.values())


CALLS = [
    (f"{path.relative_to(SOURCE)}:{line}", rule_id, passed)
    for path in sorted(SOURCE.rglob("*.py"))
    for line, rule_id, passed in built_refusals(ast.parse(path.read_text()))
]


def test_the_refusal_ids_are_the_rows() -> None:
    ids = get_args(RefusalId)
    assert len(set(ids)) == len(ids) and set(ids) == set(RULES)


@pytest.mark.parametrize("rule_id", list(RULES))
def test_every_template_is_well_formed(rule_id: RefusalId) -> None:
    rule = RULES[rule_id]
    values = {name: f"<{name}>" for name in placeholders(rule)}
    assert rule.reason.format(**values) and rule.fix.format(**values)


@pytest.mark.parametrize(("where", "rule_id", "passed"), CALLS, ids=[where for where, _, _ in CALLS])
def test_every_refusal_built_names_its_placeholders(where: str, rule_id: str, passed: set[str] | None) -> None:
    assert rule_id in BY_ID, f"{where}: no refusal {rule_id!r}"
    if passed is not None:
        missing = placeholders(BY_ID[rule_id]) - passed
        assert not missing, f"{where}: {rule_id!r} reads {sorted(missing)}, which the call does not pass"


def test_the_scan_finds_a_missing_placeholder() -> None:
    sample = ast.parse(
        "def refuse_nodes(name):\n"
        "    return incompatible('strategy-nodes', {'strategy': name})\n"  # {num_nodes} is not passed
        "def refuse_package(name, package):\n"
        "    values = {'strategy': name}\n"
        "    return incompatible('strategy-package', values, package=package)\n"
    )
    (_, nodes, passed_nodes), (_, package, passed_package) = built_refusals(sample)
    assert passed_nodes is not None and passed_package is not None
    assert placeholders(BY_ID[nodes]) - passed_nodes == {"num_nodes"}
    assert placeholders(BY_ID[package]) <= passed_package


def test_refusals_are_found_across_the_code() -> None:
    assert len({rule_id for _, rule_id, _ in CALLS}) >= 40
