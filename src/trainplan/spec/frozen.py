"""An immutable, hashable string mapping, so records holding environment variables stay frozen values."""

from __future__ import annotations

from collections.abc import Iterator, Mapping


class FrozenMap(Mapping[str, str]):
    """A read-only `Mapping[str, str]` that hashes and compares by content."""

    __slots__ = ("_hash", "_items")

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        self._items: dict[str, str] = dict(sorted((items or {}).items()))
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


def freeze_map(items: Mapping[str, str] | None) -> FrozenMap:
    """Converter: any string mapping (or None) to a `FrozenMap`."""
    if isinstance(items, FrozenMap):
        return items
    return FrozenMap(items)
