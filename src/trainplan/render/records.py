"""What the command line prints for machine readers (`--json`): every record carries the format's `version`, and
an error is a record too (its type, message and typed fields), so a tool never scrapes a sentence.

Pure: values in, plain JSON data out. The records' JSON Schemas ship in the package (`trainplan/schemas/`), and a
test validates every command's output against them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

JSON_VERSION: Final[int] = 1
"""The version of every JSON record the command line prints (the plan's own `version` is the same number)."""

_ERROR_FIELDS: Final[tuple[str, ...]] = (
    "field",
    "value",
    "allowed",
    "suggestion",
    "values",
    "rule",
    "reason",
    "fix",
    "requested",
    "available",
    "cluster",
    "variable",
    "command",
)
"""The typed fields a trainplan error may carry, in the order a record lists them."""


def plain(value: object) -> object:
    """`value` as JSON data: containers element by element, anything else that JSON has no word for as its repr."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [plain(item) for item in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    return repr(value)


def versioned(record: Mapping[str, object]) -> dict[str, object]:
    """`record` with the format's version as its first key."""
    return {"version": JSON_VERSION, **{key: item for key, item in record.items() if key != "version"}}


def error_record(error: BaseException, *, code: int) -> dict[str, object]:
    """A refused command as JSON: the error's type, its message, the typed fields it carries, and the exit code."""
    fields = {name: plain(getattr(error, name)) for name in _ERROR_FIELDS if hasattr(error, name)}
    return versioned({"error": {"type": type(error).__name__, "message": str(error), **fields}, "exit_code": code})


def problems_record(problems: list[BaseException], *, code: int) -> dict[str, object]:
    """`trainplan plan --check --json`: every problem as an error record (none: the request resolves)."""
    return versioned(
        {"problems": [error_record(problem, code=code)["error"] for problem in problems], "exit_code": code}
    )


__all__ = ["JSON_VERSION", "error_record", "plain", "problems_record", "versioned"]
