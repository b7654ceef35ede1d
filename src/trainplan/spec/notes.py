"""Notes: the record of every fallback, default taken and deprecation in a plan, as data."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from trainplan.spec.names import NoteLevel


@attrs.frozen(kw_only=True)
class Note:
    """One thing the resolver decided on the user's behalf, or a deprecation the user should act on.

    `code` is stable (tests and tools match on it); `message` is for people.
    """

    code: str
    level: NoteLevel
    message: str

    def __str__(self) -> str:
        return f"[{self.level}] {self.code}: {self.message}"


def freeze_notes(notes: Iterable[Note]) -> tuple[Note, ...]:
    """Converter: a list or tuple of notes to a tuple, so records holding notes stay hashable values; anything
    else is kept as given (the resolver ignores what is not a note)."""
    given: object = notes
    if isinstance(given, (list, tuple)):
        return tuple(given)
    return given  # type: ignore[return-value]  # kept as given: never raise in a converter
