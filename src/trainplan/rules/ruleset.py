"""A rule set as a value: every table the resolver reads, bundled, and extensible without global state.

`resolve`, `check`, the matrix and the CLI take a `Rules` (default `BUILTIN_RULES`, the tables of
`trainplan.rules`). A downstream framework that registers its own strategies (as Lightning users do through
its global `StrategyRegistry`) builds an extended value instead and passes it along::

    RULES = tp.BUILTIN_RULES.extend(
        strategies=[tp.StrategyRule(name=tp.CustomName("ddp_custom_checkpoint_io"), family="ddp",
                                    launcher="subprocess", preset={"static_graph": True})],
    )
    plan = tp.resolve(tp.Request(strategy=RULES.strategy_name("ddp_custom_checkpoint_io")), rules=RULES)

A device plugin's accelerator (with its backend) and a new precision (with its runtime recipe) are rows of an
extension too (`extend(accelerators=..., backends=..., precisions=..., precision_recipes=...)`), their names
`CustomName`s; `Environment.device_counts` counts such an accelerator's devices.

Nothing is registered anywhere: two rule sets live side by side, and the built-in one never changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final, SupportsIndex, TypeVar, get_args

import attrs

from trainplan.rules.clusters import CLUSTERS, LOCAL_CLUSTER, ClusterRule, detected_alone
from trainplan.rules.hardware import (
    ACCELERATOR_ALIAS_NOTES,
    ACCELERATOR_ALIASES,
    ACCELERATOR_GROUPS,
    ACCELERATORS,
    SUPPLIED_COUNTS,
    AcceleratorRule,
    DeviceCounts,
    ForkBlocker,
)
from trainplan.rules.job import KUBERNETES_DEVICE_RESOURCES, SYNC_BATCHNORM_ACCELERATORS
from trainplan.rules.launchers import HOST_LAUNCHER, LAUNCHERS, SERVED_START_METHODS, LauncherRule
from trainplan.rules.legacy import LEGACY_ACCELERATORS, LEGACY_STRATEGIES
from trainplan.rules.mesh import MESH_BACKENDS
from trainplan.rules.option_checks import strategy_options
from trainplan.rules.precision import (
    BACKENDS,
    PRECISION_ALIASES,
    PRECISIONS,
    BackendRule,
    PrecisionRule,
)
from trainplan.rules.recipes import (
    FRAMEWORK_ACCELERATORS,
    PRECISION_RECIPES,
    AccelerateMixedPrecision,
    DtypeName,
    FrameworkAccelerator,
    LightningDevices,
    PrecisionRecipe,
    RecipeEngine,
)
from trainplan.rules.strategies import (
    AUTO_STRATEGIES,
    AUTO_STRATEGY_FOR_OPTIONS,
    FAMILIES,
    FORK_STRATEGY_FOR,
    OPTION_TYPES,
    SCRIPT_STRATEGY_FOR,
    SPAWN_STRATEGY_FOR,
    STRATEGIES,
    STRATEGY_ALIAS_NOTES,
    STRATEGY_ALIASES,
    AutoStrategyRule,
    FamilyRule,
    StrategyRule,
)
from trainplan.spec.errors import InvalidRequest
from trainplan.spec.names import (
    ACCELERATOR_FLAGS,
    CUSTOM_NAME,
    CUSTOM_PRECISION,
    DEFAULT_PRECISION,
    PRECISION_FLAGS,
    STRATEGY_FLAGS,
    AcceleratorFlag,
    AcceleratorKey,
    BackendKey,
    ClusterName,
    CustomName,
    LauncherName,
    PrecisionKey,
    PrecisionName,
    StrategyFamily,
    StrategyFlag,
    StrategyKey,
)
from trainplan.spec.names import (
    ACCELERATORS as ACCELERATOR_NAMES,
)
from trainplan.spec.names import (
    BACKENDS as BACKEND_NAMES,
)
from trainplan.spec.names import (
    PRECISIONS as PRECISION_NAMES,
)
from trainplan.spec.options import ModelParallelOptions

_PACKAGE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?", flags=re.ASCII)  # a distribution's name
_REFERENCE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*", flags=re.ASCII)

UNNAMED_RULES: Final = "unnamed"
"""What a plan records of a downstream rule set that has no reference: read back, it is checked as far as its own
facts go."""


def is_rules_reference(text: str) -> bool:
    """Whether `text` reads as "package.module:NAME", where a rule set can be imported from."""
    return _REFERENCE.fullmatch(text) is not None


@attrs.frozen(kw_only=True, eq=False)
class Rules:
    """Every table the resolver decides from. Compared by identity: each extension is a rule set of its own.

    Built (directly, by `attrs.evolve` or by `extend`), the whole rule set is checked to hold together (see
    `_check_coherence`): an incoherent one is refused with `InvalidRequest` naming the row, never left to fail as
    `MissingRule` at the first resolve. Its tables are read-only views; a rule set pickles and deep-copies (as plain
    copies of its tables, built and checked again): `BUILTIN_RULES` comes back as itself; any other comes back as a
    new rule set with equal rows and the same reference, which resolves equal plans (plans record the reference, not
    the object) but is not `==` to the original, nor shares its memo entries (the memo is keyed by identity)."""

    accelerators: Mapping[AcceleratorKey, AcceleratorRule]
    accelerator_groups: Mapping[str, tuple[AcceleratorKey, ...]]
    accelerator_alias_notes: Mapping[str, str]
    strategies: Mapping[StrategyKey, StrategyRule]
    strategy_aliases: Mapping[str, StrategyKey]
    strategy_alias_notes: Mapping[str, str]
    families: Mapping[StrategyFamily, FamilyRule]
    auto_for_options: Mapping[StrategyFamily, StrategyKey]
    auto_strategies: tuple[AutoStrategyRule, ...]
    fork_strategy_for: Mapping[StrategyKey, StrategyKey]
    spawn_strategy_for: Mapping[StrategyKey, StrategyKey]
    script_strategy_for: Mapping[StrategyKey, StrategyKey]
    launchers: Mapping[LauncherName, LauncherRule]
    precisions: Mapping[PrecisionKey, PrecisionRule]
    precision_recipes: Mapping[PrecisionKey, PrecisionRecipe]
    """What the runtime does with each precision (autocast dtype, parameter dtype, loss scaling)."""
    default_precision: PrecisionName
    """The precision of a request that names none: always the rules package's `DEFAULT_PRECISION` (`Request()`
    carries it whichever rule set resolves it; a rule set with another is refused). A framework that runs at another
    precision by default writes `precision=` in the requests it builds."""
    backends: Mapping[BackendKey, BackendRule]
    clusters: Mapping[ClusterName, ClusterRule]
    sync_batchnorm_accelerators: frozenset[AcceleratorKey]
    framework_accelerators: Mapping[AcceleratorKey, FrameworkAccelerator]
    """How Lightning/Fabric and Accelerate spell each accelerator (the adapters read it): a downstream accelerator
    has a row where its framework plugin registers a name of its own."""
    kubernetes_resources: Mapping[AcceleratorKey, str | None]
    """The Kubernetes resource each pod of an emitted PyTorchJob asks for per device (None: CPUs, which every node
    has); an accelerator without a row runs in no PyTorchJob."""
    reference: str | None = None
    """Where this rule set can be imported from ("package.module:NAME"), recorded in the plans made from it so that
    a launched worker reading its plan back checks it against the same rules; None: nowhere said."""
    strategy_spellings: Mapping[str, StrategyFlag | CustomName] = attrs.field(init=False)
    """Every accepted strategy spelling (names, aliases, 'auto') → its name: what the normaliser reads."""
    accelerator_spellings: Mapping[str, AcceleratorFlag | CustomName] = attrs.field(init=False)
    """Every accepted accelerator spelling (flags, aliases, downstream names) → its flag: what the normaliser reads."""
    precision_spellings: Mapping[str, PrecisionKey] = attrs.field(init=False)
    """Every accepted precision spelling (names, aliases, downstream names) → its name (integers: `normalise`)."""
    backend_spellings: Mapping[str, BackendKey] = attrs.field(init=False)
    """Every backend name of the rule set → itself: what the normaliser reads."""
    accelerators_by_priority: tuple[AcceleratorRule, ...] = attrs.field(init=False)
    """The accelerators, best first: the order `accelerator='auto'` takes them in (indexed once per rule set)."""
    accelerator_order: str = attrs.field(init=False)
    """That order as text ("xla > cuda > mps > cpu"), for the reason of an 'auto' choice."""

    def __attrs_post_init__(self) -> None:
        # Every table a read-only copy: a rule set is a value (an extension is a new one), so nobody can change one
        # in place and have the memoised resolve and the cold path disagree.
        for attribute in attrs.fields(Rules):
            value = getattr(self, attribute.name) if attribute.init else None
            if isinstance(value, Mapping):
                object.__setattr__(self, attribute.name, MappingProxyType(dict(value)))
        spellings: dict[str, StrategyFlag | CustomName] = {"auto": "auto"}
        spellings.update({name: name for name in self.strategies})
        spellings.update(self.strategy_aliases)
        object.__setattr__(self, "strategy_spellings", MappingProxyType(spellings))
        accelerators: dict[str, AcceleratorFlag | CustomName] = {
            flag: flag for flag in ACCELERATOR_FLAGS if flag not in ACCELERATOR_ALIASES
        }
        accelerators.update(ACCELERATOR_ALIASES)
        accelerators.update({name: name for name in self.accelerators if name not in accelerators})
        object.__setattr__(self, "accelerator_spellings", MappingProxyType(accelerators))
        precisions: dict[str, PrecisionKey] = {name: name for name in self.precisions}
        precisions.update(PRECISION_ALIASES)
        object.__setattr__(self, "precision_spellings", MappingProxyType(precisions))
        object.__setattr__(self, "backend_spellings", MappingProxyType({name: name for name in self.backends}))
        # Built directly or through attrs.evolve, a rule set is checked as an extension's is: whole, at construction
        # (refused with InvalidRequest naming the row, not with MissingRule at the first resolve).
        _check_coherence(self)
        ranked = tuple(sorted(self.accelerators.values(), key=_priority))
        object.__setattr__(self, "accelerators_by_priority", ranked)
        object.__setattr__(self, "accelerator_order", " > ".join(rule.name for rule in ranked))

    def __repr__(self) -> str:
        # The tables run to tens of kilobytes (help() and signatures show a default's repr): name and size only.
        if self is BUILTIN_RULES:
            named = "BUILTIN_RULES"
        else:
            named = UNNAMED_RULES if self.reference is None else self.reference
        return (
            f"<Rules {named}: {len(self.strategies)} strategies, {len(self.accelerators)} accelerators, "
            f"{len(self.precisions)} precisions>"
        )

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        # trainplan's own rule set pickles and copies as itself (by its global name), so that a plan made from the
        # copy still records no rule set; any other is a new value, equal in every row, distinct by identity.
        if self is BUILTIN_RULES:
            return "BUILTIN_RULES"
        # The tables are read-only views (C-fast to read on the cold path, but not picklable): the rule set travels
        # as plain copies of its given tables and is built again (checked again) where it lands.
        given = {
            attribute.name: dict(value) if isinstance(value := getattr(self, attribute.name), Mapping) else value
            for attribute in attrs.fields(Rules)
            if attribute.init
        }
        return (_rebuilt, (given,))

    @property
    def plan_reference(self) -> str | None:
        """What a plan made from this rule set records of it (`Plan.rules`): None for trainplan's own."""
        if self is BUILTIN_RULES:
            return None
        return UNNAMED_RULES if self.reference is None else self.reference

    def may_have_made(self, plan_rules: str | None) -> bool:
        """Whether a plan recording `plan_rules` (its `Plan.rules`) may be read back or run with this rule set: a
        plan of trainplan's own rules or of an unnamed set with any, a named one only with the set of that name."""
        return plan_rules in (None, UNNAMED_RULES, self.reference)

    def strategy_name(self, name: str) -> StrategyKey:
        """`name` as a strategy of this rule set (typed), or `InvalidRequest` when it has no such strategy."""
        found = self.strategy_spellings.get(name)
        if found is None or found == "auto":
            raise InvalidRequest(
                field="strategy",
                value=name,
                reason="this rule set has no such strategy",
                allowed=tuple(self.strategies),
            )
        return found

    def extend(
        self,
        *,
        strategies: Iterable[StrategyRule] = (),
        families: Iterable[FamilyRule] = (),
        precisions: Iterable[PrecisionRule] = (),
        accelerators: Iterable[AcceleratorRule] = (),
        backends: Iterable[BackendRule] = (),
        precision_recipes: Iterable[PrecisionRecipe] = (),
        framework_accelerators: Iterable[FrameworkAccelerator] = (),
        kubernetes_resources: Mapping[AcceleratorKey, str] | None = None,
        script_counterparts: Mapping[StrategyKey, StrategyKey] | None = None,
        fork_counterparts: Mapping[StrategyKey, StrategyKey] | None = None,
        spawn_counterparts: Mapping[StrategyKey, StrategyKey] | None = None,
        name: str | None = None,
    ) -> Rules:
        """A new rule set: these strategies, accelerators, backends and precisions added, these family and
        precision rows in place of the built-in ones of the same name (their accelerators, precisions, needs and
        reasons), and the counterparts added.

        A new strategy has a `CustomName` of lowercase letters, digits and underscores, a family and a launcher of
        the rule set, and a preset of its family's options. A new accelerator (a device plugin's: Ascend's "npu",
        Gaudi's "hpu") has a `CustomName` too, its devices counted by `Environment.device_counts`, a default
        backend of the rule set (a new one, such as "hccl", is a `BackendRule` with a `CustomName`), an
        `auto_priority` of its own, and family and precision rows that list it. A new precision has a `CustomName`
        (hyphens allowed, as "bf16-mixed"), a family row that lists it and a `PrecisionRecipe`: what the runtime
        does with it. A downstream accelerator may also say how the frameworks spell it (`framework_accelerators`:
        the name its Lightning plugin registers, how Lightning takes its devices, Accelerate's flags) and which
        Kubernetes resource a pod asks for per device (`kubernetes_resources={"npu": "huawei.com/Ascend910"}`, the
        resource its device plugin advertises); without them, the adapters and `emit_kubeflow` refuse it by name. `name`
        is where the new rule set can be imported from ("package.module:NAME", the module
        that builds it): plans made from it record it, and a launched worker imports it to check the plan it reads
        back. A built-in backend's row may be replaced too (`backends=[attrs.evolve(BUILTIN_RULES.backends['gloo'],
        accelerators=... | {'npu'})]`, for an accelerator whose default backend is gloo), keeping how it reduces
        (`needs_device_tensors`). Refused with `InvalidRequest` naming what is wrong.

        trainplan checks that the rule set holds together and that each row is well-formed (a row listing an
        accelerator both in `accelerators` and in `why_not` is refused as contradictory), not that the hardware can
        do what a replaced row claims: a replaced row is the framework's claim."""
        given_name: object = name
        if given_name is not None and (not isinstance(given_name, str) or not is_rules_reference(given_name)):
            raise InvalidRequest(
                field="rules.name",
                value=name,
                reason="a rule set's name is where it is imported from",
                fix="Write e.g. name='myframework.trainplan_rules:RULES'",
            )
        added = _rows(strategies, StrategyRule, "rules.strategies")
        replaced_families = _rows(families, FamilyRule, "rules.families")
        given_precisions = _rows(precisions, PrecisionRule, "rules.precisions")
        added_accelerators = _rows(accelerators, AcceleratorRule, "rules.accelerators")
        added_backends = _rows(backends, BackendRule, "rules.backends")
        added_recipes = _rows(precision_recipes, PrecisionRecipe, "rules.precision_recipes")
        _unique("rules.strategies", [rule.name for rule in added])
        _unique("rules.families", [rule.family for rule in replaced_families])
        _unique("rules.precisions", [rule.name for rule in given_precisions])
        _unique("rules.accelerators", [rule.name for rule in added_accelerators])
        _unique("rules.backends", [rule.name for rule in added_backends])
        _unique("rules.precision_recipes", [recipe.name for recipe in added_recipes])
        for accelerator in added_accelerators:
            _new_name(
                "rules.accelerators",
                accelerator.name,
                (*self.accelerator_spellings, *ACCELERATOR_NAMES, *LEGACY_ACCELERATORS),
                CUSTOM_NAME,
            )
        for backend in added_backends:
            if backend.name not in self.backends:
                _new_name("rules.backends", backend.name, (*self.backends, *BACKEND_NAMES), CUSTOM_NAME)
            elif backend.needs_device_tensors != self.backends[backend.name].needs_device_tensors:
                kept = self.backends[backend.name].needs_device_tensors
                raise InvalidRequest(
                    field=f"rules.backends[{backend.name!r}].needs_device_tensors",
                    value=backend.needs_device_tensors,
                    reason=f"the row replaces {backend.name!r}'s, and where trainplan places the tensors its "
                    "collectives reduce is the library's own: a replaced row changes which accelerators it serves, "
                    "not how",
                    fix=f"Write needs_device_tensors={kept!r}",
                )
        for precision in given_precisions:
            if precision.name not in self.precisions:
                known = (*self.precision_spellings, *PRECISION_NAMES, *map(str, PRECISION_FLAGS))
                _new_name("rules.precisions", precision.name, known, CUSTOM_PRECISION)
        new_accelerators = {**self.accelerators, **{rule.name: rule for rule in added_accelerators}}
        new_backends = {**self.backends, **{rule.name: rule for rule in added_backends}}
        new_families = {**self.families, **{rule.family: rule for rule in replaced_families}}
        new_precisions = {**self.precisions, **{rule.name: rule for rule in given_precisions}}
        new_recipes = dict(self.precision_recipes)
        for recipe in added_recipes:
            if recipe.name in self.precision_recipes or recipe.name not in new_precisions:
                raise InvalidRequest(
                    field="rules.precision_recipes",
                    value=recipe.name,
                    reason="a recipe says what the runtime does with a precision the extension adds (a built-in "
                    "precision's recipe is the runtime's own)",
                    allowed=tuple(name for name in new_precisions if name not in self.precision_recipes),
                )
            new_recipes[recipe.name] = recipe
        for accelerator in added_accelerators:
            _check_accelerator(accelerator, new_accelerators)
        for backend in added_backends:
            _check_backend(backend, new_accelerators)
        for recipe in added_recipes:
            _check_recipe(recipe, new_accelerators)
        for accelerator in added_accelerators:
            _check_default_backend(accelerator, new_backends)
        for family in replaced_families:
            if family.family not in self.families:
                raise InvalidRequest(
                    field="rules.families",
                    value=family.family,
                    reason="a family row replaces a built-in family (custom families need a runtime of their own)",
                    allowed=tuple(self.families),
                )
            where = f"rules.families[{family.family!r}]"
            _check_family_fields(family, self.families[family.family], self.strategies)
            _known_accelerators(new_accelerators, where, [*family.accelerators, *family.why_not])
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
                if precision_name not in new_precisions:
                    raise InvalidRequest(
                        field=f"{where}.precisions",
                        value=precision_name,
                        reason="no such precision",
                        allowed=tuple(new_precisions),
                    )
        for precision in given_precisions:
            if precision.name in self.precisions:
                continue
            if precision.name not in new_recipes:
                raise InvalidRequest(
                    field=f"rules.precisions[{precision.name!r}]",
                    value=precision.name,
                    reason="the runtime needs to know what to do with a new precision (its autocast and parameter "
                    "dtypes)",
                    fix=f"Add precision_recipes=[PrecisionRecipe(name={precision.name!r}, autocast_dtype=..., "
                    "parameter_dtype=..., grad_scaler_on=frozenset(), accelerate=None, engine='torch')]",
                )
        for precision in given_precisions:
            _check_precision_fields(precision)
        for precision in new_precisions.values():
            _check_precision(precision, new_precisions, new_accelerators)
        for accelerator in added_accelerators:
            _listed(
                "accelerator",
                accelerator.name,
                families=[rule.family for rule in new_families.values() if accelerator.name in rule.accelerators],
                precisions=[rule.name for rule in new_precisions.values() if accelerator.name in rule.accelerators],
            )
        for precision in given_precisions:
            if precision.name not in self.precisions:
                _listed(
                    "precision",
                    precision.name,
                    families=[rule.family for rule in new_families.values() if precision.name in rule.precisions],
                    precisions=[precision.name] if precision.accelerators else [],
                )
        new_strategies = dict(self.strategies)
        for rule in added:
            _check_strategy(rule, self, new_families)
            new_strategies[rule.name] = rule
        counterparts: list[Mapping[StrategyKey, StrategyKey]] = []
        for field, table in (
            ("script_counterparts", script_counterparts),
            ("fork_counterparts", fork_counterparts),
            ("spawn_counterparts", spawn_counterparts),
        ):
            given_table: object = table
            if given_table is not None and not isinstance(given_table, Mapping):
                raise InvalidRequest(
                    field=f"rules.{field}",
                    value=given_table,
                    reason=f"it maps a strategy to its counterpart, not a {type(given_table).__name__}",
                    fix=f"Write e.g. {field}={{'my_strategy': 'ddp'}}",
                )
            counterparts.append(table or {})
            for key, value in (table or {}).items():
                self._check_counterpart(field, key, value, new_strategies)
        new_framework = _framework_rows(framework_accelerators, self, new_accelerators)
        new_resources = _kubernetes_resources(kubernetes_resources, self, new_accelerators)
        return attrs.evolve(
            self,
            accelerators=new_accelerators,
            backends=new_backends,
            framework_accelerators=new_framework,
            kubernetes_resources=new_resources,
            strategies=new_strategies,
            families=new_families,
            precisions=new_precisions,
            precision_recipes=new_recipes,
            script_strategy_for={**self.script_strategy_for, **counterparts[0]},
            fork_strategy_for={**self.fork_strategy_for, **counterparts[1]},
            spawn_strategy_for={**self.spawn_strategy_for, **counterparts[2]},
            reference=name,
        )

    def _check_counterpart(
        self, field: str, key: StrategyKey, value: StrategyKey, strategies: Mapping[StrategyKey, StrategyRule]
    ) -> None:
        for counterpart in (key, value):
            if counterpart not in strategies:
                raise InvalidRequest(
                    field=f"rules.{field}",
                    value=counterpart,
                    reason="a counterpart names a strategy of the rule set",
                    allowed=tuple(strategies),
                )
        table = field.replace("counterparts", "strategy_for")  # fork_counterparts adds to fork_strategy_for
        refusal = _counterpart_refusal(table, key, value, strategies, self.launchers)
        if refusal is not None:
            raise InvalidRequest(
                field=f"rules.{field}[{key!r}]", value=value, reason=refusal, fix="Name a counterpart that runs there"
            )


