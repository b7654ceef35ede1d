"""Validation of single request fields: loose input in, one canonical value out, or `InvalidRequest`.

Each function takes `object` because values arrive from untyped places (config files, CLI flags,
JSON, other frameworks); each names the field, the value, why it is refused and what to write.
Nothing here looks at the machine: that is `resolve`'s job, with an `Environment`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, TypeAlias

from trainplan.rules import (
    ACCELERATOR_ALIASES,
    CLUSTER_ALIASES,
    LEGACY_STRATEGIES,
    MAX_DEVICES_PER_NODE,
    MAX_NODES,
    OPTION_TYPES,
    PRECISION_ALIASES,
    PRECISION_FLAG_ALIASES,
    STRATEGY_ALIASES,
    OptionRow,
    ParallelDegree,
    Rules,
)
from trainplan.rules.option_checks import strategy_options
from trainplan.rules.options import spellings
from trainplan.spec.errors import InvalidRequest, a_kind, did_you_mean, shown
from trainplan.spec.names import (
    ACCELERATOR_FLAGS,
    BACKENDS,
    CLUSTER_FLAGS,
    METRICS_STORES,
    PRECISIONS,
    STRATEGY_FLAGS,
    AcceleratorFlag,
    BackendKey,
    BackendName,
    ClusterFlag,
    CustomName,
    MetricsStore,
    PrecisionKey,
    PrecisionName,
    StrategyFamily,
    StrategyFlag,
)
from trainplan.spec.notes import Note
from trainplan.spec.numbers import foreign_integer, is_ascii_digits, whole_number
from trainplan.spec.options import StrategyOptions, option_fields

DevicesSpec: TypeAlias = Literal["auto"] | int | tuple[int, ...]
"""Normalised `devices`: "auto", -1 (all), a positive count, or a tuple of distinct visible indices."""

_ACCELERATORS: Final[Mapping[str, AcceleratorFlag]] = {
    **{name: name for name in ACCELERATOR_FLAGS if name not in ACCELERATOR_ALIASES},
    **ACCELERATOR_ALIASES,
}
_STRATEGIES: Final[Mapping[str, StrategyFlag]] = {**{name: name for name in STRATEGY_FLAGS}, **STRATEGY_ALIASES}
_PRECISIONS: Final[Mapping[str, PrecisionName]] = {**{name: name for name in PRECISIONS}, **PRECISION_ALIASES}
_BACKENDS: Final[Mapping[str, BackendName]] = {name: name for name in BACKENDS}
_CLUSTERS: Final[Mapping[str, ClusterFlag]] = {**{name: name for name in CLUSTER_FLAGS}, **CLUSTER_ALIASES}
_STORES: Final[Mapping[str, MetricsStore]] = {name: name for name in METRICS_STORES}


def _name(field: str, value: object, table: Mapping[str, str], allowed: tuple[object, ...]) -> str:
    if type(value) is str and value in table:  # the common case: already a canonical name
        return table[value]
    if not isinstance(value, str):
        raise InvalidRequest(
            field=field,
            value=value,
            reason=f"it must be a name (a string), not {a_kind(value)}",
            allowed=allowed,
        )
    key = value.strip().lower().replace(" ", "_")
    if key in table:
        return table[key]
    key = key.replace("-", "_")
    if key in table:
        return table[key]
    raise InvalidRequest(field=field, value=value, reason="it is not a known name", allowed=allowed)


def accelerator(value: object) -> AcceleratorFlag:
    """`cpu`, `cuda`, `gpu`, `mps`, `xla`, `auto`; `tpu` becomes `xla`."""
    return _ACCELERATORS[_name("accelerator", value, _ACCELERATORS, ACCELERATOR_FLAGS)]


def strategy(value: object) -> StrategyFlag:
    """A registered strategy name or `auto`."""
    return _STRATEGIES[_name("strategy", value, _STRATEGIES, STRATEGY_FLAGS)]


def strategy_in(value: object, spellings: Mapping[str, StrategyFlag | CustomName]) -> StrategyFlag | CustomName:
    """A strategy name of a rule set (its `Rules.strategy_spellings`: names, aliases and `auto`)."""
    if type(value) is str and value in spellings:  # the common case: a name or an alias as written
        return spellings[value]
    try:
        return spellings[_name("strategy", value, spellings, tuple(spellings))]
    except InvalidRequest:
        spelled = value.strip() if isinstance(value, str) else ""
        legacy = LEGACY_STRATEGIES.get(spelled.lower())
        if legacy is None:
            raise
    # An old Trainer name (`tpu_spawn`, `ddp2`, ...): say what it became, not the nearest spelling.
    modern = "" if legacy.accelerator is None else f" with accelerator={legacy.accelerator!r}"
    raise InvalidRequest(
        field="strategy",
        value=value,
        reason="it is an old Trainer strategy name"
        + ("" if legacy.strategy is not None else f" with no counterpart today ({legacy.reason})"),
        suggestion=legacy.strategy,
        fix=(
            f"Write strategy={legacy.strategy!r}{modern}, or pass the old spelling to "
            f"Request.from_legacy(distributed_backend={spelled!r}), which maps it with a note"
            if legacy.strategy is not None
            else legacy.fix
        ),
    )


def accelerator_in(
    value: object, spellings: Mapping[str, AcceleratorFlag | CustomName]
) -> AcceleratorFlag | CustomName:
    """An accelerator flag of a rule set (its `Rules.accelerator_spellings`: flags, aliases, downstream names)."""
    if type(value) is str and value in spellings:  # the common case: a name as written
        return spellings[value]
    allowed = tuple(name for name, flag in spellings.items() if name == flag)
    return spellings[_name("accelerator", value, spellings, allowed)]


def precision_in(value: object, spellings: Mapping[str, PrecisionKey]) -> PrecisionKey:
    """A precision of a rule set (its `Rules.precision_spellings`), or a built-in one for any accepted spelling
    (integers included)."""
    if type(value) is str and value in spellings:  # the common case: a name as written
        return spellings[value]
    if isinstance(value, str) and value.strip().lower() in spellings:
        return spellings[value.strip().lower()]
    try:
        return precision(value)
    except InvalidRequest as error:
        custom = tuple(name for name in spellings if name not in _PRECISIONS)
        if not custom:
            raise
        raise InvalidRequest(
            field=error.field, value=value, reason=error.reason, allowed=(*PRECISIONS, *custom)
        ) from None


def backend_in(value: object, spellings: Mapping[str, BackendKey]) -> BackendKey | None:
    """A backend of a rule set (its `Rules.backend_spellings`), or None for the accelerator's default."""
    if value is None:
        return None
    if type(value) is str and value in spellings:
        return spellings[value]
    return spellings[_name("process_group_backend", value, spellings, tuple(spellings))]


