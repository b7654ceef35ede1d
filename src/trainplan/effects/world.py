"""Joining the plan's world: `with trainplan.join(plan) as world:` in any process a launcher started.

One call, whichever launcher started the process (torchrun, srun, mpirun, jsrun, a Kubeflow pod,
`trainplan launch`, `trainplan.launch`): it binds this process's device, initialises torch.distributed's
default process group with the plan's backend, main address, port and ranks, and the strategy's
`timeout_seconds` (`mapping.workers.process_group_timeout`), and destroys the group when the `with` block
ends. When a group already exists (the script or a framework made one), it is checked against the plan and
used as it is; it is then left for its owner to destroy. `trainplan.launch` joins through this same call.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import socket
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Protocol

from trainplan.effects.extras import require_torch
from trainplan.effects.probing import process_variables
from trainplan.effects.rules_loading import rules_of
from trainplan.mapping.workers import (
    STARTING_LAUNCHERS,
    job_of,
    launcher_rule,
    process_group_timeout,
    started_by_another_launcher,
)
from trainplan.rules import INFERRED_JOIN_SECONDS, JOB_IDENTITY_VARIABLES, NODES_INFERRED_NOTE
from trainplan.spec.errors import TrainplanError, a_kind
from trainplan.spec.names import BackendKey
from trainplan.spec.plan import Plan


class JoinError(TrainplanError, RuntimeError):
    """The plan cannot be joined from this process (it starts its workers, or does not say this rank)."""


class WorldMismatch(TrainplanError, RuntimeError):
    """The process group that exists is not the plan's world (another size, or this process another rank)."""

    def __init__(self, *, what: str, plan_value: int, group_value: int, fix: str) -> None:
        self.what = what
        self.plan_value = plan_value
        self.group_value = group_value
        super().__init__(
            f"The plan says {what} {plan_value}, but the process group this process is in has {what} "
            f"{group_value}: they are not the same world. {fix}"
        )


class DeviceBinder(Protocol):
    """How this process binds its device where the accelerator's row says it binds one (CUDA's; one a rule set
    adds: Ascend's "npu", Gaudi's "hpu"). The default asks torch; tests pass fakes."""

    def bind(self, device_type: str, index: int) -> None:
        """Make device `index` of `device_type` this process's current device. Raises `LookupError` when torch
        does not know the device type (its plugin is not imported), saying what torch said, and `DeviceUnavailable`
        when torch knows it but this process has no such device (a torch without CUDA, an index beyond the count).
        Cheap: no collective, no allocation beyond the plugin's own context."""


class DeviceUnavailable(RuntimeError):
    """A `DeviceBinder`'s refusal of a device this process does not have (why, in the message)."""


class TorchDevices:
    """`DeviceBinder` through torch: `torch.device(device_type, index)` and the device module's `set_device`
    (what a plugin registers as `torch.npu`, `torch.hpu`, ...)."""

    def bind(self, device_type: str, index: int) -> None:
        import torch

        try:
            device = torch.device(device_type, index)
            module: Any = torch.get_device_module(device)
        except (RuntimeError, ValueError, AttributeError) as error:
            raise LookupError(str(error).strip().splitlines()[0]) from None
        available = getattr(module, "is_available", None)
        count = getattr(module, "device_count", None)
        if callable(available) and not available():
            raise DeviceUnavailable(f"torch {torch.__version__} sees no {device_type} device here")
        if callable(count) and index >= count():
            raise DeviceUnavailable(f"torch sees {count()} {device_type} device(s) here, so {device} does not exist")
        setter = getattr(module, "set_device", None)
        if setter is not None:
            setter(device)


