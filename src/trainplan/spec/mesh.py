"""The device mesh of a plan: named dimensions in a fixed order, each rank's coordinates, and who shares a group.

A mesh lays the world's ranks out as torch's `init_device_mesh` does: `arange(world_size).view(shape)`, row-major,
so the last dimension (`tp`) varies fastest and its groups are neighbouring ranks on one node. Everything here is
arithmetic on that layout, checked against `torch.distributed.device_mesh` itself by a multi-process test.

`layout_violation` says which of the mesh rules (`rules.MESH_DIMENSIONS`, `rules.MESH_BACKENDS`) a layout
breaks, if any; the resolver turns it into an error naming the layout that fits, and `Plan.from_dict` into a
format error.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import attrs

from trainplan.spec.frozen import freeze_sequence
from trainplan.spec.names import MESH_DIMENSIONS, AcceleratorKey, BackendKey, MeshDimension, PrecisionKey
from trainplan.spec.rules import MESH_BACKENDS
from trainplan.spec.rules import MESH_DIMENSIONS as MESH_RULES


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
        if len(coordinates) != len(self.shape) or any(
            not 0 <= index < size for index, size in zip(coordinates, self.shape, strict=True)
        ):
            raise IndexError(f"coordinates {coordinates} are outside the mesh {self.describe()}")
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
        each (for a drawing of a large world); both are counts, 0 or more (`ValueError` otherwise)."""
        for name, value in (("limit", limit), ("members", members)):
            given: object = value
            if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 0):
                raise ValueError(f"{name}={value!r} is not a number of groups or ranks to keep; use 0 or more, or None")
        axis = self._index(dimension)
        size = self.shape[axis]
        stride = math.prod(self.shape[axis + 1 :])
        count = self.world_size // size if limit is None else min(limit, self.world_size // size)
        shown = size if members is None else min(members, size)
        found: list[tuple[int, ...]] = []
        for block in range(self.world_size // (size * stride)):
            for offset in range(stride):
                if len(found) == count:
                    return tuple(found)
                first = block * size * stride + offset
                found.append(tuple(first + index * stride for index in range(shown)))
        return tuple(found)

    def data_parallel(self, rank: int) -> tuple[int, int]:
        """`rank`'s data-parallel replica and their number: which batches it reads (its sampler's rank and
        replicas). Ranks that differ only along tensor, context or pipeline dimensions read the same batches."""
        position = self.coordinates(rank)
        index, count = 0, 1
        for dimension, coordinate, size in zip(self.dimensions, position, self.shape, strict=True):
            if MESH_RULES[dimension].splits_data:
                index, count = index * size + coordinate, count * size
        return index, count

    def describe(self) -> str:
        """`pp 1 × dp_replicate 1 × dp_shard 2 × cp 1 × tp 2`: every dimension, in order."""
        return " × ".join(f"{name} {size}" for name, size in zip(self.dimensions, self.shape, strict=True))

    def _index(self, dimension: MeshDimension) -> int:
        if dimension not in self.dimensions:
            names = ", ".join(repr(name) for name in self.dimensions)
            raise KeyError(f"{dimension!r} is not a dimension of this mesh; its dimensions are {names}")
        return self.dimensions.index(dimension)

    def _check_rank(self, rank: int) -> None:
        given: object = rank
        if isinstance(given, bool) or not isinstance(given, int) or not 0 <= given < self.world_size:
            raise IndexError(
                f"rank {rank!r} is outside the mesh's {self.world_size} ranks; use 0 to {self.world_size - 1}"
            )


def spelled(degrees: Mapping[MeshDimension, int]) -> str:
    """Degrees as one writes them: `dp_shard=2, tp=2` (degrees of 1 left out; all of them 1 is `dp_shard=1`)."""
    parts = [f"{name}={degree}" for name, degree in degrees.items() if degree != 1]
    return ", ".join(parts) or "dp_shard=1"


# --------------------------------------------------------------------------------------------------
# The rules a layout must keep, in the order they are checked.


@attrs.frozen(kw_only=True)
class MeshViolation:
    """The first mesh rule a layout breaks: the rule's id, the dimension at fault (None: the whole layout), and the
    numbers that show it."""

    rule: str
    dimension: MeshDimension | None
    degree: int
    detail: str
    needed: int = 0  # mesh-inside-node: the processes one group needs on a node; mesh-pipeline-nodes: a stage's


def strides(degrees: Mapping[MeshDimension, int]) -> dict[MeshDimension, int]:
    """How far apart the members of a group along each dimension are (the product of the inner degrees)."""
    found: dict[MeshDimension, int] = {}
    inner = 1
    for name in reversed(MESH_DIMENSIONS):
        found[name] = inner
        inner *= degrees[name]
    return found


def node_violations(degrees: Mapping[MeshDimension, int], processes_per_node: int) -> Iterator[MeshViolation]:
    """The dimensions that stay inside a node whose groups do not fit one: a group spans its degree times the
    inner degrees of neighbouring ranks, and that many must divide the node's processes. Innermost first."""
    apart = strides(degrees)
    for name in reversed(MESH_DIMENSIONS):
        degree, rule = degrees[name], MESH_RULES[name]
        if degree > 1 and rule.inside_node and processes_per_node % (degree * apart[name]):
            yield MeshViolation(
                rule="mesh-inside-node",
                dimension=name,
                degree=degree,
                needed=degree * apart[name],
                detail=f"{processes_per_node} processes per node",
            )


def layout_violations(
    degrees: Mapping[MeshDimension, int],
    *,
    num_nodes: int,
    processes_per_node: int,
    accelerator: AcceleratorKey,
    backend: BackendKey | None,
    precision: PrecisionKey,
) -> Iterator[MeshViolation]:
    """Every mesh rule `degrees` break on this world, in the order the rules are checked; nothing when it fits.

    The product is the world size; a dimension that stays inside a node (`tp`, `cp`) has groups that fit a node
    (its degree times the inner degrees divides the node's processes); a stage-aligned dimension (`pp`) cuts the
    world into blocks that hold whole nodes or fit whole into one; a degree above 1 runs only on its accelerators
    and precisions; the mesh's collectives run over the accelerator's mesh backend.
    """
    world = num_nodes * processes_per_node
    product = math.prod(degrees.values())
    if product != world:
        yield MeshViolation(rule="mesh-product", dimension=None, degree=product, detail=f"world size {world}")
        return
    yield from node_violations(degrees, processes_per_node)
    apart = strides(degrees)
    for name in MESH_DIMENSIONS:
        degree, rule = degrees[name], MESH_RULES[name]
        block = apart[name]
        if degree > 1 and rule.stage_aligned and block % processes_per_node and processes_per_node % block:
            yield MeshViolation(
                rule="mesh-pipeline-nodes",
                dimension=name,
                degree=degree,
                needed=block,
                detail=f"{num_nodes} nodes of {processes_per_node}",
            )
    for name in MESH_DIMENSIONS:
        degree, rule = degrees[name], MESH_RULES[name]
        if degree > 1 and accelerator not in rule.accelerators:
            yield MeshViolation(
                rule="mesh-accelerator", dimension=name, degree=degree, detail=rule.why_not.get(accelerator, "")
            )
    allowed = MESH_BACKENDS.get(accelerator)
    if world > 1 and backend is not None and allowed is not None and backend != allowed:
        yield MeshViolation(rule="mesh-backend", dimension=None, degree=world, detail=allowed)
    for name in MESH_DIMENSIONS:
        degree, rule = degrees[name], MESH_RULES[name]
        if degree > 1 and precision in rule.precisions_refused:
            yield MeshViolation(
                rule="mesh-precision", dimension=name, degree=degree, detail=rule.precisions_refused[precision]
            )


__all__ = ["MeshLayout", "MeshViolation", "layout_violations", "node_violations", "spelled", "strides"]
