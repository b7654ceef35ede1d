"""Steps 7 and 8: the strategy (`auto`: by the options record's family, else the first `auto` row that holds), run
as its script counterpart inside a started job and checked against the accelerator, packages, nodes and devices;
then its options: the record given (or the family's defaults) with the registered name's preset applied, refused
where the two disagree (`check` goes on without options)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from trainplan.resolve.draft import Draft
from trainplan.resolve.refusal import incompatible
from trainplan.rules import (
    OPTION_TYPES,
    AcceleratorRule,
    FamilyRule,
    MissingRule,
    OptionRow,
    Rules,
    StrategyRule,
    lookup,
)
from trainplan.spec.environment import Environment
from trainplan.spec.errors import TrainplanError
from trainplan.spec.names import StrategyKey
from trainplan.spec.options import StrategyOptions, option_value, with_options


def choose_strategy(draft: Draft) -> None:
    fields, rules = draft.fields, draft.rules
    name, reason = _choose_strategy(draft)
    if draft.in_started_job and name in rules.script_strategy_for:
        # The job already started every process: a strategy that would start them from a function joins
        # as its script counterpart, under every launcher alike.
        instead = rules.script_strategy_for[name]
        draft.note(
            "script-strategy",
            "warning",
            f"strategy={name!r} starts its workers from a function, but {draft.facts.started_by} already started "
            f"every process of this job: this process joins it as strategy={instead!r}",
        )
        reason = f"{reason}; inside a started job it runs as {instead!r}"
        name = instead
    if fields.strategy == "auto":
        draft.note("strategy-auto", "info", f"strategy='auto' chose {name!r}")
    draft.reasons["strategy"] = reason
    draft.strategy_name = name
    draft.strategy = lookup(rules.strategies, name, name="STRATEGIES")
    draft.family = lookup(rules.families, draft.strategy.family, name="FAMILIES")
    chosen_by = (
        fields.strategy_options
        if fields.strategy_options is not None and fields.strategy == "auto" and name in rules.auto_for_options.values()
        else None
    )
    for problem in _strategy_problems(
        name, draft.family, draft.accelerator, draft.devices, draft.num_nodes, draft.env, chosen_by
    ):
        draft.refuse(problem)


def _choose_strategy(draft: Draft) -> tuple[StrategyKey, str]:
    flag, options, rules = draft.fields.strategy, draft.fields.strategy_options, draft.rules
    accelerator, devices, num_nodes = draft.accelerator.name, len(draft.devices), draft.num_nodes
    interactive = draft.env.interactive
    if flag != "auto":
        return flag, f"asked for {flag!r}"
    if draft.memory_choice is not None:
        return draft.memory_choice.strategy, draft.reasons["memory"]
    if options is not None:
        for family, name in rules.auto_for_options.items():
            if isinstance(options, OPTION_TYPES[family]):
                return name, f"'auto' with {type(options).__name__}"
    for row in rules.auto_strategies:
        if row.matches(accelerator, devices, num_nodes, interactive):
            return row.strategy, row.reason.format(num_nodes=num_nodes, devices=devices)
    raise MissingRule(table="AUTO_STRATEGIES", key=(accelerator, devices, num_nodes, interactive))


def _strategy_problems(
    name: StrategyKey,
    family: FamilyRule,
    accelerator_rule: AcceleratorRule,
    devices: tuple[int, ...],
    num_nodes: int,
    env: Environment,
    chosen_by: StrategyOptions | None = None,
) -> Iterator[TrainplanError]:
    """`chosen_by`: the options record that made strategy='auto' choose `name` (the user wrote no strategy)."""
    accelerator = accelerator_rule.name
    if accelerator not in family.accelerators and chosen_by is not None:
        supported = " or ".join(repr(item) for item in sorted(family.accelerators))
        yield incompatible(
            "options-accelerator",
            {"strategy_options": chosen_by, "accelerator": accelerator},
            options=type(chosen_by).__name__,
            strategy=name,
            supported=supported,
            why=family.why_not.get(accelerator, "the strategy does not support it"),
        )
    elif accelerator not in family.accelerators:
        supported = " or ".join(repr(item) for item in sorted(family.accelerators))
        # The family's own fix (the XLA families point to XLA hardware), else the accelerator's, else the generic one.
        fix = (
            family.accelerator_fix
            or accelerator_rule.strategy_fix
            or f"Use accelerator='cuda' on a machine with NVIDIA GPUs, or strategy='auto' for {accelerator!r}"
        )
        yield incompatible(
            "strategy-accelerator",
            {"strategy": name, "accelerator": accelerator},
            supported=supported,
            why=family.why_not.get(accelerator, "the strategy does not support it"),
            fix=fix,
        )
    if family.requires_package is not None and family.requires_package not in env.packages:
        yield incompatible("strategy-package", {"strategy": name}, package=family.requires_package)
    if family.max_nodes is not None and num_nodes > family.max_nodes:
        yield incompatible("strategy-nodes", {"strategy": name, "num_nodes": num_nodes})
    if family.max_devices_per_node is not None and len(devices) > family.max_devices_per_node:
        yield incompatible("strategy-device-count", {"strategy": name, "devices": list(devices)}, count=len(devices))


def merge_options(draft: Draft) -> None:
    given = draft.fields.strategy_options
    if given is None and draft.memory_choice is not None:
        given = draft.memory_choice.options  # the memory-fitted layout's record (HSDP's sharding, tp's degree)
    draft.options = _merge_options(draft.strategy_name, draft.strategy, draft.family, given, draft.rules)


def no_options(draft: Draft) -> None:
    """`check`'s way on after the options were refused."""
    draft.options = None


