"""Public names that load on first use (PEP 562's module `__getattr__`): one helper for the face (`trainplan`),
`trainplan.spec` and `trainplan.effects`, so that importing a package imports none of the modules behind its names.

It imports nothing of trainplan, and nothing dynamically: the package hands it `load`, which imports a module by
name (the face and the effects pass `importlib.import_module`; the core, which imports nothing dynamically so that
the layering contracts read every import, writes its imports out).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads any TYPE_CHECKING as True)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, MutableMapping
    from types import ModuleType


def lazy_names(
    package: str,
    namespace: MutableMapping[str, object],
    modules: Mapping[str, str],
    load: Callable[[str], ModuleType],
    public: Iterable[str],
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module `__getattr__` and `__dir__` of `package`, whose globals are `namespace`: a name in `modules`
    (name → the module that defines it) is read from `load(module)` when first asked for and kept in `namespace`,
    so it is loaded once; any other name is the AttributeError Python raises for a module. `__dir__` lists `public`
    (what `from package import *` gives) and the module's own dunders, never its helper imports."""

    def __getattr__(name: str) -> object:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(load(module), name)
        namespace[name] = value
        return value

    listed = frozenset(public)

    def __dir__() -> list[str]:
        return sorted({*listed, *(name for name in namespace if name.startswith("__") and name.endswith("__"))})

    return __getattr__, __dir__
