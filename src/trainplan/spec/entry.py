"""The records' own entry points, implemented above `spec`: `Request.from_config` and `Request.from_legacy`
(`trainplan.parse`), `Plan.to_dict` and `Plan.from_dict` (the JSON wire format, `trainplan.parse.plan_json`) and
`Plan.explain` (`trainplan.render.explain`).

`spec` imports nothing above it. The face (`trainplan/__init__.py`) hands down, once, when it is imported, a loader
of these implementations through `install`; the first record method that needs them calls the loader (which
imports `parse` and `render` then, not at `import trainplan`), and the result is kept. Importing any module of
trainplan imports the face first, so a record's method always finds them. This is the one seam through which `spec`
reaches up, and it is a value passed down, not an import.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads any TYPE_CHECKING as True)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from trainplan.rules import Rules
    from trainplan.spec.plan import Plan
    from trainplan.spec.request import Request


class EntryPoints:
    """What the records' convenience methods call. A plain slotted class, not an attrs record: the face imports this
    module at `import trainplan`, which builds no attrs class (nor imports typing)."""

    __slots__ = ("explain", "plan_from_dict", "plan_to_dict", "request_from_config", "request_from_legacy")

    def __init__(
        self,
        *,
        request_from_config: Callable[[type[Request], Mapping[str, object], Rules | None], Request],
        request_from_legacy: Callable[[type[Request], Mapping[str, object]], Request],
        plan_to_dict: Callable[[Plan], dict[str, object]],
        plan_from_dict: Callable[[object, Rules | None], Plan],
        explain: Callable[[Plan], str],
    ) -> None:
        self.request_from_config = request_from_config
        self.request_from_legacy = request_from_legacy
        self.plan_to_dict = plan_to_dict
        self.plan_from_dict = plan_from_dict
        self.explain = explain


_loader: list[Callable[[], EntryPoints]] = []
_loaded: list[EntryPoints] = []


def install(load: Callable[[], EntryPoints]) -> None:
    """Called once, by the face, when trainplan is imported: `load` imports and returns the implementations."""
    _loader[:] = [load]
    _loaded.clear()


def entry_points() -> EntryPoints:
    """The implementations the face's loader returns (loaded on the first call, then kept)."""
    if not _loaded:
        if not _loader:  # only when a module under trainplan.spec is run without the package (never on import)
            raise RuntimeError("trainplan's entry points are not installed: import trainplan first")
        _loaded[:] = [_loader[0]()]
    return _loaded[0]
