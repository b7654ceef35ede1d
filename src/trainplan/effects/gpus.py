"""Usable GPUs: `find_usable_cuda_devices(n)` and `gpu_statuses()`, fast, fork-safe, parallel and explained.

Replaces Lightning's `auto_select_gpus`, which created a CUDA context on each GPU in turn (seconds on an
8-GPU machine), left those contexts and their memory in the caller, made later forking impossible, and
could only say "occupied". Here:

1. The fast path asks NVML (through nvidia-ml-py, a dependency): compute mode, processes holding each GPU,
   MIG. No CUDA context is created anywhere; the decision itself is `trainplan.resolve.gpus.judge`.
2. Where NVML cannot answer (a compute mode it cannot read, or the processes on an exclusive GPU it cannot
   list), each such GPU is confirmed by a real allocation in a fresh interpreter (never a fork of the caller),
   all of them at once, each with a timeout: a GPU whose probe hangs is reported unresponsive.

The caller's process never initialises CUDA, so `ddp_fork`/notebooks still work after the call.

The race: a GPU found free now can be taken by another job before your workers claim it. Nothing a
library does closes that window; a scheduler does (SLURM `--gres`), and exclusive-process mode at
least makes the loser fail at once instead of sharing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, Protocol

import attrs

from trainplan.effects.nvml import NvmlQuery, default_nvml
from trainplan.resolve.gpus import judge, visible_gpus
from trainplan.resolve.visible import AmbiguousDevice
from trainplan.spec.errors import InvalidRequest, TrainplanError, Unavailable
from trainplan.spec.gpus import GpuFacts, GpuStatus
from trainplan.spec.numbers import real_number

DEFAULT_TIMEOUT = 15.0
"""Seconds a confirming probe may take (interpreter start, torch import, context creation) before its GPU
is reported unresponsive."""


class GpuProbeError(TrainplanError, RuntimeError):
    """The GPUs could not be examined at all (for example an ambiguous CUDA_VISIBLE_DEVICES)."""


# --------------------------------------------------------------------------------------------------
# Seam 2: confirming probes in child processes


@attrs.frozen
class ProbeOutcome:
    """What a confirming probe found: `ok`, or the error text, or that it did not answer in time."""

    state: Literal["ok", "error", "timeout"]
    detail: str = ""


class ProbeProcess(Protocol):
    """A running probe. `poll` never blocks."""

    def poll(self) -> ProbeOutcome | None:
        """The outcome once the probe has finished, None while it runs."""

    def kill(self) -> None:
        """Stop the probe now and reap it (used when it overruns its timeout)."""


class ProbeLauncher(Protocol):
    """Starts confirming probes. `start` returns at once; the probe runs elsewhere (never in the caller)."""

    def start(self, index: int) -> ProbeProcess:
        """Start probing the device at this visible index."""


PROBE_CODE = """
import json, sys
index = int(sys.argv[1])
try:
    import torch
except ImportError as error:
    missing = isinstance(error, ModuleNotFoundError) and (error.name or "").partition(".")[0] == "torch"
    reason = "torch is not installed, so no allocation could confirm this GPU (pip install 'trainplan[torch]')"
    print(json.dumps({"ok": False, "error": reason if missing else f"cannot import torch: {error}"}))
    raise SystemExit(0)
try:
    torch.empty(1, device=torch.device("cuda", index))
    torch.cuda.synchronize(index)
    print(json.dumps({"ok": True}))
except Exception as error:
    print(json.dumps({"ok": False, "error": f"{type(error).__name__}: {error}".strip()}))
