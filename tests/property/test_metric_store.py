"""The metric store against a reference written in plain Python, over simulated worlds of 2 and 3 ranks.

Each rank is a thread with a store of its own and a collective that really reduces across the threads (a
barrier and a shared slot per rank), so every bucket's layout has to agree across ranks: the ranks log the same
keys in different orders, with every op, kind (Python numbers, float and integer tensors) and shape, NaN and inf
included. The synced values must equal the reference over every rank's data, and `sync=False` each rank's own.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainplan import Environment, MetricStore, Request
from trainplan.effects.metrics import CollectiveOp
from trainplan.resolve import resolve

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WAIT = 20.0  # seconds a thread waits at a barrier before the test fails (never a hang)


class ThreadWorld:
    """The collectives of `size` ranks that are threads of this process."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.slots: list[Any] = [None] * size
        self.barrier = threading.Barrier(size, timeout=WAIT)

    def rank(self, rank: int) -> ThreadCollective:
        return ThreadCollective(self, rank)


class ThreadCollective:
    def __init__(self, world: ThreadWorld, rank: int) -> None:
        self.world, self._rank = world, rank

    @property
    def world_size(self) -> int:
        return self.world.size

    @property
    def rank(self) -> int:
        return self._rank

    def all_reduce(self, tensor: torch.Tensor, op: CollectiveOp) -> None:
        world = self.world
        world.slots[self._rank] = tensor.clone()
        world.barrier.wait()
        stacked = torch.stack(world.slots)
        reduced = stacked.sum(0) if op == "sum" else stacked.amax(0) if op == "max" else stacked.amin(0)
        world.barrier.wait()
        tensor.copy_(reduced)

    def all_gather_object(self, value: object) -> list[object]:
        world = self.world
        world.slots[self._rank] = value
        world.barrier.wait()
        gathered = list(world.slots)
        world.barrier.wait()
        return gathered


# A key's spec: (op, form, shape); form is "number-float", "number-int", "tensor-float" or "tensor-int".
OPS = ("mean", "sum", "max", "min")
FORMS = ("number-float", "number-int", "tensor-float", "tensor-int")
SHAPES = ((), (1,), (3,), (2, 2), (0,), (2, 0))

FLOATS = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0]),
)
INTS = st.integers(min_value=-(2**40), max_value=2**40)


@st.composite
def spec(draw: st.DrawFn) -> tuple[str, str, tuple[int, ...]]:
    op = draw(st.sampled_from(OPS))
    form = draw(st.sampled_from(FORMS))
    shape = () if form.startswith("number") else draw(st.sampled_from(SHAPES))
    return op, form, shape


def value(draw: st.DrawFn, form: str, shape: tuple[int, ...]) -> Any:
    floating = form.endswith("float")
    size = math.prod(shape)
    items = [draw(FLOATS if floating else INTS) for _ in range(size)]
    if form.startswith("number"):
        return items[0]
    return torch.tensor(items, dtype=torch.float32 if floating else torch.int64).reshape(shape)


@st.composite
def world(draw: st.DrawFn) -> tuple[dict[str, tuple[str, str, tuple[int, ...]]], list[list[tuple[str, Any, float]]]]:
    """Key specs, and per rank the logs (key, value, weight) in that rank's own order."""
    keys = draw(st.lists(spec(), min_size=1, max_size=8))
    specs = {f"k{index}": item for index, item in enumerate(keys)}
    ranks = draw(st.integers(min_value=2, max_value=3))
    logs: list[list[tuple[str, Any, float]]] = []
    for _ in range(ranks):
        calls: list[tuple[str, Any, float]] = []
        for name, (op, form, shape) in specs.items():
            for _ in range(draw(st.integers(min_value=1, max_value=3))):
                weight = draw(st.sampled_from([1, 2, 0.5, 8])) if op == "mean" else 1
                calls.append((name, value(draw, form, shape), weight))
        logs.append(draw(st.permutations(calls)))
    return specs, logs


