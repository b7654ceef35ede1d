"""`Rules.extend`'s steps: the rows given, each checked as a row of its kind with a name of its own, merged into the
base's tables in the order the steps below take them, so that the first problem a call has is the one refused.

Each step reads the tables built so far (`Draft`) and indexes what it compares against once, so that extending by
100,000 rows takes time in proportion. The new rule set is then built from the draft's tables, and building it
checks it whole (`rules.coherence`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Final, TypeVar, get_args

import attrs

from trainplan.rules.clusters import CLUSTER_ALIASES, ClusterRule
from trainplan.rules.coherence import (
    counterpart_refusal,
    default_backend_problems,
    first_problem,
    no_such,
    unknown_accelerators,
)
from trainplan.rules.hardware import ACCELERATORS, AcceleratorRule
from trainplan.rules.legacy import LEGACY_ACCELERATORS
from trainplan.rules.mesh import MESH_BACKENDS
from trainplan.rules.option_checks import check_added_row
from trainplan.rules.options import OptionRow
from trainplan.rules.precision import BackendRule, PrecisionRule
from trainplan.rules.recipes import FrameworkAccelerator, LightningDevices, PrecisionRecipe
from trainplan.rules.row_checks import (
    Taken,
    check_accelerator,
    check_backend,
    check_cluster,
    check_family_fields,
    check_precision,
    check_precision_fields,
    check_recipe,
    check_strategy,
)
from trainplan.rules.strategies import OPTION_TYPES, FamilyRule, StrategyRule
from trainplan.spec.errors import InvalidRequest, a_kind
from trainplan.spec.names import (
    ACCELERATORS as ACCELERATOR_NAMES,
)
from trainplan.spec.names import (
    BACKENDS as BACKEND_NAMES,
)
from trainplan.spec.names import (
    CLUSTER_FLAGS,
    CUSTOM_NAME,
    CUSTOM_PRECISION,
    PRECISION_FLAGS,
    AcceleratorKey,
    BackendKey,
    ClusterKey,
    PrecisionKey,
    StrategyFamily,
    StrategyKey,
)
from trainplan.spec.names import (
    PRECISIONS as PRECISION_NAMES,
)
from trainplan.spec.options import ModelParallelOptions

if TYPE_CHECKING:  # the rule set's module calls in here (no import cycle)
    from trainplan.rules.ruleset import Rules

R = TypeVar("R")

_REFERENCE: Final = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*", flags=re.ASCII
)

_KUBERNETES_RESOURCE: Final = re.compile(
    r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", flags=re.ASCII
)
"""An extended Kubernetes resource, as a device plugin advertises it: `domain/name` (`nvidia.com/gpu`)."""


def is_rules_reference(text: str) -> bool:
    """Whether `text` reads as "package.module:NAME", where a rule set can be imported from."""
    return _REFERENCE.fullmatch(text) is not None


def reference(name: str | None) -> str | None:
    """`extend`'s `name`: where the new rule set is imported from, or None."""
    given: object = name
    if given is not None and (not isinstance(given, str) or not is_rules_reference(given)):
        raise InvalidRequest(
            field="rules.name",
            value=name,
            reason="a rule set's name is where it is imported from",
            fix="Write e.g. name='myframework.trainplan_rules:RULES'",
        )
    return name


