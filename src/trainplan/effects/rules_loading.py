"""Finding a rule set by its reference ("package.module:NAME"): the one place a downstream module is imported, and
only when the caller named it.

- `load_rules` imports: the CLI's `--rules`, a launcher handing its workers the rule set its caller named.
- `loaded_rules` never imports: a reference that comes with data (a plan's `rules` field, `TRAINPLAN_PLAN`, an
  emitted job's `TRAINPLAN_RULES`) names a rule set this process already has, or is refused, with how to pass
  it. Reading a plan is never running code: `"rules": "this:RULES"` prints nothing.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping

import attrs

from trainplan.parse.plan_json import plan_from_json_text
from trainplan.rules import BUILTIN_RULES, LAUNCHER_RULES_VARIABLE, UNNAMED_RULES, Rules, is_rules_reference
from trainplan.spec.errors import InvalidRequest, a_kind
from trainplan.spec.plan import Plan


def _checked_reference(reference: object) -> str:
    if not isinstance(reference, str) or not is_rules_reference(reference):
        raise InvalidRequest(
            field="rules",
            value=reference,
            reason="a rule set is named by the module that builds it and its name there",
            fix="Write MODULE:NAME, e.g. myframework.trainplan_rules:RULES",
        )
    return reference


def _rules_in(module: object, reference: str) -> Rules:
    module_name, _, attribute = reference.partition(":")
    found: object = getattr(module, attribute, None)
    if not isinstance(found, Rules):
        what = "nothing" if found is None else a_kind(found)
        raise InvalidRequest(
            field="rules",
            value=reference,
            reason=f"{module_name}.{attribute} is {what}, not a trainplan.Rules",
            fix="Build one with trainplan.BUILTIN_RULES.extend(...)",
        )
    if found is BUILTIN_RULES or found.reference == reference:
        return found
    return attrs.evolve(found, reference=reference)  # plans made from it say where it came from


def load_rules(reference: str, *, from_working_directory: bool = False) -> Rules:
    """The rule set `reference` ("package.module:NAME") names, imported, with that reference recorded. Only for a
    reference the caller named (`--rules`), never one read from a plan or an inherited variable.

    `from_working_directory`: the current directory is searched too, for this import only and after every entry
    of `sys.path` (never ahead of it: a file in the current directory cannot stand in for an installed module),
    so a console script finds a module of the project it is run in. Anything that goes wrong (no such module, a
    module that raises on import, a NAME that is not a `Rules`) is an `InvalidRequest` naming it.
    """
    reference = _checked_reference(reference)
    module_name = reference.partition(":")[0]
    added = from_working_directory and os.getcwd() not in sys.path
    if added:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except SystemExit as leaving:  # sys.exit() at its top level (a script's, unguarded): not a rule set, not an exit
        raise InvalidRequest(
            field="rules",
            value=reference,
            reason=f"importing {module_name!r} called sys.exit({leaving.code!r}): a module that ends the process "
            "when imported builds no rule set",
            fix='Put the module\'s script part under `if __name__ == "__main__":`, or name the module that '
            "builds the rules",
        ) from None
    except Exception as error:  # a downstream module may raise anything while it runs its top level
        raise InvalidRequest(
            field="rules",
            value=reference,
            reason=f"cannot import {module_name!r} ({type(error).__name__}: {error})",
            fix="Name an importable module (the current directory is searched too)"
            if from_working_directory
            else "Name a module importable here",
        ) from None
    finally:
        if added and os.getcwd() in sys.path:
            sys.path.remove(os.getcwd())
    return _rules_in(module, reference)


def loaded_rules(reference: str, *, named_by: str = "the plan", field: str = "rules") -> Rules:
    """The rule set `reference` names, from a module this process has already imported; never an import. A
    reference that comes with data (`named_by`: a plan, a variable) is compared against what is loaded: a module
    not imported here is an `InvalidRequest` (about `field`) saying how to pass the rule set."""
    reference = _checked_reference(reference)
    module_name, _, attribute = reference.partition(":")
    module = sys.modules.get(module_name)
    if module is None:
        raise InvalidRequest(
            field=field,
            value=reference,
            reason=f"{named_by} names the rule set {reference!r}, and {module_name!r} is not imported in this "
            "process: trainplan never imports a module that data names (reading a plan is never running code)",
            fix=f"Pass the rule set yourself: import {module_name} and give rules={module_name}.{attribute} "
            "(trainplan.runtime(plan, rules=...), Plan.from_dict(data, rules=...), trainplan.resolve(rules=...)), "
            "or import it before this call",
        )
    return _rules_in(module, reference)


def rules_of(plan: Plan) -> Rules:
    """The rule set `plan` was made from: trainplan's own, or the downstream one it names, when this process has it
    loaded (`loaded_rules`: never imported). A plan of an unnamed rule set names none: trainplan's own rows serve it
    as far as they go."""
    if plan.rules is None or plan.rules == UNNAMED_RULES:
        return BUILTIN_RULES
    return loaded_rules(plan.rules)


def read_plan_text(text: str, *, rules: Rules | None = None, named_by: str = "the plan") -> Plan:
    """A plan from its JSON text, checked against the rule set it was made from: `rules` when given (it must be
    that one), else the one it names when this process has it loaded (`loaded_rules`: never imported)."""
    plan = plan_from_json_text(text)  # as far as its own facts go, for a plan of a downstream rule set
    if rules is not None:
        return plan_from_json_text(text, rules)
    if plan.rules is None or plan.rules == UNNAMED_RULES:
        return plan
    return plan_from_json_text(text, loaded_rules(plan.rules, named_by=named_by))


def handed_to_workers(plan: Plan, server: int | None = None) -> dict[str, str]:
    """The variable through which `trainplan launch` hands the workers it starts the rule set its caller named
    (`--rules`, loaded in this process): the pids that start them (this process, and `server`, the forkserver it
    started, whose children the served workers are) and the reference. Empty for trainplan's own rules."""
    if plan.rules is None or plan.rules == UNNAMED_RULES:
        return {}
    loaded_rules(plan.rules)  # this launcher has it: its caller named it
    starters = ",".join(str(pid) for pid in (os.getpid(), server) if pid is not None)
    return {LAUNCHER_RULES_VARIABLE: f"{starters} {plan.rules}"}


def handed_rules(environ: Mapping[str, str]) -> Rules | None:
    """Inside a worker: the rule set its launcher handed it (`handed_to_workers`), imported, or None.

    Safe because the variable is honoured only in a direct child of the processes it names: `trainplan launch`
    writes it for the reference its own caller named with `--rules`, naming itself and the forkserver it started,
    which start its workers. The same value
    inherited further (a worker's own subprocesses, a shell or a job that kept the environment) names a pid that
    is not the parent's, and is ignored: the rule set is then compared against what is loaded, never imported.
    The module is searched for as the launcher searched for it: `sys.path`, then the current directory."""
    value = environ.get(LAUNCHER_RULES_VARIABLE)
    if value is None:
        return None
    starters, _, reference = value.partition(" ")
    if str(os.getppid()) not in starters.split(","):
        return None
    return load_rules(reference, from_working_directory=True)


__all__ = ["handed_rules", "handed_to_workers", "load_rules", "loaded_rules", "read_plan_text", "rules_of"]
