"""Finding a rule set by its reference ("package.module:NAME"): the one place a downstream module is imported.

The CLI's `--rules` and a launched worker reading back a plan made from a downstream rule set both come here.
"""

from __future__ import annotations

import importlib
import os
import sys

import attrs

from trainplan.parse.plan_json import plan_from_json_text
from trainplan.rules import BUILTIN_RULES, UNNAMED_RULES, Rules, is_rules_reference
from trainplan.spec.errors import InvalidRequest
from trainplan.spec.plan import Plan


def load_rules(reference: str, *, from_working_directory: bool = False) -> Rules:
    """The rule set `reference` ("package.module:NAME") names, imported, with that reference recorded.

    `from_working_directory`: the current directory is on `sys.path` for this import only (as `python -m` puts
    it there), so a console script finds a module of the project it is run in. Anything that goes wrong (no
    such module, a module that raises on import, a NAME that is not a `Rules`) is an `InvalidRequest` naming it.
    """
    given: object = reference
    if not isinstance(given, str) or not is_rules_reference(given):
        raise InvalidRequest(
            field="rules",
            value=reference,
            reason="a rule set is named by the module that builds it and its name there",
            fix="Write MODULE:NAME, e.g. myframework.trainplan_rules:RULES",
        )
    module_name, _, attribute = reference.partition(":")
    added = from_working_directory and os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
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
    found: object = getattr(module, attribute, None)
    if not isinstance(found, Rules):
        what = "nothing" if found is None else f"a {type(found).__name__}"
        raise InvalidRequest(
            field="rules",
            value=reference,
            reason=f"{module_name}.{attribute} is {what}, not a trainplan.Rules",
            fix="Build one with trainplan.BUILTIN_RULES.extend(...)",
        )
    if found is BUILTIN_RULES or found.reference == reference:
        return found
    return attrs.evolve(found, reference=reference)  # plans made from it say where it came from


def rules_of(plan: Plan) -> Rules:
    """The rule set `plan` was made from: trainplan's own, or the downstream one it names (imported). A plan of an
    unnamed rule set names none: trainplan's own rows serve it as far as they go."""
    if plan.rules is None or plan.rules == UNNAMED_RULES:
        return BUILTIN_RULES
    return load_rules(plan.rules)


def read_plan_text(text: str, *, from_working_directory: bool = False) -> Plan:
    """A plan from its JSON text, checked against the rule set it was made from (imported when it names one;
    `from_working_directory` as for `load_rules`: a launched worker finds the module its launcher found)."""
    plan = plan_from_json_text(text)  # as far as its own facts go, for a plan of a downstream rule set
    if plan.rules is None or plan.rules == UNNAMED_RULES:
        return plan
    return plan_from_json_text(text, load_rules(plan.rules, from_working_directory=from_working_directory))


__all__ = ["load_rules", "read_plan_text", "rules_of"]
