"""Logged metrics: O(1) accumulation per key, placement from the plan, one collective per bucket.

    store = MetricStore(plan)                      # or trainplan.metric_store(plan)
    store.log("loss", loss, weight=batch_size)     # mean by default; also sum, max, min
    store.log("acc", accuracy_metric)              # a torchmetrics Metric (it reduces its own states)
    values = store.compute()                       # {"loss": 0.42, "acc": 0.91}: synced over all ranks
    store.reset()

- Memory is O(1) per key: a running weighted sum and weight (mean), a running sum, min or max. Values are
  detached. A tensor key's state is a slice of one flat tensor shared by the keys of its (op, kind, device),
  so compute() moves, reduces and reads all of them with one tensor operation each. Floats accumulate in
  float64 (float32 on MPS, which has no float64) and integers in int64, so sums are exact and a weighted
  mean equals the mean over every rank's data, even with uneven weights (integer batch sizes are never
  truncated).
- At `compute(sync=True)`, keys are bucketed by (collective op, dtype, device) and each bucket is
  reduced with one collective, whatever the number of keys; a weighted mean's values and weights
  travel in the same buffer, and each bucket comes to the host with one transfer (on CUDA, K keys cost
  one device synchronisation per bucket, not K). The first collective, of the same length on every rank, checks
  that every rank logged the same keys the same way, and carries the float sum bucket when it is small (one key:
  one collective); if the keys differ, every rank raises `MetricKeyMismatch` naming the keys and the ranks
  that lack them, instead of hanging. One process (world size 1) skips collectives entirely.
- Placement comes from the plan (`plan.metrics`, `place_metric`): under NCCL, CPU-stored keys are
  moved to the device once per bucket for the collective and back; under gloo they are reduced where
  they are. A stateful metric kept on CPU under NCCL is refused with the plan's explanation.
- NaN and inf follow IEEE arithmetic: a NaN logged anywhere makes that key's mean, sum, max or min NaN
  (max and min count NaNs explicitly, since collectives' max/min may drop them); inf propagates; inf
  and -inf summed give NaN. Nothing crashes on them.
- Bad input (a string, a tensor that requires grad, an unknown reduce op, a weight ≤ 0, a key logged
  with another op or shape) raises `InvalidMetric` and leaves everything logged before untouched.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

import attrs

from trainplan.effects.extras import require_torch
from trainplan.effects.world import check_group
from trainplan.resolve import place_metric
from trainplan.rules import DEVICE_TYPES_WITHOUT_FLOAT64, HOST_DEVICE
from trainplan.spec.errors import InvalidRequest, TrainplanError, a_kind
from trainplan.spec.numbers import real_number
from trainplan.spec.plan import Plan

if TYPE_CHECKING:
    import torch

ReduceOp: TypeAlias = Literal["mean", "sum", "max", "min"]
CollectiveOp: TypeAlias = Literal["sum", "max", "min"]
REDUCE_OPS: tuple[ReduceOp, ...] = ("mean", "sum", "max", "min")
PlainValue: TypeAlias = float | int | list[Any] | dict[str, Any]
"""A computed metric: a number for a scalar key, a (nested) list for an n-d tensor key, a dict for a stateful
metric that computes several values (a torchmetrics MetricCollection, say)."""


class MetricError(TrainplanError, RuntimeError):
    """A metric could not be reduced."""


class InvalidMetric(InvalidRequest):
    """A logged value or its options cannot be accepted; nothing logged before is lost."""


class MetricOverflow(MetricError):
    """An integer sum left int64 once reduced over the ranks; raised on every rank alike."""

    def __init__(self, *, keys: list[str]) -> None:
        self.keys = keys
        super().__init__(
            f"Reducing {', '.join(repr(key) for key in keys)} over all ranks overflows (an integer sum past int64, or "
            "a mean's total weight past float64), so it cannot be reduced exactly. Log smaller values or weights, "
            "integers as floats, or reset() these keys more often"
        )


class NotInWorld(MetricError):
    """A synced compute for a plan of several processes, in a process that joined no process group."""

    def __init__(self, *, world_size: int) -> None:
        self.world_size = world_size
        super().__init__(
            f"compute() reduces over the plan's world of {world_size} processes, but this process has joined no "
            "process group (torch.distributed is not initialised), so it would return this rank's values alone. "
            "Join the world first: `with trainplan.join(plan):` around the loop (trainplan.launch joins for you), "
            "or call compute(sync=False) for this rank's own values"
        )


class MetricNaN(MetricError):
    """A key whose policy is `nan='error'` came out NaN; raised on every rank alike (they share the reduced value)."""

    def __init__(self, *, keys: list[str]) -> None:
        self.keys = keys
        super().__init__(
            f"The value of {', '.join(repr(key) for key in keys)} is NaN (logged with nan='error'): a NaN was logged "
            "on some rank, or the values overflowed. Find where it comes from, or choose another policy for the key: "
            "nan='ignore' (leave NaNs out), a fill value such as nan=0.0, or nan='propagate' (IEEE, the default)"
        )


class MetricKeyMismatch(MetricError):
    """Ranks logged different keys (or the same key differently); raised on every rank, never a hang."""

    def __init__(self, *, missing: Mapping[str, list[int]], differing: Mapping[str, list[int]]) -> None:
        self.missing = dict(missing)
        self.differing = dict(differing)
        parts = [f"{key!r} is missing on rank(s) {ranks}" for key, ranks in sorted(self.missing.items())]
        parts += [
            f"{key!r} is logged with another reduce op, kind, shape or store_on_cpu on rank(s) {ranks}"
            for key, ranks in sorted(self.differing.items())
        ]
        super().__init__(
            "The ranks logged different metrics, so they cannot be reduced together: "
            + "; ".join(parts)
            + ". Log every key on every rank (log a neutral value, e.g. with weight on a mean, where a rank has "
            "no data), or compute(sync=False) for per-rank values"
        )


# --------------------------------------------------------------------------------------------------
# Seams


class Collective(Protocol):
    """The process group's collectives. Each call is one collective across all ranks."""

    @property
    def world_size(self) -> int:
        """Processes in the group (1: nothing is ever reduced)."""

    @property
    def rank(self) -> int:
        """This process's rank in the group."""

    def all_reduce(self, tensor: torch.Tensor, op: CollectiveOp) -> None:
        """Reduce `tensor` in place across all ranks."""

    def all_gather_object(self, value: object) -> list[object]:
        """Every rank's `value`, in rank order (used only to explain a key mismatch)."""


