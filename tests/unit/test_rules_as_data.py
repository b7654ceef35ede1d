"""The rules are the decision procedure: no decision on a literal name outside the tables, every rule field read.

Both checks read the source (the AST), so they fail the moment someone writes `if accelerator == "cuda":` in the
resolver or adds a table field nothing reads.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import cast

import attrs
import pytest

import trainplan
from tests.downstream_rules import RULES as DOWNSTREAM_RULES
from trainplan.rules import DEFAULT_PRECISION, AcceleratorRule
from trainplan.spec import names

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

_DECIDING_RULE_MODULES = (
    "ruleset.py",
    "coherence.py",
    "extension.py",
    "row_checks.py",
    "option_checks.py",
    "__init__.py",
)
"""The modules of the rules package that hold no rows: the rule set, its checks, the options' checks, the package."""

ROWS_AND_VOCABULARY = (
    *sorted(
        path.relative_to(SOURCE).as_posix()
        for path in (SOURCE / "rules").glob("*.py")
        # the rule set's builder, its checks and the options' checks decide; the package re-exports
        if path.name not in _DECIDING_RULE_MODULES
    ),
    "spec/names.py",
)
"""The modules that hold names by right: the rows (the rules package's topics), and the vocabulary (`Literal` types
and their tuples)."""

DECIDING_MODULES = tuple(
    sorted(
        module
        for module in (path.relative_to(SOURCE).as_posix() for path in SOURCE.rglob("*.py"))
        if module not in ROWS_AND_VOCABULARY
    )
)
"""Every other module of trainplan, listed from the folders so that a new one is checked without an edit here: those
that decide from the rules (`parse`: loose input and old flags; `resolve`; `render`: the matrix, the emitted jobs,
explain; the rule set's builder), those that carry out what the rules decided (`effects`: launching, joining, metrics,
the runtime, the adapters; the CLI; the public face), and the records (`spec`: the plan, the options, the
environment, the request, the mesh), which read rows and never decide on a name."""

UNCHECKED_CONSTANTS = ("trainplan.rules", "trainplan.spec.names")
"""Modules whose constants hold literal names by right: the rules package (the rows) and the vocabulary itself
(`names.ACCELERATOR_FLAGS` is every accelerator flag: going through a whole vocabulary decides on no name)."""


# --------------------------------------------------------------------------------------------------
# No decision on a literal name outside the tables


