"""Step 8: the strategy's options: the options record given (or the family's defaults) with the registered name's
preset applied, refused where the two disagree. `check` goes on without options."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from trainplan.resolve.draft import Draft
from trainplan.resolve.refusal import incompatible
from trainplan.rules import OPTION_TYPES, FamilyRule, StrategyRule
from trainplan.spec.names import StrategyKey
from trainplan.spec.options import DeepSpeedOptions, StrategyOptions


def merge_options(draft: Draft) -> None:
    draft.options = _merge_options(draft.strategy_name, draft.strategy, draft.family, draft.fields.strategy_options)


def no_options(draft: Draft) -> None:
    """`check`'s way on after the options were refused."""
    draft.options = None


def _merge_options(
    name: StrategyKey, rule: StrategyRule, family: FamilyRule, given: StrategyOptions | None
) -> StrategyOptions | None:
    options_type = OPTION_TYPES.get(family.family)
    if options_type is None:
        if given is not None:
            raise incompatible(
                "strategy-options",
                {"strategy": name, "strategy_options": given},
                given=type(given).__name__,
                expected="no options",
                fix="Remove strategy_options",
            )
        return None
    if given is not None and not isinstance(given, options_type):
        raise incompatible(
            "strategy-options",
            {"strategy": name, "strategy_options": given},
            given=type(given).__name__,
            expected=options_type.__name__,
            fix=f"Pass {options_type.__name__}(...)",
        )
    defaults = _DEFAULT_OPTIONS[options_type]
    merged: StrategyOptions = given if given is not None else defaults
    base = family.base_strategy
    for option, preset in rule.preset.items():
        current = getattr(merged, option)
        # An option written explicitly that the preset name contradicts is a conflict, even when it equals the
        # default; one left at its default takes the preset's value.
        written = given is not None and option in given.given
        if given is not None and current != preset and (written or current != getattr(defaults, option)):
            raise incompatible(
                "strategy-preset",
                {"strategy": name, "strategy_options": given},
                field=option,
                preset=preset,
                given=current,
                base=base,
            )
        merged = _with_option(merged, option, preset)
    if isinstance(merged, DeepSpeedOptions) and merged.offload_parameters and merged.stage != 3:
        raise incompatible(
            "deepspeed-offload-stage", {"strategy": name, "strategy_options": merged}, stage=merged.stage
        )
    return merged


_DEFAULT_OPTIONS: Mapping[type[StrategyOptions], StrategyOptions] = {
    options_type: options_type() for options_type in OPTION_TYPES.values()
}
"""Each options record with every option at its default (records are values: one of each serves every plan)."""


def _with_option(options: StrategyOptions, option: str, value: object) -> StrategyOptions:
    changes: dict[str, Any] = {option: value}
    return attrs.evolve(options, **changes)