def _process_group() -> Any:
    """torch.distributed when its default process group exists, else None. A group can exist only once
    torch.distributed was imported, so this never imports torch (a one-process store of numbers needs none)."""
    distributed: Any = sys.modules.get("torch.distributed")
    if distributed is None or not (distributed.is_available() and distributed.is_initialized()):
        return None
    return distributed


class TorchCollective:
    """`Collective` over torch.distributed's default process group (world size 1 when there is none)."""

    @property
    def world_size(self) -> int:
        distributed = _process_group()
        return 1 if distributed is None else int(distributed.get_world_size())

    @property
    def rank(self) -> int:
        distributed = _process_group()
        return 0 if distributed is None else int(distributed.get_rank())

    def all_reduce(self, tensor: torch.Tensor, op: CollectiveOp) -> None:
        from torch import distributed

        ops = {"sum": distributed.ReduceOp.SUM, "max": distributed.ReduceOp.MAX, "min": distributed.ReduceOp.MIN}
        distributed.all_reduce(tensor, op=ops[op])

    def all_gather_object(self, value: object) -> list[object]:
        from torch import distributed

        gathered: list[object] = [None] * self.world_size
        distributed.all_gather_object(gathered, value)
        return gathered


class Transfer(Protocol):
    """Moves a bucket to the reduction device and back (a seam so tests can see the moves without CUDA)."""

    def __call__(self, tensor: torch.Tensor, device: str) -> torch.Tensor:
        """`tensor` on `device` (a copy, or the tensor itself when it is there already)."""


def _to_device(tensor: torch.Tensor, device: str) -> torch.Tensor:
    return tensor.to(device, non_blocking=False)


# --------------------------------------------------------------------------------------------------
# Accumulators


@attrs.define
class _Entry:
    """The running state of one key. Python numbers stay Python numbers (cheap); a tensor key's state is a
    view of its slab (see `_Slab`), so that compute() takes every key of a slab with one tensor operation."""

    op: ReduceOp
    kind: Literal["float", "int"]
    shape: tuple[int, ...] | None  # None: logged as Python numbers (a scalar)
    device: str  # where the state is stored ("python" for Python numbers)
    total: Any  # weighted sum (mean), sum, or running max/min (a tensor key's NaNs stay in it)
    weight: float = 0.0  # sum of weights (mean)
    nans: int = 0  # NaNs logged (max/min of Python numbers)
    count: int = 0
    slab: _Slab | None = None
    nan: NanPolicy = "propagate"  # what a NaN logged under this key does (the same on every rank: part of the spec)

    def spec(self) -> str:
        where = "python" if self.device == "python" else HOST_DEVICE if self.device == HOST_DEVICE else "device"
        return f"{self.op}|{self.kind}|{self.shape}|{where}|nan={self.nan!r}"


_SHARED_SLAB_LIMIT = 1 << 16
"""Keys of up to this many elements share their slab; a larger key gets a slab of its own, so that adding a
key never copies a large accumulator."""


class _Slab:
    """The accumulators of the tensor keys with one (op, kind, device), as slices of one flat tensor.

    A key's state is a view of its slice, so `log()` accumulates in place as into a tensor of its own, and
    compute() moves, reduces and reads every key of the slab with one operation each. The flat tensor grows
    by doubling (the views are pointed at the new one), so adding K keys costs O(K) in all.
    """

    def __init__(self, op: ReduceOp, kind: Literal["float", "int"], device: str, dtype: Any, *, size: int) -> None:
        import torch

        self.op, self.kind, self.device, self.dtype = op, kind, device, dtype
        self.values: torch.Tensor = torch.empty(size, dtype=dtype, device=device)
        self.used = 0
        self.entries: list[_Entry] = []
        self.names: list[str] = []
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        self.scalars_only = True

    @property
    def identity(self) -> float | int:
        """The value a fresh slot starts from: nothing accumulated yet."""
        if self.op in ("mean", "sum"):
            return 0
        if self.kind == "float":
            return -math.inf if self.op == "max" else math.inf
        return _INT64_MIN if self.op == "max" else _INT64_MAX

    def add(self, name: str, entry: _Entry, shape: tuple[int, ...]) -> Any:
        """A new slot for `entry`, filled with the identity: its view."""
        size = math.prod(shape)
        if self.used + size > self.values.numel():
            self._grow(max(2 * self.values.numel(), self.used + size, 16))
        offset = self.used
        self.used += size
        self.entries.append(entry)
        self.names.append(name)
        self.offsets.append(offset)
        self.sizes.append(size)
        self.scalars_only = self.scalars_only and shape == ()
        view = self.values[offset : offset + size]
        view.fill_(self.identity)
        return view.view(shape)

    def _grow(self, capacity: int) -> None:
        import torch

        values = torch.empty(capacity, dtype=self.dtype, device=self.device)
        values[: self.used].copy_(self.values[: self.used])
        self.values = values
        self._point_views()

    def _point_views(self) -> None:
        for entry, offset, size in zip(self.entries, self.offsets, self.sizes, strict=True):
            entry.total = self.values[offset : offset + size].view(entry.shape or ())

    def sort(self) -> None:
        """Lay the keys out in name order (what every rank agrees on, whatever order each logged them in)."""
        import torch

        order = sorted(range(len(self.names)), key=self.names.__getitem__)
        if order == list(range(len(order))):
            return
        pieces = [self.values[self.offsets[index] : self.offsets[index] + self.sizes[index]] for index in order]
        self.values = torch.cat([*pieces, self.values[self.used :]]) if pieces else self.values
        self.entries = [self.entries[index] for index in order]
        self.names = [self.names[index] for index in order]
        self.sizes = [self.sizes[index] for index in order]
        self.offsets = list(_running_offsets(self.sizes))
        self._point_views()

    def state(self) -> Any:
        """The accumulated values of every key, flat, in slot order (a view: never written to)."""
        return self.values[: self.used]


def _running_offsets(sizes: list[int]) -> Iterator[int]:
    offset = 0
    for size in sizes:
        yield offset
        offset += size


def _nest(flat: list[Any], shape: tuple[int, ...]) -> Any:
    """`flat` (row-major) as nested lists of `shape`, as `tensor.tolist()` would give them."""
    if not shape:
        return flat[0]
    if 0 in shape:
        return _empty(shape)
    items = flat
    for size in reversed(shape[1:]):
        items = [items[index : index + size] for index in range(0, len(items), size)]
    return items