def _counterpart_refusal(
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


R = TypeVar("R")

_KUBERNETES_RESOURCE = re.compile(
    r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", flags=re.ASCII
)
"""An extended Kubernetes resource, as a device plugin advertises it: `domain/name` (`nvidia.com/gpu`)."""


def _downstream_accelerator(field: str, name: object, accelerators: Mapping[AcceleratorKey, object]) -> None:
    """`name` is an accelerator of the new rule set that trainplan does not define (a built-in accelerator's framework
    spelling and Kubernetes resource are trainplan's own rows)."""
    if name in accelerators and name not in BUILTIN_RULES.accelerators:
        return
    raise InvalidRequest(
        field=field,
        value=name,
        reason="it says how a downstream accelerator of the rule set is spelled or scheduled (a built-in "
        "accelerator's row is trainplan's own)",
        allowed=tuple(name for name in accelerators if name not in BUILTIN_RULES.accelerators),
    )


def _framework_rows(
    rows: Iterable[FrameworkAccelerator], base: Rules, accelerators: Mapping[AcceleratorKey, AcceleratorRule]
) -> dict[AcceleratorKey, FrameworkAccelerator]:
    """The framework spellings of `base` with `rows` added, each checked."""
    added = _rows(rows, FrameworkAccelerator, "rules.framework_accelerators")
    _unique("rules.framework_accelerators", [row.accelerator for row in added])
    table = dict(base.framework_accelerators)
    for row in added:
        where = f"rules.framework_accelerators[{row.accelerator!r}]"
        _downstream_accelerator(f"{where}.accelerator", row.accelerator, accelerators)
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


def _kubernetes_resources(
    given: Mapping[AcceleratorKey, str] | None, base: Rules, accelerators: Mapping[AcceleratorKey, AcceleratorRule]
) -> dict[AcceleratorKey, str | None]:
    """The Kubernetes resources of `base` with `given` added, each checked."""
    table: dict[AcceleratorKey, str | None] = dict(base.kubernetes_resources)
    mapping: object = given
    if mapping is None:
        return table
    if not isinstance(mapping, Mapping):
        raise InvalidRequest(
            field="rules.kubernetes_resources",
            value=mapping,
            reason=f"it maps an accelerator to the Kubernetes resource of its devices, not a {type(mapping).__name__}",
            fix="Write e.g. kubernetes_resources={'npu': 'huawei.com/Ascend910'}",
        )
    for name, resource in mapping.items():
        where = f"rules.kubernetes_resources[{name!r}]"
        _downstream_accelerator(where, name, accelerators)
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


def _rows(rows: object, kind: type[R], field: str) -> tuple[R, ...]:
    """The rows given as an iterable of `kind` (a plain string is not one), or `InvalidRequest`."""
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Iterable):
        raise InvalidRequest(
            field=field,
            value=rows,
            reason=f"it takes a list of {kind.__name__}, not a {type(rows).__name__}",
            fix=f"Write e.g. {field.rsplit('.', maxsplit=1)[-1]}=[{kind.__name__}(...)]",
        )
    found = tuple(rows)
    for row in found:
        if not isinstance(row, kind):
            raise InvalidRequest(
                field=field, value=row, reason=f"each row is a {kind.__name__}, not a {type(row).__name__}"
            )
    return found


