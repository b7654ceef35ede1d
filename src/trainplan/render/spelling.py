"""A request written back as the user would write it: the `Request(...)` call, or the `trainplan plan` flags.

What `trainplan legacy` prints for old Trainer flags, so the modern spelling can be pasted in.
"""

from __future__ import annotations

import attrs

from trainplan.parse.fields import REQUEST_FIELD_ROWS
from trainplan.parse.legacy import devices_text
from trainplan.spec.options import option_fields, option_value
from trainplan.spec.request import Request


def python_spelling(request: Request) -> str:
    """The request as the `Request(...)` call that builds it, defaults left out."""
    default = type(request)()
    parts = []
    for attribute in attrs.fields(type(request)):
        if attribute.name in ("notes", "given"):  # the record's bookkeeping, not what it asks for
            continue
        value = getattr(request, attribute.name)
        if value != getattr(default, attribute.name) or type(value) is not type(getattr(default, attribute.name)):
            parts.append(f"{attribute.name}={devices_text(value) if attribute.name == 'devices' else repr(value)}")
    return f"Request({', '.join(parts)})"


def flag_spelling(request: Request) -> str:
    """The request as `trainplan plan` flags (each field's row names its flag), defaults left out."""
    default = type(request)()
    parts: list[str] = []
    for row in REQUEST_FIELD_ROWS:
        name = row.name
        value = getattr(request, name)
        if row.flag is None or value == getattr(default, name):
            continue
        option = row.flag.option
        if row.flag.kind == "switch":
            parts.append(option)
        elif name == "devices" and isinstance(value, tuple):
            parts.append(f"{option} {','.join(str(index) for index in value)}")
        elif row.flag.kind == "options":  # each option written, or not at its default (a field's, or added)
            defaults = type(value)()
            for key in (*option_fields(type(value)), *value.extra):
                if key in value.given or option_value(value, key, None) != option_value(defaults, key, None):
                    parts.append(f"{option} {key}={option_value(value, key, None)}")
        else:
            parts.append(f"{option} {value}")
    return " ".join(parts)