def _empty(shape: tuple[int, ...]) -> list[Any]:
    if len(shape) == 1 or shape[0] == 0:
        return []
    return [_empty(shape[1:]) for _ in range(shape[0])]


class _Bucket:
    """The parts reduced by one collective: (collective op, dtype, device)."""

    def __init__(self, op: CollectiveOp, dtype: Any, device: str) -> None:
        self.op, self.dtype, self.device = op, dtype, device
        self.segments: list[Any] = []
        self.length = 0
        self.flat: Any = None
        self.host: list[Any] = []

    def add(self, part: Any) -> int:
        """Append a part (a tensor of this dtype, or a list of Python numbers); its offset in the bucket."""
        if isinstance(part, list):
            import torch

            part = torch.tensor(part, dtype=self.dtype, device=self.device)
        offset = self.length
        self.segments.append(part)
        self.length += part.numel()
        return offset

    def join(self) -> None:
        """One flat tensor of every part: always a copy, so that nothing done to it reaches an accumulator."""
        import torch

        self.flat = torch.cat(self.segments) if len(self.segments) > 1 else self.segments[0].clone()

    def part(self, offset: int, length: int) -> Any:
        return self.flat[offset : offset + length]


class _Buckets:
    """The buckets of one compute(), keyed by (collective op, dtype, device)."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[CollectiveOp, str, str], _Bucket] = {}

    def __call__(self, op: CollectiveOp, dtype: Any, device: str) -> _Bucket:
        key = (op, str(dtype).removeprefix("torch."), device)
        bucket = self.by_key.get(key)
        if bucket is None:
            bucket = self.by_key[key] = _Bucket(op, dtype, device)
        return bucket


@attrs.define
class _Group:
    """Where one slab's (or one group of Python-number keys') parts sit in the buckets of a compute()."""

    op: ReduceOp
    names: list[str]
    total: tuple[_Bucket, int]
    count: int  # elements of the total
    weight: tuple[_Bucket, int] | None = None  # mean: one weight per key
    nans: tuple[_Bucket, int] | None = None  # float max/min, synced: NaN counts per element
    shadow: tuple[_Bucket, int] | None = None  # integer sum, synced: the same sum in floating point
    slab: _Slab | None = None  # None: Python-number keys, all scalars


def _without_float64(device: str) -> bool:
    """Whether torch device `device` ("mps:0") is of a type that has no float64 (`DEVICE_TYPES_WITHOUT_FLOAT64`)."""
    return device.partition(":")[0] in DEVICE_TYPES_WITHOUT_FLOAT64


def _floating(device: str) -> Any:
    import torch

    return torch.float32 if _without_float64(device) else torch.float64


def _finish_number(entry: _Entry) -> PlainValue:
    """A Python-number key's value, on this rank alone."""
    if entry.op == "mean":
        return entry.total / entry.weight if entry.total is not None else math.nan
    if entry.op in ("max", "min") and entry.nans:
        return math.nan
    return _scalar_total(entry)


NanPolicy = Literal["propagate", "error", "ignore"] | float
"""What a NaN logged under a key does: see `MetricStore.log`."""

_NAN_POLICIES = ("propagate", "error", "ignore")
_KEPT_NANS = ("propagate", "error")
"""The policies under which a NaN is accumulated as it is (and 'error' looks at the result)."""


def _nan_policy(value: object) -> NanPolicy:
    if isinstance(value, str) and value in _NAN_POLICIES:
        return value  # type: ignore[return-value]  # one of the Literal's names, checked above
    number = real_number(value)
    if number is None:
        raise InvalidMetric(
            field="nan",
            value=value,
            reason="a NaN policy is 'propagate', 'error', 'ignore' or a finite number to put in its place",
            allowed=(*_NAN_POLICIES, 0.0),
        )
    return number


def _scalar_weight(value: object) -> float | None:
    """A weight as a float: a real Python or numpy scalar, or a real 0-d tensor (read on the host); else None (a
    meta tensor, which holds no value; a real number past float64, such as a huge Fraction)."""
    try:
        if _is_tensor(value):
            tensor: Any = value
            if tensor.dim() != 0 or tensor.is_complex() or tensor.is_meta or tensor.dtype == sys.modules["torch"].bool:
                return None
            value = tensor.item()
        elif not isinstance(value, (int, float, bool)) and isinstance(value, numbers.Real):
            value = float(value)
    except (RuntimeError, OverflowError, ValueError, TypeError):  # a tensor without data, a float() that fails
        return None
    return real_number(value)


def _has_nan(value: object) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, list):
        return any(_has_nan(item) for item in value)
    return False


