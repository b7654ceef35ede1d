"""The metric store without processes: bad input, placement and moves, through injected seams."""

from __future__ import annotations

import fractions
import json
import math
from typing import Any

import pytest
import torch

from trainplan import Environment, Incompatible, InvalidMetric, MetricNaN, MetricStore, Request
from trainplan.effects.metrics import CollectiveOp, _agreed, _digest_header
from trainplan.resolve import resolve

CPU_PLAN = resolve(Request(accelerator="cpu", strategy="ddp", devices=2), Environment(cpu_count=2))
CUDA_PLAN = resolve(Request(strategy="ddp", devices=2), Environment(cuda_device_count=2))
ONE_PROCESS_PLAN = resolve(Request(accelerator="cpu"), Environment(cpu_count=2))


class MirrorCollective:
    """A world of `size` ranks that all logged exactly what this one did."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self.calls: list[tuple[CollectiveOp, str, int]] = []

    @property
    def world_size(self) -> int:
        return self.size

    @property
    def rank(self) -> int:
        return 0

    def all_reduce(self, tensor: torch.Tensor, op: CollectiveOp) -> None:
        device = getattr(tensor, "pretend_device", str(tensor.device))
        self.calls.append((op, device, tensor.numel()))
        if op == "sum":
            tensor.mul_(self.size)

    def all_gather_object(self, value: object) -> list[object]:
        return [value] * self.size


class RecordingTransfer:
    """Pretends to move tensors (there is no GPU here) and records each move."""

    def __init__(self) -> None:
        self.moves: list[str] = []

    def __call__(self, tensor: torch.Tensor, device: str) -> torch.Tensor:
        self.moves.append(device)
        moved = tensor.clone()
        moved.pretend_device = device  # type: ignore[attr-defined]
        return moved


def test_one_process_issues_no_collective() -> None:
    collective = MirrorCollective(size=1)
    store = MetricStore(ONE_PROCESS_PLAN, collective=collective)
    store.log("loss", 2.0, weight=2)
    store.log("loss", 5.0)
    assert store.compute() == {"loss": pytest.approx(3.0)}
    assert collective.calls == [] and store.collectives_in_last_sync == 0


def test_mirror_world_doubles_sums_and_keeps_means() -> None:
    collective = MirrorCollective()
    store = MetricStore(CPU_PLAN, collective=collective)
    store.log("loss", torch.tensor(4.0), weight=3)
    store.log("count", 3, reduce="sum")
    store.log("best", 9, reduce="max")
    assert store.compute() == {"best": 9, "count": 6, "loss": 4.0}
    ops = sorted({(op, device) for op, device, _ in collective.calls})
    assert ops == [("max", "cpu"), ("sum", "cpu")]
    # the key check carrying the sum/f64 bucket, then sum/i64 and max/i64
    assert len(collective.calls) == store.collectives_in_last_sync == 3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_key_check_sees_any_rank_that_differs_even_when_the_sum_is_the_same(dtype: torch.dtype) -> None:
    # Three ranks whose digests average to the middle one's: a sum alone would not tell them apart.
    world = 3
    top = 2**56 - 1
    headers = [_digest_header((digest, top), world, dtype) for digest in (top - 2, top - 1, top)]
    summed = [sum(column) for column in zip(*headers, strict=True)]
    assert _agreed(summed, world) == (False, True)
    alike = [_digest_header((top, 12345), 1000, dtype)] * 1000
    assert _agreed([sum(column) for column in zip(*alike, strict=True)], 1000) == (True, True)
    assert torch.tensor(headers[0], dtype=dtype).tolist() == headers[0], "every piece and square is exact in dtype"


def test_under_nccl_cpu_values_move_to_the_device_once_per_bucket_and_back() -> None:
    transfer = RecordingTransfer()
    collective = MirrorCollective()
    store = MetricStore(CUDA_PLAN, collective=collective, transfer=transfer, local_rank=1)
    for step in range(10):
        store.log(f"loss_{step}", float(step))
        store.log(f"cpu_tensor_{step}", torch.tensor(float(step)), store_on_cpu=True)
    values = store.compute()
    assert values["loss_3"] == 3.0 and values["cpu_tensor_9"] == 9.0
    # the one float64 sum bucket, carried by the key check, goes to the device and back
    assert transfer.moves == ["cuda:1", "cpu"]
    assert {device for _, device, _ in collective.calls} == {"cuda:1"}


def test_stateful_metric_on_cpu_under_nccl_is_refused() -> None:
    torchmetrics = pytest.importorskip("torchmetrics")
    store = MetricStore(CUDA_PLAN, collective=MirrorCollective())
    with pytest.raises(Incompatible, match="store_on_cpu=False"):
        store.log("acc", torchmetrics.MeanMetric(), store_on_cpu=True)


@pytest.mark.parametrize(
    ("name", "value", "options", "words"),
    [
        ("loss", "0.5", {}, "a str is not a number"),
        ("loss", torch.tensor(1.0, requires_grad=True), {}, "requires grad"),
        ("loss", 1.0, {"reduce": "median"}, "not a reduction"),
        ("loss", 1.0, {"weight": 0}, "finite real number > 0"),
        ("loss", 1.0, {"weight": -1}, "finite real number > 0"),
        ("loss", 1.0, {"weight": True}, "finite real number > 0"),
        ("loss", 1.0, {"reduce": "sum", "weight": 2}, "weights apply to a mean"),
        ("loss", 1.0, {"store_on_cpu": "yes"}, "True, False or None"),
        ("", 1.0, {}, "non-empty string"),
        ("loss", torch.tensor([1 + 2j]), {}, "real numbers"),
        ("loss", True, {}, "a bool is not a number"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_lost(
    name: str, value: object, options: dict[str, Any], words: str
) -> None:
    store = MetricStore(ONE_PROCESS_PLAN, collective=MirrorCollective(size=1))
    store.log("loss", 1.0, weight=2)
    store.log("loss", 4.0)
    with pytest.raises(InvalidMetric) as caught:
        store.log(name, value, **options)
    assert words in str(caught.value)
    assert store.compute() == {"loss": pytest.approx(2.0)}


def test_a_key_keeps_its_op_shape_and_kind() -> None:
    store = MetricStore(ONE_PROCESS_PLAN, collective=MirrorCollective(size=1))
    store.log("count", 3, reduce="sum")
    store.log("vector", torch.ones(3), reduce="sum")
    with pytest.raises(InvalidMetric, match="reduce='sum' before"):
        store.log("count", 1, reduce="max")
    with pytest.raises(InvalidMetric, match="holds integers"):
        store.log("count", 1.5, reduce="sum")
    with pytest.raises(InvalidMetric, match=r"shape \(3,\) before"):
        store.log("vector", torch.ones(4), reduce="sum")
    assert store.compute() == {"count": 3, "vector": [1.0, 1.0, 1.0]}


def test_nan_is_defined_locally() -> None:
    store = MetricStore(ONE_PROCESS_PLAN, collective=MirrorCollective(size=1))
    store.log("max", math.nan, reduce="max")
    store.log("max", 2.0, reduce="max")
    store.log("vector", torch.tensor([1.0, math.nan]), reduce="min")
    store.log("mean", math.nan)
    values = store.compute()
    peak, mean, vector = values["max"], values["mean"], values["vector"]
    assert isinstance(peak, float) and isinstance(mean, float) and isinstance(vector, list)
    assert math.isnan(peak) and math.isnan(mean)
    first, second = vector
    assert first == 1.0 and math.isnan(second)


def test_memory_is_constant_per_key() -> None:
    store = MetricStore(ONE_PROCESS_PLAN, collective=MirrorCollective(size=1))
    for step in range(1000):
        store.log("loss", torch.tensor(float(step)))
    entry = store._entries["loss"]
    assert entry.total.numel() == 1 and entry.count == 1000
    assert store.compute()["loss"] == pytest.approx(499.5)


def test_reset_forgets_everything() -> None:
    store = MetricStore(ONE_PROCESS_PLAN, collective=MirrorCollective(size=1))
    store.log("loss", 1.0)
    store.reset()
    assert store.compute() == {} and store.keys() == []


@pytest.mark.parametrize("value", [torch.tensor([1.0, 2.0]), torch.tensor([1, 2])])
def test_compute_never_changes_the_accumulated_state(value: torch.Tensor) -> None:
    # A lone tensor key fills its bucket alone: the bucket must be a copy, not the accumulator itself.
    store = MetricStore(CPU_PLAN, collective=MirrorCollective())
    store.log("tokens", value, reduce="sum")
    doubled = [2 * item for item in value.tolist()]
    assert store.compute() == store.compute() == {"tokens": doubled}
    assert store.compute(sync=False) == {"tokens": value.tolist()}


def test_a_rank_with_nothing_logged_still_takes_part_in_the_key_check() -> None:
    collective = MirrorCollective()
    store = MetricStore(CPU_PLAN, collective=collective)
    assert store.compute() == {} and len(collective.calls) == 1, "the check collective, as on every other rank"


@pytest.mark.parametrize(
    ("value", "options", "words"),
    [
        (10**400, {}, "too large for a float64"),
        (10**400, {"reduce": "max"}, "outside its range"),
        (2**63, {"reduce": "sum"}, "outside its range"),
        (1.0, {"weight": 10**400}, "finite real number > 0"),
        (1.0, {"weight": math.inf}, "finite real number > 0"),
    ],
    ids=["huge-mean", "huge-max", "int64-plus-one", "huge-weight", "inf-weight"],
)
def test_numbers_out_of_range_are_refused_before_anything_changes(
    value: object, options: dict[str, Any], words: str
) -> None:
    store = MetricStore(ONE_PROCESS_PLAN)
    store.log("kept", 1.0)
    with pytest.raises(InvalidMetric, match=words):
        store.log("v", value, **options)
    assert store.keys() == ["kept"] and store.compute() == {"kept": 1.0}


def test_a_running_integer_sum_that_would_wrap_is_refused_and_the_sum_kept() -> None:
    store = MetricStore(ONE_PROCESS_PLAN)
    store.log("n", 2**62, reduce="sum")
    store.log("t", torch.tensor([2**62, 1]), reduce="sum")
    store.log("n", 2**62 - 1, reduce="sum")
    with pytest.raises(InvalidMetric, match="would leave int64"):
        store.log("n", 1, reduce="sum")
    with pytest.raises(InvalidMetric, match="would overflow int64"):
        store.log("t", torch.tensor([2**62, 0]), reduce="sum")
    assert store.compute() == {"n": 2**63 - 1, "t": [2**62, 1]}


def _unusual_tensors() -> list[tuple[str, torch.Tensor]]:
    tensors = [
        ("sparse", torch.eye(2).to_sparse()),
        ("meta", torch.empty(2, device="meta")),
        ("quantized", torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)),
        ("nested", torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])),
    ]
    return tensors


@pytest.mark.parametrize(("kind", "tensor"), _unusual_tensors())
def test_tensors_without_plain_storage_are_refused(kind: str, tensor: torch.Tensor) -> None:
    store = MetricStore(ONE_PROCESS_PLAN)
    store.log("kept", torch.tensor(2.0), reduce="sum")
    with pytest.raises(InvalidMetric, match=kind):
        store.log("odd", tensor, reduce="sum")
    assert store.keys() == ["kept"] and store.compute() == {"kept": 2.0}


class TestSecondReview:
    """Faults a second adversarial review found: each held by a test that failed before its fix."""

    def test_key_names_cannot_make_two_signatures_spell_alike(self) -> None:
        two_keys = MetricStore(ONE_PROCESS_PLAN)
        two_keys.log("x", 1.0)
        two_keys.log("y", 1.0)
        one_key = MetricStore(ONE_PROCESS_PLAN)
        one_key.log("x=mean|float|None\ny", 1.0)
        assert two_keys._signature() != one_key._signature()
        assert json.dumps(two_keys._signature()) != json.dumps(one_key._signature())

    def test_uint64_beyond_int64_is_refused(self) -> None:
        store = MetricStore(ONE_PROCESS_PLAN)
        with pytest.raises(InvalidMetric, match="uint64"):
            store.log("v", torch.tensor([2**63 + 5], dtype=torch.uint64), reduce="sum")
        store.log("u", torch.tensor([5], dtype=torch.uint64), reduce="sum")
        assert store.compute() == {"u": [5]}

    def test_a_float_key_takes_integer_tensors(self) -> None:
        store = MetricStore(ONE_PROCESS_PLAN)
        store.log("k", torch.tensor([1.0]), reduce="sum")
        store.log("k", torch.tensor([1]), reduce="sum")
        assert store.compute() == {"k": [2.0]}

    def test_integer_sums_that_fit_are_never_called_an_overflow(self) -> None:
        store = MetricStore(CPU_PLAN, collective=MirrorCollective())
        store.log("n", 2**62 - 1, reduce="sum")
        store.log("t", torch.tensor([2**62 - 1]), reduce="sum")
        assert store.compute() == {"n": 2**63 - 2, "t": [2**63 - 2]}

    def test_a_total_weight_past_float64_is_refused(self) -> None:
        store = MetricStore(ONE_PROCESS_PLAN)
        store.log("w", 1.0, weight=1e308)
        with pytest.raises(InvalidMetric, match="total weight"):
            store.log("w", 1.0, weight=1e308)
        assert store.compute() == {"w": 1.0}

    def test_weights_that_overflow_once_added_across_ranks_are_an_overflow(self) -> None:
        from trainplan import MetricOverflow

        store = MetricStore(CPU_PLAN, collective=MirrorCollective())
        store.log("w", 1.0, weight=1e308)
        with pytest.raises(MetricOverflow, match="total weight"):
            store.compute()


def test_numpy_scalars_are_numbers() -> None:
    numpy = pytest.importorskip("numpy")
    store = MetricStore(ONE_PROCESS_PLAN)
    store.log("count", numpy.int64(3), reduce="sum")
    store.log("count", numpy.int32(4), reduce="sum")
    store.log("loss", numpy.float32(0.5))
    store.log("loss", numpy.float64(1.5))
    values = store.compute()
    assert values == {"count": 7, "loss": 1.0} and type(values["count"]) is int
    with pytest.raises(InvalidMetric, match="not a number"):
        store.log("flag", numpy.bool_(True))


def test_a_weight_may_be_any_real_scalar() -> None:
    """torchmetrics takes a 0-d tensor or a numpy scalar as a weight, and a loop's `weight=mask.sum()` is one."""
    numpy = pytest.importorskip("numpy")
    store = MetricStore(ONE_PROCESS_PLAN)
    store.log("loss", 1.0, weight=torch.tensor(32.0))
    store.log("loss", 3.0, weight=numpy.int64(32))
    store.log("loss", 5.0, weight=torch.ones(64, dtype=torch.bool).sum())
    assert store.compute() == {"loss": (1.0 * 32 + 3.0 * 32 + 5.0 * 64) / 128}
    for weight in (torch.tensor([1.0, 2.0]), torch.tensor(0.0), torch.tensor(True), numpy.float64("nan")):
        with pytest.raises(InvalidMetric, match="finite real number > 0"):
            store.log("loss", 1.0, weight=weight)
    # Neither raises torch's or Python's own error (RuntimeError from .item(), OverflowError from float()).
    with pytest.raises(InvalidMetric, match="a meta tensor holds no value; a weight is a finite real number > 0"):
        store.log("loss", 1.0, weight=torch.tensor(2.0, device="meta"))
    with pytest.raises(InvalidMetric, match="finite real number > 0"):
        store.log("loss", 1.0, weight=fractions.Fraction(10**400, 3))
    assert store.compute() == {"loss": (1.0 * 32 + 3.0 * 32 + 5.0 * 64) / 128}  # nothing was lost