def backend(value: object) -> BackendName | None:
    """`nccl`, `gloo`, `mpi`, `xla`, or None for the accelerator's default."""
    if value is None:
        return None
    return _BACKENDS[_name("process_group_backend", value, _BACKENDS, BACKENDS)]


def cluster(value: object) -> ClusterFlag:
    """`auto` (detect), `local`, `slurm`, `torchelastic`, `lsf`, `mpi`, `kubeflow`, `torch_env`."""
    return _CLUSTERS[_name("cluster", value, _CLUSTERS, CLUSTER_FLAGS)]


def cluster_in(value: object, spellings: Mapping[str, ClusterFlag | CustomName]) -> ClusterFlag | CustomName:
    """A cluster of a rule set (its `Rules.cluster_spellings`: flags, aliases, downstream names)."""
    if type(value) is str and value in spellings:  # the common case: a name as written
        return spellings[value]
    allowed = tuple(name for name, flag in spellings.items() if name == flag)
    return spellings[_name("cluster", value, spellings, allowed)]


def metrics_store(value: object) -> MetricsStore:
    """`device` (keep logged tensors where they were computed) or `cpu`."""
    return _STORES[_name("metrics_store", value, _STORES, METRICS_STORES)]


def precision(value: object) -> PrecisionName:
    """A canonical precision for any accepted spelling (`16` → `16-mixed`, `"bf16"` → `bf16-mixed`)."""
    if isinstance(value, bool):
        raise InvalidRequest(
            field="precision", value=value, reason="it must be a precision, not a bool", allowed=PRECISIONS
        )
    if isinstance(value, int):
        if value in PRECISION_FLAG_ALIASES:
            return PRECISION_FLAG_ALIASES[value]  # type: ignore[index]  # narrowed by the membership test
        raise InvalidRequest(
            field="precision", value=value, reason="only 64, 32 and 16 are integer precisions", allowed=PRECISIONS
        )
    if type(value) is str and value in _PRECISIONS:
        return _PRECISIONS[value]
    if isinstance(value, str) and value.strip().lower() in _PRECISIONS:
        return _PRECISIONS[value.strip().lower()]
    if isinstance(value, str):
        raise InvalidRequest(field="precision", value=value, reason="it is not a known precision", allowed=PRECISIONS)
    raise InvalidRequest(
        field="precision",
        value=value,
        reason=f"it must be a precision name or 64/32/16, not {a_kind(value)}",
        allowed=PRECISIONS,
    )