def _is_tensor(value: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_stateful(value: object) -> bool:
    torchmetrics = sys.modules.get("torchmetrics")
    return torchmetrics is not None and isinstance(value, torchmetrics.Metric)


class MetricStore:
    """Accumulates logged values per key and reduces them across the plan's ranks. See the module docs."""

    def __init__(
        self,
        plan: Plan,
        *,
        collective: Collective | None = None,
        transfer: Transfer | None = None,
        local_rank: int | None = None,
    ) -> None:
        if not isinstance(plan, Plan):
            raise InvalidMetric(
                field="plan", value=plan, reason="a MetricStore is created from a trainplan.Plan", fix="Pass the plan"
            )
        self.plan = plan
        self._collective: Collective = TorchCollective() if collective is None else collective
        self._transfer: Transfer = _to_device if transfer is None else transfer
        rank = plan.cluster.local_rank if local_rank is None else local_rank
        self._device = plan.device_for(rank if rank is not None and rank < plan.processes_per_node else 0)
        self._entries: dict[str, _Entry] = {}
        self._numbers: dict[tuple[ReduceOp, str], dict[str, _Entry]] = {}  # Python-number keys by (op, kind)
        self._slabs: dict[tuple[ReduceOp, str, str, bool], _Slab] = {}  # tensor keys by (op, kind, device, 0-d)
        self._own_slabs: list[_Slab] = []  # tensor keys too large to share a slab
        self._stateful: dict[str, Any] = {}  # name → the metric object (it keeps its own states)
        self._stores_on_cpu: dict[bool | None, bool] = {}  # store_on_cpu → whether tensors are kept on CPU
        self._set_digest = 0  # every key's (name, spec), in any order
        self._order_digest = 0  # the keys in the order they were created (the layout of slabs and buckets)
        self._header: tuple[tuple[object, ...], int, Any] | None = None  # the key check's last header, as a tensor
        self.collectives_in_last_sync = 0
        """How many collectives the last `compute(sync=True)` issued (0 for one process)."""

    # -- logging ------------------------------------------------------------------------------------

    def log(
        self,
        name: str,
        value: object,
        *,
        reduce: ReduceOp = "mean",
        weight: object = 1,
        store_on_cpu: bool | None = None,
        nan: NanPolicy = "propagate",
    ) -> None:
        """Accumulate `value` under `name`. Everything is checked before anything is changed.

        `weight` (a mean's) is any real number > 0: a Python or numpy scalar, or a 0-d tensor on any device (read
        on the host: one device sync, as `float(t)`). `nan` chooses what a NaN does, per key and alike on every
        rank: 'propagate' (IEEE: the result is NaN), 'error' (`MetricNaN` from compute() on every rank if the
        result is NaN), 'ignore' (NaNs are left out: a mean of the other values; for a tensor mean, scalars only),
        or a number that replaces them."""
        given_name: object = name
        given_store: object = store_on_cpu
        given_weight: object = weight
        if not isinstance(given_name, str) or not given_name:
            raise InvalidMetric(
                field="name", value=name, reason="a metric name is a non-empty string", fix="log('loss', value)"
            )
        if reduce not in REDUCE_OPS:
            raise InvalidMetric(field="reduce", value=reduce, reason="it is not a reduction", allowed=REDUCE_OPS)
        if given_store is not None and not isinstance(given_store, bool):
            raise InvalidMetric(
                field="store_on_cpu",
                value=store_on_cpu,
                reason="it must be True, False or None",
                allowed=(True, False, None),
            )
        weight_value = _scalar_weight(given_weight)
        if weight_value is None or not weight_value > 0:
            meta = _is_tensor(given_weight) and bool(getattr(given_weight, "is_meta", False))
            raise InvalidMetric(
                field="weight",
                value=weight,
                reason=("a meta tensor holds no value; " if meta else "")
                + "a weight is a finite real number > 0: a Python or numpy scalar, or a 0-d tensor",
                fix="weight=batch_size (or weight=mask.sum())",
            )
        policy = _nan_policy(nan)
        known = self._entries.get(name)
        if known is not None and known.nan != policy:
            raise InvalidMetric(
                field="nan",
                value=nan,
                reason=f"{name!r} was logged with nan={known.nan!r} before",
                fix="Keep one NaN policy per key",
            )
        if weight_value != 1 and reduce != "mean":
            raise InvalidMetric(
                field="weight",
                value=weight,
                reason=f"weights apply to a mean; reduce={reduce!r} takes none",
                fix="Drop weight=, or use reduce='mean'",
            )
        if _is_stateful(value):
            if policy != "propagate":
                raise InvalidMetric(
                    field="nan",
                    value=nan,
                    reason="a torchmetrics Metric keeps its own states and its own NaN handling",
                    fix="Create the metric with its nan_strategy (e.g. MeanMetric(nan_strategy='ignore')), and log it "
                    "without nan=",
                )
            self._log_stateful(name, value, store_on_cpu)
            return
        if name in self._stateful:
            raise InvalidMetric(
                field="name", value=name, reason="it holds a stateful metric object", fix="Use another name"
            )
        if _is_tensor(value):
            self._log_tensor(name, value, reduce, weight_value, store_on_cpu, policy)
            return
        if not isinstance(value, (int, float, bool)) and isinstance(value, numbers.Real):
            # numpy's scalars and the like: an integral one is an int, a real one a float.
            value = int(value) if isinstance(value, numbers.Integral) else float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidMetric(
                field=name,
                value=value,
                reason=f"{a_kind(value)} is not a number, a tensor or a metric object",
                fix="Log a number, a tensor, or a torchmetrics Metric",
            )
        self._log_number(name, value, reduce, weight_value, policy)

    def _existing(
        self, name: str, op: ReduceOp, kind: Literal["float", "int"], shape: tuple[int, ...] | None
    ) -> _Entry | None:
        entry = self._entries.get(name)
        if entry is None:
            return None
        if entry.op != op:
            raise InvalidMetric(
                field="reduce",
                value=op,
                reason=f"{name!r} was logged with reduce={entry.op!r} before",
                fix="Keep one reduce op per key",
            )
        if entry.shape != shape:
            raise InvalidMetric(
                field=name,
                value=f"shape {shape}",
                reason=f"{name!r} was logged with shape {entry.shape} before (None: a Python number)",
                fix="Log the same shape (and kind: number or tensor) every time",
            )
        if entry.kind != kind and not (entry.kind == "float" and kind == "int"):
            raise InvalidMetric(
                field=name,
                value=kind,
                reason=f"{name!r} holds integers, exactly; a float would have to round them",
                fix="Log floats from the start, or keep this key integer",
            )
        return entry

    @staticmethod
    def _check_weight(entry: _Entry | None, name: str, weight: float) -> None:
        if entry is not None and not math.isfinite(entry.weight + weight):
            raise InvalidMetric(
                field="weight",
                value=weight,
                reason=f"the total weight of {name!r} would overflow a float64",
                fix="Use smaller weights (relative ones are enough for a mean)",
            )

    def _log_number(self, name: str, value: float | int, op: ReduceOp, weight: float, nan: NanPolicy) -> None:
        skip = False
        if isinstance(value, float) and math.isnan(value) and nan not in _KEPT_NANS:
            if nan == "ignore":
                skip = True  # the key still exists on this rank (every rank must hold the same keys)
            else:
                value = float(nan)
        kind: Literal["float", "int"] = "int" if isinstance(value, int) and op != "mean" else "float"
        entry = self._existing(name, op, kind, None)
        if op == "mean":
            self._check_weight(entry, name, weight)
        number: float | int
        if kind == "int" and (entry is None or entry.kind == "int"):
            number = value
            if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
                raise InvalidMetric(
                    field=name,
                    value=value,
                    reason="an integer metric is reduced as int64, and this one is outside its range",
                    fix="Log it as a float (float(value)), or log smaller counts",
                )
        else:
            converted = real_number(value, finite=False)
            if converted is None:
                raise InvalidMetric(
                    field=name, value=value, reason="it is too large for a float64", fix="Log a float in range"
                )
            number = converted
        # Everything is checked: now compute the new state, check it, and only then store it.
        if op == "sum" and kind == "int" and (entry is None or entry.kind == "int"):
            total = (entry.total if entry is not None and entry.total is not None else 0) + number
            if not _INT64_MIN <= total <= _INT64_MAX:
                raise InvalidMetric(
                    field=name,
                    value=value,
                    reason=f"the running sum of {name!r} would leave int64 ({total}); it is reduced as int64",
                    fix="Log this key as floats from the start, or reset() it more often",
                )
        if entry is None:
            entry = _Entry(op=op, kind=kind, shape=None, device="python", total=None, nan=nan)
            self._entries[name] = entry
            self._numbers.setdefault((op, kind), {})[name] = entry
            self._created(name, entry.spec(), ordered=True)
        if skip:
            return
        if op == "mean":
            entry.total = (entry.total or 0.0) + float(number) * weight
            entry.weight += weight
        elif op == "sum":
            entry.total = (entry.total if entry.total is not None else 0) + (
                number if entry.kind == "int" else float(number)
            )
        elif isinstance(number, float) and math.isnan(number):
            entry.nans += 1
        else:
            better = max if op == "max" else min
            entry.total = number if entry.total is None else better(entry.total, number)
        entry.count += 1

    def _log_tensor(
        self, name: str, value: Any, op: ReduceOp, weight: float, store_on_cpu: bool | None, nan: NanPolicy
    ) -> None:
        import torch

        if nan == "ignore" and op == "mean" and value.numel() > 1:
            raise InvalidMetric(
                field="nan",
                value=nan,
                reason="leaving NaN elements out of a tensor mean would need a weight per element",
                fix="Log a scalar (a 0-d tensor) with nan='ignore', or replace NaNs with a value (nan=0.0)",
            )
        if value.requires_grad:
            raise InvalidMetric(
                field=name,
                value="a tensor that requires grad",
                reason="logging it would keep its autograd graph alive",
                fix="Log value.detach()",
            )
        if value.is_complex() or value.dtype == torch.bool:
            raise InvalidMetric(
                field=name, value=str(value.dtype), reason="only real numbers can be reduced", fix="Log a real tensor"
            )
        unusual = _unusual_tensor(value)
        if unusual is not None:
            raise InvalidMetric(
                field=name,
                value=f"a {unusual} tensor",
                reason="only dense tensors with storage can be accumulated and reduced",
                fix="Log a dense tensor (value.to_dense(), value.dequantize(), or one tensor per component)",
            )
        kind: Literal["float", "int"] = "float" if value.is_floating_point() or op == "mean" else "int"
        known = self._entries.get(name)
        if kind == "int" and known is not None and known.kind == "float":
            kind = "float"  # a float key takes integer tensors as floats, as it takes Python ints
        if kind == "int" and value.dtype == torch.uint64 and bool((value.view(torch.int64) < 0).any()):
            raise InvalidMetric(
                field=name,
                value="a uint64 tensor beyond int64",
                reason="integer metrics are accumulated and reduced as int64",
                fix="Log it as a float tensor, or smaller counts",
            )
        shape = tuple(value.shape)
        stores_on_cpu = self._stores_on_cpu.get(store_on_cpu)
        if stores_on_cpu is None:  # the plan decides once per choice of store_on_cpu (the plan never changes)
            stores_on_cpu = self._stores_on_cpu[store_on_cpu] = (
                place_metric(self.plan, "tensor", store_on_cpu).store_device == HOST_DEVICE
            )
        tensor_device = value.device
        device = (
            HOST_DEVICE if stores_on_cpu else str(tensor_device if tensor_device.type != HOST_DEVICE else self._device)
        )
        entry = self._existing(name, op, kind, shape)
        if op == "mean":
            self._check_weight(entry, name, weight)
        if entry is not None and entry.device != device:
            raise InvalidMetric(
                field="store_on_cpu",
                value=store_on_cpu,
                reason=f"{name!r} is stored on {entry.device}, and this call would store it on {device}",
                fix="Keep store_on_cpu the same for every call of a key",
            )
        dtype = (torch.float32 if _without_float64(device) else torch.float64) if kind == "float" else torch.int64
        incoming = value.detach().to(device=device, dtype=dtype)
        skip = False
        if kind == "float" and nan not in _KEPT_NANS:
            if nan != "ignore":
                incoming = torch.where(torch.isnan(incoming), float(nan), incoming)
            elif op == "mean":
                skip = bool(torch.isnan(incoming).any())  # a scalar: its NaN is left out (read on the host)
            else:  # the op's neutral value in place of each NaN: nothing accumulated there
                neutral = 0.0 if op == "sum" else -math.inf if op == "max" else math.inf
                incoming = torch.where(torch.isnan(incoming), neutral, incoming)
        summed = None
        if op == "sum" and kind == "int" and entry is not None:
            summed = entry.total + incoming
            # int64 addition overflowed where both operands share a sign that the result lacks.
            if bool((((entry.total ^ summed) & (incoming ^ summed)) < 0).any()):
                raise InvalidMetric(
                    field=name,
                    value="an integer tensor",
                    reason=f"the running sum of {name!r} would overflow int64; it is reduced as int64",
                    fix="Log this key as floats from the start, or reset() it more often",
                )
        # Everything is checked: only now is anything changed.
        if entry is None:
            entry = self._new_tensor_entry(name, op, kind, shape, device, dtype, nan)
        if skip:
            return
        total = entry.total
        if op == "mean":
            total.add_(incoming, alpha=weight)
            entry.weight += weight
        elif op == "sum":
            if summed is None:
                total.add_(incoming)
            else:
                total.copy_(summed)
        elif op == "max":
            torch.maximum(total, incoming, out=total)  # NaN stays NaN (counted only when reduced)
        else:
            torch.minimum(total, incoming, out=total)
        entry.count += 1

    def _new_tensor_entry(
        self,
        name: str,
        op: ReduceOp,
        kind: Literal["float", "int"],
        shape: tuple[int, ...],
        device: str,
        dtype: Any,
        nan: NanPolicy,
    ) -> _Entry:
        entry = _Entry(op=op, kind=kind, shape=shape, device=device, total=None, nan=nan)
        size = math.prod(shape)
        slab: _Slab | None
        if size > _SHARED_SLAB_LIMIT:
            slab = _Slab(op, kind, device, dtype, size=size)
            self._own_slabs.append(slab)
        else:
            # Scalar keys and n-d keys have slabs of their own: a slab of scalars is finished elementwise.
            slab_key = (op, kind, device, shape == ())
            slab = self._slabs.get(slab_key)
            if slab is None:
                slab = self._slabs[slab_key] = _Slab(op, kind, device, dtype, size=0)
        entry.slab = slab
        entry.total = slab.add(name, entry, shape)
        self._entries[name] = entry
        self._created(name, entry.spec(), ordered=True)
        return entry

    def _created(self, name: str, spec: str, *, ordered: bool) -> None:
        """Fold a new key into the digests the key check compares across ranks (O(1), not O(keys))."""
        key_hash = _hash(f"{len(name)}:{name}{spec}".encode())
        self._set_digest = (self._set_digest + key_hash) % _DIGEST_MODULUS
        if ordered:
            self._order_digest = _hash(self._order_digest.to_bytes(8, "big") + key_hash.to_bytes(8, "big"))

    def _log_stateful(self, name: str, metric: Any, store_on_cpu: bool | None) -> None:
        place_metric(self.plan, "stateful", store_on_cpu)  # raises for CPU-stored metrics under NCCL
        if name in self._entries:
            raise InvalidMetric(field="name", value=name, reason="it holds logged values", fix="Use another name")
        known = self._stateful.get(name)
        if known is not None and known is not metric:
            raise InvalidMetric(
                field="name", value=name, reason="it holds another metric object", fix="Log one metric object per name"
            )
        if known is None:
            self._created(name, f"stateful|{type(metric).__name__}", ordered=False)
        self._stateful[name] = metric

    # -- reading ------------------------------------------------------------------------------------

    def keys(self) -> list[str]:
        """The logged keys, sorted."""
        return sorted([*self._entries, *self._stateful])

    def reset(self) -> None:
        """Forget everything logged (stateful metrics are reset too)."""
        for stateful in self._stateful.values():
            stateful.reset()
        self._entries.clear()
        self._numbers.clear()
        self._slabs.clear()
        self._own_slabs.clear()
        self._stateful.clear()
        self._set_digest = self._order_digest = 0

    def compute(self, sync: bool = True) -> dict[str, PlainValue]:
        """Plain values per key: floats and ints for scalars, lists for n-d tensors.

        With `sync=True` (and more than one process) the values are reduced over every rank first.
        """
        self.collectives_in_last_sync = 0
        world = self._world_size() if sync else 1
        if world == 1 and not self._entries and not self._stateful:
            return {}
        # Synced, every rank takes part in the key check (in the first collective), even one that logged nothing:
        # the others would wait for it.
        values = self._values(world=world)
        failed = sorted(
            name for name, entry in self._entries.items() if entry.nan == "error" and _has_nan(values[name])
        )
        if failed:
            raise MetricNaN(keys=failed)
        for name, stateful in sorted(self._stateful.items()):  # every rank reduces them in the same order
            values[name] = _plain(_compute_stateful(stateful, sync=world > 1))
        return dict(sorted(values.items()))

    def _world_size(self) -> int:
        """The process group's size, checked against the plan: never silently local, never another world."""
        group = self._collective.world_size
        expected = self.plan.world_size
        if group == 1 and expected > 1:
            require_torch(f"A metric store reducing over the plan's {expected} processes")
            raise NotInWorld(world_size=expected)
        plan_rank = self.plan.cluster.global_rank
        check_group(
            self.plan,
            size=group,
            group_rank=self._collective.rank if group > 1 else 0,
            rank=plan_rank if group > 1 else None,
            size_fix="Create the store from the plan of this job (trainplan.resolve() inside it takes its layout)",
            rank_fix="Create the store from this process's own plan (trainplan.resolve() in this process)",
        )
        return group

    def _signature(self) -> list[tuple[str, str]]:
        return sorted(
            [(name, entry.spec()) for name, entry in self._entries.items()]
            + [(name, f"stateful|{type(stateful).__name__}") for name, stateful in self._stateful.items()]
        )

    def _check_keys(self, buckets: list[_Bucket], world: int) -> tuple[bool, _Bucket | None]:
        """The first collective of a synced compute(), alike on every rank: the key check, carrying the small float
        sum bucket (a handful of mean keys' values and weights) when there is one, so one key costs one collective.

        It is a sum of fixed length on every rank, whatever each logged: pieces of the two key digests (the set of
        keys, and the order they were created in) and their squares, then the carried bucket, padded to
        `_CARRIED`. So a mismatch is found before any collective whose length depends on the keys. Another set
        of keys: every rank raises `MetricKeyMismatch`. The same set in another order: every rank lays its keys
        out by name and gets (False, None): the carried bucket was reduced misaligned, so compute again.
        Otherwise (True, the bucket carried, reduced, or None)."""
        import torch

        device = self._device if self.plan.metrics.reduces_on == "device" else HOST_DEVICE
        dtype = _floating(device)
        carried = next(
            (
                bucket
                for bucket in buckets
                if bucket.op == "sum"
                and bucket.dtype == dtype
                and bucket.length <= _CARRIED
                and self._reduction_device(bucket) == device
            ),
            None,
        )
        source = HOST_DEVICE if carried is None else carried.device
        cache_key = (self._set_digest, self._order_digest, world, dtype, source)
        if self._header is None or self._header[0] != cache_key:  # the digests change only as keys are created
            header = _digest_header(cache_key[:2], world, dtype)
            self._header = (cache_key, len(header), torch.tensor(header + [0.0] * _CARRIED, dtype=dtype).to(source))
        _, length, head = self._header
        if carried is None:
            combined = head.clone()  # header, then zeros where a bucket would be
        else:  # header, the bucket, zeros up to the fixed length
            combined = torch.cat([head[:length], *carried.segments, head[length : length + _CARRIED - carried.length]])
        reduced = combined if source == device else self._transfer(combined, device)
        self._collective.all_reduce(reduced, "sum")
        self.collectives_in_last_sync += 1
        if carried is not None:
            reduced = reduced if source == device else self._transfer(reduced, source)
            carried.flat = reduced[length : length + carried.length]
        same_set, same_order = _agreed(reduced[:length].tolist(), world)
        if not same_set:
            self._raise_mismatch()
        if not same_order:
            self._lay_out_by_name()
            return False, None
        return True, carried

    def _reduction_device(self, bucket: _Bucket) -> str:
        """Where `bucket` is reduced: on the device under a backend that reduces device tensors only."""
        if self.plan.metrics.reduces_on == "device" and bucket.device == HOST_DEVICE:
            return self._device
        return bucket.device

    def _raise_mismatch(self) -> None:
        """The rare path: find out who lacks what (one more collective), then every rank raises the same error."""
        everyone = self._collective.all_gather_object(self._signature())
        self.collectives_in_last_sync += 1
        specs = [{str(name): str(spec) for name, spec in ranks} for ranks in everyone if isinstance(ranks, list)]
        missing: dict[str, list[int]] = {}
        differing: dict[str, list[int]] = {}
        for key in sorted(set().union(*specs)):
            present = [rank for rank, spec in enumerate(specs) if key in spec]
            if len(present) < len(specs):
                missing[key] = [rank for rank in range(len(specs)) if rank not in present]
            elif len({spec[key] for spec in specs}) > 1:
                reference = specs[0][key]
                differing[key] = [rank for rank, spec in enumerate(specs) if spec[key] != reference]
        raise MetricKeyMismatch(missing=missing, differing=differing)

    def _lay_out_by_name(self) -> None:
        """Every slab and group of keys in name order: the layout every rank reaches alike."""
        for slab in self._slabs.values():
            slab.sort()
        self._own_slabs.sort(key=lambda slab: slab.names[0])
        for group_key, group in self._numbers.items():
            self._numbers[group_key] = dict(sorted(group.items()))
        self._order_digest = _hash(b"by name" + self._set_digest.to_bytes(8, "big"))

    def _values(self, *, world: int) -> dict[str, PlainValue]:
        """Every logged key's value (stateful metrics aside): reduced over the ranks when `world` > 1.

        Keys are bucketed by (collective op, dtype, device); each bucket is one flat tensor built with one
        operation per slab (whatever its number of keys), reduced with one collective (the first one also checks
        the keys, `_check_keys`), finished in place (a mean divided by its weights, a max or min made NaN where any
        rank logged NaN, an integer sum checked against its floating-point shadow) and brought to the host with
        one `tolist()`. What is left per key is O(1) Python: reading its value out of that list.
        """
        synced = world > 1
        values: dict[str, PlainValue] = {}
        slabs = [self._slabs[key] for key in sorted(self._slabs)] + self._own_slabs
        if not synced:
            for numbers in self._numbers.values():
                values.update((name, _finish_number(entry)) for name, entry in numbers.items())
            if not slabs:
                return values  # a store of Python numbers alone needs no torch
        buckets = _Buckets()
        groups = [_slab_group(slab, buckets, synced=synced) for slab in slabs]
        if synced:
            groups += [
                _number_group(op, kind, entries, buckets) for (op, kind), entries in sorted(self._numbers.items())
            ]
        ordered = [buckets.by_key[key] for key in sorted(buckets.by_key)]  # the same order on every rank
        carried = None
        if synced:
            agreed, carried = self._check_keys(ordered, world)
            if not agreed:
                return self._values(world=world)  # in the layout by name, which every rank has now
        for bucket in ordered:
            if bucket is carried:
                continue
            bucket.join()
            if synced and bucket.length:
                target = self._reduction_device(bucket)
                flat = bucket.flat if target == bucket.device else self._transfer(bucket.flat, target)
                self._collective.all_reduce(flat, bucket.op)
                self.collectives_in_last_sync += 1
                bucket.flat = flat if target == bucket.device else self._transfer(flat, bucket.device)
        for group in groups:
            _finish_group(group)
        for bucket in ordered:
            bucket.host = bucket.flat.tolist()  # the one host transfer of each bucket
        overflowed: list[str] = []
        for group in groups:
            overflowed += _overflowed(group)
            _read_group(group, values)
        if overflowed:
            raise MetricOverflow(keys=sorted(overflowed))
        return values


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_DIGEST_BITS = 56
_DIGEST_MODULUS = 2**_DIGEST_BITS
_CARRIED = 64
"""Elements of the float sum bucket the key check carries (32 scalar mean keys: a value and a weight each); every
rank sends this many whatever it logged, so a larger bucket is reduced by a collective of its own."""


def _hash(data: bytes) -> int:
    """56 bits of BLAKE2b: the same on every rank (unlike hash())."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=7).digest(), "big")


def _digest_header(digests: tuple[int, ...], world: int, dtype: Any) -> list[float]:
    """The digests cut in pieces, then the pieces' squares: what the key check sums over the ranks.

    A piece has `bits` bits, small enough that the sum of `world` squares is an exact integer in `dtype`."""
    import torch

    significand = 1 - round(math.log2(torch.finfo(dtype).eps))  # 53 bits for float64, 24 for float32
    bits = (significand - world.bit_length()) // 2
    if bits < 1:
        raise MetricError(
            f"A world of {world} processes is too large to check the metric keys exactly in {dtype}: reduce the "
            "metrics on a device with float64"
        )
    mask = (1 << bits) - 1
    pieces = [(digest >> shift) & mask for digest in digests for shift in range(0, _DIGEST_BITS, bits)]
    return [float(piece) for piece in pieces] + [float(piece * piece) for piece in pieces]


def _agreed(sums: list[float], world: int) -> tuple[bool, bool]:
    """Whether every rank had the same first digest, and the same second, from the summed header.

    The pieces x_i of the ranks are all equal exactly when world * sum(x_i ** 2) == sum(x_i) ** 2 (Cauchy-Schwarz,
    with equality only for equal x_i), so one sum over the ranks checks them, and every rank reads the same verdict."""
    half = len(sums) // 2
    same = [world * int(squares) == int(total) ** 2 for total, squares in zip(sums[:half], sums[half:], strict=True)]
    each = half // 2
    return all(same[:each]), all(same[each:])


_COLLECTIVE_OF: dict[ReduceOp, CollectiveOp] = {"mean": "sum", "sum": "sum", "max": "max", "min": "min"}
"""The collective that reduces each op's totals (a mean's weighted sum and its weights are sums)."""

_WRAP_GAP = 2.0**40
"""An int64 sum that wrapped differs from its float64 shadow by about 2**64; one that did not, by float rounding
(far below this gap, for any world size torch can run)."""


def _slab_group(slab: _Slab, buckets: _Buckets, *, synced: bool) -> _Group:
    """Put a slab's parts in their buckets: one tensor operation per part, whatever the number of keys."""
    import torch

    state = slab.state()
    floating = _floating(slab.device)
    if slab.op in ("max", "min") and slab.kind == "float" and synced:
        # Collectives' max/min may drop NaNs: they travel as counts in a sum, the values as the identity.
        bucket = buckets(slab.op, slab.dtype, slab.device)
        total = bucket.add(torch.nan_to_num(state, nan=slab.identity, posinf=math.inf, neginf=-math.inf))
        sums = buckets("sum", floating, slab.device)
        group = _Group(slab.op, slab.names, (bucket, total), slab.used, slab=slab)
        group.nans = (sums, sums.add(state.isnan().to(floating)))
        return group
    bucket = buckets(_COLLECTIVE_OF[slab.op], slab.dtype, slab.device)
    group = _Group(slab.op, slab.names, (bucket, bucket.add(state)), slab.used, slab=slab)
    if slab.op == "mean":
        group.weight = (bucket, bucket.add([entry.weight for entry in slab.entries]))
    elif slab.op == "sum" and slab.kind == "int" and synced:
        sums = buckets("sum", floating, slab.device)
        group.shadow = (sums, sums.add(state.to(floating)))
    return group


