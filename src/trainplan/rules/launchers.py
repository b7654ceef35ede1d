"""Launchers: how the processes of a plan are started, and the start methods trainplan serves."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from trainplan.spec.names import (
    AcceleratorFlag,
    LauncherName,
    StartMethod,
)


@attrs.frozen(kw_only=True)
class LauncherRule:
    name: LauncherName
    description: str
    """A verb phrase, read as "launcher: <it>" in explain() and as "strategy X would <it>" in a refusal."""
    starts_processes: bool
    joins: bool  # the processes exist already: this one joins their world (global rank known from the job)
    interactive_compatible: bool
    start_method: StartMethod | None
    forks: bool  # trainplan forks this process itself (refused where fork is unavailable or CUDA is initialised)
    in_started_job: LauncherName | None  # what it becomes inside a job that started every process; None: unchanged
    trainplan_starts: bool  # trainplan's own launcher starts these workers (torch_xla starts the xla launcher's)


LAUNCHERS: Final[Mapping[LauncherName, LauncherRule]] = {
    rule.name: rule
    for rule in (
        LauncherRule(
            name="none",
            description="run in this process",
            starts_processes=False,
            joins=False,
            interactive_compatible=True,
            start_method=None,
            forks=False,
            in_started_job=None,
            trainplan_starts=False,
        ),
        LauncherRule(
            name="subprocess",
            description="re-run the script in fresh interpreters, one per local rank",
            starts_processes=True,
            joins=False,
            interactive_compatible=False,  # a notebook has no script to re-run
            start_method=None,
            forks=False,
            in_started_job="external",
            trainplan_starts=True,
        ),
        LauncherRule(
            name="spawn",
            description="start fresh interpreters with multiprocessing's spawn method",
            starts_processes=True,
            joins=False,
            # spawn pickles the function; functions defined in a notebook's __main__ cannot be imported back.
            interactive_compatible=False,
            start_method="spawn",
            forks=False,
            in_started_job="external",
            trainplan_starts=True,
        ),
        LauncherRule(
            name="fork",
            description="fork this process, one child per local rank",
            starts_processes=True,
            joins=False,
            interactive_compatible=True,
            start_method="fork",
            forks=True,
            in_started_job="external",
            trainplan_starts=True,
        ),
        LauncherRule(
            name="xla",
            description="start the workers through torch_xla's multiprocessing launcher",
            starts_processes=True,
            joins=False,
            interactive_compatible=True,  # torch_xla forks its workers
            start_method="fork",
            forks=False,
            in_started_job=None,
            trainplan_starts=False,
        ),
        LauncherRule(
            name="external",
            description="join the world the cluster manager already started (it started every process)",
            starts_processes=False,
            joins=True,
            interactive_compatible=True,
            start_method=None,
            forks=False,
            in_started_job=None,
            trainplan_starts=False,
        ),
    )
}


@attrs.frozen(kw_only=True)
class TorchrunProcesses:
    """One of torchrun's `--nproc-per-node` words that names an accelerator, as trainplan's request reads it
    (`trainplan launch --nproc-per-node gpu`)."""

    word: str  # torchrun's word
    accelerator: AcceleratorFlag  # the accelerator it names
    overrides_asked: bool  # it replaces an accelerator asked for (False: it fills in accelerator='auto' only)
    per_host_cpu: bool  # one process per CPU of this machine (False: one per visible device, devices=-1)
    explained: str  # what it starts, for the hint ("every visible GPU")


TORCHRUN_PROCESSES: Final[Mapping[str, TorchrunProcesses]] = {
    row.word: row
    for row in (
        TorchrunProcesses(
            word="gpu", accelerator="gpu", overrides_asked=False, per_host_cpu=False, explained="every visible GPU"
        ),
        TorchrunProcesses(
            word="cpu", accelerator="cpu", overrides_asked=True, per_host_cpu=True, explained="one process per CPU"
        ),
    )
}
"""torchrun's `--nproc-per-node` words that name an accelerator (its others are a count and `auto`)."""


HOST_LAUNCHER: Final[LauncherName] = next(
    rule.name for rule in LAUNCHERS.values() if not (rule.starts_processes or rule.joins)
)
"""The launcher that starts no process and joins no world (one process runs in place): what `check` goes on with
after a launcher is refused, and a row every rule set keeps."""

SERVED_START_METHODS: Final[Mapping[LauncherName, StartMethod]] = {"spawn": "forkserver"}
"""How a launcher's workers are started fastest with its guarantees kept, where the platform offers the method:
spawn's workers fork from a forkserver, itself a fresh interpreter that imported torch once (no CUDA state and
nothing of the caller's but what is pickled, as with spawn; torch is imported once, not once per worker). The first
and last modules hold Ctrl-C off the server while it imports (the launcher answers it): the caller's own preloads
go after the first."""

FORKSERVER_PRELOAD: Final[tuple[str, ...]] = (
    "trainplan.effects._preload_hold",
    "torch",
    "torch.distributed",
    "trainplan.effects.launching",
    "trainplan.effects._preload_release",
)
"""What the forkserver imports before it forks a worker: what every worker imports anyway."""
