"""Whether a rule set holds together, whichever rows were replaced or added: `problems(rules)`, every way it does not.

Building a `Rules` (directly, by `attrs.evolve` or by `extend`) raises the first problem (`InvalidRequest` naming
the row), so that no incoherent rule set ever reaches `resolve` to fail there as `MissingRule`; a tool lists them all
with `trainplan.rules.every_problem`. The checks are those of the whole set: every name a row gives is a row of the
set, no row says both yes and no, every accelerator runs under some family at some precision, and what 'auto' picks
can be planned. One row's own fields (a downstream row given to `extend`) are checked in `rules.row_checks`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from trainplan.rules.clusters import LOCAL_CLUSTER, detected_alone
from trainplan.rules.hardware import AcceleratorRule
from trainplan.rules.launchers import HOST_LAUNCHER, SERVED_START_METHODS, LauncherRule
from trainplan.rules.precision import PRECISIONS, BackendRule, PrecisionRule
from trainplan.rules.strategies import FAMILIES, FamilyRule, StrategyRule
from trainplan.spec.errors import InvalidRequest
from trainplan.spec.names import DEFAULT_PRECISION, AcceleratorKey, BackendKey, LauncherName, StrategyKey

if TYPE_CHECKING:  # the rule set's module calls in here (no import cycle)
    from trainplan.rules.ruleset import Rules

Problems = Iterator[InvalidRequest]
"""The problems a check finds, in the order it finds them (none: the check holds)."""


def problems(rules: Rules) -> Problems:
    """Every way `rules` does not hold together, in the order building it checks (building raises the first): every
    accelerator runs under some family at some precision; every family runs somewhere at something; a bare
    `Request()` on a bare machine resolves; what 'auto' picks can be planned; no row names an accelerator, precision,
    strategy, launcher, backend or cluster the rule set lacks. Once a row names what the set lacks, the checks that
    read the tables by those names are not run (they would read rows that are not there)."""
    named = [*_check_default_precision(rules), *_check_references(rules)]
    yield from named
    if named:
        return
    yield from _check_claims(rules)
    yield from _check_coherence(rules)
    for accelerator in rules.accelerators.values():
        counts = (1,) if accelerator.device_counts == "one" else (1, 2)
        for devices in counts:
            for interactive in (False, True):
                yield from _check_auto_pick(rules, accelerator, devices, interactive)


def first_problem(found: Iterable[InvalidRequest]) -> None:
    """Raise the first problem `found` lists, if any."""
    for problem in found:
        raise problem


def where(table: str, key: str, field: str = "") -> str:
    """The row a coherence refusal names (`rules.precisions['32-true'].accelerators`)."""
    return f"rules.{table}[{key!r}]" + (f".{field}" if field else "")


def no_such(kind: str, field: str, value: object, rows: Iterable[object]) -> InvalidRequest:
    """The refusal of a row that names a `kind` (precision, backend, ...) its rule set has no row of."""
    return InvalidRequest(field=field, value=value, reason=f"no such {kind}", allowed=tuple(rows))


def unknown_accelerators(
    accelerators: Mapping[AcceleratorKey, AcceleratorRule], field: str, names: Iterable[object]
) -> Problems:
    for accelerator in names:
        if accelerator not in accelerators:
            yield no_such("accelerator", field, accelerator, accelerators)


def default_backend_problems(rule: AcceleratorRule, backends: Mapping[BackendKey, BackendRule]) -> Problems:
    where = f"rules.accelerators[{rule.name!r}].default_backend"
    backend = backends.get(rule.default_backend)
    if backend is None:
        yield InvalidRequest(
            field=where,
            value=rule.default_backend,
            reason="no such backend (a device plugin's own backend is a BackendRule of the extension)",
            allowed=tuple(backends),
            fix="Add backends=[BackendRule(name=CustomName('hccl'), ...)], or name one of the rule set's",
        )
    elif rule.name not in backend.accelerators:
        yield InvalidRequest(
            field=where,
            value=rule.default_backend,
            reason=f"backend {backend.name!r} does not reduce {rule.name!r} tensors (its row lists "
            f"{sorted(backend.accelerators)})",
            fix=f"List {rule.name!r} in the backend's accelerators (a built-in backend's row is replaced like a "
            f"family's: backends=[attrs.evolve(BUILTIN_RULES.backends[{backend.name!r}], accelerators="
            f"BUILTIN_RULES.backends[{backend.name!r}].accelerators | {{{rule.name!r}}})]), or choose a backend that "
            "does",
        )


def counterpart_refusal(
    table: str,
    key: StrategyKey,
    value: StrategyKey,
    strategies: Mapping[StrategyKey, StrategyRule],
    launchers: Mapping[LauncherName, LauncherRule],
) -> str | None:
    """Why `value` cannot stand in for `key` as its fork, spawn or script counterpart (`table`), or None."""
    source, target = strategies[key], strategies[value]
    launcher = launchers[target.launcher]
    if source.family != target.family:
        return (
            f"{value!r} is of family {target.family!r}, {key!r} of {source.family!r}: a counterpart runs the same "
            "family"
        )
    if table == "fork_strategy_for" and not launcher.interactive_compatible:
        return f"{value!r} is started by {target.launcher!r}, which a notebook cannot run either"
    if table == "spawn_strategy_for" and launcher.forks:
        return f"{value!r} forks too (launcher {target.launcher!r}), where forking is what fails"
    if table == "script_strategy_for" and launcher.start_method is not None:
        return f"{value!r} starts its processes itself (launcher {target.launcher!r}), inside a started job too"
    return None


COUNTERPARTS: Final = ("fork_strategy_for", "spawn_strategy_for", "script_strategy_for")
"""The counterpart tables of a rule set (`extend`'s fork_, spawn_ and script_counterparts add to them)."""


def _exists(
    value: object, rows: Mapping[Any, object], kind: str, table: str, key: str | None, field: str = ""
) -> Problems:
    """`value` names a row of `rows`, else `InvalidRequest` naming the row that names it (`where(table, key, field)`,
    built only then: the built-in set is checked at import)."""
    if value not in rows:
        yield InvalidRequest(
            field=f"rules.{table}" if key is None else where(table, key, field),
            value=value,
            reason=f"no such {kind} in the rule set: the row would fail at the first resolve that reads it",
            allowed=tuple(rows),
        )


def _check_default_precision(rules: Rules) -> Problems:
    """The precision of a request that names none is a row of the set, and trainplan's own."""
    if rules.default_precision not in rules.precisions:
        yield no_such("precision", "rules.default_precision", rules.default_precision, rules.precisions)
    if rules.default_precision != DEFAULT_PRECISION:
        yield InvalidRequest(
            field="rules.default_precision",
            value=rules.default_precision,
            reason=f"a request's default precision is fixed ({DEFAULT_PRECISION!r}: Request() carries it, whichever "
            "rule set resolves it), so a rule set with another default would explain plans it never makes",
            fix=f"Write default_precision={DEFAULT_PRECISION!r}, and have the framework write precision=... in the "
            "requests it builds",
        )


def _check_references(rules: Rules) -> Problems:
    """Every name a row gives is a row of the rule set (strategies, families, launchers, precisions, backends,
    clusters, the local cluster row), and a family row under a built-in name keeps the built-in process layout."""
    strategies, families, launchers = rules.strategies, rules.families, rules.launchers
    for name in (*SERVED_START_METHODS, HOST_LAUNCHER):
        if name not in launchers:
            yield InvalidRequest(
                field="rules.launchers",
                value=tuple(launchers),
                reason=f"trainplan's runtime starts workers with launcher {name!r} (its own tables name it), and the "
                "rule set has no such row",
                fix=f"Keep the built-in row: launchers={{**BUILTIN_RULES.launchers, ...}} (it has {name!r})",
            )
    for strategy in strategies.values():
        if strategy.family in families and strategy.launcher in launchers:
            continue
        yield from _exists(strategy.family, families, "family", "strategies", strategy.name, "family")
        yield from _exists(strategy.launcher, launchers, "launcher", "strategies", strategy.name, "launcher")
    for table in COUNTERPARTS:
        for key, value in getattr(rules, table).items():
            missing = [
                *_exists(key, strategies, "strategy", table, None),
                *_exists(value, strategies, "strategy", table, key),
            ]
            yield from missing
            if missing or strategies[value].launcher not in launchers:
                continue  # named nothing the set has (said above), or a strategy whose launcher is missing (said)
            refusal = counterpart_refusal(table, key, value, strategies, launchers)
            if refusal is not None:
                yield InvalidRequest(
                    field=where(table, key), value=value, reason=refusal, fix="Name a counterpart that runs there"
                )
    for family_name, strategy_name in rules.auto_for_options.items():
        yield from _exists(family_name, families, "family", "auto_for_options", None)
        yield from _exists(strategy_name, strategies, "strategy", "auto_for_options", family_name)
    for index, row in enumerate(rules.auto_strategies):
        if row.strategy not in strategies:
            yield from _exists(row.strategy, strategies, "strategy", f"auto_strategies[{index}].strategy", None)
    for memory_layout in rules.memory_layouts:
        yield from _exists(
            memory_layout.strategy, strategies, "strategy", "memory_layouts", memory_layout.name, "strategy"
        )
    memory_layouts = {memory_layout.name: memory_layout for memory_layout in rules.memory_layouts}
    for layout_name in (*rules.memory_order.on_device, *rules.memory_order.offloaded):
        yield from _exists(layout_name, memory_layouts, "memory layout", "memory_order", None)
    for launcher in launchers.values():
        if launcher.in_started_job is not None:
            yield from _exists(
                launcher.in_started_job, launchers, "launcher", "launchers", launcher.name, "in_started_job"
            )
    for precision in rules.precisions.values():
        for field in ("fallback", "instead"):
            for accelerator, target in getattr(precision, field).items():
                if target not in rules.precisions:
                    yield from _exists(
                        target, rules.precisions, "precision", "precisions", precision.name, f"{field}[{accelerator!r}]"
                    )
    grouped = {name for family in families.values() if family.has_process_group for name in family.accelerators}
    for accelerator in rules.accelerators.values():
        if accelerator.name in grouped:  # its process groups run over the default backend (else only named)
            yield from default_backend_problems(accelerator, rules.backends)
        else:
            yield from _exists(
                accelerator.default_backend,
                rules.backends,
                "backend",
                "accelerators",
                accelerator.name,
                "default_backend",
            )
    if not any(detected_alone(rule) for rule in rules.clusters.values()):
        yield InvalidRequest(
            field="rules.clusters",
            value=tuple(rules.clusters),
            reason="no row is detected without cluster variables: a process outside any cluster manager would "
            "have no cluster to plan for",
            fix=f"Keep the built-in {LOCAL_CLUSTER!r} row: clusters={{**BUILTIN_RULES.clusters, ...}}",
        )
    for cluster in rules.clusters.values():
        for other in cluster.same_job_as:
            yield from _exists(other, rules.clusters, "cluster", "clusters", cluster.name, "same_job_as")
    for key, family in families.items():
        builtin = FAMILIES.get(family.family)
        if builtin is None or family.family != key:
            yield InvalidRequest(
                field=where("families", key),
                value=family.family,
                reason="a family row is one of trainplan's families, under its own name (custom families need a "
                "runtime of their own)",
                allowed=tuple(FAMILIES),
            )
            continue
        if family.multi_process is builtin.multi_process and family.has_process_group is builtin.has_process_group:
            continue
        for field in ("multi_process", "has_process_group"):
            if getattr(family, field) != getattr(builtin, field):
                yield InvalidRequest(
                    field=where("families", family.family, field),
                    value=getattr(family, field),
                    reason=f"trainplan's runtime runs family {family.family!r} as its built-in row says: a replaced "
                    "row changes where the family runs and at what precision, not how it runs",
                    fix=f"Write {field}={getattr(builtin, field)!r}",
                )


def _check_claims(rules: Rules) -> Problems:
    """No row says both yes and no (an accelerator in a row's `accelerators` and in its `why_not`), every precision
    runs under some family, and no two accelerators share a framework spelling or a Kubernetes resource."""
    for table in ("families", "precisions", "backends"):
        rows: Mapping[str, FamilyRule | PrecisionRule | BackendRule] = getattr(rules, table)
        for key, row in rows.items():
            if not row.accelerators.isdisjoint(row.why_not):
                both = sorted(name for name in row.accelerators if name in row.why_not)
                yield InvalidRequest(
                    field=where(table, key, "why_not"),
                    value=both,
                    reason=f"the row lists {', '.join(map(repr, both))} in its accelerators and gives a reason it "
                    "does not run there: which one holds?",
                    fix="Drop the accelerator from why_not (it runs there) or from accelerators (it does not)",
                )
    listed = {name for family in rules.families.values() for name in family.precisions}
    for precision in rules.precisions:
        if precision not in listed:
            yield InvalidRequest(
                field=where("precisions", precision),
                value=precision,
                reason="no family lists the precision, so no strategy could run at it",
                fix=f"Keep {precision!r} in the precisions of the family rows it runs with (a replaced family row "
                "drops what it does not list)",
            )
    owners: dict[str, str] = {}
    for spelling, flag in rules.accelerator_spellings.items():
        owners[spelling] = " or ".join(map(repr, rules.accelerator_groups.get(flag, (flag,))))
    for accelerator, spelled in rules.framework_accelerators.items():
        lightning: object = spelled.lightning
        if not isinstance(lightning, str):
            continue  # the row's own check says what a spelling is
        owner = owners.setdefault(lightning, repr(accelerator))
        if owner != repr(accelerator):
            yield InvalidRequest(
                field=where("framework_accelerators", accelerator, "lightning"),
                value=lightning,
                reason=f"it is how Lightning spells {owner}: the adapters would hand {accelerator!r}'s devices to "
                f"{owner}'s accelerator",
                fix=f"Write the name {accelerator!r}'s Lightning plugin registers, e.g. lightning={accelerator!r}",
            )
    resources: dict[object, AcceleratorKey] = {}
    for accelerator, resource in rules.kubernetes_resources.items():
        if resource is None:
            continue
        holder = resources.setdefault(resource, accelerator)
        if holder != accelerator:
            yield InvalidRequest(
                field=where("kubernetes_resources", accelerator),
                value=resource,
                reason=f"it is the resource of {holder!r}: the pods would ask for {holder!r} devices",
                fix=f"Write the resource {accelerator!r}'s device plugin advertises (what `kubectl describe node` "
                "lists under Allocatable)",
            )


def _check_coherence(rules: Rules) -> Problems:
    """Every accelerator has a whole-number place in the 'auto' order and a backend; every family and precision
    lists accelerators (and precisions) the set has, and some; every accelerator runs under some family at some
    precision."""
    accelerators, families, precisions = rules.accelerators, rules.families, rules.precisions
    for accelerator in accelerators.values():
        priority: object = accelerator.auto_priority
        if not isinstance(priority, int) or isinstance(priority, bool):
            yield InvalidRequest(
                field=where("accelerators", accelerator.name, "auto_priority"),
                value=priority,
                reason="it is a whole number (higher wins for 'auto')",
            )
        if accelerator.default_backend not in rules.backends:
            field = where("accelerators", accelerator.name, "default_backend")
            yield no_such("backend", field, accelerator.default_backend, rules.backends)
    for family in families.values():
        yield from unknown_accelerators(
            accelerators, where("families", family.family, "accelerators"), family.accelerators
        )
        for precision_name in family.precisions:
            if precision_name not in precisions:
                yield no_such("precision", where("families", family.family, "precisions"), precision_name, precisions)
        for field, listed in (("accelerators", family.accelerators), ("precisions", family.precisions)):
            if not listed:
                yield InvalidRequest(
                    field=where("families", family.family, field),
                    value=listed,
                    reason=f"family {family.family!r} would run {'on' if field == 'accelerators' else 'at'} nothing: "
                    f"every request naming one of its strategies would be refused with no {field[:-1]} to suggest",
                    fix=f"List the {field} it runs {'on' if field == 'accelerators' else 'at'} (the built-in row: "
                    f"{sorted(getattr(FAMILIES.get(family.family, family), field))})",
                )
    for precision in precisions.values():
        yield from unknown_accelerators(
            accelerators, where("precisions", precision.name, "accelerators"), precision.accelerators
        )
    # Which accelerators some family runs on and some precision runs at: indexed once (a set of 100,000 rows is
    # checked in linear time).
    run_on = {name for family in families.values() for name in family.accelerators}
    run_at = {name for precision in precisions.values() for name in precision.accelerators}
    for accelerator in accelerators.values():
        runs, at = accelerator.name in run_on, accelerator.name in run_at
        if not runs or not at:
            # The row to name: the first built-in one that listed it (the one replaced), else one to add it to.
            if not runs:
                table = "families"
                row = next((key for key, value in FAMILIES.items() if accelerator.name in value.accelerators), "")
                row = row or next(iter(families), "")
            else:
                table = "precisions"
                row = next((key for key, value in PRECISIONS.items() if accelerator.name in value.accelerators), "")
                row = row or rules.default_precision
            yield InvalidRequest(
                field=where(table, row, "accelerators"),
                value=accelerator.name,
                reason=f"accelerator {accelerator.name!r} would be listed by no "
                + ("family, so no strategy could run on it" if not runs else "precision, so nothing could run on it"),
                fix=f"Keep {accelerator.name!r} in the accelerators of the {table[:-1].replace('ie', 'y')} rows it "
                "runs with",
            )


def _check_auto_pick(rules: Rules, accelerator: AcceleratorRule, devices: int, interactive: bool) -> Problems:
    """What strategy='auto' picks on one node for `devices` of `accelerator` runs there (and, on the host with one
    device, at the default precision: `Request()` on a bare machine)."""
    for row in rules.auto_strategies:
        if row.matches(accelerator.name, devices, 1, interactive):
            break
    else:
        yield InvalidRequest(
            field="rules.auto_strategies",
            value=accelerator.name,
            reason=f"no row picks a strategy for {devices} {accelerator.name!r} device(s)"
            + (" in an interactive session" if interactive else ""),
            fix="End the rows with one that holds everywhere (as the built-in rows do)",
        )
        return
    strategy = rules.strategies.get(row.strategy)
    if strategy is None or strategy.family not in rules.families:
        yield InvalidRequest(
            field="rules.auto_strategies",
            value=row.strategy,
            reason="strategy='auto' picks it, and the rule set has no such strategy",
            allowed=tuple(rules.strategies),
        )
        return
    family = rules.families[strategy.family]
    if accelerator.name not in family.accelerators:
        yield InvalidRequest(
            field=where("families", family.family, "accelerators"),
            value=sorted(family.accelerators),
            reason=f"strategy='auto' picks {row.strategy!r} for {devices} {accelerator.name!r} device(s) (and "
            f"accelerator='auto' picks {accelerator.name!r} where its devices are), but family {family.family!r} "
            f"does not list {accelerator.name!r}: Request() would be refused there",
            fix=f"Keep {accelerator.name!r} in family {family.family!r}'s accelerators",
        )
        return
    if accelerator.host and devices == 1:
        default = rules.precisions[rules.default_precision]
        if rules.default_precision not in family.precisions:
            yield InvalidRequest(
                field=where("families", family.family, "precisions"),
                value=sorted(family.precisions),
                reason=f"Request() on a bare machine runs {row.strategy!r} on {accelerator.name!r} at the default "
                f"precision {rules.default_precision!r}, which the row does not list",
                fix=f"Keep {rules.default_precision!r} in family {family.family!r}'s precisions",
            )
        if accelerator.name not in default.accelerators:
            yield InvalidRequest(
                field=where("precisions", default.name, "accelerators"),
                value=sorted(default.accelerators),
                reason=f"Request() on a bare machine runs the default precision {default.name!r} on "
                f"{accelerator.name!r}, which the row does not list",
                fix=f"Keep {accelerator.name!r} in precision {default.name!r}'s accelerators",
            )


__all__ = [
    "COUNTERPARTS",
    "Problems",
    "counterpart_refusal",
    "default_backend_problems",
    "first_problem",
    "problems",
    "unknown_accelerators",
    "where",
]
