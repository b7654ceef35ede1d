"""The plan: the resolved answer, with the reason for every choice and a plain-JSON form."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeAlias

import attrs

from trainplan.spec.entry import entry_points
from trainplan.spec.frozen import FrozenMap, freeze_map, freeze_sequence
from trainplan.spec.memory import MemoryPlan
from trainplan.spec.mesh import MeshLayout
from trainplan.spec.names import (
    HOST_DEVICE,
    AcceleratorKey,
    BackendKey,
    ClusterKey,
    LauncherName,
    MeshDimension,
    MetricsStore,
    PrecisionKey,
    StrategyFamily,
    StrategyKey,
)
from trainplan.spec.notes import Note, freeze_notes
from trainplan.spec.options import StrategyOptions
from trainplan.spec.request import Request

if TYPE_CHECKING:
    from trainplan.rules import Rules


ReducesOn: TypeAlias = Literal["device", "where_stored", "nowhere"]


def _freeze_strings(value: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return freeze_sequence(value)  # type: ignore[return-value]


@attrs.frozen(kw_only=True)
class StrategyChoice:
    """The strategy: its registered name, its family and the options in force."""

    name: StrategyKey
    family: StrategyFamily
    options: StrategyOptions | None


@attrs.frozen(kw_only=True)
class ClusterInfo:
    """Where this process sits in the world: who started it, where the ranks meet, which rank it is."""

    kind: ClusterKey
    """The cluster environment: a built-in one, or a downstream rule set's (`Rules.extend(clusters=...)`)."""
    creates_processes: bool
    """True when a cluster manager (srun, torchrun, jsrun, mpirun) started every process itself."""
    main_address: str
    main_port: int | None
    """None: the launcher picks a free port at launch."""
    node_rank: int | None
    """This machine's rank among the nodes; None inside a job that states none (MPI names no node index, and ranks
    may be mapped round-robin, so none is derived)."""
    global_rank: int | None
    """This process's rank, when the cluster already says it; None before trainplan launches the workers."""
    local_rank: int | None


@attrs.frozen(kw_only=True)
class MetricPlacement:
    """Where logged metric tensors live and where they are reduced."""

    default_store: MetricsStore
    device_type: str
    """The accelerator's torch device type ("cuda", "cpu", ...)."""
    reduces_on: ReducesOn
    """`device`: the backend needs accelerator tensors; `where_stored`: reduced in place; `nowhere`: one process."""
    cpu_values_move_for_reduction: bool
    """CPU-stored values are copied to the device for each reduction and back (NCCL needs CUDA tensors)."""
    explanation: str


@attrs.frozen(kw_only=True)
class MetricSlot:
    """Where one logged metric lives and is reduced (from `place_metric`)."""

    store_device: str
    reduce_device: str | None
    """None when nothing is reduced (one process)."""
    moves_for_reduction: bool
    explanation: str