@attrs.frozen(kw_only=True)
class Given:
    """The rows one `extend` call gives, each checked to be a row of its kind, one row per name."""

    strategies: tuple[StrategyRule, ...]
    families: tuple[FamilyRule, ...]
    precisions: tuple[PrecisionRule, ...]
    accelerators: tuple[AcceleratorRule, ...]
    backends: tuple[BackendRule, ...]
    recipes: tuple[PrecisionRecipe, ...]

    @classmethod
    def read(
        cls,
        *,
        strategies: object,
        families: object,
        precisions: object,
        accelerators: object,
        backends: object,
        precision_recipes: object,
    ) -> Given:
        given = cls(
            strategies=_rows(strategies, StrategyRule, "rules.strategies"),
            families=_rows(families, FamilyRule, "rules.families"),
            precisions=_rows(precisions, PrecisionRule, "rules.precisions"),
            accelerators=_rows(accelerators, AcceleratorRule, "rules.accelerators"),
            backends=_rows(backends, BackendRule, "rules.backends"),
            recipes=_rows(precision_recipes, PrecisionRecipe, "rules.precision_recipes"),
        )
        _unique("rules.strategies", [rule.name for rule in given.strategies])
        _unique("rules.families", [rule.family for rule in given.families])
        _unique("rules.precisions", [rule.name for rule in given.precisions])
        _unique("rules.accelerators", [rule.name for rule in given.accelerators])
        _unique("rules.backends", [rule.name for rule in given.backends])
        _unique("rules.precision_recipes", [recipe.name for recipe in given.recipes])
        return given


@attrs.define(kw_only=True)
class Draft:
    """The new rule set's tables as the steps build them: the base's, with the rows given merged in."""

    base: Rules
    given: Given
    accelerators: dict[AcceleratorKey, AcceleratorRule]
    backends: dict[BackendKey, BackendRule]
    families: dict[StrategyFamily, FamilyRule]
    precisions: dict[PrecisionKey, PrecisionRule]
    recipes: dict[PrecisionKey, PrecisionRecipe] = attrs.field(factory=dict)
    strategies: dict[StrategyKey, StrategyRule] = attrs.field(factory=dict)
    options: dict[StrategyFamily, tuple[OptionRow, ...]] = attrs.field(factory=dict)

    @classmethod
    def start(cls, base: Rules, given: Given) -> Draft:
        """The given accelerators, backends and precisions have names of their own (or replace a built-in backend or
        precision row), and are merged into the base's tables, as are the family rows."""
        known = {*base.accelerator_spellings, *ACCELERATOR_NAMES, *LEGACY_ACCELERATORS}
        for accelerator in given.accelerators:
            _new_name("rules.accelerators", accelerator.name, known, CUSTOM_NAME)
        backends: set[str] = {*base.backends, *BACKEND_NAMES}
        for backend in given.backends:
            if backend.name not in base.backends:
                _new_name("rules.backends", backend.name, backends, CUSTOM_NAME)
            elif backend.needs_device_tensors != base.backends[backend.name].needs_device_tensors:
                kept = base.backends[backend.name].needs_device_tensors
                raise InvalidRequest(
                    field=f"rules.backends[{backend.name!r}].needs_device_tensors",
                    value=backend.needs_device_tensors,
                    reason=f"the row replaces {backend.name!r}'s, and where trainplan places the tensors its "
                    "collectives reduce is the library's own: a replaced row changes which accelerators it serves, "
                    "not how",
                    fix=f"Write needs_device_tensors={kept!r}",
                )
        precisions = {*base.precision_spellings, *PRECISION_NAMES, *map(str, PRECISION_FLAGS)}
        for precision in given.precisions:
            if precision.name not in base.precisions:
                _new_name("rules.precisions", precision.name, precisions, CUSTOM_PRECISION)
        return cls(
            base=base,
            given=given,
            accelerators={**base.accelerators, **{rule.name: rule for rule in given.accelerators}},
            backends={**base.backends, **{rule.name: rule for rule in given.backends}},
            families={**base.families, **{rule.family: rule for rule in given.families}},
            precisions={**base.precisions, **{rule.name: rule for rule in given.precisions}},
        )