def _strings(node: ast.AST | None) -> list[str]:
    """The string literals `node` evaluates to: itself, the items of a tuple, list or set (or of `frozenset(...)`),
    either branch of `a if c else b`, any operand of `a or b`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [value for item in node.elts for value in _strings(item)]
    if isinstance(node, ast.Starred):
        return _strings(node.value)
    if isinstance(node, ast.IfExp):
        return _strings(node.body) + _strings(node.orelse)
    if isinstance(node, ast.BoolOp):
        first = node.values[0]
        # `", ".join(items) or "none"` is text: the word a message shows for an empty list, not a name decided on.
        if isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute) and first.func.attr == "join":
            return []
        return [value for operand in node.values for value in _strings(operand)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set", "tuple"):
        return [value for argument in node.args for value in _strings(argument)]
    return []


def _named(node: ast.AST | None) -> list[str]:
    return [value for value in _strings(node) if value in VOCABULARY]


def _package_list(name: str) -> bool:
    """`OPTIONAL_PACKAGES`, `REPORTED_PACKAGES`: constants that list distributions to look for or report (the
    `deepspeed` package shares its name with a strategy; listing it, or going through the list, decides nothing)."""
    return name.rsplit(".", maxsplit=1)[-1].endswith("_PACKAGES")


OWN_VOCABULARY_FIELDS = frozenset({"wrapper", "emit"})
"""Attributes that hold a value of a vocabulary of its own, whose words share spellings with rule names: a row's
`wrapper` (`FamilyRecipe.wrapper`, a `WrapperName`: how the runtime carries out what the row decided, "ddp" wrapping
in DistributedDataParallel) and the CLI's `arguments.emit` (an `EmitFormat`: "slurm" is an sbatch script, not the
SLURM cluster rule). Comparing one with its words dispatches to what carries it out; mypy checks the words against
their `Literal`."""

OWN_VOCABULARY_TYPES = frozenset({"OffloadDevice"})
"""`Literal` types of another tool's vocabulary that shares a spelling with a rule name: DeepSpeed's offload device
`"cpu"` (host memory, DeepSpeed's own word), the default of an annotated field."""

NAMING_CALLS = frozenset({"getattr", "hasattr", "flatten"})
"""Calls whose string arguments name an attribute or a mesh dimension of torch's (`getattr(torch.version, "cuda")`,
`mesh._flatten(..., "dp")`, torchtitan's name for the data-parallel dimension), not a rule's name."""


def _module_constants(path: Path) -> dict[str, list[str]]:
    """The string literals of each module-level constant of `path`."""
    constants: dict[str, list[str]] = {}
    for statement in ast.parse(path.read_text()).body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            constants.update(
                {target.id: _strings(statement.value) for target in targets if isinstance(target, ast.Name)}
            )
    return constants


def _source_of(module: str) -> Path | None:
    """The file of a trainplan module (None: not trainplan's, or one of `UNCHECKED_CONSTANTS`)."""
    if any(module == unchecked or module.startswith(unchecked + ".") for unchecked in UNCHECKED_CONSTANTS):
        return None
    if not module.startswith("trainplan."):
        return None
    base = SOURCE.joinpath(*module.split(".")[1:])
    return next((path for path in (base.with_suffix(".py"), base / "__init__.py") if path.exists()), None)


def _constants_in_reach(tree: ast.Module, path: Path) -> dict[str, list[str]]:
    """The constants `tree` can name: its own, those it imports by name from trainplan's modules, and those of a
    module it imports whole (`from trainplan.parse import normalise` lends `normalise.X`)."""
    reach = _module_constants(path)
    for statement in tree.body:
        if isinstance(statement, ast.ImportFrom) and statement.module is not None and statement.level == 0:
            source = _source_of(statement.module)
            for alias in statement.names:
                bound = alias.asname or alias.name
                whole = _source_of(f"{statement.module}.{alias.name}")
                if whole is not None:
                    reach.update({f"{bound}.{name}": value for name, value in _module_constants(whole).items()})
                elif source is not None:
                    reach[bound] = _module_constants(source).get(alias.name, [])
    return reach


class _LiteralDecisions(ast.NodeVisitor):
    """Every form of deciding on a vocabulary name written as a literal; one finding per line."""

    def __init__(self, constants: Mapping[str, list[str]]) -> None:
        self.constants = constants
        self.found: dict[int, str] = {}

    def flag(self, node: ast.AST, form: str) -> None:
        line = getattr(node, "lineno", 0)
        self.found.setdefault(line, f"{line}: {form}: {ast.unparse(node)[:100]}")

    def bound(self, node: ast.AST) -> list[str]:
        """The literals of the constant `node` names (`NAME` or `module.NAME`), if it names one."""
        return self.constants.get(ast.unparse(node), []) if isinstance(node, (ast.Name, ast.Attribute)) else []

    def visit_Compare(self, node: ast.Compare) -> None:  # x == "cuda", x in ("cpu", "cuda"), x in GPU_NAMES
        operands = (node.left, *node.comparators)
        carried = any(
            isinstance(operand, ast.Attribute) and operand.attr in OWN_VOCABULARY_FIELDS for operand in operands
        )
        if not carried and any(_named(operand) or VOCABULARY.intersection(self.bound(operand)) for operand in operands):
            self.flag(node, "comparison")
        self.generic_visit(node)

    def visit_MatchValue(self, node: ast.MatchValue) -> None:  # case "cuda": (each side of case "a" | "b": too)
        # `case None` / `True` / `False` (ast.MatchSingleton) cannot hold a name: it needs no visit of its own.
        if _named(node.value):
            self.flag(node, "match")

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:  # case {"ddp": options}:
        if any(_named(key) for key in node.keys):
            self.flag(node, "match")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
        if method in ("startswith", "endswith"):  # x.startswith("deepspeed"), x.endswith("_offload"): part of a name
            pieces = [piece for argument in node.args for piece in [*_strings(argument), *self.bound(argument)]]
            if any(getattr(name, method)(piece) for piece in pieces if piece for name in VOCABULARY):
                self.flag(node, method)
        # A name handed on is a decided value: table.get("ddp"), detect("local", ...), Facts(kind="local").
        called = method or (node.func.id if isinstance(node.func, ast.Name) else "")
        handed = (*node.args, *(keyword.value for keyword in node.keywords)) if called not in NAMING_CALLS else ()
        if any(_named(argument) for argument in handed):
            self.flag(node, "argument")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:  # TABLE["ddp"]
        # `Literal["cuda", "mps"]` is a type (mypy checks the names against it), not a lookup: not looked into.
        if ast.unparse(node.value).split(".")[-1] == "Literal":
            return
        if _named(node.slice):
            self.flag(node, "subscript")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        if any(_named(default) for default in (*node.args.defaults, *node.args.kw_defaults)):  # def f(strategy="ddp")
            self.flag(node, "default")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    def visit_Return(self, node: ast.Return | ast.Yield) -> None:  # return "ddp_spawn"
        if _named(node.value):
            self.flag(node, "returned")
        self.generic_visit(node)

    visit_Yield = visit_Return

    def visit_Assign(self, node: ast.Assign | ast.AnnAssign | ast.AugAssign | ast.NamedExpr) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        packages = all(isinstance(target, ast.Name) and _package_list(target.id) for target in targets)
        annotation = ast.unparse(node.annotation) if isinstance(node, ast.AnnAssign) else ""
        own = packages or annotation in OWN_VOCABULARY_TYPES
        if _named(node.value) and not own:  # family = "ddp", GPU_NAMES = ("cuda", "mps")
            self.flag(node, "assigned")
        self.generic_visit(node)

    visit_AnnAssign = visit_AugAssign = visit_NamedExpr = visit_Assign

    def visit_For(self, node: ast.For | ast.comprehension) -> None:  # for name in ("cuda", "mps"):
        # Going through a whole list of packages (to find which are installed) decides on no name; asking whether a
        # name is one of them (`name in OPTIONAL_PACKAGES`) still does.
        packages = _package_list(ast.unparse(node.iter))
        if _named(node.iter) or (not packages and VOCABULARY.intersection(self.bound(node.iter))):
            self.flag(node.iter, "iterated")
        self.generic_visit(node)

    visit_comprehension = visit_For

    def visit_Set(self, node: ast.Set) -> None:  # {"cuda", "mps"}
        if _named(node):
            self.flag(node, "set")
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:  # {"ddp": ...}: a table outside the tables
        if any(_named(key) for key in node.keys):
            self.flag(node, "keyed")
        elif any(_named(value) for value in node.values):
            self.flag(node, "valued")
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        """An f-string is a message: the names in it are shown, not decided on (so it is not looked into)."""


def literal_decisions(path: Path) -> list[str]:
    """Every line of `path` that decides on a literal vocabulary name, as 'line: form: source'."""
    tree = ast.parse(path.read_text())
    visitor = _LiteralDecisions(_constants_in_reach(tree, path))
    visitor.visit(tree)
    return [visitor.found[line] for line in sorted(visitor.found)]


@pytest.mark.parametrize("module", DECIDING_MODULES)
def test_no_decision_on_a_literal_name_outside_the_tables(module: str) -> None:
    assert literal_decisions(SOURCE / module) == [], f"{module} decides on literal names: move them into a row"


def test_every_module_of_resolve_is_checked() -> None:
    assert {"resolve/pipeline.py", "resolve/steps/strategy.py", "render/report.py", "parse/legacy.py"} <= set(
        DECIDING_MODULES
    )
    assert len(DECIDING_MODULES) == len(set(DECIDING_MODULES)) > len(list((SOURCE / "resolve").rglob("*.py")))


def test_the_effects_the_cli_and_the_records_are_checked() -> None:
    """The thin layer and the records are checked too: every module of effects, the CLI, the face, the records;
    only the rows and the vocabulary are not."""
    effects = {path.relative_to(SOURCE).as_posix() for path in (SOURCE / "effects").glob("*.py")}
    records = {f"spec/{name}.py" for name in ("plan", "options", "environment", "request", "mesh")}
    records |= {f"rules/{name}" for name in _DECIDING_RULE_MODULES}
    assert effects | records | {"cli.py", "__init__.py"} <= set(DECIDING_MODULES)
    assert {"effects/launching.py", "effects/world.py", "effects/metrics.py", "effects/runtime.py"} <= effects
    assert set(ROWS_AND_VOCABULARY).isdisjoint(DECIDING_MODULES)
    assert all((SOURCE / module).exists() for module in ROWS_AND_VOCABULARY)


LITERAL_SAMPLE = '''\
from typing import Literal

from trainplan.effects import probing
from trainplan.effects.probing import OPTIONAL_PACKAGES
from trainplan.rules import GPU_ACCELERATORS

GPU_NAMES = ("cuda", "mps")  # found: assigned


def choose(accelerator: Literal["cpu", "cuda"], name, table, strategy="ddp"):  # found: default
    """Choose "cuda" (a docstring is no decision)."""
    if accelerator == "xla":  # found: comparison
        return {"ddp": 1, "fsdp": 2}  # found: keyed
    if accelerator in ("cpu", "cuda"):  # found: comparison
        family = "ddp"  # found: assigned
    if accelerator in GPU_NAMES:  # found: comparison
        return "ddp_spawn"  # found: returned
    if name in OPTIONAL_PACKAGES:  # found: comparison
        yield name
    if name not in probing.OPTIONAL_PACKAGES:  # found: comparison
        yield name
    match accelerator:
        case "cuda" | "mps":  # found: match
            pass
        case {"fsdp": options}:  # found: match
            pass
        case None:
            pass
    if name.startswith("deepspeed_stage"):  # found: startswith
        pass
    if name.endswith("_offload"):  # found: endswith
        pass
    rule = table["ddp"]  # found: subscript
    values = {"strategy": "model_parallel"}  # found: valued
    rule = table.get("fsdp")  # found: argument
    rule = dict(kind="local")  # found: argument
    {"cuda", "mps"}.issuperset(name)  # found: set
    for each in ("gloo", "nccl"):  # found: iterated
        pass
    if accelerator in GPU_ACCELERATORS:
        message = f"{accelerator!r} is not 'cuda'; use 'cpu'"
    if table.wrapper == "ddp" or getattr(name, "cuda", None) or hasattr(name, "xla") or table.emit == "slurm":
        name.flatten(("dp_replicate", "dp_shard"), "dp")
    offload: OffloadDevice = "cpu"
    chosen: AcceleratorName = "cpu"  # found: assigned
    if table.family == "ddp":  # found: comparison
        pass
    if name in PACKAGES_SEEN:  # found: comparison
        pass
    found = getattr(name, "cuda") or table.get(name, "cuda")  # found: argument
    shown = ", ".join(name) or "none"
    return rule, message, shown, name.startswith("MIG-"), found, offload, chosen, [each for each in OPTIONAL_PACKAGES]


REPORTED_PACKAGES = ("deepspeed", "torch_xla")
PACKAGES_SEEN = ("deepspeed", "torch_xla")  # found: assigned
'''
"""One line per form the check finds (marked `# found: form`) and the lines it must pass by: a Literal annotation,
a docstring, a table's constant, an f-string message, the placeholder of an empty list, an unrelated prefix, a
row's wrapper kind or an emitted format (`OWN_VOCABULARY_FIELDS`), another tool's typed word
(`OWN_VOCABULARY_TYPES`), an attribute or mesh dimension named to torch (`NAMING_CALLS`), a list of
packages (`*_PACKAGES`); each passed form has a found neighbour (a row's `family`, a vocabulary-typed default, a
constant not of packages, a name handed on beside a getattr)."""


def test_the_check_finds_a_literal_decision(tmp_path: Path) -> None:
    """The check itself can fail: each form of deciding on a literal name is found, on its own line, and nothing
    else is."""
    sample = tmp_path / "sample.py"
    sample.write_text(LITERAL_SAMPLE)
    found = [line.split(": ")[:2] for line in literal_decisions(sample)]
    marked = [
        [str(number), line.split("# found: ")[1]]
        for number, line in enumerate(LITERAL_SAMPLE.splitlines(), start=1)
        if "# found: " in line
    ]
    assert found == marked
    assert len({form for _, form in marked}) == 13


# --------------------------------------------------------------------------------------------------
# Every field of every rule has a reader


RULE_MODULES = [
    importlib.import_module(f"trainplan.rules.{path.stem}")
    for path in sorted((SOURCE / "rules").glob("*.py"))
    if path.stem != "__init__"
]
"""The modules of the rules package (each topic's rows, and the rule set's value)."""

RULE_CLASSES = [
    value
    for module in RULE_MODULES
    for value in vars(module).values()
    if isinstance(value, type)
    and attrs.has(value)
    and value.__module__ == module.__name__
    # the rule set itself and its builder's records: the rows' holders, not rows
    and module.__name__ not in {f"trainplan.rules.{name.removesuffix('.py')}" for name in _DECIDING_RULE_MODULES}
]

_RULE_CLASS_NAMES = frozenset(rule_class.__name__ for rule_class in RULE_CLASSES)
_WORD = re.compile(r"\w+")
_HANDING_ON = frozenset(
    {"lookup", "get", "values", "items", "pop", "next", "iter", "sorted", "reversed", "tuple", "list", "filter"}
    | {"frozenset", "set", "min", "max", "evolve"}
)
"""Calls whose result holds rows of what they are given: `lookup(TABLE, key)`, `TABLE.get(key)`, `TABLE.values()`,
`next(rows)`, `sorted(rows, key=...)`, `attrs.evolve(row, ...)`."""


def _classes_named(annotation: ast.AST | None) -> set[str]:
    """The rule classes an annotation names (`AcceleratorRule | None`, `Mapping[str, ClusterRule]`, a string)."""
    return set(_RULE_CLASS_NAMES.intersection(_WORD.findall(ast.unparse(annotation)))) if annotation else set()


class _Rows:
    """Which rule classes' rows each expression of one scope may hold: names bound from tables, lookups, rule
    fields, functions annotated as returning rows, and parameters annotated with a rule class."""

    def __init__(self, program: _Program, names: dict[str, set[str]], modules: dict[str, Path]) -> None:
        self.program = program
        self.names = names
        self.modules = modules

    def of(self, node: ast.AST) -> set[str]:
        if isinstance(node, ast.Name):
            return self.names.get(node.id, set()) | ({node.id} & _RULE_CLASS_NAMES)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id in self.modules:  # CLUSTERS
                return set(self.program.exports.get(self.modules[node.value.id], {}).get(node.attr, set()))
            return set(self.program.attributes.get(node.attr, set()))  # rules.clusters, rule.job_port
        if isinstance(node, (ast.Subscript, ast.Starred)):
            return self.of(node.value)
        if isinstance(node, ast.Call):
            receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
            called = node.func.attr if isinstance(node.func, ast.Attribute) else ast.unparse(node.func)
            found = self.program.functions.get(called, set()) | ({called} & _RULE_CLASS_NAMES)
            if called in _HANDING_ON:  # table.values(), table.get(key); lookup(table, key), attrs.evolve(row)
                given = [receiver] if receiver is not None and called != "evolve" else node.args[:1]
                found |= {name for argument in given for name in self.of(argument)}
            return found
        if isinstance(node, ast.IfExp):
            return self.of(node.body) | self.of(node.orelse)
        if isinstance(node, (ast.BoolOp, ast.Tuple, ast.List, ast.Set)):
            parts = node.values if isinstance(node, ast.BoolOp) else node.elts
            return {name for part in parts for name in self.of(part)}
        if isinstance(node, (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
            return self.of(node.elt)
        if isinstance(node, ast.DictComp):
            return self.of(node.value)
        return set()

    def bind(self, target: ast.AST, classes: set[str]) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name) and classes:
                self.names.setdefault(node.id, set()).update(classes)

    def learn(self, scope: ast.AST) -> None:
        """Bind every name of `scope` (flow-insensitive: a name bound twice may hold either)."""
        for node in ast.walk(scope):
            if isinstance(node, ast.arg):
                self.bind(ast.Name(node.arg), _classes_named(node.annotation))
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    self.bind(target, self.of(node.value))
            elif isinstance(node, ast.AnnAssign):
                self.bind(node.target, _classes_named(node.annotation) | (self.of(node.value) if node.value else set()))
            elif isinstance(node, ast.NamedExpr):
                self.bind(node.target, self.of(node.value))
            elif isinstance(node, (ast.For, ast.comprehension)):
                self.bind(node.target, self.of(node.iter))
            elif isinstance(node, ast.Call) and node.args:  # sorted(rows, key=lambda rule: rule.priority)
                for keyword in node.keywords:
                    if isinstance(keyword.value, ast.Lambda):
                        for argument in keyword.value.args.args:
                            self.bind(ast.Name(argument.arg), self.of(node.args[0]))


class _Program:
    """trainplan's sources, read for `row.field` where `row` is known to hold a row of a rule class."""

    def __init__(self, trees: Mapping[Path, ast.Module]) -> None:
        self.trees = trees
        self.attributes: dict[str, set[str]] = {}  # class-level fields annotated with rows (Rules.clusters)
        self.functions: dict[str, set[str]] = {}  # functions and methods annotated as returning rows
        for tree in trees.values():
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    for field in node.body:
                        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
                            self.attributes.setdefault(field.target.id, set()).update(_classes_named(field.annotation))
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.functions.setdefault(node.name, set()).update(_classes_named(node.returns))
        self.exports: dict[Path, dict[str, set[str]]] = {}
        for _ in range(2):  # a module's constants may come from another's (imports in any order)
            for path, tree in trees.items():
                self.exports[path] = self.module_rows(tree).names

    def module_path(self, module: str) -> Path | None:
        base = SOURCE.joinpath(*module.split(".")[1:])
        paths = (base.with_suffix(".py"), base / "__init__.py")
        return next((path for path in paths if path in self.trees), None) if module.startswith("trainplan.") else None

    def module_rows(self, tree: ast.Module) -> _Rows:
        """What the module's own constants and its imports from trainplan hold."""
        rows = _Rows(self, {}, {})
        for statement in tree.body:
            if isinstance(statement, ast.ImportFrom) and statement.module is not None and statement.level == 0:
                source = self.module_path(statement.module)
                for alias in statement.names:
                    whole = self.module_path(f"{statement.module}.{alias.name}")
                    if whole is not None:
                        rows.modules[alias.asname or alias.name] = whole
                    elif source is not None:
                        rows.bind(
                            ast.Name(alias.asname or alias.name), self.exports.get(source, {}).get(alias.name, set())
                        )
        for _ in range(2):
            for statement in tree.body:
                if isinstance(statement, ast.Assign):
                    for target in statement.targets:
                        rows.bind(target, rows.of(statement.value))
                elif isinstance(statement, ast.AnnAssign):
                    value = rows.of(statement.value) if statement.value else set()
                    rows.bind(statement.target, _classes_named(statement.annotation) | value)
        return rows

    def reads(self, paths: Iterable[Path]) -> set[tuple[str, str]]:
        """(rule class, field) for each `row.field` read in `paths`, scope by scope (a function, a method, a
        module-level statement)."""
        found: set[tuple[str, str]] = set()
        for path in paths:
            module = self.module_rows(self.trees[path])
            body = self.trees[path].body
            scopes = [
                (part, node.name if isinstance(node, ast.ClassDef) else None)
                for node in body
                for part in (node.body if isinstance(node, ast.ClassDef) else [node])
            ]
            for scope, owner in scopes:
                rows = _Rows(self, {name: set(classes) for name, classes in module.names.items()}, module.modules)
                if owner in _RULE_CLASS_NAMES:  # a rule class's own method reads its row as `self`
                    rows.names["self"] = {owner}
                for _ in range(2):
                    rows.learn(scope)
                for node in ast.walk(scope):
                    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                        found.update((rule_class, node.attr) for rule_class in rows.of(node.value))
        return found


@functools.cache
def _trainplan() -> _Program:
    return _Program({path: ast.parse(path.read_text()) for path in sorted(SOURCE.rglob("*.py"))})


@functools.cache
def _trainplan_reads() -> set[tuple[str, str]]:
    return _trainplan().reads(_trainplan().trees)


def _unread(rule_class: type, reads: set[tuple[str, str]]) -> list[str]:
    return [field.name for field in attrs.fields(rule_class) if (rule_class.__name__, field.name) not in reads]


@pytest.mark.parametrize("rule_class", RULE_CLASSES, ids=lambda rule_class: rule_class.__name__)
def test_every_field_of_every_rule_has_a_reader(rule_class: type) -> None:
    """Each field of each rule class is read off a row of that class, not merely by name: `.description` read off a
    plan, or off a `FamilyRule`, is no reader of `AcceleratorRule.description` (many fields share a name: name,
    description, accelerators, why_not, reason, fix). A row is known by a small inference over each function: a name
    bound from a table (`ACCELERATORS`, `rules.accelerators`, imported or not), from `lookup`/`.get`/`.values()`/
    `next`/`sorted` over one, from a rule field or function annotated with the class (`rule.job_port`,
    `precision_recipe(plan)`), a parameter annotated with it, or `self` in the class's own method. A table's own
    index (`{rule.name: rule for ...}` in the rules package) reads its key field. The inference errs towards
    "unread": a row reached through nothing annotated is not seen, and the test fails until its reader says what it
    holds; it is flow-insensitive within a function (a name bound to rows of two classes counts for both)."""
    unread = _unread(rule_class, _trainplan_reads())
    assert unread == [], f"{rule_class.__name__} fields nothing reads (read them, or remove them): {unread}"


READS_SAMPLE = """\
from trainplan.rules import hardware
from trainplan.rules import ACCELERATORS, FamilyRule, lookup


def described(plan, family: FamilyRule, name):
    shown = plan.description, family.description, family.why_not
    row = lookup(ACCELERATORS, name)
    return shown, row.host, [rule.device_type for rule in hardware.ACCELERATORS.values()]
"""


def test_a_field_is_read_only_off_a_row_of_its_class() -> None:
    """The check can fail: a field read under its name off something else (a plan, a row of another class) is not
    read, where the name-based check it replaces counted it."""
    sample = SOURCE / "_reads_sample.py"  # a path of the program only: nothing is written there
    program = _Program({**_trainplan().trees, sample: ast.parse(READS_SAMPLE)})
    reads = program.reads([sample])
    assert {("AcceleratorRule", "host"), ("AcceleratorRule", "device_type"), ("FamilyRule", "why_not")} <= reads
    assert ("FamilyRule", "description") in reads
    assert ("AcceleratorRule", "description") not in reads
    assert "description" in _unread(AcceleratorRule, reads)


def test_a_field_whose_only_reader_goes_is_unread() -> None:
    """`AcceleratorRule.slurm_gpus` is read in one place (the emitted SLURM job): without that read, it is unread."""
    emit = SOURCE / "render" / "emit.py"
    assert ("AcceleratorRule", "slurm_gpus") in _trainplan().reads([emit])
    without = _Program({**_trainplan().trees, emit: ast.parse(emit.read_text().replace(".slurm_gpus", ".gpus"))})
    assert ("AcceleratorRule", "slurm_gpus") not in without.reads(without.trees)


def test_the_rule_classes_are_all_found() -> None:
    found = {rule_class.__name__ for rule_class in RULE_CLASSES}
    assert {"AcceleratorRule", "LauncherRule", "FamilyRule", "StrategyRule", "PrecisionRule", "BackendRule"} <= found
    assert {"ClusterRule", "AutoStrategyRule", "Rule", "LegacyStrategy"} <= found


def test_the_default_precision_is_written_once() -> None:
    """DEFAULT_PRECISION is the one source: the request's default and the rule set's are it."""
    assert trainplan.Request().precision == DEFAULT_PRECISION == trainplan.BUILTIN_RULES.default_precision
    spelled = [
        f"{path.relative_to(SOURCE)}:{node.lineno}"
        for path in SOURCE.rglob("*.py")
        # the rows (which name that precision as they name every other), and the Literal type that names every one
        if not path.relative_to(SOURCE).as_posix().startswith(("rules/", "spec/names.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value == DEFAULT_PRECISION
    ]
    assert spelled == []


def _rows(value: object) -> list[attrs.AttrsInstance]:
    if attrs.has(type(value)):
        return [cast(attrs.AttrsInstance, value)]
    if isinstance(value, Mapping):
        return [row for item in value.values() for row in _rows(item)]
    if isinstance(value, (tuple, list, frozenset)):
        return [row for item in value for row in _rows(item)]
    return []


@pytest.mark.parametrize("rules", [trainplan.BUILTIN_RULES, DOWNSTREAM_RULES], ids=["builtin", "downstream"])
def test_no_rule_can_be_changed_in_place(rules: trainplan.Rules) -> None:
    """Every table of a rule set is read-only, and so is every map nested in a row (a `why_not`, a preset): a rule
    changed in place would make the memoised resolve and the cold path disagree."""
    tables_of_rules = [getattr(rules, field.name) for field in attrs.fields(trainplan.Rules)]
    rows = [row for table in tables_of_rules for row in _rows(table)]
    rows += [row for module in RULE_MODULES for value in vars(module).values() for row in _rows(value)]
    nested = [
        (type(row).__name__, field.name, getattr(row, field.name))
        for row in rows
        for field in attrs.fields(type(row))
        if isinstance(getattr(row, field.name), Mapping)
    ]
    assert len(nested) > 50
    for table in tables_of_rules:
        if isinstance(table, Mapping):
            with pytest.raises(TypeError):
                table["x"] = None  # type: ignore[index]
    for owner, name, value in nested:
        with pytest.raises(TypeError):
            value["x"] = None
        assert not isinstance(value, dict), f"{owner}.{name} is a plain dict"
