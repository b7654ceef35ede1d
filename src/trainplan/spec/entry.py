"""The records' own entry points, implemented above `spec`: `Request.from_config` and `Request.from_legacy`
(`trainplan.parse`), `Plan.to_dict` and `Plan.from_dict` (the JSON wire format, `trainplan.parse.plan_json`) and
`Plan.explain` (`trainplan.render.explain`).

`spec` imports nothing above it. The face (`trainplan/__init__.py`) hands these implementations down once, when it
is imported, through `install`; importing any module of trainplan imports the face first, so a record's method
always finds them. This is the one seam through which `spec` reaches up, and it is a value passed down, not an
import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from trainplan.rules import Rules
    from trainplan.spec.plan import Plan
    from trainplan.spec.request import Request


@attrs.frozen(kw_only=True)
class EntryPoints:
    """What the records' convenience methods call."""

    request_from_config: Callable[[type[Request], Mapping[str, object], Rules | None], Request]
    request_from_legacy: Callable[[type[Request], Mapping[str, object]], Request]
    plan_to_dict: Callable[[Plan], dict[str, object]]
    plan_from_dict: Callable[[object, Rules | None], Plan]
    explain: Callable[[Plan], str]


_installed: list[EntryPoints] = []


def install(points: EntryPoints) -> None:
    """Called once, by the face, when trainplan is imported."""
    _installed[:] = [points]


def entry_points() -> EntryPoints:
    """The implementations the face installed."""
    if not _installed:  # only when a module under trainplan.spec is run without the package (never on import)
        raise RuntimeError("trainplan's entry points are not installed: import trainplan first")
    return _installed[0]
