"""Step 3: every field of the request in its normal form, through its row (`trainplan.parse.fields`): its
normaliser, the notes its spelling carries, and the default a refused value takes (so that `check` goes on and
lists every problem; `resolve` raises the first, in the rows' check order)."""

from __future__ import annotations

from typing import Any

from trainplan.parse.fields import IN_CHECK_ORDER, REFUSED, REQUEST_FIELD_ROWS
from trainplan.resolve.draft import Draft, Fields
from trainplan.spec.errors import TrainplanError
from trainplan.spec.notes import Note
from trainplan.spec.request import Request


def normalise(draft: Draft) -> None:
    request, rules = draft.request, draft.rules
    problems: list[TrainplanError] = []
    given_notes: object = request.notes
    notes: list[Note] = (
        [note for note in given_notes if isinstance(note, Note)] if isinstance(given_notes, tuple) else []
    )
    normal: dict[str, Any] = {}
    for row in IN_CHECK_ORDER:
        value = getattr(request, row.name)
        try:
            normal[row.name] = found = row.normalise(value, rules)
        except TrainplanError as error:
            problems.append(error)
            normal[row.name] = row.default(rules)
            found = REFUSED
        if row.notes is not None:
            notes.extend(row.notes(value, found, rules))
    for problem in problems:
        draft.refuse(problem)
    draft.fields = Fields(**normal, notes=tuple(notes))
    draft.notes = list(notes)


def normal_request(fields: Fields) -> Request:
    """The request in normal form (resolving it again gives an equal plan)."""
    return Request(**{row.name: getattr(fields, row.name) for row in REQUEST_FIELD_ROWS}, notes=fields.notes)
