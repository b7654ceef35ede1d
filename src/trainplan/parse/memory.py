"""The memory records of a request (`ModelFacts`, `MemoryPolicy`): checked field by field, and their JSON form.

Each record holds numbers, bools and strings only; the fields' kinds are read from the records themselves, so a
field added to a record is checked and carried without another line here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Final, TypeVar

import attrs

from trainplan.parse.wire import Reader
from trainplan.rules.memory import MODEL_DTYPES
from trainplan.spec.errors import InvalidRequest, PlanFormatError, a_kind
from trainplan.spec.memory import MemoryEstimate, MemoryPlan, MemoryPolicy, ModelFacts
from trainplan.spec.names import CUSTOM_PRECISION, PRECISIONS
from trainplan.spec.numbers import foreign_integer

R = TypeVar("R")

_KINDS: Final[Mapping[str, type]] = {
    "int": int,
    "float": float,
    "bool": bool,
    "str": str,
    "StrategyKey": str,
    "PrecisionKey": str,
}
_AT_LEAST_ONE: Final = frozenset({"parameter_count", "layer_count", "batch_size"})
"""The counts of `ModelFacts` that cannot be zero (every other byte count may be)."""
MAX_BYTES: Final = 1 << 62
"""Beyond any machine (4 EiB): a larger count is a mistake, not a model."""


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmgtp]?)(i?)(b?)\s*", re.IGNORECASE)
_UNITS: Final = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


UNITLESS_LEAST: Final = 1 << 20
"""A size written without a unit is bytes, so below a MiB it is a forgotten unit (`40` meant 40GiB), not a device."""


def parse_bytes(text: str) -> int | None:
    """A size as people write it: `40GiB`, `40G` (GiB, as nvidia-smi counts), `40GB` (10⁹), `512MiB`, `1e9`; None
    when it is not one (or not above zero, or written without a unit and under a MiB: `40` is a forgotten unit)."""
    match = _SIZE.fullmatch(text)
    if match is None or len(text) > 40:
        return None
    number, unit, binary, byte = match.groups()
    if not (unit or binary or byte) and float(number) < UNITLESS_LEAST:
        return None
    power = _UNITS[unit.lower()]
    base = 1000 if (byte and not binary and unit) else 1024
    value = float(number) * base**power
    if not value < MAX_BYTES + 1:  # beyond any machine, or beyond a float (1e400 reads as inf)
        return None
    size = int(value)
    return size if 0 < size <= MAX_BYTES else None


_COUNT = re.compile(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmbt]?)\s*", re.IGNORECASE)
_COUNT_UNITS: Final = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def parse_count(text: str) -> int | None:
    """A parameter count as people write it: `7e9`, `7000000000`, `7B`, `1.3b`, `350M`, `125k`, `1T` (decimal, as
    model cards count); None when it is not one (a size such as `7GiB`, or not at least 1)."""
    match = _COUNT.fullmatch(text)
    if match is None or len(text) > 40:
        return None
    number, unit = match.groups()
    value = float(number) * _COUNT_UNITS[unit.lower()]
    if not value < MAX_BYTES + 1:
        return None
    count = round(value)
    return count if 1 <= count <= MAX_BYTES else None


def _kind(record: type, name: str) -> type:
    annotation = str(attrs.fields_dict(record)[name].type)
    return _KINDS[annotation.removesuffix(" | None")]


def model_facts(value: object) -> ModelFacts | None:
    """`Request.model`: None, or `ModelFacts` whose counts are whole numbers in range."""
    if value is None:
        return None
    if not isinstance(value, ModelFacts):
        raise InvalidRequest(
            field="model",
            value=value,
            reason=f"model takes trainplan.ModelFacts, not {a_kind(value)}",
            fix="Write ModelFacts(...) by hand, build one with trainplan.transformer_facts(...), or measure a module "
            "with trainplan.measure_model(...)",
        )
    for field in attrs.fields(ModelFacts):
        number: object = getattr(value, field.name)
        if field.name == "precision":
            _check_precision(number)
            continue
        if _kind(ModelFacts, field.name) is str:
            if not isinstance(number, str) or number not in MODEL_DTYPES:
                raise InvalidRequest(
                    field=f"model.{field.name}",
                    value=number,
                    reason="it is the parameters' dtype, by torch's name",
                    allowed=MODEL_DTYPES,
                    fix="Write torch's name without 'torch.' (str(torch.bfloat16): dtype='bfloat16'), one of "
                    + ", ".join(MODEL_DTYPES),
                )
            continue
        least = 1 if field.name in _AT_LEAST_ONE else 0
        if type(number) is not int or not least <= number <= MAX_BYTES:
            raise _bad_fact(
                field.name, number, f"it must be a whole number from {least} to {MAX_BYTES}{foreign_integer(number)}"
            )
    for field_name, broken, reason, fix in _CONSISTENCY:
        if broken(value):
            raise InvalidRequest(
                field=f"model.{field_name}", value=getattr(value, field_name), reason=reason(value), fix=fix
            )
    return value


_CONSISTENCY: Final[tuple[tuple[str, Callable[[ModelFacts], bool], Callable[[ModelFacts], str], str], ...]] = (
    (
        "layer_count",
        lambda facts: facts.layer_count > facts.parameter_count,
        lambda facts: f"{facts.layer_count} blocks cannot share {facts.parameter_count} parameters",
        "Write the number of repeated blocks (a transformer's layers, e.g. layer_count=32)",
    ),
    (
        "largest_layer_bytes",
        lambda facts: facts.largest_layer_bytes + facts.root_bytes > facts.parameter_bytes,
        lambda facts: (
            f"a block of {facts.largest_layer_bytes} bytes and the root's {facts.root_bytes} are more than "
            f"the model's parameter_bytes={facts.parameter_bytes}: both are parts of the parameters"
        ),
        "Write one block's parameter bytes (the whole model's divided by layer_count, about), not the whole model's",
    ),
    (
        "layer_input_bytes_per_sample",
        lambda facts: facts.layer_input_bytes_per_sample > facts.activation_bytes_per_sample,
        lambda facts: (
            f"one block's input of {facts.layer_input_bytes_per_sample} bytes is more than every "
            f"activation saved (activation_bytes_per_sample={facts.activation_bytes_per_sample}), of which it is a part"
        ),
        "Write one block's input per sample (sequence × hidden × bytes), and the activations of all blocks",
    ),
    (
        "hidden_size",
        lambda facts: facts.hidden_size > 0 and facts.layer_input_bytes_per_sample % facts.hidden_size != 0,
        lambda facts: (
            f"a block's input per sample is sequence × hidden × bytes, but hidden_size={facts.hidden_size} "
            f"does not divide layer_input_bytes_per_sample={facts.layer_input_bytes_per_sample}"
        ),
        "Write the width of a block's input (a transformer's hidden size, e.g. 4096), or 0 when not known",
    ),
)
"""Facts that cannot all be true together: (the field named, when it is broken, why, what to write)."""


def _check_precision(value: object) -> None:
    """`ModelFacts.precision`: None (not said), or a precision's name in its normal form."""
    if value is None or (isinstance(value, str) and (value in PRECISIONS or CUSTOM_PRECISION.fullmatch(value))):
        return
    raise InvalidRequest(
        field="model.precision",
        value=value,
        reason="it is the training precision the facts were built or measured for, by its normal name",
        allowed=PRECISIONS,
        fix="Write e.g. precision='bf16-mixed' (as transformer_facts(precision=...) does), or None when not known",
    )


