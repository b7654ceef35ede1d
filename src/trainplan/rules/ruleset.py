"""A rule set as a value: every table the resolver reads, bundled, and extensible without global state.

`resolve`, `check`, the matrix and the CLI take a `Rules` (default `BUILTIN_RULES`, the tables of
`trainplan.rules`). A downstream framework that registers its own strategies (as Lightning users do through
its global `StrategyRegistry`) builds an extended value instead and passes it along::

    RULES = tp.BUILTIN_RULES.extend(
        strategies=[tp.StrategyRule(name=tp.CustomName("ddp_custom_checkpoint_io"), family="ddp",
                                    launcher="subprocess", preset={"static_graph": True})],
    )
    plan = tp.resolve(tp.Request(strategy=RULES.strategy_name("ddp_custom_checkpoint_io")), rules=RULES)

A device plugin's accelerator (with its backend), a new precision (with its runtime recipe) and a cluster manager are
rows of an extension too (`extend(accelerators=..., backends=..., precisions=..., precision_recipes=...,
clusters=...)`), their names `CustomName`s; `Environment.device_counts` counts such an accelerator's devices.

Building a rule set checks it whole (`rules.coherence`); `extend`'s steps, and each row's own checks, are
`rules.extension` and `rules.row_checks`.

Nothing is registered anywhere: two rule sets live side by side, and the built-in one never changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final, SupportsIndex

import attrs

from trainplan.rules import extension
from trainplan.rules.clusters import CLUSTER_ALIASES, CLUSTERS, ClusterRule, cluster_variables
from trainplan.rules.coherence import first_problem, problems
from trainplan.rules.extension import R, is_rules_reference
from trainplan.rules.hardware import (
    ACCELERATOR_ALIAS_NOTES,
    ACCELERATOR_ALIASES,
    ACCELERATOR_GROUPS,
    ACCELERATORS,
    AcceleratorRule,
    auto_order_key,
)
from trainplan.rules.job import KUBERNETES_DEVICE_RESOURCES, SYNC_BATCHNORM_ACCELERATORS
from trainplan.rules.launchers import LAUNCHERS, LauncherRule
from trainplan.rules.memory import MEMORY_LAYOUTS, MEMORY_ORDER, MEMORY_POLICY, MemoryLayout, MemoryOrder
from trainplan.rules.options import OPTIONS, OptionRow
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
    FrameworkAccelerator,
    PrecisionRecipe,
)
from trainplan.rules.strategies import (
    AUTO_STRATEGIES,
    AUTO_STRATEGY_FOR_OPTIONS,
    FAMILIES,
    FORK_STRATEGY_FOR,
    SCRIPT_STRATEGY_FOR,
    SPAWN_STRATEGY_FOR,
    STRATEGIES,
    STRATEGY_ALIAS_NOTES,
    STRATEGY_ALIASES,
    AutoStrategyRule,
    FamilyRule,
    StrategyRule,
)
from trainplan.spec.errors import InvalidRequest, a_kind
from trainplan.spec.memory import MemoryPolicy
from trainplan.spec.names import (
    ACCELERATOR_FLAGS,
    CLUSTER_FLAGS,
    DEFAULT_PRECISION,
    AcceleratorFlag,
    AcceleratorKey,
    BackendKey,
    ClusterFlag,
    ClusterKey,
    CustomName,
    LauncherName,
    PrecisionKey,
    PrecisionName,
    StrategyFamily,
    StrategyFlag,
    StrategyKey,
)

UNNAMED_RULES: Final = "unnamed"
"""What a plan records of a downstream rule set that has no reference: read back, it is checked as far as its own
facts go."""


@attrs.frozen(kw_only=True, eq=False)
class Rules:
    """Every table the resolver decides from. Compared by identity: each extension is a rule set of its own.

    Built (directly, by `attrs.evolve` or by `extend`), the whole rule set is checked to hold together (see
    `rules.coherence.problems`): an incoherent one is refused with `InvalidRequest` naming the row, never left to fail
    as `MissingRule` at the first resolve. Its tables are read-only views; a rule set pickles and deep-copies (as plain
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
    options: Mapping[StrategyFamily, tuple[OptionRow, ...]]
    """Each family's option rows (`rules.options`): the options its record and `extra` may hold, checked, and how
    every framework spells them."""
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
    clusters: Mapping[ClusterKey, ClusterRule]
    """The cluster managers a process may run under (`Rules.extend(clusters=...)` adds a downstream one)."""
    sync_batchnorm_accelerators: frozenset[AcceleratorKey]
    framework_accelerators: Mapping[AcceleratorKey, FrameworkAccelerator]
    """How Lightning/Fabric and Accelerate spell each accelerator (the adapters read it): a downstream accelerator
    has a row where its framework plugin registers a name of its own."""
    kubernetes_resources: Mapping[AcceleratorKey, str | None]
    """The Kubernetes resource each pod of an emitted PyTorchJob asks for per device (None: CPUs, which every node
    has); an accelerator without a row runs in no PyTorchJob."""
    memory_layouts: tuple[MemoryLayout, ...] = MEMORY_LAYOUTS
    """The candidate layouts of the memory-aware choice (`rules.memory`), each with its arithmetic."""
    memory_order: MemoryOrder = MEMORY_ORDER
    """The order those layouts are preferred in, and why."""
    memory_policy: MemoryPolicy = MEMORY_POLICY
    """The policy of a request that names none (headroom, checkpointing, offload)."""
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
    cluster_spellings: Mapping[str, ClusterFlag | CustomName] = attrs.field(init=False)
    """Every accepted cluster spelling (flags, aliases, downstream names) → its name: what the normaliser reads."""
    cluster_variables: frozenset[str] = attrs.field(init=False)
    """Every variable the rule set's clusters name (and trainplan's launched workers): what `probe(rules=...)` copies
    from the process's environment."""

    def __attrs_post_init__(self) -> None:
        _derive(self)
        # Built directly or through attrs.evolve, a rule set is checked as an extension's is: whole, at construction
        # (refused with InvalidRequest naming the row, not with MissingRule at the first resolve).
        first_problem(problems(self))
        ranked = tuple(sorted(self.accelerators.values(), key=auto_order_key))
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
        options: Iterable[OptionRow] = (),
        kubernetes_resources: Mapping[AcceleratorKey, str] | None = None,
        script_counterparts: Mapping[StrategyKey, StrategyKey] | None = None,
        fork_counterparts: Mapping[StrategyKey, StrategyKey] | None = None,
        spawn_counterparts: Mapping[StrategyKey, StrategyKey] | None = None,
        clusters: Iterable[ClusterRule] = (),
        name: str | None = None,
    ) -> Rules:
        """A new rule set: these strategies, accelerators, backends, precisions and clusters added, these family and
        precision rows in place of the built-in ones of the same name (their accelerators, precisions, needs and
        reasons), these options added to their families, and the counterparts added.

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
        that builds it): plans made from it record it, and a plan read back is checked with it where this process has
        it (passed as `rules=`, or imported: a plan's reference is never imported). A built-in backend's row may be
        replaced too (`backends=[attrs.evolve(BUILTIN_RULES.backends['gloo'],
        accelerators=... | {'npu'})]`, for an accelerator whose default backend is gloo), keeping how it reduces
        (`needs_device_tensors`). A new cluster manager (PBS, Flux) is a `ClusterRule` with a `CustomName`, found by
        variables of its own at a `detect_priority` no other row has, its jobs read through `JobVariables` schemas;
        `probe(rules=...)` copies its variables, `Request(cluster=...)` may name it, and a plan of it reads back from
        JSON with this rule set. Refused with `InvalidRequest` naming what is wrong.

        trainplan checks that the rule set holds together and that each row is well-formed (a row listing an
        accelerator both in `accelerators` and in `why_not` is refused as contradictory), not that the hardware can
        do what a replaced row claims: a replaced row is the framework's claim."""
        reference = extension.reference(name)
        given = extension.Given.read(
            strategies=strategies,
            families=families,
            precisions=precisions,
            accelerators=accelerators,
            backends=backends,
            precision_recipes=precision_recipes,
        )
        draft = extension.Draft.start(self, given)
        extension.add_recipes(draft)
        extension.check_hardware(draft)
        extension.check_families(draft)
        extension.check_precisions(draft)
        extension.check_usable(draft)
        extension.add_options(draft, options)
        extension.add_strategies(draft)
        return attrs.evolve(
            self,
            accelerators=draft.accelerators,
            backends=draft.backends,
            strategies=draft.strategies,
            families=draft.families,
            options=draft.options,
            precisions=draft.precisions,
            precision_recipes=draft.recipes,
            script_strategy_for=extension.counterparts(draft, "script_counterparts", script_counterparts),
            fork_strategy_for=extension.counterparts(draft, "fork_counterparts", fork_counterparts),
            spawn_strategy_for=extension.counterparts(draft, "spawn_counterparts", spawn_counterparts),
            framework_accelerators=extension.framework_rows(draft, framework_accelerators),
            kubernetes_resources=extension.kubernetes_resources(draft, kubernetes_resources),
            clusters=extension.cluster_rows(draft, clusters),
            reference=reference,
        )


