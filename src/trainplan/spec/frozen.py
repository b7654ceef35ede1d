"""Immutable values: a hashable string mapping (so records holding environment variables stay frozen values), and
a cheap constructor for frozen records whose values are known to be in form."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, ParamSpec, TypeAlias, TypeVar

import attrs


class FrozenMap(Mapping[str, str]):
    """A read-only `Mapping[str, str]` that hashes and compares by content."""

    __slots__ = ("_hash", "_items", "plain")

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        given = items or {}
        self.plain: bool = _all_strings(given)
        """Every key and every value is a string (checked once: the map never changes)."""
        if self.plain:
            # The common case: distinct string keys order the pairs alone (their values are never compared).
            self._items: dict[str, str] = dict(sorted(given.items()))
        else:
            # Sorted by text, so keys of the wrong type (which resolve then reports) never make sorting raise.
            self._items = dict(sorted(given.items(), key=lambda item: (str(item[0]), repr(item))))
        self._hash: int | None = None

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self._items.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self._items) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"


Text: TypeAlias = "str | tuple[Callable[..., str], tuple[object, ...]]"
"""A text, or how to write it: `(render, arguments)`, rendered as `render(*arguments)` when first read."""


class LazyTexts(FrozenMap):
    """A `FrozenMap` whose texts are written when first read: a plan's reasons.

    The resolver gives each value as a text or as `(render, arguments)`; nothing is rendered (nor sorted) until
    the map is read, compared, hashed, printed or pickled, so a plan nobody asks "why" of costs no explanation.
    It is a `FrozenMap` of the rendered texts in every other respect: equal to any mapping holding them.
    """

    __slots__ = ("_pending",)

    def __init__(self, pending: Mapping[str, Text]) -> None:
        self._pending: Mapping[str, Text] | None = pending
        self._hash = None
        self.plain = True  # the resolver's keys, and texts (a render returns one)

    def _rendered(self) -> dict[str, str]:
        pending = self._pending
        if pending is not None:
            # Distinct keys order the pairs alone: the specs are never compared.
            self._items = {
                key: text if isinstance(text, str) else text[0](*text[1])
                for key, text in sorted(pending.items(), key=_first)
            }
            self._pending = None
        return self._items

    def __getitem__(self, key: str) -> str:
        return self._rendered()[key]

    def __contains__(self, key: object) -> bool:
        return key in (self._pending if self._pending is not None else self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._rendered())

    def __len__(self) -> int:
        return len(self._pending if self._pending is not None else self._items)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self._rendered().items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._rendered() == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenMap({self._rendered()!r})"

    def __reduce__(self) -> tuple[type[FrozenMap], tuple[dict[str, str]]]:
        return FrozenMap, (self._rendered(),)  # what it holds, rendered: a pickled plan carries no functions


def _first(item: tuple[str, object]) -> str:
    return item[0]


def _all_strings(items: Mapping[Any, Any]) -> bool:
    """Whether every key and value is a `str` (joining them is the check at C speed: it takes strings only)."""
    try:
        "".join(items)
        "".join(items.values())
    except TypeError:
        return False
    return True


def freeze_map(items: Mapping[str, str] | None) -> FrozenMap:
    """Converter: any string mapping (or None) to a `FrozenMap`. Anything else is kept as given, for the
    resolver to refuse by name (a converter never raises)."""
    if isinstance(items, FrozenMap):
        return items
    if items is not None and not isinstance(items, Mapping):
        return items  # kept for resolve to reject by name
    return FrozenMap(items)


def freeze_sequence(value: object) -> object:
    """Converter helper: a list, tuple or set becomes a tuple; anything else (a string, a number) is kept as
    given, for the resolver to refuse by name."""
    if isinstance(value, (list, tuple)):
        return tuple(value)
    if isinstance(value, (set, frozenset)):
        try:
            return tuple(sorted(value))
        except TypeError:
            return tuple(value)
    return value


P = ParamSpec("P")
R = TypeVar("R")


def trusted_constructor(record: Callable[P, R]) -> Callable[P, R]:
    """A constructor of the slotted attrs class `record` (frozen or not) for values already in their converted form.

    It takes the class's own keywords (so a type checker checks every call as it checks `record(...)`) and sets each
    field straight through its slot: no converter runs, and the keywords are not packed into a dict, as calling a
    class does. The resolver builds its plan's records with it on its cold path; everyone else calls the class.
    A class with validators or `__attrs_post_init__` is refused: skipping those would not be honest.
    """
    cls: Any = record
    fields = attrs.fields(cls)
    if "__slots__" not in vars(cls):
        raise TypeError(f"{cls.__name__} is not slotted: build it by calling the class")
    if any(field.validator is not None for field in fields) or hasattr(cls, "__attrs_post_init__"):
        raise TypeError(f"{cls.__name__} validates its fields: build it by calling the class")
    if any(isinstance(field.default, attrs.Factory) for field in fields):  # type: ignore[arg-type]
        raise TypeError(f"{cls.__name__} has a default factory: build it by calling the class")
    names = [field.name for field in fields]
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    parameters: list[str] = []
    for field in fields:
        if field.default is attrs.NOTHING:
            parameters.append(field.name)
        else:
            namespace[f"_default_{field.name}"] = field.default
            parameters.append(f"{field.name}=_default_{field.name}")
        namespace[f"_set_{field.name}"] = cls.__dict__[field.name].__set__  # the slot's own setter
    # Generated, as attrs generates __init__: one straight line of slot stores is what makes it cheap. A class that
    # takes plain assignment (not frozen, no hooks) is assigned to; a frozen one is set through its slots.
    plain = cls.__setattr__ is object.__setattr__
    body = "".join(f"    self.{name} = {name}\n" if plain else f"    _set_{name}(self, {name})\n" for name in names)
    source = f"def build(*, {', '.join(parameters)}):\n    self = _new(_cls)\n{body}    return self\n"
    exec(compile(source, f"<trusted constructor of {cls.__name__}>", "exec"), namespace)
    build: Callable[P, R] = namespace["build"]
    return build


K = TypeVar("K")
V = TypeVar("V")


class ReadOnlyMap(Mapping[K, V]):
    """A read-only mapping in the order given, that pickles: the nested maps of a rule's row (a `why_not` per
    accelerator, a strategy's preset), so that nobody can change a rule in place under a memoised resolve."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[K, V] | None = None) -> None:
        self._items: dict[K, V] = dict(items or {})

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._items == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __repr__(self) -> str:
        return repr(self._items)


def freeze_nested_maps(row: attrs.AttrsInstance) -> None:
    """`__attrs_post_init__` of a frozen row: each of its maps becomes a `ReadOnlyMap` (the field keeps its type;
    a value of the wrong type is kept for the rule-set checks to name)."""
    for field in attrs.fields(type(row)):
        value = getattr(row, field.name)
        if isinstance(value, Mapping) and not isinstance(value, ReadOnlyMap):
            object.__setattr__(row, field.name, ReadOnlyMap(value))