def _bad_fact(name: str, value: object, reason: str) -> InvalidRequest:
    return InvalidRequest(
        field=f"model.{name}",
        value=value,
        reason=reason,
        fix="Give the model's facts as counted (trainplan.measure_model counts them for a module)",
    )


def memory_policy(value: object) -> MemoryPolicy | None:
    """`Request.memory_policy`: None (the rule set's policy), or a `MemoryPolicy` with a headroom in [0, 1)."""
    if value is None:
        return None
    if not isinstance(value, MemoryPolicy):
        raise InvalidRequest(
            field="memory_policy",
            value=value,
            reason=f"memory_policy takes trainplan.MemoryPolicy, not {a_kind(value)}",
            fix="Write MemoryPolicy(headroom=0.1, activation_checkpointing=True, offload=True), or leave it out",
        )
    headroom: object = value.headroom
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < 1:
        raise InvalidRequest(
            field="memory_policy.headroom",
            value=headroom,
            reason="it is the fraction of each device's memory left free, from 0 up to (not including) 1",
            fix="Write e.g. MemoryPolicy(headroom=0.1)",
        )
    for name in ("activation_checkpointing", "offload"):
        if type(getattr(value, name)) is not bool:
            raise InvalidRequest(field=f"memory_policy.{name}", value=getattr(value, name), reason="True or False")
    return value


def to_dict(record: object) -> dict[str, object] | None:
    """A memory record as plain JSON (None stays None)."""
    return None if record is None else attrs.asdict(record)  # type: ignore[arg-type]