def _merge_options(
    name: StrategyKey,
    rule: StrategyRule,
    family: FamilyRule,
    given: StrategyOptions | None,
    rules: Rules,
) -> StrategyOptions | None:
    """The options in force: the request's record (or the defaults) with the strategy's preset merged in, which
    options were written kept as the request's; then what each option row needs of the others (`rules.options`)."""
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
    for option, preset in rule.preset.items():
        current = option_value(merged, option, preset)  # an added option nobody wrote takes the preset's value
        # An option written explicitly that the preset name contradicts is a conflict, even when it equals the
        # default; one left at its default takes the preset's value.
        if current != preset and (option in merged.given or current != option_value(defaults, option, preset)):
            raise incompatible(
                "strategy-preset",
                {"strategy": name, "strategy_options": given},
                field=option,
                preset=preset,
                given=current,
                base=family.base_strategy,
            )
        merged = _with_option(merged, option, preset)
    _check_needs(name, merged, rules.options.get(family.family, ()))
    return merged


def _check_needs(name: StrategyKey, merged: StrategyOptions, rows: tuple[OptionRow, ...]) -> None:
    """What each option row written away from its default needs of the others (DeepSpeed's parameter offload needs
    stage 3), refused with the row's refusal."""
    for row in rows:
        needs = row.needs
        if needs is None or option_value(merged, row.name, row.default) == row.default:
            continue
        held = {other.name: option_value(merged, other.name, other.default) for other in rows}
        if any(held[needed] != value for needed, value in needs.values.items()):
            raise incompatible(
                needs.refusal,
                {"strategy": name, "strategy_options": merged},
                **{needed: held[needed] for needed in needs.values},
            )


_DEFAULT_OPTIONS: Mapping[type[StrategyOptions], StrategyOptions] = {
    options_type: options_type() for options_type in OPTION_TYPES.values()
}
"""Each options record with every option at its default (records are values: one of each serves every plan)."""


def _with_option(options: StrategyOptions, option: str, value: object) -> StrategyOptions:
    """`options` with `option` set to `value` (a field, or an entry of `extra`), which options were written kept."""
    return with_options(options, {option: value})
