"""The JSON wire format's shared readers and writers: a reader that names the path of whatever is wrong, and the
pieces a plan and a request both carry (notes, strategy options, downstream names).

Explicit, so a changed record cannot silently change the wire format: `plan_json` reads plans with it, and the
request's field rows (`fields`) read and write each request field with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

from trainplan.rules import OPTION_TYPES
from trainplan.spec.errors import PlanFormatError, a_kind
from trainplan.spec.names import CUSTOM_NAME, NOTE_LEVELS, CustomName
from trainplan.spec.notes import Note
from trainplan.spec.options import StrategyOptions, option_fields
from trainplan.spec.text import unsafe_character

T = TypeVar("T")
C = TypeVar("C")


MAX_DEPTH = 32
"""How deeply a plan's JSON may nest (a plan written by `Plan.to_dict` nests 5 deep; a downstream option's value
may add some)."""
MAX_VALUES = 20_000
"""How many values (objects, lists, strings, numbers) a plan's JSON may hold in all (one written by `Plan.to_dict`
holds a few hundred)."""
MAX_TEXT = 10_000
"""How long one string of a plan may be, in characters (a note or a reason is a sentence or two)."""
MAX_INTEGER_BITS = 64
"""How wide one integer of a plan may be: every count, size and port of a plan fits 64 bits."""


def check_document(data: object, path: str) -> None:
    """The shape every plan and request read from JSON keeps before any field is read: at most `MAX_DEPTH` deep,
    `MAX_VALUES` values and `MAX_TEXT` characters a string, and no string (key or value) holding a character
    `unsafe_character` names (a line break, a control character, a lone surrogate), since a plan's text is
    written into explain(), comments of emitted jobs and workers' environments. Iterative, so a value nested a
    million deep is a `PlanFormatError`, not a `RecursionError`."""
    pending: list[tuple[object, str, int]] = [(data, path, 1)]
    seen = 0
    while pending:
        value, where, depth = pending.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise PlanFormatError(path=path, reason=f"it holds more than {MAX_VALUES} values; a plan holds hundreds")
        if depth > MAX_DEPTH:
            raise PlanFormatError(path=where, reason=f"it nests more than {MAX_DEPTH} deep")
        if isinstance(value, str):
            _check_text(value, where)
        elif isinstance(value, int) and value.bit_length() > MAX_INTEGER_BITS:
            # before any field is read: a check's message would write it out, past Python's 4300 digits
            raise PlanFormatError(
                path=where, reason=f"an integer of {value.bit_length()} bits (at most {MAX_INTEGER_BITS})"
            )
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise PlanFormatError(path=where, reason=f"a key is {a_kind(key)}, not a string")
                _check_text(key, f"{where} (a key)")
                pending.append((item, f"{where}.{key}", depth + 1))
        elif isinstance(value, (list, tuple)):
            pending.extend((item, f"{where}[{index}]", depth + 1) for index, item in enumerate(value))


def _check_text(text: str, where: str) -> None:
    if len(text) > MAX_TEXT:
        raise PlanFormatError(path=where, reason=f"a string of {len(text)} characters (at most {MAX_TEXT})")
    character = unsafe_character(text)
    if character is not None:
        raise PlanFormatError(
            path=where,
            reason=f"it holds the character {character!a} (line breaks, control characters and lone "
            "surrogates are refused: a plan's text is written into scripts, manifests and explain())",
        )


class Reader:
    """Reads one JSON object; each reading names the path of what is wrong (`PlanFormatError`)."""

    def __init__(self, data: object, path: str) -> None:
        if not isinstance(data, Mapping):
            raise PlanFormatError(path=path, reason=f"expected an object, found {type(data).__name__}")
        self.data = data
        self.path = path

    def _get(self, key: str) -> object:
        if key not in self.data:
            raise PlanFormatError(path=f"{self.path}.{key}", reason="the key is missing")
        return self.data[key]

    def field(self, key: str, kind: type[T]) -> T:
        value = self._get(key)
        if kind is int and isinstance(value, bool):
            raise PlanFormatError(path=f"{self.path}.{key}", reason="expected an integer, found a bool")
        if not isinstance(value, kind):
            raise PlanFormatError(
                path=f"{self.path}.{key}", reason=f"expected {kind.__name__}, found {type(value).__name__}"
            )
        return value

    def optional(self, key: str, kind: type[T]) -> T | None:
        if self._get(key) is None:
            return None
        return self.field(key, kind)

    def choice(self, key: str, allowed: tuple[C, ...]) -> C:
        value = self._get(key)
        for option in allowed:
            if value == option and type(value) is type(option):
                return option
        raise PlanFormatError(path=f"{self.path}.{key}", reason=f"{value!r} is not one of {list(allowed)}")

    def strategy(self, key: str, allowed: tuple[C, ...], pattern: re.Pattern[str] = CUSTOM_NAME) -> C | CustomName:
        """A built-in name (a strategy's, an accelerator's, a precision's), or a downstream rule set's (`CustomName`:
        lowercase, digits, underscores; hyphens too in a precision's)."""
        value = self._get(key)
        if isinstance(value, str) and value not in allowed and pattern.fullmatch(value):
            return CustomName(value)
        return self.choice(key, allowed)

    def optional_custom(self, key: str, allowed: tuple[C, ...]) -> C | CustomName | None:
        if self._get(key) is None:
            return None
        return self.strategy(key, allowed)

    def child(self, key: str) -> Reader:
        return Reader(self._get(key), f"{self.path}.{key}")

    def children(self, key: str) -> list[Reader]:
        value = self._get(key)
        if not isinstance(value, list):
            raise PlanFormatError(path=f"{self.path}.{key}", reason="expected a list")
        return [Reader(item, f"{self.path}.{key}[{index}]") for index, item in enumerate(value)]

    def int_list(self, key: str) -> list[int]:
        value = self._get(key)
        if not isinstance(value, list) or not all(
            isinstance(item, int) and not isinstance(item, bool) for item in value
        ):
            raise PlanFormatError(path=f"{self.path}.{key}", reason="expected a list of integers")
        return list(value)

    def string_list(self, key: str) -> list[str]:
        value = self._get(key)
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise PlanFormatError(path=f"{self.path}.{key}", reason="expected a list of strings")
        return list(value)

    def string_map(self, key: str) -> dict[str, str]:
        value = self._get(key)
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise PlanFormatError(path=f"{self.path}.{key}", reason="expected an object of strings")
        return dict(value)


def note_from(read: Reader) -> Note:
    return Note(
        code=read.field("code", str), level=read.choice("level", NOTE_LEVELS), message=read.field("message", str)
    )


OPTION_KINDS: dict[type[StrategyOptions], str] = {record: family for family, record in OPTION_TYPES.items()}
"""An options record's `kind` on the wire: the family that takes it."""


def options_to_dict(options: StrategyOptions | None) -> dict[str, object] | None:
    """The record on the wire: its family (`kind`), every field, the options a rule set adds (`extra`, when it
    holds any) and which were written (`given`), so that it reads back equal."""
    if options is None:
        return None
    kind = OPTION_KINDS[type(options)]
    values = {name: getattr(options, name) for name in option_fields(type(options))}
    extra = {"extra": dict(options.extra)} if options.extra else {}
    return {"kind": kind, **values, **extra, "given": sorted(options.given)}


def options_from_dict(read: Reader, key: str) -> StrategyOptions | None:
    if read._get(key) is None:
        return None
    options = read.child(key)
    kind = options.choice("kind", tuple(OPTION_TYPES))
    values: dict[str, Any] = {name: value for name, value in options.data.items() if name not in WIRE_ONLY}
    if "extra" in options.data:
        if not isinstance(options.data["extra"], Mapping):
            raise PlanFormatError(path=f"{options.path}.extra", reason="expected an object of options")
        values["extra"] = options.data["extra"]
    if "given" in options.data:
        given = options.string_list("given")
        unknown = sorted(set(given) - set(values) - set(values.get("extra", ())))
        if unknown:
            raise PlanFormatError(path=f"{options.path}.given", reason=f"{unknown} are not options of {kind}")
        values["given"] = frozenset(given)
    try:
        return OPTION_TYPES[kind](**values)
    except TypeError as error:
        raise PlanFormatError(path=options.path, reason=str(error)) from None


WIRE_ONLY = ("kind", "extra", "given")
"""The keys of a record on the wire that are not fields of options: its family, and the two kept apart."""


def builtin_or_custom(value: object, allowed: tuple[object, ...], pattern: re.Pattern[str] = CUSTOM_NAME) -> bool:
    """A built-in name, or one a downstream rule set may add (read back as a `CustomName`)."""
    return value in allowed or (isinstance(value, str) and pattern.fullmatch(value) is not None)