def precision_alias_notes(value: object, canonical: PrecisionKey) -> tuple[Note, ...]:
    """A deprecation note when a precision was given in a short or legacy spelling (`16`, `"bf16"`)."""
    if isinstance(value, str) and (value in PRECISIONS or value == canonical):
        return ()
    return (
        Note(
            code="precision-alias",
            level="deprecation",
            message=f"precision={value!r} means {canonical!r}; write precision={canonical!r}",
        ),
    )


def strategy_alias_notes(value: object, notes: Mapping[str, str]) -> tuple[Note, ...]:
    """A deprecation note when a strategy was given by an alias the rule set notes (`single_tpu`, `xla_debug`)."""
    if not isinstance(value, str):
        return ()
    message = notes.get(value.strip().lower().replace(" ", "_").replace("-", "_"))
    return () if message is None else (Note(code="strategy-alias", level="deprecation", message=message),)


def accelerator_alias_notes(value: object, notes: Mapping[str, str]) -> tuple[Note, ...]:
    """A deprecation note when an accelerator was given by an alias the rule set notes (`tpu`)."""
    if not isinstance(value, str):
        return ()
    message = notes.get(value.strip().lower())
    return () if message is None else (Note(code="accelerator-alias", level="deprecation", message=message),)


def num_nodes(value: object) -> int | Literal["auto"]:
    """A positive number of machines, or "auto" (the nodes a started job has, else 1)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    original = value
    if isinstance(value, str) and is_ascii_digits(value.strip().removeprefix("-")):
        value = _big_number(value.strip(), MAX_NODES)  # a count written as text ("-1", 30 digits): judged as one
        if 1 <= value <= MAX_NODES:  # a good count, but as text (from_config reads text; Request takes the int)
            raise InvalidRequest(
                field="num_nodes", value=original, reason="it is text, not a number", fix=f"Write num_nodes={value}"
            )
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "neither" if isinstance(value, str) else f"not {a_kind(value)}"
        raise InvalidRequest(
            field="num_nodes",
            value=value,
            reason=f"it must be a positive integer or 'auto', and it is {kind}{foreign_integer(value)}",
            fix="Write num_nodes='auto' (the job's nodes, else 1), or the number of machines, e.g. num_nodes=2",
        )
    if value > MAX_NODES:
        raise InvalidRequest(
            field="num_nodes",
            value=original,
            reason=f"it is more machines than any cluster has (at most {MAX_NODES})",
            fix="Write the number of machines, e.g. num_nodes=2",
        )
    if value < 1:
        raise InvalidRequest(
            field="num_nodes",
            value=original,
            reason="it must be at least 1",
            fix="Write num_nodes=1 for this machine alone, or the number of machines, e.g. num_nodes=2",
        )
    return value


def loose_number(value: object) -> object:
    """A count from a config file: digit strings are numbers (a sign too, "-1": the normaliser refuses it as a
    number); anything else is kept for the normaliser to judge."""
    if isinstance(value, str):
        counted = whole_number(value.strip(), signed=True)
        return value if counted is None else counted
    return value


def _big_number(text: str, limit: int) -> int:
    """A signed run of ASCII digits as an int, or `limit + 1` (`-limit - 1` when negative) where it has more digits
    than any count has (its digits are never all read: `int()` of 5000 digits raises)."""
    counted = whole_number(text, signed=True)
    if counted is None:
        return -limit - 1 if text.startswith("-") else limit + 1
    return counted


def loose_bool(value: object) -> object:
    """A switch from a config file: true/false, 1/0, yes/no (any case) are bools; anything else is kept for the
    normaliser to judge."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    return value


def flag(field: str, value: object) -> bool:
    """A plain bool (sync_batchnorm, select_usable_gpus)."""
    if not isinstance(value, bool):
        raise InvalidRequest(
            field=field,
            value=value,
            reason=f"it must be True or False, not {a_kind(value)}",
            allowed=(True, False),
        )
    return value


_DEVICES_FIX: Final = (
    "Write a positive count (devices=2), -1 for all, 'auto', a comma-separated list of indices ('0,2') "
    "or a list of indices ([0, 2])"
)


