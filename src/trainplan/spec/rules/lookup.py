"""The one place a table is read: a row, or `MissingRule` naming the table and the key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from trainplan.spec.errors import TrainplanError

K = TypeVar("K")
V = TypeVar("V")


class MissingRule(TrainplanError, LookupError):
    """A table has no row for a key: a gap in the rules, reported with the table and the key."""

    def __init__(self, *, table: str, key: object) -> None:
        self.table = table
        self.key = key
        super().__init__(
            f"The rule table {table} has no row for {key!r}: this combination is not covered by trainplan's "
            "rules. Report it as a bug, and pick explicit values meanwhile."
        )


def lookup(table: Mapping[K, V], key: K, *, name: str) -> V:
    """The one place tables are read: a row, or `MissingRule` naming the table and the key."""
    try:
        return table[key]
    except (KeyError, TypeError):
        raise MissingRule(table=name, key=key) from None
