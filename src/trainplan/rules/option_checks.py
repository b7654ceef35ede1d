"""The check of a strategy options record against its family's rows (`rules.options`): what `Request.strategy_options`,
a rule's preset and a plan read back must hold; and the check of an option row a rule set adds.

A record's fields are typed, but values arrive from untyped places (config files, JSON, another framework); each
refusal names the option, the value, why and what to write. Every option is checked by its row: nothing here names
one.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainplan.rules.coherence import no_such
from trainplan.rules.messages import RULES
from trainplan.rules.options import (
    OPTION_TARGETS_OF,
    OPTIONS,
    SPELLING_KINDS,
    Carried,
    HandlerField,
    Keyword,
    OneOf,
    OptionRow,
    OptionTarget,
    ParallelDegree,
    ProcessGroupTimeout,
    Refused,
    ThroughMesh,
    ThroughMeshGroups,
    ThroughPipeline,
    TrueOrFalse,
    WholeNumber,
    spellings,
)
from trainplan.rules.strategies import OPTION_TYPES
from trainplan.spec.errors import InvalidRequest, a_kind
from trainplan.spec.names import CUSTOM_NAME, MESH_DIMENSIONS, StrategyFamily
from trainplan.spec.numbers import MAX_DIGITS, is_ascii_digits, real_number
from trainplan.spec.options import RECORD_FIELDS, StrategyOptions, option_fields, option_value

OptionRows = Mapping[StrategyFamily, tuple[OptionRow, ...]]
"""A rule set's option rows, by family (`Rules.options`)."""

_RECORDS: tuple[type[StrategyOptions], ...] = tuple(OPTION_TYPES.values())
_FAMILY_OF: Mapping[type[StrategyOptions], StrategyFamily] = {record: family for family, record in OPTION_TYPES.items()}


def strategy_options(value: object, rows: OptionRows = OPTIONS) -> StrategyOptions | None:
    """None or one of the options records, each option's value checked by its row in `rows`, `extra` holding
    options of the rows only and `given` naming options only."""
    if value is None:
        return None
    if not isinstance(value, _RECORDS):
        *others, last = [f"{record.__name__}(...)" for record in _RECORDS]
        raise InvalidRequest(
            field="strategy_options",
            value=value,
            reason=f"{a_kind(value)} is not a strategy options record",
            fix=f"Pass {', '.join(others)} or {last}, or None",
        )
    family = _FAMILY_OF[type(value)]
    family_rows = rows.get(family, ())
    names = tuple(row.name for row in family_rows)
    extra: object = value.extra
    if not isinstance(extra, Mapping):
        raise InvalidRequest(
            field="strategy_options.extra",
            value=extra,
            reason="it maps the names of options a rule set adds to their values",
            fix="Write e.g. extra={'bucket_cap_mb': 25}, for an option the rule set has a row of",
        )
    fields = option_fields(type(value))
    for name in extra:
        if name not in names or name in fields:
            reason = (
                f"{name!r} is a field of {type(value).__name__}: write it as one"
                if name in fields
                else f"the rule set has no option {name!r} of family {family!r}"
            )
            raise InvalidRequest(
                field="strategy_options.extra",
                value=name,
                reason=reason,
                allowed=tuple(row.name for row in family_rows if row.name not in fields),
            )
    given: object = value.given
    if not isinstance(given, frozenset) or not all(isinstance(name, str) and name in names for name in given):
        unknown = sorted(map(str, given - set(names))) if isinstance(given, frozenset) else given
        raise InvalidRequest(
            field="strategy_options.given",
            value=unknown,
            reason="it names the options written (the record's keywords), and these are not options of family "
            f"{family!r}",
            allowed=names,
        )
    for row in family_rows:
        check_value(row, option_value(value, row.name, row.default))
    return value