class World:
    """This process's place in the plan's world, joined; leave it (or end the `with` block) when done."""

    def __init__(
        self, *, plan: Plan, rank: int, local_rank: int, device: str, created: bool, timeout_seconds: int
    ) -> None:
        self.plan = plan
        self.rank = rank
        """This process's global rank."""
        self.local_rank = local_rank
        self.world_size = plan.world_size
        self.device = device
        """This process's torch device string ("cuda:0", "cpu"); on CUDA it is the current device."""
        self.backend: BackendKey | None = plan.process_group_backend
        self.created = created
        """Whether joining created the process group (then leaving destroys it)."""
        self.timeout_seconds = timeout_seconds
        self._left = False

    @property
    def left(self) -> bool:
        """Whether this process has left the world."""
        return self._left

    def leave(self, *, wait_for_peers: bool = True) -> None:
        """Destroy the process group if joining created it (idempotent). Leaving normally first waits for the
        other ranks (a barrier): tearing a group down while a peer still talks to it can abort the process
        at exit; leaving on an error does not wait, since the peers may never come."""
        if self._left:
            return
        self._left = True
        if not self.created:
            return
        from torch import distributed

        if distributed.is_available() and distributed.is_initialized():
            if wait_for_peers and self.world_size > 1:
                with contextlib.suppress(RuntimeError):  # a peer that died: nothing left to wait for
                    distributed.barrier()
            distributed.destroy_process_group()

    def __enter__(self) -> World:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.leave(wait_for_peers=kind is None)

    def __repr__(self) -> str:
        return (
            f"World(rank={self.rank}, local_rank={self.local_rank}, world_size={self.world_size}, "
            f"device={self.device!r}, backend={self.backend!r}, created={self.created})"
        )


def join(plan: Plan, *, devices: DeviceBinder | None = None) -> World:
    """Join the plan's world from this process: device bound, process group up (see the module docs).

    The device is bound where the accelerator's row says so (`AcceleratorRule.binds_device`: CUDA's, and a
    downstream accelerator's, a rule set's own from `Rules.extend(accelerators=...)`), through `devices` (default:
    torch's, `torch.device(device_type, index)` and its device module's `set_device`, `torch.cuda.set_device` on
    CUDA). A downstream device needs the accelerator's torch plugin imported in this process; without it,
    `JoinError` names the accelerator and its rule set."""
    if not isinstance(plan, Plan):
        raise JoinError(f"join takes a trainplan.Plan, not {a_kind(plan)}: build one with trainplan.resolve()")
    if plan.launcher in STARTING_LAUNCHERS:
        raise JoinError(
            f"This plan starts its {plan.world_size} workers itself (launcher {plan.launcher!r}), so this process is "
            "not one of them and has no world to join. Run the function with trainplan.launch(plan, fn), which "
            "joins inside each worker; or start the script with `trainplan launch` or torchrun and call "
            "trainplan.resolve() inside it (launcher 'external'), then join that plan"
        )
    if started_by_another_launcher(plan):
        raise JoinError(
            f"The plan's launcher is {plan.launcher!r}: torch_xla starts and joins its own workers "
            "(torch_xla.launch(fn)); call trainplan.resolve() inside them"
        )
    if launcher_rule(plan).joins:
        cluster = plan.cluster
        if cluster.global_rank is None or cluster.local_rank is None or cluster.main_port is None:
            raise JoinError(
                "The plan's launcher is 'external' but it does not say this process's rank and main port; resolve "
                "it inside the process the job started (trainplan.resolve() there reads them)"
            )
        rank, local_rank = cluster.global_rank, cluster.local_rank
        _check_this_process(plan, rank)
    else:
        rank, local_rank = 0, 0
    device = plan.device_for(local_rank if local_rank < plan.processes_per_node else 0)
    row = rules_of(plan).accelerators.get(plan.accelerator)
    binds = row is None or row.binds_device  # a downstream row out of reach: bound as its plan names the device
    if binds or (plan.process_group_backend is not None and plan.world_size > 1):
        require_torch(f"Joining a world of {plan.world_size} process(es) on {plan.accelerator}")
    if binds:
        _bind_device(plan, device, TorchDevices() if devices is None else devices)
    timeout = process_group_timeout(plan, rules_of(plan))
    backend = plan.process_group_backend
    if backend is None or plan.world_size == 1:
        _check_existing_group(plan, rank)
        return World(plan=plan, rank=rank, local_rank=local_rank, device=device, created=False, timeout_seconds=timeout)
    from torch import distributed

    if distributed.is_initialized():
        _check_existing_group(plan, rank)
        return World(plan=plan, rank=rank, local_rank=local_rank, device=device, created=False, timeout_seconds=timeout)
    port = plan.cluster.main_port
    if port is None:
        raise JoinError(
            f"The plan's world has {plan.world_size} processes but no main port to meet at: resolve it inside the "
            "job (trainplan.resolve()), which reads MASTER_PORT"
        )
    address = plan.cluster.main_address
    delta = datetime.timedelta(seconds=timeout)
    inferred = next((note for note in plan.notes if note.code == NODES_INFERRED_NOTE), None)
    # A node count the launcher did not state: the world's store must form within a bound (another node's ranks may
    # have read another layout and refused), then the store keeps the plan's timeout.
    meeting = delta if inferred is None else min(delta, datetime.timedelta(seconds=INFERRED_JOIN_SECONDS))
    on_this_machine = _is_loopback(address) or plan.num_nodes == 1
    own_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"  # else torchrun's agent store serves
    store: Any = None
    try:
        if on_this_machine and own_store:
            # The world meets on this machine (a loopback main address, or one node named by its host name, as in
            # every one-node SLURM job): the rendezvous store listens on loopback only, never on every interface
            # (torch's own store binds the wildcard address). Under torchrun's agent store, torchrun owns it.
            host = address if _is_loopback(address) else "127.0.0.1"
            store = _loopback_store(host, port, rank=rank, world_size=plan.world_size, timeout=meeting)
        elif inferred is not None and own_store:
            from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported at runtime

            store = TCPStore(address.strip("[]"), port, plan.world_size, rank == 0, meeting)
    except (RuntimeError, TimeoutError, OSError) as error:
        if inferred is None or isinstance(error, JoinError):
            raise
        said = (str(error).strip().splitlines() or [""])[0][:200]
        raise JoinError(
            f"The world of {plan.world_size} did not form at {address}:{port} within {INFERRED_JOIN_SECONDS} s "
            f"({type(error).__name__}: {said}): the other ranks read another layout and refused, or never started. "
            f"{inferred.message}"
        ) from None
    if store is not None:
        same_job(store, rank, job_identity(os.environ), f"{address}:{port}")
        store.set_timeout(delta)
        distributed.init_process_group(
            backend=backend, store=store, rank=rank, world_size=plan.world_size, timeout=delta
        )
    else:
        distributed.init_process_group(
            backend=backend,
            init_method=f"tcp://{_host_for_url(address)}:{port}",
            rank=rank,
            world_size=plan.world_size,
            timeout=delta,
        )
    _collect_before_teardown()
    return World(plan=plan, rank=rank, local_rank=local_rank, device=device, created=True, timeout_seconds=timeout)