@attrs.frozen(kw_only=True)
class Plan:
    """The resolved layout of a training run. Build one with `trainplan.resolve`; read it anywhere."""

    request: Request
    """The request, normalised (resolving it again gives an equal plan)."""
    accelerator: AcceleratorKey
    device_type: str
    """The torch device type of the accelerator, from its row ("cuda", "cpu", "mps", "xla", or a downstream one's
    such as "npu"): what `device_for` writes a local rank's device with."""
    strategy: StrategyChoice
    devices: tuple[int, ...]
    """Local device indices, one per process on this node (visible CUDA indices; 0..n-1 for CPU processes)."""
    num_nodes: int
    processes_per_node: int
    world_size: int
    launcher: LauncherName
    cluster: ClusterInfo
    process_group_backend: BackendKey | None
    """None when the strategy runs a single process and creates no process group."""
    precision: PrecisionKey
    metrics: MetricPlacement
    notes: tuple[Note, ...] = attrs.field(converter=freeze_notes)
    reasons: FrozenMap = attrs.field(converter=freeze_map)
    """Why each choice was made, by decision: accelerator, devices, strategy, launcher, cluster, ..."""
    physical_devices: tuple[str, ...] = attrs.field(default=(), converter=_freeze_strings)
    """Which physical GPU each of `devices` is, as CUDA_VISIBLE_DEVICES names it (an index such as "2", or a
    `GPU-…`/`MIG-…` UUID); the index itself when the variable is unset. Empty for non-CUDA plans."""
    mesh: MeshLayout | None = None
    """The device mesh (strategy `model_parallel`): its dimensions in their fixed order and their sizes; None for
    the other strategies."""
    memory: MemoryPlan | None = None
    """The memory arithmetic, when the request gave the model's facts and the devices' memory is known: the estimate
    per device by category for each candidate layout, and the one chosen (`explain()` shows it as a table)."""
    rules: str | None = None
    """The rule set the plan was made from: None for trainplan's own; its reference ("module:NAME", which a worker
    imports to check the plan it reads back) for a downstream one; `UNNAMED_RULES` for one without a reference."""

    @property
    def mesh_coordinates(self) -> dict[MeshDimension, int] | None:
        """This process's place in the mesh, by dimension; None without a mesh or before the rank is known."""
        if self.mesh is None or self.cluster.global_rank is None:
            return None
        return dict(zip(self.mesh.dimensions, self.mesh.coordinates(self.cluster.global_rank), strict=True))

    @property
    def mesh_groups(self) -> dict[MeshDimension, tuple[int, ...]] | None:
        """The ranks this process shares a group with along each dimension (itself included); None without a mesh
        or before the rank is known."""
        if self.mesh is None or self.cluster.global_rank is None:
            return None
        rank = self.cluster.global_rank
        return {name: self.mesh.group(rank, name) for name in self.mesh.dimensions}

    @property
    def is_distributed(self) -> bool:
        """Whether the run has more than one process."""
        return self.world_size > 1

    @property
    def global_rank(self) -> int | None:
        """This process's global rank when known (inside a launched or cluster-started worker)."""
        return self.cluster.global_rank

    @property
    def device_strings(self) -> tuple[str, ...]:
        """The torch device string of each local rank, in local-rank order."""
        return tuple(self.device_for(local_rank) for local_rank in range(self.processes_per_node))

    def device_for(self, local_rank: int) -> str:
        """The torch device string for a local rank: "cuda:3", "mps:0", "xla:1", "cpu".

        With one process driving several devices (`dp`), this is the first of them.
        """
        rank: object = local_rank
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.processes_per_node:
            raise IndexError(
                f"local_rank={local_rank!r} is outside this plan's {self.processes_per_node} local process(es); "
                f"use 0 to {self.processes_per_node - 1}"
            )
        device_type = self.device_type
        if device_type == HOST_DEVICE:  # torch's host device has no index: every CPU process is on "cpu"
            return device_type
        return f"{device_type}:{self.devices[local_rank]}"

    def physical_device_for(self, local_rank: int) -> str:
        """The physical GPU a local rank drives ("2", or a UUID), whatever CUDA_VISIBLE_DEVICES renumbered;
        for non-CUDA plans, the torch device string."""
        device = self.device_for(local_rank)
        if not self.physical_devices:
            return device
        return self.physical_devices[local_rank]

    def explain(self) -> str:
        """A human-readable account of the plan: each choice with its reason, then the notes."""
        return entry_points().explain(self)

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-compatible data; `Plan.from_dict` reads it back to an equal plan."""
        return entry_points().plan_to_dict(self)

    @classmethod
    def from_dict(cls, data: object, rules: Rules | None = None) -> Plan:
        """Read `to_dict`'s output back; anything else raises `PlanFormatError` naming the bad path.

        A plan read back is as valid as one resolved (workers trust it): ranges and consistency are checked
        (world size = nodes × processes, one device per process, ranks inside the world, a real port, options
        and request fields that resolve would accept), against the rules it was made from. `rules` is that rule
        set; without it, a plan of trainplan's own rules is checked against `BUILTIN_RULES`, and a plan of a
        downstream rule set (whose rows may replace the built-in ones) only as far as its own facts allow: the
        family's and precision's rows are not read (a launched worker imports the recorded rule set:
        `trainplan.effects.read_plan_text`)."""
        return entry_points().plan_from_dict(data, rules)


__all__ = [
    "ClusterInfo",
    "MeshLayout",
    "MetricPlacement",
    "MetricSlot",
    "Plan",
    "StrategyChoice",
]
