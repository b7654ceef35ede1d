"""Reading whole numbers from text, safely: ASCII digits only, and never more than fit a plan.

`"²".isdigit()` and `"٣".isdigit()` are true, `int("9" * 5000)` raises past Python's digit limit, and
`int("1" * 4000)` is a number no machine has; every place that reads a count, an index, a rank or a port
from text goes through `whole_number`, which answers None for all of those.
"""

from __future__ import annotations

import math
import numbers
from typing import Final

MAX_DIGITS: Final[int] = 18
"""More digits than this is no count, index, rank or port of any real machine (and stays within int64)."""

DIGITS: Final[frozenset[str]] = frozenset("0123456789")


def is_ascii_digits(text: str) -> bool:
    """Non-empty and made of ASCII digits only."""
    return bool(text) and all(character in DIGITS for character in text)


def whole_number(text: str, *, signed: bool = False) -> int | None:
    """The integer `text` spells in ASCII digits (an optional leading '-' when `signed`), or None."""
    body = text[1:] if signed and text.startswith("-") else text
    if not is_ascii_digits(body) or len(body) > MAX_DIGITS:
        return None
    return int(text)


def real_number(value: object, *, finite: bool = True) -> float | None:
    """`value` as a float when it is a real number (an int or a float, not a bool) that a float64 holds, and
    finite unless `finite=False`; else None. `10**400` and NaN (with `finite`) are None, never an error."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    if finite and not math.isfinite(number):
        return None
    return number


def foreign_integer(value: object) -> str:
    """For an integer that is not a Python int (numpy's `int64`, torch's sizes held as such), what to write instead:
    " (numpy.int64 is not a Python int: write int(x))"; else "". Counts are Python ints everywhere in a request, as
    JSON and the plan hold them, so such a value is refused by every field alike, with this spelling."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        kind = type(value)
        return f" ({kind.__module__.partition('.')[0]}.{kind.__name__} is not a Python int: write int(x))"
    return ""


__all__ = ["DIGITS", "MAX_DIGITS", "foreign_integer", "is_ascii_digits", "real_number", "whole_number"]
