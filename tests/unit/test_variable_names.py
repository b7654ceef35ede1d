"""Environment variable names are rows: no ALL_CAPS string literal (`"SLURM_NODEID"`, `"RANK"`) in `resolve/`.

The cluster readers, the launched workers' variables and the probe's list read the variable schemas in
the rules package (`ClusterRule.schemas`, `LAUNCHED_WORKERS`); a name spelled in the resolver instead is a rule
outside the tables. The check reads the source (the AST), so it fails the moment one is written.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import trainplan

SOURCE = Path(trainplan.__file__).parent

RESOLVER_MODULES = sorted(
    path.relative_to(SOURCE).as_posix()
    for package in ("parse", "resolve", "mapping", "render")
    for path in (SOURCE / package).rglob("*.py")
)

VARIABLE_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*", flags=re.ASCII)
"""What an environment variable's name looks like (and what a literal must not be)."""

NOT_VARIABLES: dict[str, dict[str, str]] = {
    "render/report.py": {
        **dict.fromkeys(
            ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "KEY", "APIKEY", "CREDENTIAL", "CREDENTIALS"),
            "a word of a secret variable's name (the bug report masks those variables)",
        ),
        "AUTH": "a word of a secret variable's name",
        "PRIVATE": "a word of a secret variable's name",
        "AKIA": "the start of an AWS access key, a value",
    },
}
"""ALL_CAPS literals in the resolver that are not variable names, each with what it is instead."""

TABLE_NAME_CALLS = frozenset({"lookup", "MissingRule"})
"""Calls whose `name=`/`table=` argument names a rule table (`ACCELERATORS`), not a variable."""

TYPE_NAME_CALLS = frozenset({"TypeVar", "ParamSpec", "TypeVarTuple", "NewType"})
"""Calls whose first argument names a type (`T = TypeVar("T")`)."""


def variable_name_literals(text: str) -> list[tuple[int, str]]:
    """Every string constant that reads as a variable name, as (line, name): except the names in `__all__`, the
    table names given to `lookup(..., name=...)` and `MissingRule(table=...)`, and type variables' names."""
    tree = ast.parse(text)
    exempt: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            exempt.update(id(constant) for constant in ast.walk(node.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in TABLE_NAME_CALLS:
            exempt.update(id(keyword.value) for keyword in node.keywords if keyword.arg in ("name", "table"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in TYPE_NAME_CALLS:
            exempt.update(id(argument) for argument in node.args[:1])
    found = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and VARIABLE_NAME.fullmatch(node.value)
        and id(node) not in exempt
    ]
    return [(node.lineno, str(node.value)) for node in sorted(found, key=lambda node: (node.lineno, node.col_offset))]


@pytest.mark.parametrize("module", RESOLVER_MODULES)
def test_no_variable_name_is_spelled_in_the_resolver(module: str) -> None:
    allowed = NOT_VARIABLES.get(module, {})
    found = variable_name_literals((SOURCE / module).read_text())
    spelled = [f"{line}: {name!r}" for line, name in found if name not in allowed]
    assert spelled == [], f"{module} spells variable names: read them from a schema row of the rules package"


def test_every_module_is_checked() -> None:
    assert {"resolve/cluster.py", "resolve/steps/layout.py", "mapping/workers.py", "parse/normalise.py"} <= set(
        RESOLVER_MODULES
    )


@pytest.mark.parametrize("module", sorted(NOT_VARIABLES))
def test_every_exception_is_still_there(module: str) -> None:
    """An exception that nothing needs any more is removed, so the list never hides a real name."""
    found = {name for _, name in variable_name_literals((SOURCE / module).read_text())}
    assert set(NOT_VARIABLES[module]) <= found


def test_the_check_finds_variable_names() -> None:
    """The check itself can fail: the reader code this replaced is found, line by line; the table names given to
    `lookup`, `__all__` and ordinary text are not."""
    code = (
        "def read(variables, rules):\n"
        '    rank = variables.get("SLURM_PROCID")\n'
        '    name = "NODE_RANK" if "NODE_RANK" in variables else "GROUP_RANK"\n'
        '    env = {"RANK": str(rank), "MASTER_PORT": "29500"}\n'
        '    rule = lookup(rules.clusters, "slurm", name="CLUSTERS")\n'
        '    return f"SLURM_NTASKS={rank}", "a Reason", "x"\n'
        '__all__ = ["MAX_HOSTS"]\n'
        'T = TypeVar("T")\n'
    )
    assert variable_name_literals(code) == [
        (2, "SLURM_PROCID"),
        (3, "NODE_RANK"),
        (3, "NODE_RANK"),
        (3, "GROUP_RANK"),
        (4, "RANK"),
        (4, "MASTER_PORT"),
    ]
