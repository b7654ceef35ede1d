"""Logged metrics: O(1) accumulation per key, placement from the plan, one collective per bucket.

    store = MetricStore(plan)                      # or trainplan.metric_store(plan)
    store.log("loss", loss, weight=batch_size)     # mean by default; also sum, max, min
    store.log("acc", accuracy_metric)              # a torchmetrics Metric (it reduces its own states)
    values = store.compute()                       # {"loss": 0.42, "acc": 0.91}: synced over all ranks
    store.reset()

- Memory is O(1) per key: a running weighted sum and weight (mean), a running sum, min or max, with a
  count of NaNs. Values are detached. Floats accumulate in float64 (float32 on MPS, which has no
  float64) and integers in int64, so sums are exact and a weighted mean equals the mean over every
  rank's data, even with uneven weights (integer batch sizes are never truncated).
- At `compute(sync=True)`, keys are bucketed by (collective op, dtype, device) and each bucket is
  reduced with one collective, whatever the number of keys; a weighted mean's values and weights
  travel in the same buffer. Before that, one small collective checks that every rank logged the
  same keys the same way; if not, every rank raises `MetricKeyMismatch` naming the keys and the ranks
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
import json
import math
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

import attrs

from trainplan.effects.extras import require_torch
from trainplan.effects.world import check_group
from trainplan.resolve import place_metric
from trainplan.spec.errors import InvalidRequest, TrainplanError
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


class MetricKeyMismatch(MetricError):
    """Ranks logged different keys (or the same key differently); raised on every rank, never a hang."""

    def __init__(self, *, missing: Mapping[str, list[int]], differing: Mapping[str, list[int]]) -> None:
        self.missing = dict(missing)
        self.differing = dict(differing)
        parts = [f"{key!r} is missing on rank(s) {ranks}" for key, ranks in sorted(self.missing.items())]
        parts += [
            f"{key!r} is logged with another reduce op, dtype or shape on rank(s) {ranks}"
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
    """The running state of one key. Python numbers stay Python numbers (cheap); tensors stay tensors."""

    op: ReduceOp
    kind: Literal["float", "int"]
    shape: tuple[int, ...] | None  # None: logged as Python numbers (a scalar)
    device: str  # where the state is stored ("python" for Python numbers)
    total: Any  # weighted sum (mean), sum, or running max/min
    weight: float = 0.0  # sum of weights (mean)
    nans: Any = 0  # NaNs seen (max/min): a count, or a tensor of counts per element
    count: int = 0

    def spec(self) -> str:
        return f"{self.op}|{self.kind}|{self.shape}"


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
        self._stateful: dict[str, Any] = {}  # name → the metric object (it keeps its own states)
        self.collectives_in_last_sync = 0
        """How many collectives the last `compute(sync=True)` issued (0 for one process)."""

    # -- logging ------------------------------------------------------------------------------------

    def log(
        self,
        name: str,
        value: object,
        *,
        reduce: ReduceOp = "mean",
        weight: float | int = 1,
        store_on_cpu: bool | None = None,
    ) -> None:
        """Accumulate `value` under `name`. Everything is checked before anything is changed."""
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
        weight_value = real_number(given_weight)
        if weight_value is None or not weight_value > 0:
            raise InvalidMetric(
                field="weight", value=weight, reason="a weight is a finite number > 0", fix="weight=batch_size"
            )
        if weight != 1 and reduce != "mean":
            raise InvalidMetric(
                field="weight",
                value=weight,
                reason=f"weights apply to a mean; reduce={reduce!r} takes none",
                fix="Drop weight=, or use reduce='mean'",
            )
        if _is_stateful(value):
            self._log_stateful(name, value, store_on_cpu)
            return
        if name in self._stateful:
            raise InvalidMetric(
                field="name", value=name, reason="it holds a stateful metric object", fix="Use another name"
            )
        if _is_tensor(value):
            self._log_tensor(name, value, reduce, weight_value, store_on_cpu)
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidMetric(
                field=name,
                value=value,
                reason=f"a {type(value).__name__} is not a number, a tensor or a metric object",
                fix="Log a number, a tensor, or a torchmetrics Metric",
            )
        self._log_number(name, value, reduce, weight_value)

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

    def _log_number(self, name: str, value: float | int, op: ReduceOp, weight: float) -> None:
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
            entry = _Entry(op=op, kind=kind, shape=None, device="python", total=None)
            self._entries[name] = entry
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

    def _log_tensor(self, name: str, value: Any, op: ReduceOp, weight: float, store_on_cpu: bool | None) -> None:
        import torch

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
        slot = place_metric(self.plan, "tensor", store_on_cpu)
        device = (
            "cpu" if slot.store_device == "cpu" else str(value.device if value.device.type != "cpu" else self._device)
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
        dtype = (torch.float32 if device.startswith("mps") else torch.float64) if kind == "float" else torch.int64
        incoming = value.detach().to(device=device, dtype=dtype)
        if entry is None:
            entry = _Entry(op=op, kind=kind, shape=shape, device=device, total=None)
        if op == "mean":
            contribution = incoming * weight
            entry.total = contribution if entry.total is None else entry.total.add_(contribution)
            entry.weight += weight
        elif op == "sum":
            if entry.total is None:
                entry.total = incoming.clone()
            elif kind == "int":
                total = entry.total + incoming
                # int64 addition overflowed where both operands share a sign that the result lacks.
                if bool((((entry.total ^ total) & (incoming ^ total)) < 0).any()):
                    raise InvalidMetric(
                        field=name,
                        value="an integer tensor",
                        reason=f"the running sum of {name!r} would overflow int64; it is reduced as int64",
                        fix="Log this key as floats from the start, or reset() it more often",
                    )
                entry.total = total
            else:
                entry.total = entry.total.add_(incoming)
        else:
            if kind == "float":
                nan = torch.isnan(incoming)
                entry.nans = nan.to(incoming.dtype) + entry.nans  # per element
                incoming = torch.where(nan, torch.full_like(incoming, -math.inf if op == "max" else math.inf), incoming)
            if entry.total is None:
                entry.total = incoming.clone()
            else:
                entry.total = (
                    torch.maximum(entry.total, incoming) if op == "max" else torch.minimum(entry.total, incoming)
                )
        entry.count += 1
        self._entries[name] = entry

    def _log_stateful(self, name: str, metric: Any, store_on_cpu: bool | None) -> None:
        place_metric(self.plan, "stateful", store_on_cpu)  # raises for CPU-stored metrics under NCCL
        if name in self._entries:
            raise InvalidMetric(field="name", value=name, reason="it holds logged values", fix="Use another name")
        known = self._stateful.get(name)
        if known is not None and known is not metric:
            raise InvalidMetric(
                field="name", value=name, reason="it holds another metric object", fix="Log one metric object per name"
            )
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
        self._stateful.clear()

    def compute(self, sync: bool = True) -> dict[str, PlainValue]:
        """Plain values per key: floats and ints for scalars, lists for n-d tensors.

        With `sync=True` (and more than one process) the values are reduced over every rank first.
        """
        self.collectives_in_last_sync = 0
        world = self._world_size() if sync else 1
        if world > 1:
            # Every rank takes part in the check, even one that logged nothing: the others would wait for it.
            self._check_same_keys()
        if not self._entries and not self._stateful:
            return {}
        if world > 1:
            reduced = self._reduce_buckets()
        else:
            reduced = {name: _local_state(entry) for name, entry in self._entries.items()}
        values: dict[str, PlainValue] = {name: _finish(self._entries[name], state) for name, state in reduced.items()}
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

    def _check_same_keys(self) -> None:
        """One collective on two integers: every rank's key signature hashed, max and (negated) min."""
        import torch

        signature = self._signature()
        # JSON of (name, spec) pairs: no key name can make two different signatures spell the same text.
        text = json.dumps(signature, ensure_ascii=True)
        digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "big")
        check = torch.tensor([digest, -digest], dtype=torch.int64)
        if self.plan.metrics.reduces_on == "device":
            check = self._transfer(check, self._device)
        self._collective.all_reduce(check, "max")
        self.collectives_in_last_sync += 1
        high, negated_low = (int(item) for item in check.tolist())
        if high == -negated_low:
            return
        # The rare path: find out who lacks what, then every rank raises the same error.
        everyone = self._collective.all_gather_object(signature)
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

    def _reduce_buckets(self) -> dict[str, dict[str, Any]]:
        """One collective per (op, dtype, device) bucket; returns the reduced state of every key.

        Parts that are Python numbers (values logged as numbers, weights, NaN counts) enter a bucket as
        one tensor built from a list, and leave it as Python numbers through one `tolist()`; tensor
        parts are flattened in and sliced out.
        """
        import torch

        buckets: dict[tuple[CollectiveOp, str, str], list[tuple[str, str, Any]]] = {}

        def add(op: CollectiveOp, dtype: str, device: str, name: str, part: str, value: Any) -> None:
            buckets.setdefault((op, dtype, device), []).append((name, part, value))

        for name in sorted(self._entries):
            entry = self._entries[name]
            device = "cpu" if entry.device == "python" else entry.device
            floating = "float32" if device.startswith("mps") else "float64"
            dtype = floating if entry.kind == "float" else "int64"
            total = entry.total if entry.device != "python" else _scalar_total(entry)
            if entry.op == "mean":
                add("sum", dtype, device, name, "total", total)
                add("sum", dtype, device, name, "weight", float(entry.weight))
            elif entry.op == "sum":
                add("sum", dtype, device, name, "total", total)
                if entry.kind == "int":
                    # A float64 shadow of an integer sum tells, on every rank alike, whether int64 overflowed.
                    plain: Any = total
                    shadow = plain.to(getattr(torch, floating)) if _is_tensor(plain) else float(plain)
                    add("sum", floating, device, name, "shadow", shadow)
            else:
                add(entry.op, dtype, device, name, "total", total)
                # NaN counts travel in a sum bucket (a max/min collective may drop NaNs).
                add("sum", floating, device, name, "nans", entry.nans if _is_tensor(entry.nans) else float(entry.nans))
        reduced: dict[str, dict[str, Any]] = {name: {} for name in self._entries}
        move = self.plan.metrics.reduces_on == "device"
        for (op, dtype, device), parts in sorted(buckets.items()):
            torch_dtype = getattr(torch, dtype)
            segments: list[Any] = []
            scalars: list[float | int] = []
            for _, _, value in parts:
                if _is_tensor(value):
                    if scalars:
                        segments.append(torch.tensor(scalars, dtype=torch_dtype, device=device))
                        scalars = []
                    segments.append(value.reshape(-1).to(torch_dtype))
                else:
                    scalars.append(value)
            if scalars:
                segments.append(torch.tensor(scalars, dtype=torch_dtype, device=device))
            # A bucket of one tensor segment would be a view of a key's accumulator: reduce a copy, so that
            # compute() never changes the accumulated state.
            if len(segments) > 1:
                flat = torch.cat(segments)
            elif _is_tensor(parts[0][2]):
                flat = segments[0].clone()
            else:
                flat = segments[0]  # built from Python numbers just now
            target = self._device if move and device == "cpu" else device
            if target != device:
                flat = self._transfer(flat, target)
            self._collective.all_reduce(flat, op)
            self.collectives_in_last_sync += 1
            if target != device:
                flat = self._transfer(flat, device)
            host: list[Any] | None = None
            offset = 0
            for name, part, value in parts:
                if _is_tensor(value):
                    size = value.numel()
                    reduced[name][part] = flat[offset : offset + size].reshape(value.shape)
                else:
                    if host is None:
                        host = flat.tolist()
                    size = 1
                    reduced[name][part] = host[offset]
                offset += size
        overflowed = sorted(
            name
            for name, parts in reduced.items()
            if ("shadow" in parts and _wrapped(parts.pop("shadow"), parts["total"]))
            or ("weight" in parts and not math.isfinite(float(parts["weight"])))
        )
        if overflowed:
            raise MetricOverflow(keys=overflowed)
        return reduced


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


