"""Byte counts told to a person: the one formatter every memory message, verdict and table uses.

A size prints in the largest binary unit it reaches, up to GiB (device and host memory are counted in GiB), so a
40 MiB device is "40.0 MiB", not "0.0 GiB"; two sizes compared ("needs 40.9 MiB > 36.0 MiB") print in one unit with
as many decimals as it takes to tell them apart. Pure, stdlib only, at the bottom of the layers.
"""

from __future__ import annotations

from typing import Final

UNITS: Final[tuple[tuple[str, int], ...]] = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
"""The units a size prints in, largest first; below a KiB it prints in bytes."""

MOST_DECIMALS: Final = 6
"""The decimals `compared` goes to before it prints two sizes in bytes."""


def unit_of(count: int) -> tuple[str, int]:
    """The unit `count` bytes print in, and its scale: the largest of `UNITS` it reaches, else bytes (1)."""
    return next(((unit, scale) for unit, scale in UNITS if abs(count) >= scale), ("bytes", 1))


def in_unit(count: int, unit: tuple[str, int], decimals: int = 1) -> str:
    """`count` bytes in `unit` with `decimals` decimals ("46.1 GiB"); in bytes, a whole number ("300 bytes")."""
    name, scale = unit
    return f"{count:,} bytes" if scale == 1 else f"{count / scale:.{decimals}f} {name}"


def size(count: int) -> str:
    """`count` bytes in the largest unit they reach, one decimal: "46.1 GiB", "512.0 MiB", "300 bytes"."""
    return in_unit(count, unit_of(count))


def compared(first: int, second: int) -> tuple[str, str]:
    """Two sizes in one unit (the larger one's), with the fewest decimals (one at least) that tell them apart:
    (`"36.04 GiB"`, `"36.00 GiB"`), never "36.0 GiB > 36.0 GiB"; equal sizes print alike."""
    unit = unit_of(max(abs(first), abs(second)))
    for decimals in range(1, MOST_DECIMALS + 1):
        texts = in_unit(first, unit, decimals), in_unit(second, unit, decimals)
        if texts[0] != texts[1] or first == second:
            return texts
    return in_unit(first, ("bytes", 1)), in_unit(second, ("bytes", 1))


__all__ = ["MOST_DECIMALS", "UNITS", "compared", "in_unit", "size", "unit_of"]