def _unique(field: str, names: list[str]) -> None:
    for index, row_name in enumerate(names):
        if row_name in names[:index]:
            raise InvalidRequest(
                field=field,
                value=row_name,
                reason="two rows of one call have that name (which one holds?)",
                fix="Give each name one row",
            )


def _new_name(field: str, name: object, known: Iterable[str], pattern: re.Pattern[str]) -> None:
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
    if name in set(known):
        raise InvalidRequest(
            field=field,
            value=name,
            reason="the rule set already has that name (as a name, an alias or a flag): a built-in name is not "
            "reused for another row",
            fix="Choose a name of your own (replace a built-in family, precision or backend row with "
            "families=/precisions=/backends=)",
        )


def _check_accelerator(rule: AcceleratorRule, accelerators: Mapping[AcceleratorKey, AcceleratorRule]) -> None:
    """A downstream accelerator's row: its devices counted by `Environment.device_counts`, indexed devices of its
    own (not the host's CPUs, not CUDA's usable-GPU probe), and a place of its own in the 'auto' order."""
    where = f"rules.accelerators[{rule.name!r}]"
    if rule.count_fact != SUPPLIED_COUNTS:
        raise InvalidRequest(
            field=f"{where}.count_fact",
            value=rule.count_fact,
            reason="probe() cannot count a downstream accelerator's devices: the framework supplies the count in "
            "Environment.device_counts",
            fix="Write count_fact='device_counts', and pass probe().with_device_counts({...}) to resolve",
        )
    _plain_fields(
        where,
        rule,
        flags=("takes_indices", "host", "slurm_gpus", "job_layout", "probes_usable"),
        texts=("description", "counts_why"),
        optional_texts=("strategy_fix",),
    )
    blocker: object = rule.fork_blocked_by
    if blocker is not None and blocker not in get_args(ForkBlocker):
        raise InvalidRequest(
            field=f"{where}.fork_blocked_by",
            value=blocker,
            reason="it names the Environment fact after which a forked child fails (or None)",
            allowed=get_args(ForkBlocker),
            fix="Write fork_blocked_by=None unless forking fails after one of those facts holds",
        )
    device_type: object = rule.device_type
    taken = {other.device_type: other.name for other in accelerators.values() if other.name != rule.name}
    if isinstance(device_type, str) and device_type in taken:
        raise InvalidRequest(
            field=f"{where}.device_type",
            value=device_type,
            reason=f"it is {taken[device_type]!r}'s torch device type: the workers would bind {taken[device_type]!r}'s "
            "devices, not the plugin's",
            fix=f"Write the device type the plugin registers with torch, e.g. device_type={rule.name!r}",
        )
    visibility: object = rule.visibility_variable
    interactive: object = rule.interactive_auto_devices
    binds: object = rule.binds_device
    refusals = (
        (
            not rule.takes_indices,
            "takes_indices",
            "its devices are indexed (devices counting processes is the CPU's policy)",
            "Write takes_indices=True",
        ),
        (rule.host, "host", "its devices are not the host's CPUs", "Write host=False"),
        (
            rule.probes_usable,
            "probes_usable",
            "the usable-GPU probe reads NVIDIA's driver only",
            "Write probes_usable=False",
        ),
        (
            rule.device_counts not in get_args(DeviceCounts),
            "device_counts",
            f"it is one of {get_args(DeviceCounts)}",
            "Write device_counts='any'",
        ),
        (
            rule.device_counts != "any" and not rule.counts_why,
            "counts_why",
            "a device policy that refuses counts says why",
            "Write counts_why='...'",
        ),
        (
            not isinstance(device_type, str) or not CUSTOM_NAME.fullmatch(device_type),
            "device_type",
            "it is the torch device type the workers bind (torch.device(device_type, index))",
            f"Write device_type={rule.name!r}",
        ),
        (
            visibility is not None,
            "visibility_variable",
            "trainplan's launcher hands a downstream accelerator's devices to its workers through the plan (each "
            "binds device_for(local_rank)), not by narrowing a visibility variable",
            "Write visibility_variable=None",
        ),
        (
            interactive is not None
            and (not isinstance(interactive, int) or isinstance(interactive, bool) or interactive < 1),
            "interactive_auto_devices",
            "it is a positive number of devices (or None)",
            "Write e.g. interactive_auto_devices=1",
        ),
        (
            not isinstance(binds, bool),
            "binds_device",
            "it says whether a worker makes its device torch's current one (True or False)",
            "Write binds_device=True (the default: through the plugin's torch device module)",
        ),
    )
    for refused, field, reason, fix in refusals:
        if refused:
            raise InvalidRequest(field=f"{where}.{field}", value=getattr(rule, field), reason=reason, fix=fix)
    priority: object = rule.auto_priority
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise InvalidRequest(
            field=f"{where}.auto_priority", value=priority, reason="it is a whole number (higher wins for 'auto')"
        )
    for other in accelerators.values():
        if other.name != rule.name and other.auto_priority == priority:
            ranked = sorted(accelerators.values(), key=_priority)
            order = ", ".join(f"{row.name}={row.auto_priority}" for row in ranked)
            raise InvalidRequest(
                field=f"{where}.auto_priority",
                value=priority,
                reason=f"{other.name!r} has that priority too: accelerator='auto' would have no order between them",
                fix=f"Choose a priority no other accelerator has (now: {order}; higher wins)",
            )


