"""Step 13: the precision: as asked, or its row's fallback on this accelerator (with a note), checked against the
accelerator, the strategy's family and the packages it needs. `check` goes on with the precision asked for."""

from __future__ import annotations

from trainplan.resolve.draft import Draft
from trainplan.resolve.refusal import incompatible
from trainplan.rules import lookup
from trainplan.spec.names import PrecisionKey


def choose_precision(draft: Draft) -> None:
    asked, accelerator, rules = draft.fields.precision, draft.accelerator.name, draft.rules
    rule = lookup(rules.precisions, asked, name="PRECISIONS")
    precision = asked
    if accelerator in rule.fallback:
        precision = rule.fallback[accelerator]
        draft.note(
            "precision-fallback",
            "warning",
            f"precision={asked!r} is not supported on {accelerator!r} ({rule.fallback_why[accelerator]}); "
            f"using {precision!r} instead",
        )
        rule = lookup(rules.precisions, precision, name="PRECISIONS")
    if accelerator not in rule.accelerators:
        raise incompatible(
            "precision-accelerator",
            {"precision": asked, "accelerator": accelerator},
            why=rule.why_not.get(accelerator, "it is not supported there"),
            instead=rule.instead.get(accelerator, rules.default_precision),
        )
    if precision not in draft.family.precisions:
        # Offer only what runs as itself or as another accepted precision here (16-mixed runs as bf16-mixed on CPU).
        family = draft.family.precisions
        accepted = (
            name
            for name in family
            if name in rules.precisions and rules.precisions[name].fallback.get(accelerator, name) in family
        )
        supported = ", ".join(repr(item) for item in sorted(accepted))
        runs_as = "" if precision == asked else f" (which runs as {precision!r} on {accelerator!r})"
        raise incompatible(
            "precision-strategy",
            {"precision": asked, "strategy": draft.strategy_name},
            supported=supported,
            runs_as=runs_as,
        )
    if rule.requires_package is not None and rule.requires_package not in draft.env.packages:
        raise incompatible("precision-package", {"precision": asked}, package=rule.requires_package)
    _adopt(draft, precision)


def as_asked(draft: Draft) -> None:
    """`check`'s way on after the precision was refused."""
    _adopt(draft, draft.fields.precision)


def _adopt(draft: Draft, precision: PrecisionKey) -> None:
    draft.precision = precision
    draft.reasons["precision"] = lookup(draft.rules.precisions, precision, name="PRECISIONS").description