def _number_group(op: ReduceOp, kind: str, entries: Mapping[str, _Entry], buckets: _Buckets) -> _Group:
    """Put the Python-number keys of one (op, kind) in their buckets, as one tensor per part."""
    import torch

    names = list(entries)
    integer = kind == "int"
    dtype = torch.int64 if integer else torch.float64
    bucket = buckets(_COLLECTIVE_OF[op], dtype, HOST_DEVICE)
    totals = [_scalar_total(entry) for entry in entries.values()]
    group = _Group(op, names, (bucket, bucket.add(totals)), len(names))
    if op == "mean":
        group.weight = (bucket, bucket.add([entry.weight for entry in entries.values()]))
    elif op == "sum" and integer:
        sums = buckets("sum", torch.float64, HOST_DEVICE)
        group.shadow = (sums, sums.add([float(total) for total in totals]))
    elif op in ("max", "min") and not integer:
        sums = buckets("sum", torch.float64, HOST_DEVICE)
        group.nans = (sums, sums.add([float(entry.nans) for entry in entries.values()]))
    return group


def _finish_group(group: _Group) -> None:
    """In place, on the reduced bucket: divide means, poison NaN maxima and minima, flag wrapped integer sums."""
    bucket, offset = group.total
    total = bucket.part(offset, group.count)
    if group.weight is not None:
        weights = group.weight[0].part(group.weight[1], len(group.names))
        slab = group.slab
        if slab is None or slab.scalars_only:
            total.div_(weights)
        else:  # n-d keys: one division per key (repeat_interleave would run a parallel region, which hangs
            # in a forked worker of a parent that used torch's thread pool)
            for index, (start, size) in enumerate(zip(slab.offsets, slab.sizes, strict=True)):
                total[start : start + size].div_(weights[index : index + 1])
    if group.nans is not None:
        total.masked_fill_(group.nans[0].part(group.nans[1], group.count) > 0, math.nan)
    if group.shadow is not None:
        shadow = group.shadow[0].part(group.shadow[1], group.count)
        shadow.copy_((shadow - total.to(shadow.dtype)).abs() > _WRAP_GAP)


