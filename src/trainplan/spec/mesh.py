"""The device mesh of a plan: named dimensions in a fixed order, each rank's coordinates, and who shares a group.

A mesh lays the world's ranks out as torch's `init_device_mesh` does: `arange(world_size).view(shape)`, row-major,
so the last dimension (`tp`) varies fastest and its groups are neighbouring ranks on one node. Everything here is
arithmetic on that layout, checked against `torch.distributed.device_mesh` itself by a multi-process test.

Which of the mesh rules a layout breaks is `rules.mesh.layout_violations`'s to say.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from trainplan.spec.errors import MeshDimensionError, MeshQueryError, MeshRankError, shown
from trainplan.spec.frozen import freeze_map, freeze_sequence
from trainplan.spec.names import (
    EXPERT_DIMENSIONS,
    MESH_DIMENSIONS,
    ContextParallelBalancer,
    ContextParallelRotate,
    ExpertDimension,
    GroupBackend,
    MeshDimension,
    PipelineSchedule,
)


def _freeze_dimensions(value: tuple[MeshDimension, ...] | list[MeshDimension]) -> tuple[MeshDimension, ...]:
    return freeze_sequence(value)  # type: ignore[return-value]


def _freeze_shape(value: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    return freeze_sequence(value)  # type: ignore[return-value]


def _freeze_backends(value: Mapping[MeshDimension, GroupBackend]) -> Mapping[MeshDimension, GroupBackend]:
    return freeze_map(value)  # type: ignore[arg-type,return-value]  # a FrozenMap of dimension → backend names


@attrs.frozen(kw_only=True)
class PipelineLayout:
    """How the `pp` dimension runs: torch's schedule, the microbatches one step splits into, and the stages each
    rank holds (`virtual_stages`; the model is cut into `pp × virtual_stages` stages). Which stages a rank holds
    is `rules.mesh.stage_indices`'s to say (the schedule's style)."""

    schedule: PipelineSchedule = "1F1B"
    microbatches: int = 1
    virtual_stages: int = 1


@attrs.frozen(kw_only=True)
class ContextParallelLayout:
    """How the `cp` dimension runs torch's context parallelism: its rotate method (`set_rotate_method`) and load
    balancer (`context_parallel`'s head-tail one, or none); `rt.context_parallel` applies both."""

    rotate_method: ContextParallelRotate = "allgather"
    load_balancer: ContextParallelBalancer = "head_tail"


@attrs.frozen(kw_only=True)
class MeshLayout:
    """A device mesh: its dimensions (always `pp, dp_replicate, dp_shard, cp, sp, tp`, outermost first) and their sizes.

    Rank r sits at the coordinates of r in a row-major array of `shape`, as in torch's `init_device_mesh`; a group
    along a dimension is the ranks that share every other coordinate (a `DeviceMesh`'s group for that dimension).
    """

    dimensions: tuple[MeshDimension, ...] = attrs.field(default=MESH_DIMENSIONS, converter=_freeze_dimensions)
    shape: tuple[int, ...] = attrs.field(converter=_freeze_shape)
    ep: int = 1
    """Expert parallelism (torchtitan's `ep`): the experts split over this many ranks, borrowed from the
    `dp_shard × cp × sp × tp` ranks rather than multiplied into the world (it divides their product; `rules.mesh` says
    so)."""
    pipeline: PipelineLayout = PipelineLayout()
    """How the pipeline stages run (schedule, microbatches, stages per rank)."""
    context_parallel: ContextParallelLayout = ContextParallelLayout()
    """How context parallelism runs (rotate method, load balancer): torch's defaults unless `cp` > 1 says otherwise."""
    backends: Mapping[MeshDimension, GroupBackend] = attrs.field(factory=dict, converter=_freeze_backends)
    """The backend of each dimension's groups where the request named one (`tp_group_backend="gloo"`: `{"tp": "gloo"}`,
    torch's `init_device_mesh(..., backend_override=...)`); a dimension left out runs over the world's backend."""

    @property
    def world_size(self) -> int:
        """The number of ranks in the mesh (the product of its sizes)."""
        return math.prod(self.shape)

    @property
    def sizes(self) -> dict[MeshDimension, int]:
        """Each dimension's size, in the mesh's order."""
        return dict(zip(self.dimensions, self.shape, strict=True))

    def size(self, dimension: MeshDimension) -> int:
        """The size of one dimension (its parallel degree)."""
        return self.shape[self._index(dimension)]

    def coordinates(self, rank: int) -> tuple[int, ...]:
        """Where `rank` sits: one index per dimension, in the mesh's order."""
        self._check_rank(rank)
        return _coordinates(self.shape, rank)

    def rank_at(self, coordinates: tuple[int, ...]) -> int:
        """The rank at `coordinates` (the inverse of `coordinates`)."""
        return _rank_at(self.shape, coordinates, self.describe())

    def group(self, rank: int, dimension: MeshDimension) -> tuple[int, ...]:
        """The ranks in `rank`'s group along `dimension` (its own included), in order."""
        axis = self._index(dimension)
        self._check_rank(rank)
        return _group(self.shape, axis, rank)

    @property
    def expert(self) -> ExpertLayout:
        """The expert mesh (torchtitan's sparse mesh) over the same ranks: `pp × dp_replicate × efsdp × ep`, where
        `efsdp = dp_shard · cp · sp · tp / ep`. With `ep` 1 it still exists (efsdp is the whole dense shard region)."""
        pp, replicate = self.size("pp"), self.size("dp_replicate")
        region = self.world_size // (pp * replicate)  # the ranks of one replica's stage: dp_shard · cp · sp · tp
        return ExpertLayout(shape=(pp, replicate, region // self.ep if region % self.ep == 0 else region, self.ep))

    def groups(
        self, dimension: MeshDimension, limit: int | None = None, *, members: int | None = None
    ) -> tuple[tuple[int, ...], ...]:
        """Every group along `dimension`, each in rank order, ordered by their first rank; there are
        `world_size // size(dimension)` in all. `limit` keeps the first groups only, `members` the first ranks of
        each (for a drawing of a large world); both are counts, 0 or more (`MeshQueryError`, a `ValueError`,
        otherwise)."""
        for name, value in (("limit", limit), ("members", members)):
            given: object = value
            if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 0):
                raise MeshQueryError(
                    f"{name}={shown(value)} is not a number of groups or ranks to keep; use 0 or more, or None"
                )
        axis = self._index(dimension)
        size = self.shape[axis]
        stride = math.prod(self.shape[axis + 1 :])
        count = self.world_size // size if limit is None else min(limit, self.world_size // size)
        kept = size if members is None else min(members, size)
        found: list[tuple[int, ...]] = []
        for block in range(self.world_size // (size * stride)):
            for offset in range(stride):
                if len(found) == count:
                    return tuple(found)
                first = block * size * stride + offset
                found.append(tuple(first + index * stride for index in range(kept)))
        return tuple(found)

    def describe(self) -> str:
        """`pp 1 × dp_replicate 1 × dp_shard 2 × cp 1 × sp 1 × tp 2`: every dimension, in order (and `, ep 2` when the
        experts are split)."""
        dense = " × ".join(f"{name} {size}" for name, size in zip(self.dimensions, self.shape, strict=True))
        return dense if self.ep == 1 else f"{dense}, ep {self.ep}"

    def _index(self, dimension: MeshDimension) -> int:
        if dimension not in self.dimensions:
            names = ", ".join(repr(name) for name in self.dimensions)
            raise MeshDimensionError(f"{shown(dimension)} is not a dimension of this mesh; its dimensions are {names}")
        return self.dimensions.index(dimension)

    def _check_rank(self, rank: int) -> None:
        _checked_rank(rank, self.world_size)


@attrs.frozen(kw_only=True)
class ExpertLayout:
    """The expert mesh: `pp, dp_replicate, efsdp, ep` over the same ranks as the dense mesh, row-major as torch's
    `init_device_mesh` (and torchtitan's `_unflatten` of the world) lays them out: an `ep` group is `ep` neighbouring
    ranks of one dense shard region, an `efsdp` group the ranks `ep` apart."""

    dimensions: tuple[ExpertDimension, ...] = EXPERT_DIMENSIONS
    shape: tuple[int, ...] = attrs.field(converter=_freeze_shape)

    @property
    def sizes(self) -> dict[ExpertDimension, int]:
        """Each dimension's size, in the mesh's order."""
        return dict(zip(self.dimensions, self.shape, strict=True))

    def coordinates(self, rank: int) -> tuple[int, ...]:
        """Where `rank` sits in the expert mesh: one index per dimension."""
        _checked_rank(rank, math.prod(self.shape))
        return _coordinates(self.shape, rank)

    def group(self, rank: int, dimension: ExpertDimension) -> tuple[int, ...]:
        """The ranks in `rank`'s group along `dimension` of the expert mesh (its own included), in order."""
        if dimension not in self.dimensions:
            names = ", ".join(repr(name) for name in self.dimensions)
            raise MeshDimensionError(
                f"{shown(dimension)} is not a dimension of the expert mesh; its dimensions are {names}"
            )
        _checked_rank(rank, math.prod(self.shape))
        return _group(self.shape, self.dimensions.index(dimension), rank)


def _coordinates(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    position: list[int] = []
    for size in reversed(shape):
        rank, index = divmod(rank, size)
        position.append(index)
    return tuple(reversed(position))


def _rank_at(shape: tuple[int, ...], coordinates: tuple[int, ...], described: str) -> int:
    given: object = coordinates
    if (
        not isinstance(given, (tuple, list))
        or len(given) != len(shape)
        or any(isinstance(index, bool) or not isinstance(index, int) for index in given)
        or any(not 0 <= index < size for index, size in zip(given, shape, strict=True))
    ):
        raise MeshRankError(
            f"coordinates {shown(coordinates)} are not in the mesh {described}: write one whole number per "
            f"dimension ({len(shape)} of them), each from 0 to its size - 1"
        )
    rank = 0
    for index, size in zip(coordinates, shape, strict=True):
        rank = rank * size + index
    return rank


def _group(shape: tuple[int, ...], axis: int, rank: int) -> tuple[int, ...]:
    position = list(_coordinates(shape, rank))
    members = []
    for index in range(shape[axis]):
        position[axis] = index
        members.append(_rank_at(shape, tuple(position), ""))
    return tuple(members)


def _checked_rank(rank: int, world_size: int) -> None:
    given: object = rank
    if isinstance(given, bool) or not isinstance(given, int):
        raise MeshRankError(
            f"rank {shown(rank)} is not a rank: a rank is a whole number, from 0 to {world_size - 1} here"
        )
    if not 0 <= given < world_size:
        raise MeshRankError(f"rank {rank} is outside the mesh's {world_size} ranks; use 0 to {world_size - 1}")


def spelled(degrees: Mapping[MeshDimension, int]) -> str:
    """Degrees as one writes them: `dp_shard=2, tp=2` (degrees of 1 left out; all of them 1 is `dp_shard=1`)."""
    parts = [f"{name}={degree}" for name, degree in degrees.items() if degree != 1]
    return ", ".join(parts) or "dp_shard=1"


# --------------------------------------------------------------------------------------------------
# The rules a layout must keep, in the order they are checked.


__all__ = ["ContextParallelLayout", "ExpertLayout", "MeshLayout", "PipelineLayout"]
