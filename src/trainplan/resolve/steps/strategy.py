"""Step 7: the strategy (`auto`: by the options record's family, else the first `auto` row that holds), run as its
script counterpart inside a started job, and checked against the accelerator, packages, nodes and devices."""

from __future__ import annotations

from collections.abc import Iterator

from trainplan.resolve.draft import Draft
from trainplan.resolve.refusal import incompatible
from trainplan.rules import OPTION_TYPES, AcceleratorRule, FamilyRule, MissingRule, Rules, lookup
from trainplan.spec.environment import Environment
from trainplan.spec.errors import TrainplanError
from trainplan.spec.names import AcceleratorKey, CustomName, StrategyFlag, StrategyKey
from trainplan.spec.options import StrategyOptions


def choose_strategy(draft: Draft) -> None:
    fields, rules = draft.fields, draft.rules
    name, reason = _choose_strategy(
        fields.strategy,
        draft.accelerator.name,
        draft.devices,
        draft.num_nodes,
        draft.env,
        fields.strategy_options,
        rules,
    )
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


def _choose_strategy(
    flag: StrategyFlag | CustomName,
    accelerator: AcceleratorKey,
    devices: tuple[int, ...],
    num_nodes: int,
    env: Environment,
    options: StrategyOptions | None,
    rules: Rules,
) -> tuple[StrategyKey, str]:
    if flag != "auto":
        return flag, f"asked for {flag!r}"
    if options is not None:
        for family, name in rules.auto_for_options.items():
            if isinstance(options, OPTION_TYPES[family]):
                return name, f"'auto' with {type(options).__name__}"
    for row in rules.auto_strategies:
        if row.matches(accelerator, len(devices), num_nodes, env.interactive):
            return row.strategy, row.reason.format(num_nodes=num_nodes, devices=len(devices))
    raise MissingRule(table="AUTO_STRATEGIES", key=(accelerator, len(devices), num_nodes, env.interactive))


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