def _bind_device(plan: Plan, device: str, devices: DeviceBinder) -> None:
    device_type, _, index = device.partition(":")
    try:
        devices.bind(device_type, int(index or 0))
    except DeviceUnavailable as error:
        raise JoinError(
            f"The plan drives {device} on this process, and {error}. A plan is made for the machine it was resolved "
            "on: resolve it here (trainplan.resolve() probes this machine), or run where its devices are"
        ) from None
    except LookupError as error:
        rules = "an unnamed rule set" if plan.rules is None or ":" not in plan.rules else f"the rule set {plan.rules}"
        raise JoinError(
            f"The plan's accelerator {plan.accelerator!r} (a row of {rules}) binds devices of type {device_type!r}, "
            f"and this torch does not know that type ({error}). Import the device plugin that registers it (for "
            f"'npu', `import torch_npu`) in every worker before joining, or correct the row's device_type"
        ) from None


_COLLECTING = False


def _collect_before_teardown() -> None:
    """Once per process: collect garbage at exit, before the interpreter tears itself down. DDP's hooks and
    autograd state sit in reference cycles; left to the final teardown, torch's C++ objects are destroyed out
    of order and the process sometimes aborts ("terminate called without an active exception", SIGABRT)
    after its work is done. Collected while the interpreter still stands, they go quietly."""
    global _COLLECTING
    if _COLLECTING:
        return
    _COLLECTING = True
    import atexit
    import gc

    atexit.register(gc.collect)