def check_value(row: OptionRow, value: object, field: str | None = None) -> None:
    """`value` is one `row` takes, or `InvalidRequest` naming the option (as `field`, default
    `strategy_options.<name>`)."""
    where = f"strategy_options.{row.name}" if field is None else field
    check = row.check
    if isinstance(check, TrueOrFalse):
        if not isinstance(value, bool):
            raise InvalidRequest(field=where, value=value, reason="it must be True or False", allowed=(True, False))
    elif isinstance(check, OneOf):
        flags = any(isinstance(allowed, bool) for allowed in check.values)
        if (isinstance(value, bool) and not flags) or value not in check.values:
            raise InvalidRequest(field=where, value=value, reason=check.reason, allowed=check.values)
    elif isinstance(check, WholeNumber):
        if value is None and check.optional:
            return
        if _beyond(value, check.maximum):  # 1e30, or a count written as 30 digits of text: the limit is why
            raise InvalidRequest(field=where, value=value, reason=check.above, fix=check.fix)
        if isinstance(value, bool) or not isinstance(value, int) or value < check.minimum:
            whole = "a positive integer" if check.minimum == 1 else f"a whole number from {check.minimum}"
            # the row's own example where its default is no number (None: one the plan works out)
            fix = f"Write e.g. {row.name}={row.default!r}" if isinstance(row.default, int) else check.fix
            raise InvalidRequest(
                field=where, value=value, reason=f"it must be {whole}, at most {check.maximum}", fix=fix
            )
        if value > check.maximum:
            raise InvalidRequest(field=where, value=value, reason=check.above, fix=check.fix)
    else:
        unused = value is None and check.optional
        auto = check.takes_auto and (
            (value == "auto" and isinstance(value, str))
            or (check.minus_one_is_auto and not isinstance(value, bool) and value == -1)
        )
        ranks = not isinstance(value, bool) and isinstance(value, int) and 1 <= value <= check.maximum
        if not (unused or auto or ranks):
            raise InvalidRequest(
                field=where,
                value=value,
                reason=f"a parallel degree is a whole number of ranks from 1 to {check.maximum}"
                + (", or 'auto'" if check.takes_auto else ""),
                fix=f"Write e.g. {row.name}=2"
                + (f", or {row.name}='auto' to take what the other degrees leave" if check.takes_auto else ""),
            )


def _beyond(value: object, maximum: int) -> bool:
    """`value` is a number above `maximum` that is not an int (a float, or text spelling a number); an int is
    judged as one."""
    if isinstance(value, str):
        text = value.strip()
        if is_ascii_digits(text):
            return len(text) > MAX_DIGITS or int(text) > maximum
        if len(text) > 32:  # no number a person writes; float() is not asked to read it
            return False
        try:
            value = float(text)
        except ValueError:
            return False
    number = real_number(value, finite=False)
    return not isinstance(value, int) and number is not None and number > maximum


def check_row(row: OptionRow, rows: OptionRows, where: str) -> None:
    """An option row holds together with the rows of its family (`rows`, this one among them): it names a family
    that takes options, its default passes its own check, it says how every place its family runs spells it (and
    nothing for the others), what it carries or needs are options of the family. `InvalidRequest` names the row's
    field (`where`: the row's own path)."""
    if row.family not in OPTION_TARGETS_OF:
        raise InvalidRequest(
            field=f"{where}.family",
            value=row.family,
            reason="the family takes no options (a family's options record is trainplan's)",
            allowed=tuple(OPTION_TARGETS_OF),
        )
    names = [other.name for other in rows.get(row.family, ())]
    if names.count(row.name) > 1:
        raise InvalidRequest(field=f"{where}.name", value=row.name, reason="the family has an option of that name")
    check = row.check
    if not isinstance(check, (TrueOrFalse, OneOf, WholeNumber, ParallelDegree)):
        raise InvalidRequest(
            field=f"{where}.check",
            value=check,
            reason="it says which values the option takes",
            fix="Write TrueOrFalse(), OneOf(values, reason), WholeNumber(...) or ParallelDegree()",
        )
    try:
        check_value(row, row.default, f"{where}.default")
        hash(row.default)
    except TypeError:
        raise InvalidRequest(
            field=f"{where}.default", value=row.default, reason="a default is a value: hashable, as records are"
        ) from None
    reached = OPTION_TARGETS_OF[row.family]
    for target, spelling in spellings(row).items():
        _check_spelling(row, target, spelling, target in reached, names, f"{where}.{target}")
    if isinstance(row.torch, ProcessGroupTimeout) != isinstance(row.accelerate, ProcessGroupTimeout):
        raise InvalidRequest(
            field=f"{where}.accelerate",
            value=row.accelerate,
            reason="the process group's timeout is one: torch's and Accelerate's together (ProcessGroupTimeout() in "
            "both), or neither",
        )
    timeouts = [
        other.name
        for other in rows.get(row.family, ())
        if isinstance(other.torch, ProcessGroupTimeout) or isinstance(other.accelerate, ProcessGroupTimeout)
    ]
    if len(timeouts) > 1:
        raise InvalidRequest(
            field=f"{where}.torch",
            value=row.torch,
            reason=f"family {row.family!r} already has the process group's timeout, {timeouts[0]!r}",
        )
    needs = row.needs
    if needs is not None:
        for name in needs.values:
            if name not in names or name == row.name:
                raise InvalidRequest(
                    field=f"{where}.needs", value=name, reason="it names another option of the family", allowed=names
                )
        if needs.refusal not in RULES:
            raise no_such("rule", f"{where}.needs.refusal", needs.refusal, RULES)