def _overflowed(group: _Group) -> list[str]:
    """The keys of a finished group whose reduction overflowed (read from the host copy: no transfer)."""
    names: list[str] = []
    if group.weight is not None:
        bucket, offset = group.weight
        weights = bucket.host[offset : offset + len(group.names)]
        if weights and max(weights) == math.inf:
            names += [name for name, weight in zip(group.names, weights, strict=True) if not math.isfinite(weight)]
    if group.shadow is not None:
        bucket, offset = group.shadow
        flags = bucket.host[offset : offset + group.count]
        if any(flags):
            if group.slab is None:
                names += [name for name, flag in zip(group.names, flags, strict=True) if flag]
            else:
                slab = group.slab
                names += [
                    name
                    for name, start, size in zip(slab.names, slab.offsets, slab.sizes, strict=True)
                    if any(flags[start : start + size])
                ]
    return names


def _read_group(group: _Group, values: dict[str, PlainValue]) -> None:
    """Each key's value out of its bucket's host copy: O(1) per scalar key."""
    bucket, offset = group.total
    host = bucket.host
    slab = group.slab
    if slab is None or slab.scalars_only:
        values.update(zip(group.names, host[offset : offset + group.count], strict=True))
        return
    for name, entry, start, size in zip(slab.names, slab.entries, slab.offsets, slab.sizes, strict=True):
        values[name] = _nest(host[offset + start : offset + start + size], entry.shape or ())