"""


class _ChildProbe:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._process = process

    def poll(self) -> ProbeOutcome | None:
        if self._process.poll() is None:
            return None
        output, errors = self._process.communicate()
        try:
            answer = json.loads(output.strip().splitlines()[-1])
        except (ValueError, IndexError):
            detail = (errors or output).strip().splitlines()
            return ProbeOutcome("error", detail[-1] if detail else f"exit code {self._process.returncode}")
        if answer.get("ok"):
            return ProbeOutcome("ok")
        return ProbeOutcome("error", str(answer.get("error", "unknown error")))

    def kill(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        self._process.communicate()


class SubprocessProbeLauncher:
    """Probes in fresh interpreters (`python -c`): nothing of the caller is forked or imported."""

    def __init__(self, *, probe_code: str = PROBE_CODE) -> None:
        self.probe_code = probe_code

    def start(self, index: int) -> ProbeProcess:
        process = subprocess.Popen(
            [sys.executable, "-c", self.probe_code, str(index)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return _ChildProbe(process)


def probe_in_parallel(
    indices: Sequence[int],
    launcher: ProbeLauncher,
    *,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, ProbeOutcome]:
    """Start every probe at once, collect them as they finish, kill those still running at the deadline."""
    running = {index: launcher.start(index) for index in indices}
    outcomes: dict[int, ProbeOutcome] = {}
    deadline = clock() + timeout
    try:
        while running:
            for index, process in list(running.items()):
                outcome = process.poll()
                if outcome is not None:
                    outcomes[index] = outcome
                    del running[index]
            if not running:
                break
            if clock() >= deadline:
                for index, process in running.items():
                    process.kill()
                    outcomes[index] = ProbeOutcome("timeout", f"no answer within {timeout:g} s")
                running.clear()
                break
            sleep(0.005)
    finally:
        for process in running.values():  # interrupted: leave no probe behind
            process.kill()
    return outcomes


# --------------------------------------------------------------------------------------------------


def _check_timeout(timeout: object) -> None:
    """A probe timeout is a finite number of seconds > 0 (NaN would disable the hang guard)."""
    seconds = real_number(timeout)
    if seconds is None or not seconds > 0:
        raise InvalidRequest(
            field="timeout", value=timeout, reason="it must be a finite, positive number of seconds", fix="timeout=15"
        )


def gpu_statuses(
    *,
    timeout: float = DEFAULT_TIMEOUT,
    nvml: NvmlQuery | None = None,
    launcher: ProbeLauncher | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[GpuStatus]:
    """Every visible GPU with whether a new process can use it now, and why not.

    Never initialises CUDA in this process. NVML decides where it can; the rest is confirmed by
    real allocations in child processes, in parallel, each bounded by `timeout` seconds.
    """
    _check_timeout(timeout)
    environ = os.environ if environ is None else environ
    nvml = default_nvml() if nvml is None else nvml
    launcher = SubprocessProbeLauncher() if launcher is None else launcher
    # No NVML library at all means no NVIDIA driver, and so no CUDA device (probe() agrees).
    facts = nvml.gpus() or []
    try:
        visible = visible_gpus(environ.get("CUDA_VISIBLE_DEVICES"), facts)
    except AmbiguousDevice as error:
        raise GpuProbeError(f"{error}. Write a longer UUID prefix, or indices, in CUDA_VISIBLE_DEVICES.") from None
    devices: list[tuple[GpuFacts, bool | None, str | None]] = []
    for gpu in visible:
        verdict = judge(gpu)
        devices.append((gpu, verdict.usable, verdict.reason))
    unknown = [index for index, (_, usable, _) in enumerate(devices) if usable is None]
    outcomes = probe_in_parallel(unknown, launcher, timeout=timeout) if unknown else {}
    statuses = []
    for index, (gpu, nvml_usable, nvml_reason) in enumerate(devices):
        checked_by: Literal["nvml", "probe", "none"] = "nvml"
        usable, reason = nvml_usable, nvml_reason
        if index in outcomes:
            outcome = outcomes[index]
            checked_by = "probe"
            usable = outcome.state == "ok"
            reason = {
                "ok": None,
                "error": f"probe failed: {outcome.detail}",
                "timeout": f"unresponsive: {outcome.detail}",
            }[outcome.state]
        statuses.append(
            GpuStatus(
                index=index,
                uuid=gpu.uuid,
                name=gpu.name,
                memory_total=gpu.memory_total,
                memory_used=gpu.memory_used,
                usable=bool(usable),
                reason=reason,
                checked_by=checked_by,
            )
        )
    return statuses


def find_usable_cuda_devices(
    num_devices: int = -1,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    nvml: NvmlQuery | None = None,
    launcher: ProbeLauncher | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[int]:
    """Visible indices of GPUs that can take a new process now, in index order: the first `num_devices`
    of them (-1: all usable, 0: none). Use as `Request(devices=find_usable_cuda_devices(2))`.

    Raises `Unavailable` when fewer GPUs are visible than asked for, or fewer are usable (naming each
    unusable GPU and why: exclusive mode held by pid N, prohibited, a probe's error, timed out).
    """
    count: object = num_devices
    if isinstance(count, bool) or not isinstance(count, int) or count < -1:
        raise InvalidRequest(
            field="num_devices",
            value=num_devices,
            reason="it must be -1 (all usable), 0 or a positive count",
            fix="Write e.g. find_usable_cuda_devices(2)",
        )
    _check_timeout(timeout)
    if num_devices == 0:
        return []
    statuses = gpu_statuses(timeout=timeout, nvml=nvml, launcher=launcher, environ=environ)
    if num_devices > len(statuses) or not statuses:
        raise Unavailable(
            requested=f"{'every usable' if num_devices == -1 else num_devices} CUDA device(s)",
            available=f"{len(statuses)} visible CUDA device(s)",
            fix="Ask for fewer, check CUDA_VISIBLE_DEVICES, or run where more GPUs are visible",
        )
    usable = [status.index for status in statuses if status.usable]
    wanted = len(usable) if num_devices == -1 else num_devices
    if wanted == 0 or len(usable) < wanted:
        busy = "; ".join(
            f"GPU {status.index} ({status.name or status.uuid}): {status.reason}"
            for status in statuses
            if not status.usable
        )
        raise Unavailable(
            requested=f"{wanted or 'any'} usable CUDA device(s)",
            available=f"{len(usable)} usable of {len(statuses)} visible ({busy})",
            fix="Ask for fewer devices, wait for the busy ones, or run where more are free",
        )
    return usable[:wanted]
