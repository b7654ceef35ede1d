"""Refusals built from the rule table: one place turns a rule id and the values involved into an `Incompatible`."""

from __future__ import annotations

from collections.abc import Mapping

from trainplan.rules import RULES, RefusalId, lookup
from trainplan.spec.errors import Incompatible


def incompatible(rule_id: RefusalId, values: Mapping[str, object], **fields: object) -> Incompatible:
    """An `Incompatible` error whose reason and fix come from the rule table."""
    rule = lookup(RULES, rule_id, name="RULES")
    return Incompatible(
        values=values,
        rule=rule_id,
        reason=rule.reason.format(**values, **fields),
        fix=rule.fix.format(**values, **fields),
    )


__all__ = ["incompatible"]