def check_added_row(row: OptionRow, rows: OptionRows, where: str) -> None:
    """An option a rule set adds: a name of its own (never a record's field, nor `extra` or `given`), and a row
    that holds together (`check_row`); a mesh degree or a second timeout is trainplan's own."""
    record = OPTION_TYPES.get(row.family)
    taken = (*option_fields(record), *RECORD_FIELDS) if record is not None else RECORD_FIELDS
    name: object = row.name
    if not isinstance(name, str) or not CUSTOM_NAME.fullmatch(name) or name in taken:
        raise InvalidRequest(
            field=f"{where}.name",
            value=name,
            reason="an added option has a name of its own: lowercase letters, digits and underscores, not a field "
            "of the family's record",
            fix="Write e.g. name='bucket_cap_mb'",
        )
    for spelling in (row.torch, row.lightning, row.accelerate, row.deepspeed_config):
        if isinstance(spelling, (ThroughMesh, ThroughMeshGroups)):
            raise InvalidRequest(
                field=f"{where}",
                value=spelling,
                reason="a mesh's degrees and how its groups run are ModelParallelOptions' own fields",
                fix="Spell the option as a keyword, a handler field or Refused(reason)",
            )
    check_row(row, rows, where)


def _check_spelling(
    row: OptionRow,
    target: OptionTarget,
    spelling: tuple[Keyword | HandlerField, ...]
    | ProcessGroupTimeout
    | ThroughMesh
    | ThroughMeshGroups
    | ThroughPipeline
    | Carried
    | Refused
    | None,
    reached: bool,
    names: list[str],
    where: str,
) -> None:
    if spelling is None:
        if reached:
            raise InvalidRequest(
                field=where,
                value=None,
                reason=f"family {row.family!r} runs there: say how it spells {row.name!r}, or why it cannot",
                fix=f"Write e.g. {target}=Refused('why')",
            )
        return
    if not reached:
        raise InvalidRequest(
            field=where, value=spelling, reason=f"family {row.family!r} never runs there", fix=f"Write {target}=None"
        )
    keyword, *others = SPELLING_KINDS[target]
    if isinstance(spelling, tuple):
        if not spelling or not all(isinstance(part, keyword) for part in spelling):
            raise InvalidRequest(
                field=where,
                value=spelling,
                reason=f"it is a tuple of {keyword.__name__}s (at least one), or one of "
                + ", ".join(f"{kind.__name__}(...)" for kind in others),
            )
    elif not isinstance(spelling, tuple(others)):
        raise InvalidRequest(
            field=where,
            value=spelling,
            reason=f"it is not how {target} spells an option",
            allowed=(f"a tuple of {keyword.__name__}s", *(kind.__name__ for kind in others)),
        )
    elif isinstance(spelling, ThroughMesh) and spelling.dimension not in (*MESH_DIMENSIONS, "ep"):
        raise no_such("mesh dimension", f"{where}.dimension", spelling.dimension, (*MESH_DIMENSIONS, "ep"))
    elif isinstance(spelling, ThroughMeshGroups) and spelling.dimension not in MESH_DIMENSIONS:
        raise no_such("mesh dimension", f"{where}.dimension", spelling.dimension, MESH_DIMENSIONS)
    elif isinstance(spelling, Carried):
        unknown = [name for name in spelling.by if name not in names or name == row.name]
        if unknown or not spelling.by:
            raise InvalidRequest(
                field=f"{where}.by", value=unknown, reason="it names other options of the family", allowed=names
            )
    elif isinstance(spelling, Refused):
        reason: object = spelling.reason
        if not isinstance(reason, str) or not reason:
            raise InvalidRequest(field=f"{where}.reason", value=reason, reason="it says why, as text")


__all__ = ["OptionRows", "check_added_row", "check_row", "check_value", "strategy_options"]