_ADDED_LATER: Final = frozenset({"hidden_size", "precision"})
"""Fields a plan saved before they existed lacks (`ModelFacts.hidden_size`, 0: not known; `ModelFacts.precision`,
None: not said): read as their default."""


def _record(read: Reader, record: type[R]) -> R:
    values: dict[str, object] = {}
    for field in attrs.fields(record):  # type: ignore[arg-type]
        kind = _kind(record, field.name)
        if field.name in _ADDED_LATER and field.name not in read.data:
            continue  # a plan saved before the field existed: its default ("not known")
        if kind is float:
            number = read._get(field.name)
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
                raise PlanFormatError(path=f"{read.path}.{field.name}", reason="expected a number")
            values[field.name] = float(number)
        elif str(field.type).endswith("| None"):
            values[field.name] = read.optional(field.name, kind)
        else:
            values[field.name] = read.field(field.name, kind)
    return record(**values)


def facts_from_json(read: Reader, key: str) -> ModelFacts | None:
    return None if read._get(key) is None else _record(read.child(key), ModelFacts)


def policy_from_json(read: Reader, key: str) -> MemoryPolicy | None:
    return None if read._get(key) is None else _record(read.child(key), MemoryPolicy)


def memory_plan_to_dict(memory: MemoryPlan | None) -> dict[str, object] | None:
    if memory is None:
        return None
    data = attrs.asdict(memory, recurse=False)
    data["policy"] = attrs.asdict(memory.policy)
    data["candidates"] = [attrs.asdict(item) for item in memory.candidates]
    return data


_DEGREES: Final = frozenset({"tensor_parallel", "data_parallel"})
"""The counts of a `MemoryEstimate` that are degrees (at least 1); every other count is bytes (at least 0)."""
MAX_DEGREE: Final = 1 << 20
"""Beyond any world: a larger parallel degree is a mistake, not a layout."""


def _checked_counts(read: Reader, record: MemoryPlan | MemoryEstimate, least_one: frozenset[str] = frozenset()) -> None:
    """Every int field of a memory record read back from JSON in its range, else `PlanFormatError` at its path: a
    plan's bytes are from 0 to `MAX_BYTES` (`explain()` divides and sums them) and its degrees from 1."""
    for field in attrs.fields(type(record)):
        value = getattr(record, field.name)
        if type(value) is not int:
            continue
        least, most = (1, MAX_DEGREE) if field.name in least_one else (0, MAX_BYTES)
        if not least <= value <= most:
            raise PlanFormatError(path=f"{read.path}.{field.name}", reason=f"{value} is not from {least} to {most}")


def memory_plan_from_json(read: Reader) -> MemoryPlan | None:
    """A plan's `memory` (absent in plans written before it existed: None), its numbers in range and its choice one
    of its candidates."""
    if read.data.get("memory") is None:
        return None
    memory = read.child("memory")
    policy = _record(memory.child("policy"), MemoryPolicy)
    if not 0 <= policy.headroom < 1:
        raise PlanFormatError(path=f"{memory.path}.policy.headroom", reason=f"{policy.headroom} is not in [0, 1)")
    readers = memory.children("candidates")
    candidates = tuple(_record(item, MemoryEstimate) for item in readers)
    for item, estimate in zip(readers, candidates, strict=True):
        _checked_counts(item, estimate, _DEGREES)
    plan = MemoryPlan(
        device_bytes=memory.field("device_bytes", int),
        budget_bytes=memory.field("budget_bytes", int),
        host_bytes=memory.optional("host_bytes", int),
        policy=policy,
        chosen=memory.optional("chosen", str),
        candidates=candidates,
    )
    _checked_counts(memory, plan)
    if plan.device_bytes < 1 or plan.budget_bytes > plan.device_bytes:
        raise PlanFormatError(
            path=f"{memory.path}.{'device_bytes' if plan.device_bytes < 1 else 'budget_bytes'}",
            reason=f"a device of {plan.device_bytes} bytes with a budget of {plan.budget_bytes}: the budget is the "
            "device's memory less the headroom",
        )
    layouts = list(dict.fromkeys(item.layout for item in candidates))
    if plan.chosen is not None and plan.chosen not in layouts:
        raise PlanFormatError(
            path=f"{memory.path}.chosen", reason=f"{plan.chosen!r} names no candidate (they are {layouts})"
        )
    return plan


__all__ = [
    "facts_from_json",
    "memory_plan_from_json",
    "memory_plan_to_dict",
    "memory_policy",
    "model_facts",
    "parse_bytes",
    "parse_count",
    "policy_from_json",
    "to_dict",
]
