"""The errors trainplan raises: one type per concept, each carrying its fields.

Every message has three parts, in order: what was asked, why it cannot be, and what to write instead.
`resolve` raises nothing but these (a property test holds it to that); the effects layer adds its own
subclasses of `TrainplanError` for probing, launching and reducing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def did_you_mean(value: object, allowed: Iterable[object]) -> str | None:
    """The closest allowed name to a misspelt one, or None when nothing is close (or it is the value itself)."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    import difflib  # on a refusal only: not a cost of every `import trainplan`

    names = {str(name).lower(): str(name) for name in allowed}
    typed = value.lower()
    matches = difflib.get_close_matches(typed, list(names), n=len(names) or 1, cutoff=0.6)
    if not matches:
        return None
    # Of the close names, the fewest keystrokes away, then as long as what was typed: `dpp` is a slip for `ddp`
    # (one letter swapped) before `dp` (one dropped), though difflib ranks `dp` first.
    best = min(matches, key=lambda name: (_edits(typed, name), abs(len(name) - len(typed)), matches.index(name)))
    return None if names[best] == value else names[best]


def _edits(first: str, second: str) -> int:
    """The letters to insert, delete, change or swap with a neighbour to turn `first` into `second` (both short)."""
    previous_row: list[int] | None = None
    row = list(range(len(second) + 1))
    for i, letter in enumerate(first, start=1):
        before, previous_row, row = previous_row, row, [i] + [0] * len(second)
        for j, other in enumerate(second, start=1):
            row[j] = min(previous_row[j] + 1, row[j - 1] + 1, previous_row[j - 1] + (letter != other))
            if before is not None and i > 1 and j > 1 and letter == second[j - 2] and first[i - 2] == other:
                row[j] = min(row[j], before[j - 2] + 1)
    return row[-1]


def shown(value: object, limit: int = 160) -> str:
    """`repr(value)` for a message, cut short when long (a 100,000-character value says how long it was)."""
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__}>"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def a_kind(value: object) -> str:
    """The type of `value` with its article, for a message: "an int", "a str", "an OptionMap"."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


class TrainplanError(Exception):
    """Base of every error trainplan raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[object, ...]:
        # Errors cross process boundaries (workers report them); keep them picklable with their fields.
        return (_rebuild_error, (type(self), self.__dict__))


def _rebuild_error(cls: type[TrainplanError], state: dict[str, object]) -> TrainplanError:
    error = cls.__new__(cls)
    Exception.__init__(error, state.get("message", ""))
    error.__dict__.update(state)
    return error


class TrainplanWarning(UserWarning):
    """A plan's warning note, shown through Python's warnings by `trainplan.resolve`: the plan works, but probably
    not as meant (a process planned alone beside a job's tasks, a loopback address across nodes). The note's code is
    `code`; filter the category to silence them."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class InvalidRequest(TrainplanError, ValueError):
    """A value (or its type) that trainplan does not accept for a field."""

    def __init__(
        self,
        *,
        field: str,
        value: object,
        reason: str,
        allowed: Iterable[object] = (),
        suggestion: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        self.allowed = tuple(allowed)
        # None is no word to suggest for a text ('none' would become 'None', itself refused as text): it is said as
        # leaving the field unset.
        spelled = tuple(name for name in self.allowed if name is not None)
        self.suggestion = suggestion if suggestion is not None else did_you_mean(value, spelled)
        if self.suggestion is not None and self.suggestion == str(value):
            self.suggestion = None  # suggesting the refused value itself helps nobody
        parts = [f"{field}={shown(value)} is not accepted: {reason}."]
        if self.suggestion is not None:
            parts.append(f"Did you mean {field}={self.suggestion!r}?")
        if fix is not None:
            parts.append(fix if fix.endswith(".") else fix + ".")
        elif self.allowed:
            names = ", ".join(repr(name) for name in spelled)
            unset = len(spelled) < len(self.allowed)
            if not spelled:
                parts.append("Leave it unset (None).")
            else:
                parts.append(f"Write one of: {names}" + (", or leave it unset (None)." if unset else "."))
        self.fix = fix
        super().__init__(" ".join(parts))


class Incompatible(TrainplanError, ValueError):
    """A combination of values that cannot work together, with the rule that forbids it and the fix."""

    def __init__(self, *, values: Mapping[str, object], rule: str, reason: str, fix: str) -> None:
        self.values = dict(values)
        self.rule = rule
        self.reason = reason
        self.fix = fix
        if not self.values:  # a refusal of the job itself (inside a started job), not of anything the request wrote
            super().__init__(f"{reason[:1].upper()}{reason[1:]}. {_sentence(fix)}")
            return
        asked = ", ".join(f"{key}={shown(value)}" for key, value in self.values.items())
        verdict = "cannot work together" if len(self.values) > 1 else "cannot be used"
        super().__init__(f"{asked} {verdict}: {reason}. {_sentence(fix)}")


class Unavailable(TrainplanError, RuntimeError):
    """Hardware (or a package) was asked for that this environment does not have."""

    def __init__(self, *, requested: str, available: str, fix: str) -> None:
        self.requested = requested
        self.available = available
        self.fix = fix
        super().__init__(f"Asked for {requested}, but this environment has {available}. {_sentence(fix)}")


class ClusterEnvironmentError(TrainplanError, ValueError):
    """An environment variable set by a cluster manager holds a value that cannot be right."""

    def __init__(self, *, cluster: str, variable: str, value: str, reason: str, fix: str) -> None:
        self.cluster = cluster
        self.variable = variable
        self.value = value
        self.reason = reason
        self.fix = fix
        super().__init__(
            f"The {cluster} environment variable {variable}={shown(value)} cannot be used: {reason}. {_sentence(fix)}"
        )


class MissingRule(TrainplanError, LookupError):
    """A table has no row for a key: a gap in the rules, reported with the table and the key."""

    def __init__(self, *, table: str, key: object) -> None:
        self.table = table
        self.key = key
        super().__init__(
            f"The rule table {table} has no row for {key!r}: this combination is not covered by trainplan's "
            "rules. Report it as a bug, and pick explicit values meanwhile."
        )


class MeshRankError(TrainplanError, IndexError):
    """A rank or coordinates that are not in a device mesh (as `IndexError`, so that index code still catches it)."""


class MeshDimensionError(TrainplanError, KeyError):
    """A name that is not a dimension of a device mesh (as `KeyError`, so that mapping code still catches it)."""


class MeshQueryError(TrainplanError, ValueError):
    """A device-mesh question asked with a value that is not one (a negative limit, say)."""


class PlanFormatError(TrainplanError, ValueError):
    """A plan's JSON form that cannot be read back (a wrong key, type or value)."""

    def __init__(self, *, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"The plan data at {path} cannot be read: {reason}. "
            "Pass the unmodified output of Plan.to_dict() (or `trainplan plan --json`)."
        )


def _sentence(text: str) -> str:
    return text if text.endswith((".", "?", "!")) else text + "."