_CONTAINERS: Final[Mapping[str, tuple[type, ...]]] = {
    "Mapping": (Mapping,),
    "tuple": (tuple,),
    "frozenset": (frozenset, set),
}
"""What each kind of table is given as (by the start of its annotation)."""


def _derive(rules: Rules) -> None:
    """The read-only tables and the indexes of a rule set (its spellings, its clusters' variables), built once; a
    table of another kind (`clusters=5`) is refused naming it."""
    # Every table a read-only copy: a rule set is a value (an extension is a new one), so nobody can change one in
    # place and have the memoised resolve and the cold path disagree.
    for attribute in attrs.fields(Rules):
        if not attribute.init:
            continue
        value = getattr(rules, attribute.name)
        kind = str(attribute.type).partition("[")[0]
        if kind in _CONTAINERS and not isinstance(value, _CONTAINERS[kind]):
            raise InvalidRequest(
                field=f"rules.{attribute.name}",
                value=value,
                reason=f"a rule set's {attribute.name} is a {kind}, not {a_kind(value)}",
                fix=f"Write e.g. {attribute.name}=BUILTIN_RULES.{attribute.name}",
            )
        if isinstance(value, Mapping):
            object.__setattr__(rules, attribute.name, MappingProxyType(dict(value)))
    spellings: dict[str, StrategyFlag | CustomName] = {"auto": "auto"}
    spellings.update({name: name for name in rules.strategies})
    spellings.update(rules.strategy_aliases)
    object.__setattr__(rules, "strategy_spellings", MappingProxyType(spellings))
    accelerators: dict[str, AcceleratorFlag | CustomName] = {
        flag: flag for flag in ACCELERATOR_FLAGS if flag not in ACCELERATOR_ALIASES
    }
    accelerators.update(ACCELERATOR_ALIASES)
    accelerators.update({name: name for name in rules.accelerators if name not in accelerators})
    object.__setattr__(rules, "accelerator_spellings", MappingProxyType(accelerators))
    precisions: dict[str, PrecisionKey] = {name: name for name in rules.precisions}
    precisions.update(PRECISION_ALIASES)
    object.__setattr__(rules, "precision_spellings", MappingProxyType(precisions))
    object.__setattr__(rules, "backend_spellings", MappingProxyType({name: name for name in rules.backends}))
    clusters: dict[str, ClusterFlag | CustomName] = {flag: flag for flag in CLUSTER_FLAGS}
    clusters.update(CLUSTER_ALIASES)
    clusters.update({name: name for name in rules.clusters if name not in clusters})
    object.__setattr__(rules, "cluster_spellings", MappingProxyType(clusters))
    object.__setattr__(rules, "cluster_variables", cluster_variables(rules.clusters.values()))


def every_problem(base: Rules, **tables: Any) -> tuple[InvalidRequest, ...]:
    """Every problem of `base` with `tables` in place of its own (as `attrs.evolve(base, **tables)` would build it,
    which raises the first): what a tool lists, all at once. Empty: that rule set builds. A name that is no table,
    or a table of another kind (`clusters=5`), is refused at once, as building refuses it."""
    unknown = sorted(set(tables) - {attribute.name for attribute in attrs.fields(Rules) if attribute.init})
    if unknown:
        raise InvalidRequest(
            field="rules",
            value=unknown[0],
            reason="a rule set has no such table",
            allowed=tuple(attribute.name for attribute in attrs.fields(Rules) if attribute.init),
        )
    draft = object.__new__(Rules)  # never handed out: it is only read, here
    for attribute in attrs.fields(Rules):
        if attribute.init:
            object.__setattr__(draft, attribute.name, tables.get(attribute.name, getattr(base, attribute.name)))
    _derive(draft)
    return tuple(problems(draft))


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
    options=OPTIONS,
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


__all__ = ["BUILTIN_RULES", "UNNAMED_RULES", "R", "Rules", "every_problem", "is_rules_reference"]
