"""One downstream row's own fields, checked before `Rules.extend` adds it: each field of the type and the range the
resolver reads it in, its templates filled by the placeholders the resolver gives, its names those of the new rule
set. Refused with `InvalidRequest` naming the row's field (`rules.clusters['pbs'].launch_hint`).

Whether the new rule set holds together as a whole is `rules.coherence`'s to say.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, get_args

import attrs

from trainplan.rules.clusters import (
    PROCESS_TREE_FACTS,
    ClusterRule,
    DefaultPort,
    JobPort,
    JobVariable,
    JobVariables,
    NotATask,
    TaskVerdict,
    VariableFormat,
)
from trainplan.rules.coherence import first_problem, no_such, unknown_accelerators
from trainplan.rules.hardware import SUPPLIED_COUNTS, AcceleratorRule, DeviceCounts, ForkBlocker, auto_order_key
from trainplan.rules.legacy import LEGACY_STRATEGIES
from trainplan.rules.messages import RULES as REFUSALS
from trainplan.rules.option_checks import strategy_options
from trainplan.rules.options import OptionRow
from trainplan.rules.precision import BackendRule, PrecisionRule
from trainplan.rules.recipes import AccelerateMixedPrecision, DtypeName, PrecisionRecipe, RecipeEngine
from trainplan.rules.strategies import OPTION_TYPES, FamilyRule, StrategyRule
from trainplan.spec.errors import InvalidRequest, a_kind
from trainplan.spec.names import (
    CUSTOM_NAME,
    STRATEGY_FLAGS,
    AcceleratorKey,
    ClusterKey,
    LauncherName,
    PrecisionKey,
    StrategyFamily,
    StrategyKey,
)
from trainplan.spec.options import with_options

if TYPE_CHECKING:  # the rule set's module calls in here (no import cycle)
    from trainplan.rules.ruleset import Rules

_PACKAGE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?", flags=re.ASCII)  # a distribution's name
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}", flags=re.ASCII)  # an environment variable's name
_MAX_PORT = 65535


@attrs.frozen(kw_only=True)
class Taken:
    """What the accelerators of the new rule set hold, indexed once for all the rows added (so that adding 100,000
    rows takes linear time): each torch device type's accelerators, and each 'auto' priority's."""

    device_types: Mapping[object, tuple[AcceleratorKey, ...]]
    priorities: Mapping[int, tuple[AcceleratorKey, ...]]

    @classmethod
    def of(cls, accelerators: Mapping[AcceleratorKey, AcceleratorRule]) -> Taken:
        device_types: dict[object, list[AcceleratorKey]] = {}
        priorities: dict[int, list[AcceleratorKey]] = {}
        for rule in accelerators.values():
            device_type: object = rule.device_type
            priority: object = rule.auto_priority
            if isinstance(device_type, str):
                device_types.setdefault(device_type, []).append(rule.name)
            if isinstance(priority, int) and not isinstance(priority, bool):
                priorities.setdefault(priority, []).append(rule.name)
        return cls(
            device_types={key: tuple(names) for key, names in device_types.items()},
            priorities={key: tuple(names) for key, names in priorities.items()},
        )


def check_accelerator(
    rule: AcceleratorRule, accelerators: Mapping[AcceleratorKey, AcceleratorRule], taken: Taken
) -> None:
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
    plain_fields(
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
    holders = [name for name in taken.device_types.get(device_type, ()) if name != rule.name]
    if isinstance(device_type, str) and holders:
        raise InvalidRequest(
            field=f"{where}.device_type",
            value=device_type,
            reason=f"it is {holders[-1]!r}'s torch device type: the workers would bind {holders[-1]!r}'s devices, not "
            "the plugin's",
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
    others = [name for name in taken.priorities.get(priority, ()) if name != rule.name]
    if others:
        ranked = sorted(accelerators.values(), key=auto_order_key)
        order = ", ".join(f"{row.name}={row.auto_priority}" for row in ranked)
        raise InvalidRequest(
            field=f"{where}.auto_priority",
            value=priority,
            reason=f"{others[0]!r} has that priority too: accelerator='auto' would have no order between them",
            fix=f"Choose a priority no other accelerator has (now: {order}; higher wins)",
        )


def check_precision(
    rule: PrecisionRule,
    precisions: Mapping[PrecisionKey, PrecisionRule],
    accelerators: Mapping[AcceleratorKey, AcceleratorRule],
) -> None:
    where = f"rules.precisions[{rule.name!r}]"
    first_problem(
        unknown_accelerators(
            accelerators,
            where,
            [*rule.accelerators, *rule.fallback, *rule.fallback_why, *rule.why_not, *rule.instead],
        )
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
            raise no_such("precision", f"{where}.instead[{accelerator!r}]", instead, precisions)


def check_strategy(
    rule: StrategyRule,
    base: Rules,
    families: Mapping[StrategyFamily, FamilyRule],
    pairs: frozenset[tuple[StrategyFamily, LauncherName]],
    options: Mapping[StrategyFamily, tuple[OptionRow, ...]],
) -> None:
    """A downstream strategy: a new name, a family and a launcher the family runs under (`pairs`: the base's
    strategies' families and launchers), a preset of its family's options."""
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
        raise no_such("family", f"rules.strategies[{name!r}].family", rule.family, families)
    if rule.launcher not in base.launchers:
        raise no_such("launcher", f"rules.strategies[{name!r}].launcher", rule.launcher, base.launchers)
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
    names = tuple(row.name for row in options.get(rule.family, ()))
    for option in rule.preset:
        if option not in names:
            raise InvalidRequest(
                field=f"rules.strategies[{name!r}].preset",
                value=option,
                reason=f"family {rule.family!r} has no such option",
                allowed=names,
            )
    if options_type is not None:
        try:
            strategy_options(with_options(options_type(), rule.preset), options)  # as a request's options are
        except InvalidRequest as error:
            raise InvalidRequest(
                field=f"rules.strategies[{name!r}].preset",
                value=dict(rule.preset),
                reason=error.reason if error.field.startswith("strategy_options") else str(error),
                fix=error.fix,
            ) from None


def plain_fields(
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
                reason=f"it is a set of names, not {a_kind(value)}",
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


def check_backend(rule: BackendRule, accelerators: Mapping[AcceleratorKey, AcceleratorRule]) -> None:
    where = f"rules.backends[{rule.name!r}]"
    plain_fields(
        where,
        rule,
        flags=("needs_device_tensors",),
        texts=("description",),
        sets=("accelerators",),
        text_maps=("why_not",),
    )
    first_problem(unknown_accelerators(accelerators, where, [*rule.accelerators, *rule.why_not]))


def check_recipe(recipe: PrecisionRecipe, accelerators: Mapping[AcceleratorKey, AcceleratorRule]) -> None:
    where = f"rules.precision_recipes[{recipe.name!r}]"
    plain_fields(where, recipe, sets=("grad_scaler_on",))
    first_problem(unknown_accelerators(accelerators, f"{where}.grad_scaler_on", recipe.grad_scaler_on))
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


def check_precision_fields(rule: PrecisionRule) -> None:
    where = f"rules.precisions[{rule.name!r}]"
    plain_fields(where, rule, texts=("description",), sets=("accelerators",), text_maps=("fallback_why", "why_not"))
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


def check_family_fields(rule: FamilyRule, builtin: FamilyRule, strategies: Mapping[StrategyKey, StrategyRule]) -> None:
    """A replaced family row changes where the family runs and at what precision (and why not), not how trainplan's
    runtime runs it: its process layout is the built-in row's."""
    where = f"rules.families[{rule.family!r}]"
    plain_fields(
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
        raise no_such("strategy", f"{where}.base_strategy", rule.base_strategy, strategies)


# --------------------------------------------------------------------------------------------------
# Clusters


class _Anything(dict[str, str]):
    """A template's values where any key reads as '?' (the facts a schema's reason names, a row's variables)."""

    def __missing__(self, key: str) -> str:
        return "?"


_TEMPLATES: Mapping[str, Mapping[str, object]] = {
    "launch_hint": {"num_nodes": 2, "processes_per_node": 4, "world_size": 8},
    "reason": {"how": "detected", "values": _Anything(), "managers": "SLURM"},
    "uneven_fix": {"num_nodes": 2, "per_node": 2, "world_size": 4},
    "unset_fix": {"cluster": "PBS", "address": "MASTER_ADDR", "port": "MASTER_PORT"},
    "note": {"port": 29500, "variable": "MASTER_PORT"},
}
"""What the resolver fills each cluster template with (its placeholders: `{num_nodes}` in a launch hint)."""


def _template(field: str, value: object, kind: str) -> None:
    """`value` is text the resolver can fill with the placeholders of a `kind` template."""
    given = _TEMPLATES[kind]
    if not isinstance(value, str):
        raise InvalidRequest(field=field, value=value, reason="it is text, shown in the plan's reasons and errors")
    try:
        value.format(**given)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as error:
        named = ", ".join(f"{{{name}}}" for name in given) or "none (write a literal brace as {{ or }})"
        raise InvalidRequest(
            field=field,
            value=value,
            reason=f"the resolver fills it with {named}, and it cannot be filled ({type(error).__name__}: {error})",
            fix="Name only those placeholders, and write a literal brace as {{ or }}",
        ) from None


def _whole(field: str, value: object, *, least: int, most: int | None = None, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < least or (most is not None and value > most):
        bound = f"from {least} to {most}" if most is not None else f"at least {least}"
        raise InvalidRequest(
            field=field, value=value, reason=f"it is a whole number {bound}" + (", or None" if optional else "")
        )


def _names(
    field: str, value: object, *, empty: bool = False, kind: type[tuple[object, ...] | frozenset[object]] = tuple
) -> None:
    """A tuple (or frozenset) of environment variable names."""
    if (
        not isinstance(value, (tuple, frozenset))
        or not isinstance(value, kind)
        or (not empty and not value)
        or not all(isinstance(name, str) and _VARIABLE.fullmatch(name) for name in value)
    ):
        spelled = "frozenset({...})" if kind is frozenset else "(...,)"
        raise InvalidRequest(
            field=field,
            value=value,
            reason=f"it is a {kind.__name__} of environment variable names" + ("" if empty else ", at least one"),
            fix=f"Write e.g. {field.rsplit('.', maxsplit=1)[-1]}={spelled} with names like 'PBS_JOBID'",
        )


def _job_variable(where: str, source: object, *, fixed: bool = False, unknown: bool = True) -> None:
    """One fact's source in a schema: a `JobVariable` (None, where `unknown`: not stated; a whole number, where
    `fixed`: a fact of the cluster itself)."""
    if (source is None and unknown) or (
        fixed and isinstance(source, int) and not isinstance(source, bool) and source >= 0
    ):
        return
    if not isinstance(source, JobVariable):
        raise InvalidRequest(
            field=where,
            value=source,
            reason="it is a JobVariable (the variable that states the fact), "
            + ("a whole number (a fact of the cluster itself), " if fixed else "")
            + ("or None (unknown)" if unknown else "one for each variable that may give it"),
            fix="Write e.g. JobVariable(names=('PBS_TASKNUM',), required=True)",
        )
    _names(f"{where}.names", source.names)
    if source.format not in get_args(VariableFormat):
        raise InvalidRequest(
            field=f"{where}.format", value=source.format, reason="no reader reads it", allowed=get_args(VariableFormat)
        )
    plain_fields(where, source, flags=("required",), texts=("unset_reason",))
    _whole(f"{where}.default", source.default, least=0, optional=True)
    _template(f"{where}.unset_fix", source.unset_fix, "unset_fix")


def _check_schema(where: str, schema: object) -> None:
    if not isinstance(schema, JobVariables):
        raise InvalidRequest(
            field=where, value=schema, reason="it is a JobVariables: which variable states each fact of the job"
        )
    plain_fields(
        where,
        schema,
        flags=("loopback_needs_one_node", "job_id_is_the_nodes"),
        texts=("label", "detail_unit", "main_address_fix"),
    )
    if not schema.label:
        raise InvalidRequest(field=f"{where}.label", value=schema.label, reason="messages name the cluster by it")
    for field in ("reason", "reason_asked"):
        _template(f"{where}.{field}", getattr(schema, field), "reason")
    _template(f"{where}.uneven_fix", schema.uneven_fix, "uneven_fix")
    for fact in ("world_size", "global_rank", "node_rank", "num_nodes", "main_port", "job_id", "step_id", "node_list"):
        _job_variable(f"{where}.{fact}", getattr(schema, fact))
    for fact in ("processes_per_node", "local_rank"):
        _job_variable(f"{where}.{fact}", getattr(schema, fact), fixed=True)
    addresses: object = schema.main_address
    if not isinstance(addresses, tuple):
        raise InvalidRequest(
            field=f"{where}.main_address",
            value=addresses,
            reason="it is a tuple of JobVariables, the first that is set giving the host of rank 0",
        )
    for index, address in enumerate(addresses):
        _job_variable(f"{where}.main_address[{index}]", address, unknown=False)
    _whole(f"{where}.job_id_shift", schema.job_id_shift, least=0, most=63)


def _check_ports(where: str, rule: ClusterRule) -> None:
    port: object = rule.job_port
    if port is not None:
        if not isinstance(port, JobPort):
            raise InvalidRequest(field=f"{where}.job_port", value=port, reason="it is a JobPort, or None")
        _whole(f"{where}.job_port.base", port.base, least=1, most=_MAX_PORT)
        _whole(f"{where}.job_port.modulo", port.modulo, least=1, most=_MAX_PORT + 1 - port.base)
        _whole(f"{where}.job_port.step_stride", port.step_stride, least=0)
    default: object = rule.default_port
    if default is not None:
        if not isinstance(default, DefaultPort):
            raise InvalidRequest(field=f"{where}.default_port", value=default, reason="it is a DefaultPort, or None")
        _whole(f"{where}.default_port.port", default.port, least=1, most=_MAX_PORT)
        plain_fields(f"{where}.default_port", default, flags=("one_node_only",), texts=("note_code",))
        _template(f"{where}.default_port.note", default.note, "note")
        _template(f"{where}.default_port.several_nodes_fix", default.several_nodes_fix, "note")


def _check_not_task(where: str, row: object) -> None:
    if not isinstance(row, NotATask):
        raise InvalidRequest(
            field=where, value=row, reason="it is a NotATask: a process with the variables that is not a task"
        )
    plain_fields(where, row, texts=("code", "message"))
    _names(f"{where}.unset", row.unset, empty=True, kind=frozenset)
    _names(f"{where}.set", row.set, empty=True, kind=frozenset)
    _names(f"{where}.tasks", row.tasks)
    for field in ("when_one", "when_many"):
        if getattr(row, field) not in get_args(TaskVerdict):
            raise no_such("verdict", f"{where}.{field}", getattr(row, field), get_args(TaskVerdict))
    for field, level in (("level", row.level), ("level_when_one", row.level_when_one)):
        if level not in ("info", "warning") and (field == "level" or level is not None):
            raise no_such("level", f"{where}.{field}", level, ("info", "warning"))
    if "refuse" in (row.when_one, row.when_many) and row.code not in REFUSALS:
        raise InvalidRequest(
            field=f"{where}.code",
            value=row.code,
            reason="a 'refuse' verdict raises the refusal of that id, and trainplan's refusals have none",
            allowed=tuple(REFUSALS),
        )
    try:
        row.message.format_map(_Anything())
    except (ValueError, AttributeError, IndexError, TypeError) as error:
        raise InvalidRequest(
            field=f"{where}.message",
            value=row.message,
            reason=f"it cannot be filled with the row's variables ({type(error).__name__}: {error})",
            fix="Write a literal brace as {{ or }}",
        ) from None


def check_cluster(rule: ClusterRule, clusters: Mapping[ClusterKey, ClusterRule], taken: frozenset[int]) -> None:
    """A downstream cluster manager's row: detected by variables of its own (the built-in local row alone is found
    without any) at a priority no other row has (`taken`), read through schemas the one reader reads, its templates
    filled by what the resolver gives them, the clusters it shares jobs with rows of the new rule set."""
    where = f"rules.clusters[{rule.name!r}]"
    plain_fields(
        where, rule, flags=("creates_processes", "node_rank_in_blocks"), texts=("description", "node_rank_variable")
    )
    groups: object = rule.detect_variables
    if not isinstance(groups, tuple) or not groups:
        raise InvalidRequest(
            field=f"{where}.detect_variables",
            value=groups,
            reason="it is a tuple of sets of variables: the cluster is detected where every variable of one set is "
            "present",
            fix="Write e.g. detect_variables=(frozenset({'PBS_JOBID', 'PBS_NODENUM'}),)",
        )
    for index, group in enumerate(groups):
        _names(f"{where}.detect_variables[{index}]", group, kind=frozenset)
    priority: object = rule.detect_priority
    if priority is not None:
        _whole(f"{where}.detect_priority", priority, least=1, optional=True)
        if priority in taken:
            holder = next(other.name for other in clusters.values() if other.detect_priority == priority)
            raise InvalidRequest(
                field=f"{where}.detect_priority",
                value=priority,
                reason=f"{holder!r} has that priority too: detection would have no order between them",
                fix="Choose a priority no other cluster has (higher is tried first; "
                + ", ".join(f"{other.name}={other.detect_priority}" for other in clusters.values())
                + ")",
            )
    schemas: object = rule.schemas
    if not isinstance(schemas, tuple) or not schemas:
        raise InvalidRequest(
            field=f"{where}.schemas",
            value=schemas,
            reason="it is a tuple of JobVariables, at least one: the variables its processes carry",
        )
    for index, schema in enumerate(schemas):
        _check_schema(f"{where}.schemas[{index}]", schema)
    _whole(f"{where}.max_processes_per_node", rule.max_processes_per_node, least=1, optional=True)
    _template(f"{where}.launch_hint", rule.launch_hint, "launch_hint")
    _check_ports(where, rule)
    not_tasks: object = rule.not_tasks
    if not isinstance(not_tasks, tuple):
        raise InvalidRequest(field=f"{where}.not_tasks", value=not_tasks, reason="it is a tuple of NotATask rows")
    for index, row in enumerate(not_tasks):
        _check_not_task(f"{where}.not_tasks[{index}]", row)
    fact: object = rule.started_by_fact
    if fact != "" and fact not in PROCESS_TREE_FACTS:
        raise InvalidRequest(
            field=f"{where}.started_by_fact",
            value=fact,
            reason="it names a fact of the process tree the probe writes (or is empty)",
            allowed=PROCESS_TREE_FACTS,
        )
    shared: object = rule.same_job_as
    if not isinstance(shared, tuple) or any(other not in clusters or other == rule.name for other in shared):
        raise InvalidRequest(
            field=f"{where}.same_job_as",
            value=shared,
            reason="it is a tuple of the rule set's other clusters, whose variables may describe the same processes",
            allowed=tuple(name for name in clusters if name != rule.name),
        )


__all__ = [
    "Taken",
    "check_accelerator",
    "check_backend",
    "check_cluster",
    "check_family_fields",
    "check_precision",
    "check_precision_fields",
    "check_recipe",
    "check_strategy",
    "plain_fields",
]
