"""`trainplan env`: gather a bug report's facts from this machine, without creating a CUDA context.

Versions come from the interpreter and from package metadata (nothing optional is imported to learn its
version), the driver and GPU names from NVML, and torch's build from torch itself when it is installed:
`torch.version` and the cuDNN/NCCL versions it was built with, never `torch.cuda.is_available()` or anything
else that initialises CUDA. Without torch the report says so, and everything else is there.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from trainplan._version import __version__
from trainplan.effects.extras import torch_installed
from trainplan.effects.nvml import PynvmlQuery
from trainplan.effects.probing import probe
from trainplan.render.report import report_variables
from trainplan.spec.gpus import GpuFacts
from trainplan.spec.report import BugReport, DriverFacts, TorchFacts

REPORTED_PACKAGES = (
    "torch",
    "numpy",
    "lightning",
    "pytorch-lightning",
    "lightning-fabric",
    "accelerate",
    "deepspeed",
    "torchmetrics",
    "nvidia-ml-py",
    "transformer-engine",
    "torch-xla",
    "mpi4py",
    "python-dotenv",
    "attrs",
)
"""Distributions whose versions a bug report lists (looked up in the installed metadata, never imported)."""


class DriverQuery(Protocol):
    """The driver's facts (the default asks NVML through nvidia-ml-py). Cost: milliseconds, no CUDA context."""

    def driver(self) -> DriverFacts:
        """The driver's version and GPUs, or why they cannot be read here."""


class _Answered:
    """`NvmlQuery` over driver facts read already."""

    def __init__(self, facts: DriverFacts) -> None:
        self.facts = facts

    def gpus(self) -> list[GpuFacts] | None:
        return list(self.facts.gpus) if self.facts.available else None


def package_versions(names: tuple[str, ...] = REPORTED_PACKAGES) -> list[tuple[str, str | None]]:
    """(distribution, installed version or None), from the installed metadata alone."""
    found: list[tuple[str, str | None]] = []
    for name in names:
        try:
            found.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            found.append((name, None))
    return found


def torch_facts() -> TorchFacts:
    """torch's version and the CUDA, cuDNN and NCCL versions it was built with; no CUDA context is created."""
    if not torch_installed():
        return TorchFacts(installed=False)
    try:
        import torch
    except Exception as error:  # installed but broken (a missing shared library, an ABI mismatch, ...)
        return TorchFacts(installed=True, problem=f"{type(error).__name__}: {error}")
    built: Any = torch.version
    backends: Any = torch.backends  # cudnn's helpers are untyped
    nccl_module: Any = torch.cuda.nccl

    # Both read the libraries' own version numbers: no device, no context.
    def cudnn() -> str | None:
        return str(backends.cudnn.version()) if backends.cudnn.is_available() else None

    def nccl() -> str | None:
        if not (torch.distributed.is_available() and torch.distributed.is_nccl_available()):
            return None
        return ".".join(str(part) for part in nccl_module.version())

    return TorchFacts(
        installed=True,
        version=str(torch.__version__),
        cuda=getattr(built, "cuda", None),
        hip=getattr(built, "hip", None),
        cudnn=_unless_it_fails(cudnn),
        nccl=_unless_it_fails(nccl),
    )


def _unless_it_fails(read: Callable[[], str | None]) -> str | None:
    """A version torch reads from a library; a build that cannot say still gives a report."""
    try:
        return read()
    except Exception as error:
        return f"unknown ({type(error).__name__}: {error})"


def bug_report(
    *,
    environ: Mapping[str, str] | None = None,
    driver: DriverQuery | None = None,
    torch: Callable[[], TorchFacts] = torch_facts,
) -> BugReport:
    """The facts `trainplan env` prints. `environ`, `driver` and `torch` default to this machine; tests pass
    their own."""
    environ = os.environ if environ is None else environ
    facts = (PynvmlQuery() if driver is None else driver).driver()
    return BugReport(
        trainplan=__version__,
        python=f"{platform.python_version()} ({platform.python_implementation()})",
        system=platform.platform(),
        torch=torch(),
        driver=facts,
        environment=probe(environ=environ, nvml=_Answered(facts)),  # the same GPUs, asked once
        variables=report_variables(environ),
        packages=package_versions(),
        memory=system_memory(),
    )


def system_memory() -> int | None:
    """This machine's RAM in bytes (POSIX sysconf), or None where the system does not say."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


__all__ = ["REPORTED_PACKAGES", "DriverQuery", "bug_report", "package_versions", "system_memory", "torch_facts"]
