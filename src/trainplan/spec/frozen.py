"""Immutable values: a hashable string mapping (so records holding environment variables stay frozen values), and the
read-only maps of the rules' rows."""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any, TypeVar

import attrs


class FrozenMap(Mapping[str, str]):
    """A read-only `Mapping[str, str]` that hashes and compares by content."""

    __slots__ = ("_hash", "_items")

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        given = items or {}
        if _all_strings(given):
            # The common case: distinct string keys order the pairs alone (their values are never compared).
            self._items: dict[str, str] = {key: given[key] for key in sorted(given)}
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

    # The views of the map itself (Mapping's own would go through `__getitem__` item by item).
    def keys(self) -> KeysView[str]:
        return self._items.keys()

    def items(self) -> ItemsView[str, str]:
        return self._items.items()

    def values(self) -> ValuesView[str]:
        return self._items.values()

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


def all_strings(items: Iterable[object]) -> bool:
    """Whether every item is a `str` (joining them is the check at C speed: it takes strings only)."""
    try:
        "".join(items)  # type: ignore[arg-type]  # anything: the join is the check
    except TypeError:
        return False
    return True


def _all_strings(items: Mapping[Any, Any]) -> bool:
    """Whether every key and value is a `str`."""
    return all_strings(items) and all_strings(items.values())


def freeze_map(items: Mapping[str, str] | None) -> FrozenMap:
    """Converter: any string mapping (or None) to a `FrozenMap`. Anything else is kept as given, for the
    resolver to refuse by name (a converter never raises)."""
    if isinstance(items, FrozenMap):
        return items
    if type(items) is dict:  # the common case, known without asking the Mapping ABC
        return FrozenMap(items)
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
