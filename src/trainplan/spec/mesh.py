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
from trainplan.spec.frozen import freeze_sequence
from trainplan.spec.names import MESH_DIMENSIONS, MeshDimension


def _freeze_dimensions(value: tuple[MeshDimension, ...] | list[MeshDimension]) -> tuple[MeshDimension, ...]:
    return freeze_sequence(value)  # type: ignore[return-value]


def _freeze_shape(value: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    return freeze_sequence(value)  # type: ignore[return-value]


@attrs.frozen(kw_only=True)
class MeshLayout:
    """A device mesh: its dimensions (always `pp, dp_replicate, dp_shard, cp, tp`, outermost first) and their sizes.

    Rank r sits at the coordinates of r in a row-major array of `shape`, as in torch's `init_device_mesh`; a group
    along a dimension is the ranks that share every other coordinate (a `DeviceMesh`'s group for that dimension).
    """

    dimensions: tuple[MeshDimension, ...] = attrs.field(default=MESH_DIMENSIONS, converter=_freeze_dimensions)
    shape: tuple[int, ...] = attrs.field(converter=_freeze_shape)

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
        position: list[int] = []
        for size in reversed(self.shape):
            rank, index = divmod(rank, size)
            position.append(index)
        return tuple(reversed(position))

    def rank_at(self, coordinates: tuple[int, ...]) -> int:
        """The rank at `coordinates` (the inverse of `coordinates`)."""
        given: object = coordinates
        if (
            not isinstance(given, (tuple, list))
            or len(given) != len(self.shape)
            or any(isinstance(index, bool) or not isinstance(index, int) for index in given)
            or any(not 0 <= index < size for index, size in zip(given, self.shape, strict=True))
        ):
            raise MeshRankError(
                f"coordinates {shown(coordinates)} are not in the mesh {self.describe()}: write one whole number per "
                f"dimension ({len(self.shape)} of them), each from 0 to its size - 1"
            )
        rank = 0
        for index, size in zip(coordinates, self.shape, strict=True):
            rank = rank * size + index
        return rank

    def group(self, rank: int, dimension: MeshDimension) -> tuple[int, ...]:
        """The ranks in `rank`'s group along `dimension` (its own included), in order."""
        axis = self._index(dimension)
        position = list(self.coordinates(rank))
        members = []
        for index in range(self.shape[axis]):
            position[axis] = index
            members.append(self.rank_at(tuple(position)))
        return tuple(members)

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
        """`pp 1 × dp_replicate 1 × dp_shard 2 × cp 1 × tp 2`: every dimension, in order."""
        return " × ".join(f"{name} {size}" for name, size in zip(self.dimensions, self.shape, strict=True))

    def _index(self, dimension: MeshDimension) -> int:
        if dimension not in self.dimensions:
            names = ", ".join(repr(name) for name in self.dimensions)
            raise MeshDimensionError(f"{shown(dimension)} is not a dimension of this mesh; its dimensions are {names}")
        return self.dimensions.index(dimension)

    def _check_rank(self, rank: int) -> None:
        given: object = rank
        if isinstance(given, bool) or not isinstance(given, int):
            raise MeshRankError(
                f"rank {shown(rank)} is not a rank: a rank is a whole number, from 0 to {self.world_size - 1} here"
            )
        if not 0 <= given < self.world_size:
            raise MeshRankError(
                f"rank {rank} is outside the mesh's {self.world_size} ranks; use 0 to {self.world_size - 1}"
            )


def spelled(degrees: Mapping[MeshDimension, int]) -> str:
    """Degrees as one writes them: `dp_shard=2, tp=2` (degrees of 1 left out; all of them 1 is `dp_shard=1`)."""
    parts = [f"{name}={degree}" for name, degree in degrees.items() if degree != 1]
    return ", ".join(parts) or "dp_shard=1"


# --------------------------------------------------------------------------------------------------
# The rules a layout must keep, in the order they are checked.


__all__ = ["MeshLayout"]