def _check_this_process(plan: Plan, rank: int) -> None:
    """An external plan names one rank of one job: it must be this process's (its launcher's variables say)."""
    rules = rules_of(plan)
    job = job_of(process_variables(rules=rules), rules)
    if job is None:
        managers = sorted({rule.schemas[0].label for rule in rules.clusters.values() if rule.creates_processes})
        raise JoinError(
            f"The plan is rank {rank}'s of a world of {plan.world_size}, but no launcher started this process (none "
            f"of {', '.join(managers)}'s or trainplan's variables are set). Join from the processes the job started, "
            "each with the plan trainplan.resolve() gives there"
        )
    if job.world_size is not None and job.world_size != plan.world_size:
        raise WorldMismatch(
            what="world size",
            plan_value=plan.world_size,
            group_value=job.world_size,
            fix="Resolve the plan inside this job (trainplan.resolve() takes its layout)",
        )
    if job.main_port is not None and plan.cluster.main_port != job.main_port:
        raise JoinError(
            f"The plan meets at port {plan.cluster.main_port}, but this job meets at {job.main_port} (MASTER_PORT): "
            "the plan comes from another run. Resolve the plan in this process (trainplan.resolve())"
        )
    if job.global_rank is not None and job.global_rank != rank:
        raise JoinError(
            f"The plan is rank {rank}'s, but {job.started_by} started this process as rank {job.global_rank}. "
            "Resolve the plan in this process (trainplan.resolve()), not in another rank's"
        )


def _check_existing_group(plan: Plan, rank: int) -> None:
    import sys

    if sys.modules.get("torch.distributed") is None:
        return  # without torch.distributed loaded there can be no process group
    from torch import distributed

    if not (distributed.is_available() and distributed.is_initialized()):
        return
    check_group(
        plan,
        size=distributed.get_world_size(),
        group_rank=distributed.get_rank(),
        rank=rank,
        size_fix="Resolve the plan inside the job (trainplan.resolve() takes the job's layout), or ask for the "
        "layout the job started",
        rank_fix="Resolve the plan in this process (its RANK), not in another rank's",
    )


def check_group(plan: Plan, *, size: int, group_rank: int, rank: int | None, size_fix: str, rank_fix: str) -> None:
    """The process group this process is in must be the plan's world: its size, and this process at the plan's
    rank (`rank`; None: not checked). `WorldMismatch` otherwise, with the fix the caller knows."""
    if size != plan.world_size:
        raise WorldMismatch(what="world size", plan_value=plan.world_size, group_value=size, fix=size_fix)
    if rank is not None and group_rank != rank:
        raise WorldMismatch(what="rank", plan_value=rank, group_value=group_rank, fix=rank_fix)


def _is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


_JOB_KEY = "trainplan/job"


def job_identity(environ: Mapping[str, str]) -> str:
    """What every rank of this job shares and another job does not (`rules.JOB_IDENTITY_VARIABLES`), as text."""
    return ";".join(f"{name}={environ[name]}" for name in JOB_IDENTITY_VARIABLES if name in environ)


def same_job(store: Any, rank: int, identity: str, where: str) -> None:
    """Rank 0 records the job in the world's store; every other rank checks it met its own job's store, not the store
    of another job that chose the same port (a late rank would then wait in its first collective for ranks that are
    not there): `JoinError` naming both jobs."""
    if rank == 0:
        store.set(_JOB_KEY, identity)
        return
    theirs = bytes(store.get(_JOB_KEY)).decode("utf-8", "replace")
    if theirs != identity:
        raise JoinError(
            f"The rendezvous store at {where} belongs to another job ({theirs or 'no job variables'}), not this one "
            f"({identity or 'no job variables'}): two jobs chose the same port. Give one of them another "
            "MASTER_PORT (or let its launcher choose a free one)"
        )


def _loopback_store(address: str, port: int, *, rank: int, world_size: int, timeout: datetime.timedelta) -> Any:
    """torch's TCPStore for a world on this machine; rank 0's listens on `address` (loopback) alone."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported at runtime

    host = "127.0.0.1" if address == "localhost" else address.strip("[]")
    if rank != 0:
        return TCPStore(host, port, world_size, False, timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen()
    except OSError as error:
        listener.close()
        raise JoinError(
            f"Rank 0 cannot listen on {host}:{port} for the world's rendezvous ({error.strerror}: address already "
            "in use, or not this machine's). Choose another MASTER_PORT, or let the launcher choose a free one"
        ) from None
    descriptor = listener.detach()  # the store owns the socket from here on, even when it fails: never close it
    return TCPStore(host, port, world_size, True, timeout, master_listen_fd=descriptor)


def _host_for_url(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


__all__ = ["DeviceBinder", "JoinError", "TorchDevices", "World", "WorldMismatch", "check_group", "join"]