def devices(value: object) -> DevicesSpec:
    """`devices` in one of its canonical forms; the count and indices are checked against the machine later.

    Refused here: 0, "0", [], booleans, floats, negatives other than -1, duplicate or negative
    indices, and strings that are neither a number nor a comma-separated list of indices.
    """
    if type(value) is str and value == "auto":  # the default, as written
        return "auto"
    if isinstance(value, (bool, float)):
        raise InvalidRequest(
            field="devices", value=value, reason=f"{a_kind(value)} is not a device selection", fix=_DEVICES_FIX
        )
    if isinstance(value, int):
        return _device_count(value, value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        if text.startswith(("[", "(")) and text.endswith(("]", ")")):
            inner = ",".join(part.strip() for part in text[1:-1].split(","))
            raise InvalidRequest(
                field="devices",
                value=value,
                reason="brackets are Python's list syntax: as text, indices are separated by commas alone",
                fix=f"Write devices={inner!r} (on the command line: --devices {inner})",
            )
        if "," in text:
            parts = [part.strip() for part in text.split(",")]
            if parts and parts[-1] == "":
                parts = parts[:-1]  # "1," names index 1, as in Lightning
            numbers = [whole_number(part) for part in parts]
            if parts and all(is_ascii_digits(part) for part in parts):  # an index of 19 digits or more
                numbers = [_big_number(part, MAX_DEVICES_PER_NODE) for part in parts]
            if not parts or any(number is None for number in numbers):
                raise InvalidRequest(
                    field="devices",
                    value=value,
                    reason="it is not a comma-separated list of indices (ASCII digits, at most 18 each)",
                    fix=_DEVICES_FIX,
                )
            return _device_indices(value, [number for number in numbers if number is not None])
        if is_ascii_digits(text.removeprefix("-")):
            return _device_count(value, _big_number(text, MAX_DEVICES_PER_NODE))
        raise InvalidRequest(
            field="devices", value=value, reason="it is neither a number nor a list of indices", fix=_DEVICES_FIX
        )
    if isinstance(value, (tuple, list)):
        items: list[int] = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int):
                raise InvalidRequest(
                    field="devices",
                    value=value,
                    reason=f"device indices must be integers, and {shown(item, 40)} is {a_kind(item)}"
                    f"{foreign_integer(item)}",
                    fix=_DEVICES_FIX,
                )
            items.append(item)
        return _device_indices(value, items)
    raise InvalidRequest(
        field="devices",
        value=value,
        reason=f"{a_kind(value)} is not a device selection{foreign_integer(value)}",
        fix=_DEVICES_FIX,
    )


def _device_count(original: object, count: int) -> int:
    if count > MAX_DEVICES_PER_NODE:
        raise InvalidRequest(
            field="devices",
            value=original,
            reason=f"it is more processes or devices than any one machine has (at most {MAX_DEVICES_PER_NODE})",
            fix="Write the number per node, e.g. devices=8, and the machines as num_nodes",
        )
    if count == -1 or count > 0:
        return count
    if count == 0:
        reason = "zero devices cannot run anything"
    else:
        reason = "a negative count other than -1 (all devices) has no meaning"
    raise InvalidRequest(field="devices", value=original, reason=reason, fix=_DEVICES_FIX)


def _device_indices(original: object, indices: list[int]) -> tuple[int, ...]:
    if not indices:
        raise InvalidRequest(
            field="devices", value=original, reason="an empty list selects no device", fix=_DEVICES_FIX
        )
    if len(indices) > MAX_DEVICES_PER_NODE or any(index >= MAX_DEVICES_PER_NODE for index in indices):
        raise InvalidRequest(
            field="devices",
            value=original,
            reason=f"it names more devices, or higher indices, than any machine has (at most {MAX_DEVICES_PER_NODE})",
            fix=_DEVICES_FIX,
        )
    negative = [index for index in indices if index < 0]
    if negative:
        raise InvalidRequest(
            field="devices",
            value=original,
            reason=f"device indices cannot be negative ({negative[0]})",
            fix=_DEVICES_FIX,
        )
    seen: set[int] = set()
    repeated: set[int] = set()
    for index in indices:
        (repeated if index in seen else seen).add(index)
    duplicates = sorted(repeated)
    if duplicates:
        raise InvalidRequest(
            field="devices",
            value=original,
            reason=f"index {duplicates[0]} is listed more than once",
            fix=f"List each device once, e.g. devices={sorted(set(indices))!r}",
        )
    return tuple(indices)