_WRAP_GAP = 2.0**40
"""An int64 sum that wrapped differs from its float64 shadow by about 2**64; one that did not, by float rounding
(far below this gap, for any world size torch can run)."""


def _wrapped(shadow: Any, total: Any) -> bool:
    """Whether a reduced int64 sum wrapped: it disagrees with the float64 sum of the same values."""
    if _is_tensor(shadow):
        return bool(((shadow - total.to(shadow.dtype)).abs() > _WRAP_GAP).any())
    return bool(abs(float(shadow) - float(total)) > _WRAP_GAP)


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


def _local_state(entry: _Entry) -> dict[str, Any]:
    return {"total": entry.total, "weight": entry.weight, "nans": entry.nans}


def _finish(entry: _Entry, state: Mapping[str, Any]) -> PlainValue:
    total, nans = state["total"], state.get("nans", 0)
    if entry.op == "mean":
        weight = state["weight"]
        weight = float(weight.item()) if _is_tensor(weight) else float(weight)
        return _plain(total / weight if total is not None else math.nan)
    if entry.op in ("max", "min"):
        if _is_tensor(nans):
            import torch

            if bool((nans > 0).any()):
                poisoned = torch.where(nans > 0, torch.full_like(nans, math.nan), total.to(nans.dtype))
                return _plain(poisoned)
        elif nans:
            return math.nan
    return _plain(total)


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
    "MetricOverflow",
    "MetricStore",
    "NotInWorld",
    "PlainValue",
    "ReduceOp",
    "TorchCollective",
    "Transfer",
    "metric_store",
]
