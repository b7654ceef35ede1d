"""Which physical GPUs CUDA_VISIBLE_DEVICES exposes, and in which order (pure; torch's own rules).

CUDA reads the variable like `strtoul` over a comma-separated list: `"1gpu2,2"` is `1,2`; the list
is cut at the first entry that is negative, malformed or out of range; a repeated entry empties it;
UUID entries (`GPU-…`, `MIG-…`) match by unique prefix, and an ambiguous prefix is an error.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainplan.spec.numbers import DIGITS, whole_number


class AmbiguousDevice(ValueError):
    """A UUID prefix in CUDA_VISIBLE_DEVICES matches more than one device."""


def _leading_integer(text: str) -> int:
    """The integer an entry starts with (as C's strtoul reads it), or -1 when there is none."""
    end = 0
    for position, character in enumerate(text):
        if character in DIGITS or (position == 0 and character in "+-"):
            end = position + 1
        else:
            break
    digits = text[:end]
    if not digits or digits in ("+", "-"):
        return -1
    number = whole_number(digits.lstrip("+"), signed=True)
    return -1 if number is None else number  # more digits than any device count: out of range, so cut


def visible_device_order(value: str | None, uuids: Sequence[str]) -> tuple[int, ...]:
    """Physical indices of the visible devices, in visible order, for a CUDA_VISIBLE_DEVICES value.

    `uuids` are the physical devices' UUIDs in physical (NVML) order, e.g. "GPU-5e1c…" or "MIG-…".
    `None` (unset) exposes every device.
    """
    count = len(uuids)
    if value is None:
        return tuple(range(count))
    text = value.strip()
    if text.startswith(("GPU-", "MIG-")):
        prefix = text[:4]
        chosen: list[int] = []
        for entry in (part.strip() for part in text.split(",")):
            if not entry.startswith(prefix):
                break
            matches = [index for index, uuid in enumerate(uuids) if uuid.startswith(entry)]
            if len(matches) > 1:
                raise AmbiguousDevice(f"CUDA_VISIBLE_DEVICES entry {entry!r} matches {len(matches)} devices")
            if not matches:
                break
            if matches[0] in chosen:
                return ()
            chosen.append(matches[0])
        return tuple(chosen)
    ordinals: list[int] = []
    for entry in text.split(","):
        index = _leading_integer(entry.strip())
        if index in ordinals:
            return ()
        if index < 0 or index >= count:
            break
        ordinals.append(index)
    return tuple(ordinals)


def visible_entries(value: str | None, count: int) -> tuple[str, ...]:
    """How CUDA_VISIBLE_DEVICES names each of the `count` visible devices, in visible order.

    An integer entry is written as CUDA reads it (`"1gpu2"` is `"1"`); a UUID entry is kept as written.
    Unset, the visible devices are the physical ones: `"0"`, `"1"`, ... Entries past the first `count`
    (those CUDA cut off) are dropped.
    """
    if value is None:
        return tuple(str(index) for index in range(count))
    names: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry.startswith(("GPU-", "MIG-")):
            number = _leading_integer(entry)
            if number < 0:
                break
            entry = str(number)
        names.append(entry)
        if len(names) == count:
            break
    return tuple(names)


def narrowed_visible_devices(value: str | None, count: int, devices: Sequence[int]) -> str:
    """The CUDA_VISIBLE_DEVICES value that makes exactly `devices` (visible indices under `value`) visible, in
    that order: what a launcher gives its workers so that local rank i drives `cuda:i` (torchrun's convention)."""
    entries = visible_entries(value, count)
    return ",".join(entries[index] if index < len(entries) else str(index) for index in devices)
