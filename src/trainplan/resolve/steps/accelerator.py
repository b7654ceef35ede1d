"""Step 5: the accelerator (`auto`: the first available by the rows' priority; a group such as `gpu`: its first
available member), checked to be there. `check` goes on past an absent one as if it were present."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from trainplan.resolve.draft import Draft
from trainplan.rules import SUPPLIED_COUNTS, AcceleratorRule, MissingRule, Rules, lookup
from trainplan.spec.environment import Environment
from trainplan.spec.errors import Unavailable
from trainplan.spec.names import AcceleratorFlag, AcceleratorKey, CustomName


def choose_accelerator(draft: Draft) -> None:
    name, reason = _choose_accelerator(draft.fields.accelerator, draft.env, draft.rules)
    _adopt(draft, name, reason)


def assume_present(draft: Draft) -> None:
    """`check`'s way on past an absent accelerator: the facts with every accelerator present, to find the request's
    other problems (an accelerator the rule set does not know ends the run)."""
    flag = draft.fields.accelerator
    if flag not in draft.rules.accelerators:
        draft.end()
        return
    assumed: AcceleratorKey = flag  # type: ignore[assignment]  # narrowed by the membership test
    draft.env = _with_plenty(draft.env, draft.rules)
    _adopt(draft, assumed, "assumed present (check only)")


def _adopt(draft: Draft, name: AcceleratorKey, reason: str) -> None:
    draft.reasons["accelerator"] = reason
    draft.accelerator = lookup(draft.rules.accelerators, name, name="ACCELERATORS")
    if draft.fields.accelerator == "auto":
        draft.note("accelerator-auto", "info", f"accelerator='auto' chose {name!r}")


def visible(env: Environment, rule: AcceleratorRule) -> int:
    """How many devices of `rule`'s accelerator the facts count (its row names the fact; `device_counts`, the
    counts a framework supplies for the accelerators it adds, is read at the accelerator's name)."""
    fact = rule.count_fact
    if fact is None:
        return 1
    if fact == SUPPLIED_COUNTS:
        return env.device_counts.get(rule.name, 0)
    return int(getattr(env, fact))


def _available(env: Environment, rules: Rules) -> dict[AcceleratorKey, int]:
    """Device count per available accelerator, from the fact each row names (no fact: one place to run)."""
    found: dict[AcceleratorKey, int] = {}
    for name, rule in rules.accelerators.items():
        count = visible(env, rule)
        if count > 0:
            found[name] = count
    return found


def _describe(found: Mapping[AcceleratorKey, int], rules: Rules) -> str:
    parts: list[str] = []
    for rule in rules.accelerators_by_priority:
        name = rule.name
        if name not in found:
            continue
        if rule.count_fact is None:
            parts.append(name)
        else:
            count = found[name]
            parts.append(f"{name} ({count} device{'s' if count != 1 else ''})")
    alone = len(parts) == 1 and rules.accelerators[next(iter(found))].count_fact is None
    return "only " + parts[0] if alone else ", ".join(parts)


def _choose_accelerator(
    flag: AcceleratorFlag | CustomName, env: Environment, rules: Rules
) -> tuple[AcceleratorKey, str]:
    if flag == "auto":
        found = _available(env, rules)
        for rule in rules.accelerators_by_priority:
            if rule.name in found:
                return rule.name, f"the best available of {_describe(found, rules)} (order: {rules.accelerator_order})"
        raise MissingRule(table="ACCELERATORS", key="an available accelerator")
    group = rules.accelerator_groups.get(flag)
    if group is not None:
        for member in group:
            member_rule = rules.accelerators.get(member)
            if member_rule is not None and visible(env, member_rule) > 0:
                return member, f"accelerator={flag!r} means {member!r} here"
        members = " or ".join(name.upper() for name in group)
        raise Unavailable(
            requested=f"accelerator={flag!r}",
            available=_describe(_available(env, rules), rules),
            fix=f"Use accelerator='cpu' (or 'auto'), or run where a {members} GPU is visible",
        )
    name: AcceleratorKey = flag  # type: ignore[assignment]  # the normaliser folds aliases; groups are above
    rule = lookup(rules.accelerators, name, name="ACCELERATORS")
    if visible(env, rule) <= 0:
        raise _absent(name, rule, env, rules)
    return name, f"asked for {name!r} ({rule.description})"


def _absent(name: AcceleratorKey, rule: AcceleratorRule, env: Environment, rules: Rules) -> Unavailable:
    variable = rule.visibility_variable
    hidden = variable is not None and variable in env.variables
    hidden = hidden and env.variables.get(variable or "", "").strip() in ("", "-1")
    supplied = rule.count_fact == SUPPLIED_COUNTS
    return Unavailable(
        requested=f"accelerator={name!r}",
        available=_describe(_available(env, rules), rules)
        + (f" ({variable} hides every GPU)" if hidden else "")
        + (f"; Environment.device_counts has no {name!r} devices" if supplied else ""),
        fix=f"Pass the count the device plugin sees, e.g. probe().with_device_counts({{{name!r}: 8}}), or use "
        "accelerator='auto'"
        if supplied
        else "Use accelerator='auto' to take the best available, or run where that hardware is visible",
    )


_PLENTY = 1 << 12
"""Devices enough that no selection fails for want of them (`check` going on past an absent accelerator)."""

_ENVIRONMENT_DEFAULTS: dict[str, object] = {field.name: field.default for field in attrs.fields(Environment)}


def _with_plenty(env: Environment, rules: Rules) -> Environment:
    """The facts with every accelerator of the rule set present: each row's count fact at plenty (a yes/no fact
    yes), the downstream ones' counts supplied, the usable-GPU probe forgotten."""
    facts: dict[str, Any] = {"usable_cuda_devices": None}
    supplied: dict[str, int] = {}
    for rule in rules.accelerators.values():
        fact = rule.count_fact
        if fact == SUPPLIED_COUNTS:
            supplied[rule.name] = _PLENTY
        elif fact is not None:
            facts[fact] = True if isinstance(_ENVIRONMENT_DEFAULTS[fact], bool) else _PLENTY
    return attrs.evolve(env, device_counts=supplied, **facts)