def test_a_key_chooses_what_a_nan_does() -> None:
    store = MetricStore(ONE_PROCESS_PLAN, collective=MirrorCollective(size=1))
    store.log("kept", math.nan)  # IEEE propagation, the default
    store.log("left_out", math.nan, nan="ignore")
    store.log("left_out", 2.0, nan="ignore")
    store.log("scalar_tensor", torch.tensor(math.nan), nan="ignore")
    store.log("scalar_tensor", torch.tensor(4.0), nan="ignore")
    store.log("filled", torch.tensor([math.nan, 1.0]), reduce="sum", nan=0.5)
    store.log("peak", torch.tensor([math.nan, 3.0]), reduce="max", nan="ignore")
    store.log("only_nans", math.nan, nan="ignore")
    values = store.compute()
    kept, nothing = values["kept"], values["only_nans"]
    assert isinstance(kept, float) and math.isnan(kept) and isinstance(nothing, float) and math.isnan(nothing)
    assert (values["left_out"], values["scalar_tensor"]) == (2.0, 4.0)
    assert (values["filled"], values["peak"]) == ([0.5, 1.0], [-math.inf, 3.0])
    store.log("checked", 1.0, nan="error")
    assert store.compute()["checked"] == 1.0
    store.log("checked", math.nan, nan="error")
    with pytest.raises(MetricNaN, match="'checked' is NaN"):
        store.compute()


def test_nan_policies_are_checked_before_anything_is_logged() -> None:
    store = MetricStore(ONE_PROCESS_PLAN)
    store.log("loss", 1.0, nan="ignore")
    with pytest.raises(InvalidMetric, match="logged with nan='ignore' before"):
        store.log("loss", 1.0)
    with pytest.raises(InvalidMetric, match="weight per element"):
        store.log("vector", torch.ones(3), nan="ignore")
    for policy in ("drop", math.inf, True, None):
        with pytest.raises(InvalidMetric, match="NaN policy is"):
            store.log("other", 1.0, nan=policy)  # type: ignore[arg-type]
    assert store.keys() == ["loss"]