def add_recipes(draft: Draft) -> None:
    """A recipe is given for a precision the extension adds (a built-in precision's recipe is the runtime's own)."""
    base = draft.base
    draft.recipes = dict(base.precision_recipes)
    for recipe in draft.given.recipes:
        if recipe.name in base.precision_recipes or recipe.name not in draft.precisions:
            raise InvalidRequest(
                field="rules.precision_recipes",
                value=recipe.name,
                reason="a recipe says what the runtime does with a precision the extension adds (a built-in "
                "precision's recipe is the runtime's own)",
                allowed=tuple(name for name in draft.precisions if name not in base.precision_recipes),
            )
        draft.recipes[recipe.name] = recipe


def check_hardware(draft: Draft) -> None:
    """Each given accelerator, backend and recipe row on its own, then each new accelerator's default backend."""
    given, accelerators = draft.given, draft.accelerators
    taken = Taken.of(accelerators)
    for accelerator in given.accelerators:
        check_accelerator(accelerator, accelerators, taken)
    for backend in given.backends:
        check_backend(backend, accelerators)
    for recipe in given.recipes:
        check_recipe(recipe, accelerators)
    for accelerator in given.accelerators:
        first_problem(default_backend_problems(accelerator, draft.backends))


def check_families(draft: Draft) -> None:
    """A family row replaces a built-in one's places to run (accelerators, precisions, reasons), not its layout."""
    base = draft.base
    for family in draft.given.families:
        if family.family not in base.families:
            raise InvalidRequest(
                field="rules.families",
                value=family.family,
                reason="a family row replaces a built-in family (custom families need a runtime of their own)",
                allowed=tuple(base.families),
            )
        where = f"rules.families[{family.family!r}]"
        check_family_fields(family, base.families[family.family], base.strategies)
        first_problem(unknown_accelerators(draft.accelerators, where, [*family.accelerators, *family.why_not]))
        if OPTION_TYPES.get(family.family) is ModelParallelOptions:
            for accelerator_name in family.accelerators:
                if accelerator_name not in MESH_BACKENDS:
                    raise InvalidRequest(
                        field=f"{where}.accelerators",
                        value=accelerator_name,
                        reason="a device mesh's collectives run over the backends trainplan's mesh knows "
                        f"({', '.join(f'{backend} on {name}' for name, backend in MESH_BACKENDS.items())})",
                        allowed=tuple(MESH_BACKENDS),
                    )
        for precision_name in family.precisions:
            if precision_name not in draft.precisions:
                raise no_such("precision", f"{where}.precisions", precision_name, draft.precisions)


def check_precisions(draft: Draft) -> None:
    """A new precision has a recipe; each given row's fields; every precision's fallbacks run where they stand in."""
    base = draft.base
    for precision in draft.given.precisions:
        if precision.name in base.precisions:
            continue
        if precision.name not in draft.recipes:
            raise InvalidRequest(
                field=f"rules.precisions[{precision.name!r}]",
                value=precision.name,
                reason="the runtime needs to know what to do with a new precision (its autocast and parameter dtypes)",
                fix=f"Add precision_recipes=[PrecisionRecipe(name={precision.name!r}, autocast_dtype=..., "
                "parameter_dtype=..., grad_scaler_on=frozenset(), accelerate=None, engine='torch')]",
            )
    for precision in draft.given.precisions:
        check_precision_fields(precision)
    for row in draft.precisions.values():
        check_precision(row, draft.precisions, draft.accelerators)


def check_usable(draft: Draft) -> None:
    """Every new accelerator and precision is usable: some family lists it, and it runs at some precision (an
    accelerator) or on some accelerator (a precision)."""
    running_on: dict[object, list[StrategyFamily]] = {}  # an accelerator → the families that run on it
    running_at: dict[object, list[StrategyFamily]] = {}  # a precision → the families that run at it
    for family in draft.families.values():
        for accelerator_name in family.accelerators:
            running_on.setdefault(accelerator_name, []).append(family.family)
        for precision_name in family.precisions:
            running_at.setdefault(precision_name, []).append(family.family)
    precisions_on: dict[object, list[PrecisionKey]] = {}  # an accelerator → the precisions that run on it
    for row in draft.precisions.values():
        for accelerator_name in row.accelerators:
            precisions_on.setdefault(accelerator_name, []).append(row.name)
    for accelerator in draft.given.accelerators:
        name = accelerator.name
        _listed("accelerator", name, families=running_on.get(name, []), precisions=precisions_on.get(name, []))
    for precision in draft.given.precisions:
        if precision.name not in draft.base.precisions:
            runs = [precision.name] if precision.accelerators else []
            _listed("precision", precision.name, families=running_at.get(precision.name, []), precisions=runs)