def _unusual_tensor(value: Any) -> str | None:
    """The kind of a tensor that has no plain strided storage (sparse, meta, quantized, nested), or None."""
    if getattr(value, "is_nested", False):
        return "nested"
    if getattr(value, "is_meta", False):
        return "meta"
    if getattr(value, "is_quantized", False):
        return "quantized"
    if str(getattr(value, "layout", "torch.strided")) != "torch.strided":
        return f"{str(value.layout).removeprefix('torch.')} (not dense)"
    return None


def _scalar_total(entry: _Entry) -> float | int:
    """A Python-number key's total, with the identity of max/min when only NaNs were logged."""
    if entry.total is not None:
        return entry.total  # type: ignore[no-any-return]
    if entry.op == "max":
        return -math.inf if entry.kind == "float" else 0
    if entry.op == "min":
        return math.inf if entry.kind == "float" else 0
    return 0


def _plain(value: object) -> PlainValue:
    if _is_tensor(value):
        tensor: Any = value
        plain: PlainValue = tensor.item() if tensor.dim() == 0 else tensor.tolist()
        return plain
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, (int, float)):
        return value
    return float(value)  # type: ignore[arg-type]  # numpy scalars and the like


def _compute_stateful(metric: Any, *, sync: bool) -> Any:
    if sync:
        return metric.compute()
    # torchmetrics syncs inside compute() when a process group exists; ask it not to, just this once.
    previous_sync, previous_cache = getattr(metric, "_to_sync", None), getattr(metric, "_computed", None)
    metric._to_sync = False
    metric._computed = None
    try:
        return metric.compute()
    finally:
        metric._to_sync = previous_sync
        metric._computed = previous_cache


def metric_store(plan: Plan, **options: Any) -> MetricStore:
    """A `MetricStore` for this plan (see `MetricStore` for the options)."""
    return MetricStore(plan, **options)


__all__ = [
    "Collective",
    "InvalidMetric",
    "MetricError",
    "MetricKeyMismatch",
    "MetricNaN",
    "MetricOverflow",
    "MetricStore",
    "NanPolicy",
    "NotInWorld",
    "PlainValue",
    "ReduceOp",
    "TorchCollective",
    "Transfer",
    "metric_store",
]