def reference(op: str, form: str, shape: tuple[int, ...], calls: list[tuple[Any, float]]) -> Any:
    """What the store must give for one key, from every logged (value, weight), in plain Python."""
    size = math.prod(shape)
    columns: list[list[Any]] = [[] for _ in range(size)]
    weights = [weight for _, weight in calls]
    for item, _ in calls:
        flat = [item] if not isinstance(item, torch.Tensor) else item.reshape(-1).tolist()
        for index, element in enumerate(flat):
            columns[index].append(element)
    integer = form.endswith("int") and op != "mean"
    results: list[Any] = []
    for column in columns:
        if op == "mean":
            results.append(sum(float(x) * w for x, w in zip(column, weights, strict=True)) / sum(weights))
        elif op == "sum":
            results.append(sum(column) if integer else sum(float(x) for x in column))
        elif any(isinstance(x, float) and math.isnan(x) for x in column):
            results.append(math.nan)
        else:
            chosen = max(column) if op == "max" else min(column)
            results.append(chosen if integer else float(chosen))
    if not shape:
        return results[0]
    return torch.tensor(results, dtype=torch.float64 if not integer else torch.int64).reshape(shape).tolist()


def same(got: Any, expected: Any) -> bool:
    if isinstance(expected, list):
        return isinstance(got, list) and len(got) == len(expected) and all(map(same, got, expected))
    if isinstance(expected, float) and math.isnan(expected):
        return isinstance(got, float) and math.isnan(got)
    if isinstance(expected, int):
        return type(got) is int and got == expected
    return isinstance(got, float) and got == pytest.approx(expected, rel=1e-9, abs=1e-9)


def run_world(logs: list[list[tuple[str, Any, float]]], specs: dict[str, tuple[str, str, tuple[int, ...]]]) -> Any:
    size = len(logs)
    plan = resolve(Request(accelerator="cpu", strategy="ddp", devices=size), Environment(cpu_count=size))
    simulated = ThreadWorld(size)
    synced: list[Any] = [None] * size
    local: list[Any] = [None] * size
    failures: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            store = MetricStore(plan, collective=simulated.rank(rank))
            for name, item, weight in logs[rank]:
                store.log(name, item, reduce=specs[name][0], weight=weight)  # type: ignore[arg-type]
            local[rank] = store.compute(sync=False)
            synced[rank] = store.compute()
            # compute() never changes what was accumulated: the same values again, synced or not.
            again, own = store.compute(), store.compute(sync=False)
            assert all(same(again[key], synced[rank][key]) and same(own[key], local[rank][key]) for key in specs)
        except BaseException as error:  # reported by the main thread
            failures.append(error)
            simulated.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 4)
    assert not any(thread.is_alive() for thread in threads), "a simulated rank hung"
    if failures:
        raise failures[0]
    return synced, local


@SETTINGS
@given(world())
def test_synced_values_are_the_reference_over_every_ranks_data(
    case: tuple[dict[str, tuple[str, str, tuple[int, ...]]], list[list[tuple[str, Any, float]]]],
) -> None:
    specs, logs = case
    synced, local = run_world(logs, specs)
    for name, (op, form, shape) in specs.items():
        everything = [(item, weight) for rank_logs in logs for key, item, weight in rank_logs if key == name]
        expected = reference(op, form, shape, everything)
        for rank, values in enumerate(synced):
            assert same(values[name], expected), (name, op, form, shape, rank, values[name], expected)
        for rank, values in enumerate(local):
            own = [(item, weight) for key, item, weight in logs[rank] if key == name]
            assert same(values[name], reference(op, form, shape, own)), (name, rank, values[name])


def test_ranks_that_created_their_keys_in_other_orders_agree_on_the_layout() -> None:
    # Rank 0 logs a..z, rank 1 z..a: the slabs differ until the key check lays both out by name.
    names = [chr(ord("a") + index) for index in range(26)]
    logs = [
        [(name, torch.tensor(float(index)), 1.0) for index, name in enumerate(names)],
        [(name, torch.tensor(float(index) * 10), 1.0) for index, name in reversed(list(enumerate(names)))],
    ]
    specs: dict[str, tuple[str, str, tuple[int, ...]]] = {name: ("sum", "tensor-float", ()) for name in names}
    synced, _ = run_world(logs, specs)
    assert synced[0] == synced[1] == {name: float(index) * 11 for index, name in enumerate(names)}