def add_options(draft: Draft, rows: Iterable[OptionRow]) -> None:
    """The base's option rows with `rows` added to their families, each checked against its family's others."""
    draft.options = dict(draft.base.options)
    for option in _rows(rows, OptionRow, "rules.options"):
        draft.options[option.family] = (*draft.options.get(option.family, ()), option)
        check_added_row(option, draft.options, f"rules.options[{option.family!r}, {option.name!r}]")


def add_strategies(draft: Draft) -> None:
    """Each given strategy: a new name, a family and a launcher the family runs under, a preset of its options."""
    base = draft.base
    pairs = frozenset((strategy.family, strategy.launcher) for strategy in base.strategies.values())
    draft.strategies = dict(base.strategies)
    for rule in draft.given.strategies:
        check_strategy(rule, base, draft.families, pairs, draft.options)
        draft.strategies[rule.name] = rule


def counterparts(draft: Draft, field: str, table: object) -> dict[StrategyKey, StrategyKey]:
    """`field` (fork_, spawn_ or script_counterparts) added to the base's table: each a strategy of the new rule set
    that runs where its counterpart cannot."""
    given: object = table
    if given is not None and not isinstance(given, Mapping):
        raise InvalidRequest(
            field=f"rules.{field}",
            value=given,
            reason=f"it maps a strategy to its counterpart, not {a_kind(given)}",
            fix=f"Write e.g. {field}={{'my_strategy': 'ddp'}}",
        )
    name = field.replace("counterparts", "strategy_for")  # fork_counterparts adds to fork_strategy_for
    merged: dict[StrategyKey, StrategyKey] = dict(getattr(draft.base, name))
    for key, value in (given or {}).items():
        for counterpart in (key, value):
            if counterpart not in draft.strategies:
                raise InvalidRequest(
                    field=f"rules.{field}",
                    value=counterpart,
                    reason="a counterpart names a strategy of the rule set",
                    allowed=tuple(draft.strategies),
                )
        refusal = counterpart_refusal(name, key, value, draft.strategies, draft.base.launchers)
        if refusal is not None:
            raise InvalidRequest(
                field=f"rules.{field}[{key!r}]", value=value, reason=refusal, fix="Name a counterpart that runs there"
            )
        merged[key] = value
    return merged


def framework_rows(draft: Draft, rows: Iterable[FrameworkAccelerator]) -> dict[AcceleratorKey, FrameworkAccelerator]:
    """The framework spellings of the base with `rows` added, each checked."""
    added = _rows(rows, FrameworkAccelerator, "rules.framework_accelerators")
    _unique("rules.framework_accelerators", [row.accelerator for row in added])
    table = dict(draft.base.framework_accelerators)
    for row in added:
        where = f"rules.framework_accelerators[{row.accelerator!r}]"
        _downstream_accelerator(f"{where}.accelerator", row.accelerator, draft.accelerators)
        lightning: object = row.lightning
        devices: object = row.lightning_devices
        flags: dict[str, object] = {
            "accelerate_gpu_ids": row.accelerate_gpu_ids,
            "accelerate_processes": row.accelerate_processes,
        }
        if not isinstance(lightning, str) or not CUSTOM_NAME.fullmatch(lightning):
            raise InvalidRequest(
                field=f"{where}.lightning",
                value=lightning,
                reason="it is the accelerator name the framework's Lightning plugin registers",
                fix=f"Write e.g. lightning={row.accelerator!r}",
            )
        if devices not in get_args(LightningDevices):
            raise InvalidRequest(
                field=f"{where}.lightning_devices",
                value=devices,
                reason="it says how Lightning takes `devices` for the accelerator",
                allowed=get_args(LightningDevices),
            )
        if row.accelerate_cpu is not False:
            raise InvalidRequest(
                field=f"{where}.accelerate_cpu",
                value=row.accelerate_cpu,
                reason="Accelerate's cpu=True runs on the host's CPUs, and a downstream accelerator's devices are not "
                "the host's",
                fix="Write accelerate_cpu=False",
            )
        for field, value in flags.items():
            if not isinstance(value, bool):
                raise InvalidRequest(field=f"{where}.{field}", value=value, reason="it is True or False")
        table[row.accelerator] = row
    return table