def _check_default_backend(rule: AcceleratorRule, backends: Mapping[BackendKey, BackendRule]) -> None:
    where = f"rules.accelerators[{rule.name!r}].default_backend"
    backend = backends.get(rule.default_backend)
    if backend is None:
        raise InvalidRequest(
            field=where,
            value=rule.default_backend,
            reason="no such backend (a device plugin's own backend is a BackendRule of the extension)",
            allowed=tuple(backends),
            fix="Add backends=[BackendRule(name=CustomName('hccl'), ...)], or name one of the rule set's",
        )
    if rule.name not in backend.accelerators:
        raise InvalidRequest(
            field=where,
            value=rule.default_backend,
            reason=f"backend {backend.name!r} does not reduce {rule.name!r} tensors (its row lists "
            f"{sorted(backend.accelerators)})",
            fix=f"List {rule.name!r} in the backend's accelerators (a built-in backend's row is replaced like a "
            f"family's: backends=[attrs.evolve(BUILTIN_RULES.backends[{backend.name!r}], accelerators="
            f"BUILTIN_RULES.backends[{backend.name!r}].accelerators | {{{rule.name!r}}})]), or choose a backend that "
            "does",
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


def _check_precision(
    rule: PrecisionRule,
    precisions: Mapping[PrecisionKey, PrecisionRule],
    accelerators: Mapping[AcceleratorKey, AcceleratorRule],
) -> None:
    where = f"rules.precisions[{rule.name!r}]"
    _known_accelerators(
        accelerators, where, [*rule.accelerators, *rule.fallback, *rule.fallback_why, *rule.why_not, *rule.instead]
    )
    for accelerator, fallback in rule.fallback.items():
        if accelerator not in rule.fallback_why:
            raise InvalidRequest(
                field=f"{where}.fallback_why",
                value=accelerator,
                reason="a fallback says why, for the note",
                fix=f"Add fallback_why={{{accelerator!r}: '...'}}",
            )
        target = precisions.get(fallback)
        if target is None or accelerator not in target.accelerators or accelerator in target.fallback:
            raise InvalidRequest(
                field=f"{where}.fallback[{accelerator!r}]",
                value=fallback,
                reason=f"the fallback is a precision that runs on {accelerator!r} itself",
                allowed=tuple(name for name, row in precisions.items() if accelerator in row.accelerators),
            )
    for accelerator, instead in rule.instead.items():
        if instead not in precisions:
            raise InvalidRequest(
                field=f"{where}.instead[{accelerator!r}]",
                value=instead,
                reason="no such precision",
                allowed=tuple(precisions),
            )


def _check_strategy(rule: StrategyRule, base: Rules, families: Mapping[StrategyFamily, FamilyRule]) -> None:
    name: object = rule.name
    if not isinstance(name, str) or not CUSTOM_NAME.fullmatch(name):
        raise InvalidRequest(
            field="rules.strategies",
            value=name,
            reason="a strategy name is lowercase letters, digits and underscores, starting with a letter",
            fix="Write e.g. CustomName('ddp_custom_checkpoint_io')",
        )
    if name in base.strategy_spellings or name in STRATEGY_FLAGS:
        raise InvalidRequest(
            field="rules.strategies",
            value=name,
            reason="the rule set already has a strategy (or an alias) of that name",
            fix="Choose a name of your own, e.g. one with your framework's prefix",
        )
    legacy = LEGACY_STRATEGIES.get(name)
    if legacy is not None and legacy.strategy != name:
        meaning = f"means strategy={legacy.strategy!r}" if legacy.strategy is not None else "is refused with its reason"
        raise InvalidRequest(
            field="rules.strategies",
            value=name,
            reason=f"it is an old Lightning name: Request.from_legacy reads {name!r} and {meaning}, so one name "
            "would name two strategies",
            fix="Choose a name of your own, e.g. one with your framework's prefix",
        )
    if rule.family not in families:
        raise InvalidRequest(
            field=f"rules.strategies[{name!r}].family",
            value=rule.family,
            reason="no such family",
            allowed=tuple(families),
        )
    if rule.launcher not in base.launchers:
        raise InvalidRequest(
            field=f"rules.strategies[{name!r}].launcher",
            value=rule.launcher,
            reason="no such launcher",
            allowed=tuple(base.launchers),
        )
    pairs = {(strategy.family, strategy.launcher) for strategy in base.strategies.values()}
    if (rule.family, rule.launcher) not in pairs:
        launchers = tuple(sorted(launcher for family, launcher in pairs if family == rule.family))
        raise InvalidRequest(
            field=f"rules.strategies[{name!r}].launcher",
            value=rule.launcher,
            reason=f"family {rule.family!r} does not run under it (trainplan's runtime starts it with "
            f"{', '.join(map(repr, launchers)) or 'no launcher'})",
            allowed=launchers,
        )
    options_type = OPTION_TYPES.get(rule.family)
    fields = () if options_type is None else tuple(attribute.name for attribute in attrs.fields(options_type))
    for option in rule.preset:
        if option not in fields:
            raise InvalidRequest(
                field=f"rules.strategies[{name!r}].preset",
                value=option,
                reason=f"family {rule.family!r} has no such option",
                allowed=fields,
            )
    if options_type is not None:
        try:
            preset: dict[str, Any] = dict(rule.preset)
            strategy_options(attrs.evolve(options_type(), **preset))  # as a request's options are
        except InvalidRequest as error:
            raise InvalidRequest(
                field=f"rules.strategies[{name!r}].preset",
                value=dict(rule.preset),
                reason=error.reason if error.field.startswith("strategy_options") else str(error),
                fix=error.fix,
            ) from None


def _priority(rule: AcceleratorRule) -> int:
    return -rule.auto_priority


def _known_accelerators(
    accelerators: Mapping[AcceleratorKey, AcceleratorRule], field: str, names: Iterable[object]
) -> None:
    for accelerator in names:
        if accelerator not in accelerators:
            raise InvalidRequest(
                field=field, value=accelerator, reason="no such accelerator", allowed=tuple(accelerators)
            )


def _plain_fields(
    where: str,
    row: object,
    *,
    flags: Iterable[str] = (),
    texts: Iterable[str] = (),
    optional_texts: Iterable[str] = (),
    sets: Iterable[str] = (),
    text_maps: Iterable[str] = (),
) -> None:
    """The fields of a downstream row whose type is all there is to check: True/False flags, texts (a reason, a
    description, a fix), sets of names and maps of name → reason."""
    for field in flags:
        if not isinstance(getattr(row, field), bool):
            raise InvalidRequest(field=f"{where}.{field}", value=getattr(row, field), reason="it is True or False")
    for field in (*texts, *optional_texts):
        value = getattr(row, field)
        if not isinstance(value, str) and not (value is None and field in optional_texts):
            raise InvalidRequest(
                field=f"{where}.{field}",
                value=value,
                reason="it is text, shown in the plan's reasons and errors"
                + (" (or None)" if field in optional_texts else ""),
                fix=f"Write {field}='...'",
            )
    for field in sets:
        value = getattr(row, field)
        if not isinstance(value, (frozenset, set)):
            raise InvalidRequest(
                field=f"{where}.{field}",
                value=value,
                reason=f"it is a set of names, not a {type(value).__name__}",
                fix=f"Write {field}=frozenset({{...}})",
            )
    for field in text_maps:
        value = getattr(row, field)
        if not isinstance(value, Mapping) or not all(isinstance(text, str) for text in value.values()):
            raise InvalidRequest(
                field=f"{where}.{field}",
                value=value,
                reason="it maps an accelerator to the reason, as text",
                fix=f"Write {field}={{'cpu': '...'}}",
            )


def _check_backend(rule: BackendRule, accelerators: Mapping[AcceleratorKey, AcceleratorRule]) -> None:
    where = f"rules.backends[{rule.name!r}]"
    _plain_fields(
        where,
        rule,
        flags=("needs_device_tensors",),
        texts=("description",),
        sets=("accelerators",),
        text_maps=("why_not",),
    )
    _known_accelerators(accelerators, where, [*rule.accelerators, *rule.why_not])


def _check_recipe(recipe: PrecisionRecipe, accelerators: Mapping[AcceleratorKey, AcceleratorRule]) -> None:
    where = f"rules.precision_recipes[{recipe.name!r}]"
    _plain_fields(where, recipe, sets=("grad_scaler_on",))
    _known_accelerators(accelerators, f"{where}.grad_scaler_on", recipe.grad_scaler_on)
    choices: tuple[tuple[str, object, tuple[object, ...]], ...] = (
        ("autocast_dtype", recipe.autocast_dtype, (None, *get_args(DtypeName))),
        ("parameter_dtype", recipe.parameter_dtype, get_args(DtypeName)),
        ("accelerate", recipe.accelerate, (None, *get_args(AccelerateMixedPrecision))),
        ("engine", recipe.engine, get_args(RecipeEngine)),
    )
    for field, value, allowed in choices:
        if value not in allowed:
            raise InvalidRequest(
                field=f"{where}.{field}",
                value=value,
                reason="the runtime knows these values only",
                allowed=allowed,
            )


def _check_precision_fields(rule: PrecisionRule) -> None:
    where = f"rules.precisions[{rule.name!r}]"
    _plain_fields(where, rule, texts=("description",), sets=("accelerators",), text_maps=("fallback_why", "why_not"))
    for field in ("fallback", "instead"):
        if not isinstance(getattr(rule, field), Mapping):
            raise InvalidRequest(
                field=f"{where}.{field}",
                value=getattr(rule, field),
                reason="it maps an accelerator to a precision",
                fix=f"Write {field}={{'cpu': '32-true'}} (or {{}})",
            )
    _package(where, rule.requires_package)


def _package(where: str, package: object) -> None:
    if package is not None and (not isinstance(package, str) or not _PACKAGE.fullmatch(package)):
        raise InvalidRequest(
            field=f"{where}.requires_package",
            value=package,
            reason="it is the name of the package it needs (as Environment.packages lists it), or None",
            fix="Write e.g. requires_package='deepspeed'",
        )


def _check_family_fields(rule: FamilyRule, builtin: FamilyRule, strategies: Mapping[StrategyKey, StrategyRule]) -> None:
    """A replaced family row changes where the family runs and at what precision (and why not), not how trainplan's
    runtime runs it: its process layout is the built-in row's."""
    where = f"rules.families[{rule.family!r}]"
    _plain_fields(
        where,
        rule,
        texts=("description",),
        optional_texts=("accelerator_fix",),
        sets=("accelerators", "precisions"),
        text_maps=("why_not",),
    )
    for field in ("multi_process", "has_process_group"):
        if getattr(rule, field) != getattr(builtin, field):
            raise InvalidRequest(
                field=f"{where}.{field}",
                value=getattr(rule, field),
                reason=f"trainplan's runtime runs family {rule.family!r} as its row says: a replaced row changes "
                "where the family runs and at what precision, not how it runs",
                fix=f"Write {field}={getattr(builtin, field)!r}",
            )
    for field in ("max_devices_per_node", "max_nodes"):
        value: object = getattr(rule, field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise InvalidRequest(
                field=f"{where}.{field}", value=value, reason="it is a positive whole number, or None (no limit)"
            )
    _package(where, rule.requires_package)
    if rule.base_strategy is not None and rule.base_strategy not in strategies:
        raise InvalidRequest(
            field=f"{where}.base_strategy",
            value=rule.base_strategy,
            reason="no such strategy",
            allowed=tuple(strategies),
        )


_COUNTERPARTS: Final = ("fork_strategy_for", "spawn_strategy_for", "script_strategy_for")
"""The counterpart tables of a rule set (`extend`'s fork_, spawn_ and script_counterparts add to them)."""


def _exists(value: object, rows: Mapping[Any, object], kind: str, table: str, key: str | None, field: str = "") -> None:
    """`value` names a row of `rows`, else `InvalidRequest` naming the row that names it (`_where(table, key, field)`,
    built only then: the built-in set is checked at import)."""
    if value not in rows:
        raise InvalidRequest(
            field=f"rules.{table}" if key is None else _where(table, key, field),
            value=value,
            reason=f"no such {kind} in the rule set: the row would fail at the first resolve that reads it",
            allowed=tuple(rows),
        )


def _check_references(rules: Rules) -> None:
    """Every name a row gives is a row of the rule set (strategies, families, launchers, precisions, backends, the
    local cluster row), and a family row under a built-in name keeps the built-in process layout."""
    strategies, families, launchers = rules.strategies, rules.families, rules.launchers
    for name in (*SERVED_START_METHODS, HOST_LAUNCHER):
        if name not in launchers:
            raise InvalidRequest(
                field="rules.launchers",
                value=tuple(launchers),
                reason=f"trainplan's runtime starts workers with launcher {name!r} (its own tables name it), and the "
                "rule set has no such row",
                fix=f"Keep the built-in row: launchers={{**BUILTIN_RULES.launchers, ...}} (it has {name!r})",
            )
    for strategy in strategies.values():
        if strategy.family in families and strategy.launcher in launchers:
            continue
        _exists(strategy.family, families, "family", "strategies", strategy.name, "family")
        _exists(strategy.launcher, launchers, "launcher", "strategies", strategy.name, "launcher")
    for table in _COUNTERPARTS:
        for key, value in getattr(rules, table).items():
            _exists(key, strategies, "strategy", table, None)
            _exists(value, strategies, "strategy", table, key)
            refusal = _counterpart_refusal(table, key, value, strategies, launchers)
            if refusal is not None:
                raise InvalidRequest(
                    field=_where(table, key), value=value, reason=refusal, fix="Name a counterpart that runs there"
                )
    for family_name, strategy_name in rules.auto_for_options.items():
        _exists(family_name, families, "family", "auto_for_options", None)
        _exists(strategy_name, strategies, "strategy", "auto_for_options", family_name)
    for index, row in enumerate(rules.auto_strategies):
        if row.strategy not in strategies:
            _exists(row.strategy, strategies, "strategy", f"auto_strategies[{index}].strategy", None)
    for launcher in launchers.values():
        if launcher.in_started_job is not None:
            _exists(launcher.in_started_job, launchers, "launcher", "launchers", launcher.name, "in_started_job")
    for precision in rules.precisions.values():
        for field in ("fallback", "instead"):
            for accelerator, target in getattr(precision, field).items():
                if target not in rules.precisions:
                    _exists(
                        target, rules.precisions, "precision", "precisions", precision.name, f"{field}[{accelerator!r}]"
                    )
    grouped = {name for family in families.values() if family.has_process_group for name in family.accelerators}
    for accelerator in rules.accelerators.values():
        if accelerator.name in grouped:  # its process groups run over the default backend (else only named)
            _check_default_backend(accelerator, rules.backends)
        else:
            _exists(
                accelerator.default_backend,
                rules.backends,
                "backend",
                "accelerators",
                accelerator.name,
                "default_backend",
            )
    if not any(detected_alone(rule) for rule in rules.clusters.values()):
        raise InvalidRequest(
            field="rules.clusters",
            value=tuple(rules.clusters),
            reason="no row is detected without cluster variables: a process outside any cluster manager would "
            "have no cluster to plan for",
            fix=f"Keep the built-in {LOCAL_CLUSTER!r} row: clusters={{**BUILTIN_RULES.clusters, ...}}",
        )
    for key, family in families.items():
        builtin = FAMILIES.get(family.family)
        if builtin is None or family.family != key:
            raise InvalidRequest(
                field=_where("families", key),
                value=family.family,
                reason="a family row is one of trainplan's families, under its own name (custom families need a "
                "runtime of their own)",
                allowed=tuple(FAMILIES),
            )
        if family.multi_process is builtin.multi_process and family.has_process_group is builtin.has_process_group:
            continue
        for field in ("multi_process", "has_process_group"):
            if getattr(family, field) != getattr(builtin, field):
                raise InvalidRequest(
                    field=_where("families", family.family, field),
                    value=getattr(family, field),
                    reason=f"trainplan's runtime runs family {family.family!r} as its built-in row says: a replaced "
                    "row changes where the family runs and at what precision, not how it runs",
                    fix=f"Write {field}={getattr(builtin, field)!r}",
                )


def _check_claims(rules: Rules) -> None:
    """No row says both yes and no (an accelerator in a row's `accelerators` and in its `why_not`), every precision
    runs under some family, and no two accelerators share a framework spelling or a Kubernetes resource."""
    for table in ("families", "precisions", "backends"):
        rows: Mapping[str, FamilyRule | PrecisionRule | BackendRule] = getattr(rules, table)
        for key, row in rows.items():
            if not row.accelerators.isdisjoint(row.why_not):
                both = sorted(name for name in row.accelerators if name in row.why_not)
                raise InvalidRequest(
                    field=_where(table, key, "why_not"),
                    value=both,
                    reason=f"the row lists {', '.join(map(repr, both))} in its accelerators and gives a reason it "
                    "does not run there: which one holds?",
                    fix="Drop the accelerator from why_not (it runs there) or from accelerators (it does not)",
                )
    listed = {name for family in rules.families.values() for name in family.precisions}
    for precision in rules.precisions:
        if precision not in listed:
            raise InvalidRequest(
                field=_where("precisions", precision),
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
            raise InvalidRequest(
                field=_where("framework_accelerators", accelerator, "lightning"),
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
            raise InvalidRequest(
                field=_where("kubernetes_resources", accelerator),
                value=resource,
                reason=f"it is the resource of {holder!r}: the pods would ask for {holder!r} devices",
                fix=f"Write the resource {accelerator!r}'s device plugin advertises (what `kubectl describe node` "
                "lists under Allocatable)",
            )


def _where(table: str, key: str, field: str = "") -> str:
    """The row a coherence refusal names (`rules.precisions['32-true'].accelerators`)."""
    return f"rules.{table}[{key!r}]" + (f".{field}" if field else "")


def _check_coherence(rules: Rules) -> None:
    """The whole rule set holds together, whichever rows were replaced: every accelerator runs under some family at
    some precision; every family runs somewhere at something; a bare `Request()` on a bare machine resolves; what
    'auto' picks can be planned; no row names an accelerator, precision or strategy the rule set lacks."""
    accelerators, families, precisions = rules.accelerators, rules.families, rules.precisions
    if rules.default_precision not in precisions:
        raise InvalidRequest(
            field="rules.default_precision",
            value=rules.default_precision,
            reason="no such precision",
            allowed=tuple(precisions),
        )
    if rules.default_precision != DEFAULT_PRECISION:
        raise InvalidRequest(
            field="rules.default_precision",
            value=rules.default_precision,
            reason=f"a request's default precision is fixed ({DEFAULT_PRECISION!r}: Request() carries it, whichever "
            "rule set resolves it), so a rule set with another default would explain plans it never makes",
            fix=f"Write default_precision={DEFAULT_PRECISION!r}, and have the framework write precision=... in the "
            "requests it builds",
        )
    _check_references(rules)
    _check_claims(rules)
    for accelerator in accelerators.values():
        priority: object = accelerator.auto_priority
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise InvalidRequest(
                field=_where("accelerators", accelerator.name, "auto_priority"),
                value=priority,
                reason="it is a whole number (higher wins for 'auto')",
            )
        if accelerator.default_backend not in rules.backends:
            raise InvalidRequest(
                field=_where("accelerators", accelerator.name, "default_backend"),
                value=accelerator.default_backend,
                reason="no such backend",
                allowed=tuple(rules.backends),
            )
    for family in families.values():
        _known_accelerators(accelerators, _where("families", family.family, "accelerators"), family.accelerators)
        for precision_name in family.precisions:
            if precision_name not in precisions:
                raise InvalidRequest(
                    field=_where("families", family.family, "precisions"),
                    value=precision_name,
                    reason="no such precision",
                    allowed=tuple(precisions),
                )
        for field, listed in (("accelerators", family.accelerators), ("precisions", family.precisions)):
            if not listed:
                raise InvalidRequest(
                    field=_where("families", family.family, field),
                    value=listed,
                    reason=f"family {family.family!r} would run {'on' if field == 'accelerators' else 'at'} nothing: "
                    f"every request naming one of its strategies would be refused with no {field[:-1]} to suggest",
                    fix=f"List the {field} it runs {'on' if field == 'accelerators' else 'at'} (the built-in row: "
                    f"{sorted(getattr(FAMILIES.get(family.family, family), field))})",
                )
    for precision in precisions.values():
        _known_accelerators(accelerators, _where("precisions", precision.name, "accelerators"), precision.accelerators)
    for accelerator in accelerators.values():
        runs = [family.family for family in families.values() if accelerator.name in family.accelerators]
        at = [precision.name for precision in precisions.values() if accelerator.name in precision.accelerators]
        if not runs or not at:
            # The row to name: the first built-in one that listed it (the one replaced), else one to add it to.
            if not runs:
                table = "families"
                row = next((key for key, value in FAMILIES.items() if accelerator.name in value.accelerators), "")
                row = row or next(iter(families))
            else:
                table = "precisions"
                row = next((key for key, value in PRECISIONS.items() if accelerator.name in value.accelerators), "")
                row = row or rules.default_precision
            raise InvalidRequest(
                field=_where(table, row, "accelerators"),
                value=accelerator.name,
                reason=f"accelerator {accelerator.name!r} would be listed by no "
                + ("family, so no strategy could run on it" if not runs else "precision, so nothing could run on it"),
                fix=f"Keep {accelerator.name!r} in the accelerators of the {table[:-1].replace('ie', 'y')} rows it "
                "runs with",
            )
    for accelerator in accelerators.values():
        counts = (1,) if accelerator.device_counts == "one" else (1, 2)
        for devices in counts:
            for interactive in (False, True):
                _check_auto_pick(rules, accelerator, devices, interactive)


def _check_auto_pick(rules: Rules, accelerator: AcceleratorRule, devices: int, interactive: bool) -> None:
    """What strategy='auto' picks on one node for `devices` of `accelerator` runs there (and, on the host with one
    device, at the default precision: `Request()` on a bare machine)."""
    for row in rules.auto_strategies:
        if row.matches(accelerator.name, devices, 1, interactive):
            break
    else:
        raise InvalidRequest(
            field="rules.auto_strategies",
            value=accelerator.name,
            reason=f"no row picks a strategy for {devices} {accelerator.name!r} device(s)"
            + (" in an interactive session" if interactive else ""),
            fix="End the rows with one that holds everywhere (as the built-in rows do)",
        )
    strategy = rules.strategies.get(row.strategy)
    if strategy is None or strategy.family not in rules.families:
        raise InvalidRequest(
            field="rules.auto_strategies",
            value=row.strategy,
            reason="strategy='auto' picks it, and the rule set has no such strategy",
            allowed=tuple(rules.strategies),
        )
    family = rules.families[strategy.family]
    if accelerator.name not in family.accelerators:
        raise InvalidRequest(
            field=_where("families", family.family, "accelerators"),
            value=sorted(family.accelerators),
            reason=f"strategy='auto' picks {row.strategy!r} for {devices} {accelerator.name!r} device(s) (and "
            f"accelerator='auto' picks {accelerator.name!r} where its devices are), but family {family.family!r} "
            f"does not list {accelerator.name!r}: Request() would be refused there",
            fix=f"Keep {accelerator.name!r} in family {family.family!r}'s accelerators",
        )
    if accelerator.host and devices == 1:
        default = rules.precisions[rules.default_precision]
        if rules.default_precision not in family.precisions:
            raise InvalidRequest(
                field=_where("families", family.family, "precisions"),
                value=sorted(family.precisions),
                reason=f"Request() on a bare machine runs {row.strategy!r} on {accelerator.name!r} at the default "
                f"precision {rules.default_precision!r}, which the row does not list",
                fix=f"Keep {rules.default_precision!r} in family {family.family!r}'s precisions",
            )
        if accelerator.name not in default.accelerators:
            raise InvalidRequest(
                field=_where("precisions", default.name, "accelerators"),
                value=sorted(default.accelerators),
                reason=f"Request() on a bare machine runs the default precision {default.name!r} on "
                f"{accelerator.name!r}, which the row does not list",
                fix=f"Keep {accelerator.name!r} in precision {default.name!r}'s accelerators",
            )


def _rebuilt(given: dict[str, Any]) -> Rules:
    """A pickled or copied rule set, built again from its tables (`Rules.__reduce_ex__`)."""
    return Rules(**given)


BUILTIN_RULES: Final[Rules] = Rules(
    accelerators=ACCELERATORS,
    accelerator_groups=ACCELERATOR_GROUPS,
    accelerator_alias_notes=ACCELERATOR_ALIAS_NOTES,
    strategies=STRATEGIES,
    strategy_aliases=STRATEGY_ALIASES,
    strategy_alias_notes=STRATEGY_ALIAS_NOTES,
    families=FAMILIES,
    auto_for_options=AUTO_STRATEGY_FOR_OPTIONS,
    auto_strategies=AUTO_STRATEGIES,
    fork_strategy_for=FORK_STRATEGY_FOR,
    spawn_strategy_for=SPAWN_STRATEGY_FOR,
    script_strategy_for=SCRIPT_STRATEGY_FOR,
    launchers=LAUNCHERS,
    precisions=PRECISIONS,
    default_precision=DEFAULT_PRECISION,
    backends=BACKENDS,
    precision_recipes=PRECISION_RECIPES,
    clusters=CLUSTERS,
    sync_batchnorm_accelerators=SYNC_BATCHNORM_ACCELERATORS,
    framework_accelerators=FRAMEWORK_ACCELERATORS,
    kubernetes_resources=KUBERNETES_DEVICE_RESOURCES,
)
"""trainplan's own rule set: the tables of the `trainplan.rules` package."""


__all__ = ["BUILTIN_RULES", "Rules"]