# --------------------------------------------------------------------------------------------------
# Strategy options from a config file


def _loose_degree(value: object) -> object:
    """A degree from a config file: "AUTO" is "auto" and digit strings are numbers, a minus sign included ("-1",
    torchtitan's dp_shard=-1, as the command line reads it); anything else is kept for `strategy_options` to refuse
    by name."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        negative = text.startswith("-")
        number = whole_number(text[1:] if negative else text)
        return value if number is None else -number if negative else number
    return value


def _option_meant(written: str, rows: tuple[OptionRow, ...]) -> str | None:
    """The option `written` most likely means: the one a framework spells so (Lightning's `timeout` is
    `timeout_seconds`), else the closest name."""
    for row in rows:
        for spelling in spellings(row).values():
            if isinstance(spelling, tuple) and any(part.key == written for part in spelling) and row.name != written:
                return row.name
    return did_you_mean(written, [row.name for row in rows])


def _auto_family(keys: set[str], value: Mapping[object, object], rules: Rules) -> StrategyFamily:
    """The family whose options record a mapping fills under strategy='auto': the one family that strategy='auto'
    may choose by the devices (`rules.auto_strategies`: ddp on several) whose options take every key, else the one
    an options record makes it choose (`rules.auto_for_options`: a mesh's degrees), where exactly one fits; else
    the request is refused, naming the strategy to write."""

    def fitting(families: list[StrategyFamily]) -> list[StrategyFamily]:
        takes = {family: {row.name for row in rules.options.get(family, ())} for family in families}
        return [family for family in dict.fromkeys(families) if family in OPTION_TYPES and keys <= takes[family]]

    by_devices = fitting([rules.strategies[row.strategy].family for row in rules.auto_strategies])
    by_options = fitting(list(rules.auto_for_options))
    for found in (by_devices, by_options):
        if len(found) == 1:
            return found[0]
    suggested = next(iter(by_devices or by_options or fitting(list(OPTION_TYPES)) or OPTION_TYPES))
    raise InvalidRequest(
        field="strategy_options",
        value=dict(value),
        reason="options given as a mapping need a strategy to say which options record they fill, and "
        + (
            "these fit several"
            if len(by_devices) + len(by_options) > 1
            else "strategy='auto' chooses none that takes them"
        ),
        fix=f"Name the strategy too, e.g. strategy={suggested!r}, or pass {OPTION_TYPES[suggested].__name__}(...) "
        "itself",
    )


def options_from_config(
    strategy_name: StrategyFlag | CustomName, value: object, rules: Rules
) -> StrategyOptions | None:
    """`strategy_options` from a config file: a mapping fills the options record of `strategy_name`'s family (an
    option the rule set adds goes to its `extra`; digit strings read as degrees where a mesh takes them); a record
    or None is checked as it is. Every option is one of the family's rows (`rules.options`)."""
    if value is None or not isinstance(value, Mapping):
        return strategy_options(value, rules.options)
    if strategy_name == "auto":
        family = _auto_family({str(key) for key in value}, value, rules)
    else:
        family = rules.strategies[strategy_name].family
    options_type = OPTION_TYPES.get(family)
    if options_type is None:
        raise InvalidRequest(
            field="strategy_options",
            value=dict(value),
            reason=f"strategy {strategy_name!r} takes no options",
            fix="Remove strategy_options",
        )
    rows = {row.name: row for row in rules.options.get(family, ())}
    values = {str(key): item for key, item in value.items()}
    unknown = [key for key in values if key not in rows]
    if unknown:
        meant = _option_meant(unknown[0], tuple(rows.values()))
        names = ", ".join(repr(name) for name in rows)
        refusal = InvalidRequest(
            field="strategy_options",
            value=dict(value),
            reason=f"{options_type.__name__} does not take these options ({', '.join(map(repr, unknown))})",
            allowed=tuple(rows),
            fix=None if meant is None else f"Did you mean {meant}={values[unknown[0]]!r}? The options: {names}",
        )
        refusal.suggestion = meant  # the option's name (the record's own would read strategy_options='...')
        raise refusal
    loose = {
        key: _loose_degree(item) if isinstance(rows[key].check, ParallelDegree) else item
        for key, item in values.items()
    }
    fields = option_fields(options_type)
    extra = {key: item for key, item in loose.items() if key not in fields}
    written: dict[str, Any] = {key: item for key, item in loose.items() if key in fields}
    if extra:
        written["extra"] = extra
    built = options_type(**written)
    return strategy_options(built, rules.options)