def kubernetes_resources(draft: Draft, given: Mapping[AcceleratorKey, str] | None) -> dict[AcceleratorKey, str | None]:
    """The Kubernetes resources of the base with `given` added, each checked."""
    base = draft.base
    table: dict[AcceleratorKey, str | None] = dict(base.kubernetes_resources)
    mapping: object = given
    if mapping is None:
        return table
    if not isinstance(mapping, Mapping):
        raise InvalidRequest(
            field="rules.kubernetes_resources",
            value=mapping,
            reason=f"it maps an accelerator to the Kubernetes resource of its devices, not {a_kind(mapping)}",
            fix="Write e.g. kubernetes_resources={'npu': 'huawei.com/Ascend910'}",
        )
    for name, resource in mapping.items():
        where = f"rules.kubernetes_resources[{name!r}]"
        _downstream_accelerator(where, name, draft.accelerators)
        if name in base.kubernetes_resources:
            raise InvalidRequest(field=where, value=resource, reason="the rule set names its resource already")
        if not isinstance(resource, str) or not _KUBERNETES_RESOURCE.fullmatch(resource):
            raise InvalidRequest(
                field=where,
                value=resource,
                reason="it is the extended resource the device plugin advertises, domain/name",
                fix="Write e.g. 'huawei.com/Ascend910' (what `kubectl describe node` lists under Allocatable)",
            )
        table[name] = resource
    return table


def cluster_rows(draft: Draft, rows: Iterable[ClusterRule]) -> dict[ClusterKey, ClusterRule]:
    """The clusters of the base with `rows` added: each a cluster manager of its own (a new name, variables to detect
    it by, a place of its own in the detection order), its fields as the one reader reads them."""
    base = draft.base
    added = _rows(rows, ClusterRule, "rules.clusters")
    _unique("rules.clusters", [rule.name for rule in added])
    known = {*base.clusters, *CLUSTER_FLAGS, *CLUSTER_ALIASES}
    for rule in added:
        _new_name("rules.clusters", rule.name, known, CUSTOM_NAME)
    table: dict[ClusterKey, ClusterRule] = {**base.clusters, **{rule.name: rule for rule in added}}
    taken = frozenset(rule.detect_priority for rule in base.clusters.values() if rule.detect_priority is not None)
    for rule in added:
        check_cluster(rule, table, taken)
        priority: object = rule.detect_priority
        if isinstance(priority, int):
            taken |= {priority}
    return table


def _downstream_accelerator(field: str, name: object, accelerators: Mapping[AcceleratorKey, object]) -> None:
    """`name` is an accelerator of the new rule set that trainplan does not define (a built-in accelerator's framework
    spelling and Kubernetes resource are trainplan's own rows)."""
    if name in accelerators and name not in ACCELERATORS:
        return
    raise InvalidRequest(
        field=field,
        value=name,
        reason="it says how a downstream accelerator of the rule set is spelled or scheduled (a built-in "
        "accelerator's row is trainplan's own)",
        allowed=tuple(name for name in accelerators if name not in ACCELERATORS),
    )


