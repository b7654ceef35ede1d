"""Optional installs: what is missing, said as a typed error that names what to install.

The planner (spec, resolve, and the CLI's planning commands) needs attrs alone. torch is the `torch` extra
(`pip install 'trainplan[torch]'`): launching workers, joining a world of several processes, the metric store's
reductions and the runtime need it, and each checks for it *before* anything starts, so a missing torch is a
`MissingExtra` in the caller, never a `ModuleNotFoundError` deep in a worker. The frameworks (Lightning, Fabric,
Accelerate) are their adapters' business, and say so the same way.
"""

from __future__ import annotations

import importlib.util
import sys

from trainplan.spec.errors import TrainplanError

TORCH_EXTRA = "trainplan[torch]"
"""What to install for the parts that need torch."""


class MissingExtra(TrainplanError, ImportError):
    """Something needs a package that is not installed (torch, or an adapter's framework)."""

    def __init__(self, *, framework: str, install: str, needed_by: str = "This adapter", why: str = "") -> None:
        self.framework = framework
        self.install = install
        self.needed_by = needed_by
        because = f" ({why})" if why else ""
        shown = f"'{install}'" if "[" in install else install  # quoted, so that no shell globs the brackets
        super().__init__(
            f"{needed_by} needs {framework}, which is not installed{because}. Install it: pip install {shown}"
        )


def torch_installed() -> bool:
    """Whether torch can be found, without importing it (a stub or a blocked module counts as absent)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except ValueError:  # a module in sys.modules without a spec (a stand-in): it is there
        return sys.modules.get("torch") is not None
    except ImportError:
        return False


def require_torch(needed_by: str) -> None:
    """Raise `MissingExtra` naming the `torch` extra when torch is not installed; cheap, imports nothing."""
    if not torch_installed():
        raise MissingExtra(
            framework="torch",
            install=TORCH_EXTRA,
            needed_by=needed_by,
            why="the planner installs without it; launch, metric reductions and the runtime use it",
        )


def is_missing(error: ImportError, *modules: str) -> bool:
    """Whether `error` says that one of `modules` (top-level names) is not installed, rather than that an
    installed package is broken inside."""
    if not isinstance(error, ModuleNotFoundError):
        return False
    return (error.name or "").partition(".")[0] in modules


__all__ = ["TORCH_EXTRA", "MissingExtra", "is_missing", "require_torch", "torch_installed"]
