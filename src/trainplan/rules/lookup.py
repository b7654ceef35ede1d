"""The one place a table is read: a row, or `MissingRule` naming the table and the key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from trainplan.spec.errors import MissingRule

K = TypeVar("K")
V = TypeVar("V")


def lookup(table: Mapping[K, V], key: K, *, name: str) -> V:
    """The one place tables are read: a row, or `MissingRule` naming the table and the key."""
    try:
        return table[key]
    except (KeyError, TypeError):
        raise MissingRule(table=name, key=key) from None