def _rows(rows: object, kind: type[R], field: str) -> tuple[R, ...]:
    """The rows given as an iterable of `kind` (a plain string is not one), or `InvalidRequest`."""
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Iterable):
        raise InvalidRequest(
            field=field,
            value=rows,
            reason=f"it takes a list of {kind.__name__}, not {a_kind(rows)}",
            fix=f"Write e.g. {field.rsplit('.', maxsplit=1)[-1]}=[{kind.__name__}(...)]",
        )
    found = tuple(rows)
    for row in found:
        if not isinstance(row, kind):
            raise InvalidRequest(field=field, value=row, reason=f"each row is a {kind.__name__}, not {a_kind(row)}")
    return found


def _unique(field: str, names: list[str]) -> None:
    """One row per name in one call (names seen are kept in a set: linear in the rows)."""
    seen: set[object] = set()
    for row_name in names:
        key: object = row_name
        try:
            hash(key)
        except TypeError:  # not a name at all: the row's own check says so
            key = id(row_name)
        if key in seen:
            raise InvalidRequest(
                field=field,
                value=row_name,
                reason="two rows of one call have that name (which one holds?)",
                fix="Give each name one row",
            )
        seen.add(key)


def _new_name(field: str, name: object, known: set[str], pattern: re.Pattern[str]) -> None:
    """A downstream name: a lowercase name the rule set does not have yet (nor as an alias or a flag)."""
    if not isinstance(name, str) or not pattern.fullmatch(name):
        raise InvalidRequest(
            field=field,
            value=name,
            reason="a downstream name is lowercase letters, digits and underscores"
            + (" (hyphens too)" if pattern is CUSTOM_PRECISION else "")
            + ", starting with a letter",
            fix="Write e.g. CustomName('npu')" if pattern is CUSTOM_NAME else "Write e.g. CustomName('int8-qat')",
        )
    if name in known:
        raise InvalidRequest(
            field=field,
            value=name,
            reason="the rule set already has that name (as a name, an alias or a flag): a built-in name is not "
            "reused for another row",
            fix="Choose a name of your own (replace a built-in family, precision or backend row with "
            "families=/precisions=/backends=)",
        )


def _listed(kind: str, name: str, *, families: list[StrategyFamily], precisions: list[PrecisionKey]) -> None:
    """A new accelerator or precision must be usable: some family lists it, and it runs at some precision (an
    accelerator) or on some accelerator (a precision)."""
    if not families:
        raise InvalidRequest(
            field=f"rules.{kind}s[{name!r}]",
            value=name,
            reason=f"no family lists the {kind}, so no strategy could run {'on' if kind == 'accelerator' else 'at'} it",
            fix=f"Add it to the {kind}s of the family rows it runs with: families=[attrs.evolve("
            f"BUILTIN_RULES.families['ddp'], {kind}s=BUILTIN_RULES.families['ddp'].{kind}s | {{{name!r}}})]",
        )
    if not precisions:
        missing = "no precision runs on it" if kind == "accelerator" else "it runs on no accelerator"
        raise InvalidRequest(
            field=f"rules.{kind}s[{name!r}]",
            value=name,
            reason=missing,
            fix="List the accelerator in the rows of the precisions it runs at (precisions=[attrs.evolve("
            "BUILTIN_RULES.precisions['32-true'], accelerators=...)])"
            if kind == "accelerator"
            else "List the accelerators it runs on in its row's accelerators",
        )


__all__ = [
    "Draft",
    "Given",
    "R",
    "add_recipes",
    "add_strategies",
    "check_families",
    "check_hardware",
    "check_precisions",
    "check_usable",
    "cluster_rows",
    "counterparts",
    "framework_rows",
    "is_rules_reference",
    "kubernetes_resources",
    "reference",
]
