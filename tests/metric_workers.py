"""Worker functions for the metric tests: each rank logs its share of known data and reports."""

from __future__ import annotations

import math

import numpy as np
import torch

from trainplan import MetricKeyMismatch, MetricNaN, PlainValue, metric_store, resolve

# Per rank: (value, weight) pairs for a weighted mean, uneven in length and weight.
MEAN_DATA = {0: [(1.0, 3), (2.0, 1)], 1: [(10.0, 7), (4.0, 2), (0.5, 5)]}
SUM_DATA = {0: [3, 4, 5], 1: [100]}  # integers, summed exactly
MAX_DATA = {0: [1.5, -2.0], 1: [7.25, 0.0]}
VECTOR_DATA = {0: [[1.0, 5.0, -1.0], [2.0, 0.0, 3.0]], 1: [[-4.0, 9.0, 0.5]]}


def log_everything() -> dict[str, object]:
    rank = torch.distributed.get_rank()
    store = metric_store(resolve())
    for value, weight in MEAN_DATA[rank]:
        store.log("loss", torch.tensor(value), weight=weight)
        store.log("loss_number", value, weight=weight)
        store.log("loss_cpu", torch.tensor(value, dtype=torch.float16), weight=weight, store_on_cpu=True)
    for value in SUM_DATA[rank]:
        store.log("samples", value, reduce="sum")
        store.log("samples_tensor", torch.tensor(value), reduce="sum")
    for value in MAX_DATA[rank]:
        store.log("peak", value, reduce="max")
        store.log("floor", torch.tensor(value), reduce="min")
    for row in VECTOR_DATA[rank]:
        store.log("vector_sum", torch.tensor(row), reduce="sum")
        store.log("vector_max", torch.tensor(row), reduce="max")
        store.log("vector_mean", torch.tensor(row), weight=2 if rank == 0 else 1)
    store.log("poisoned_max", math.nan if rank == 1 else 1.0, reduce="max")
    store.log("infinite", math.inf if rank == 0 else 1.0, reduce="sum")
    local = store.compute(sync=False)
    synced = store.compute()
    return {"local": local, "synced": synced, "collectives": store.collectives_in_last_sync}


def mismatched_keys() -> str:
    rank = torch.distributed.get_rank()
    store = metric_store(resolve())
    store.log("loss", 1.0)
    if rank == 1:
        store.log("only_on_one", 2.0)
        store.log("loss_sum", 1.0, reduce="sum")
    else:
        store.log("loss_sum", 1.0, reduce="max")
    try:
        store.compute()
    except MetricKeyMismatch as error:
        return str(error)
    return "no error"


def many_keys(count: int) -> tuple[dict[str, PlainValue], int]:
    store = metric_store(resolve())
    for index in range(count):
        store.log(f"mean_{index}", float(index), weight=1 + index % 3)
        store.log(f"max_{index}", torch.tensor(float(index)), reduce="max")
    values = store.compute()
    return values, store.collectives_in_last_sync


def stateful_mean() -> dict[str, PlainValue]:
    from torchmetrics import MeanMetric

    rank = torch.distributed.get_rank()
    metric = MeanMetric()
    store = metric_store(resolve())
    for value, weight in MEAN_DATA[rank]:
        metric.update(torch.tensor(value), weight)
        store.log("mean_metric", metric)
    return store.compute()


def hostile_metrics() -> dict[str, object]:
    """Each fault of the reliability review in one real world; every answer is reported, never raised."""
    from trainplan import MetricOverflow

    rank = torch.distributed.get_rank()
    report: dict[str, object] = {}
    # 1. compute() must not change the accumulated state (a lone tensor key's bucket was its accumulator).
    store = metric_store(resolve())
    store.log("tokens", torch.tensor([1.0, 2.0]), reduce="sum")
    report["computes"] = [store.compute(), store.compute(), store.compute(sync=False)]
    counts = metric_store(resolve())
    counts.log("n", torch.tensor(5), reduce="sum")
    first = counts.compute()
    counts.log("n", torch.tensor(1), reduce="sum")
    report["counts"] = [first, counts.compute()]
    # 2. A rank that logged nothing still takes part: both ranks get the mismatch, the next collective is clean.
    sparse = metric_store(resolve())
    if rank == 1:
        sparse.log("loss", 0.5)
    try:
        report["empty_rank"] = sparse.compute()
    except MetricKeyMismatch as error:
        report["empty_rank"] = f"MetricKeyMismatch: {error}"
    after = torch.tensor([100.0, 200.0], dtype=torch.float64)
    torch.distributed.all_reduce(after)
    report["next_collective"] = after.tolist()
    # 3. An integer sum that leaves int64 once reduced: the same typed error on every rank, never a wrap.
    for name, value in (("python", 2**62), ("tensor", torch.tensor(2**62))):
        big = metric_store(resolve())
        big.log("n", value, reduce="sum")
        try:
            report[f"overflow_{name}"] = big.compute()
        except MetricOverflow as error:
            report[f"overflow_{name}"] = f"MetricOverflow: {error}"
    final = torch.tensor([1.0])
    torch.distributed.all_reduce(final)
    report["final_collective"] = final.item()
    return report


def stateful_in_either_order() -> dict[str, PlainValue]:
    """Rank 0 logs two stateful metrics a, b; rank 1 logs b, a: they must still be reduced pairwise."""
    from torchmetrics import MaxMetric

    rank = torch.distributed.get_rank()
    first, second = MaxMetric(), MaxMetric()
    first.update(torch.tensor(1.0 + rank))
    second.update(torch.tensor(100.0 + rank))
    store = metric_store(resolve())
    for name, metric in [("a", first), ("b", second)] if rank == 0 else [("b", second), ("a", first)]:
        store.log(name, metric)
    return store.compute()


def nan_policies() -> dict[str, object]:
    """Rank 1 alone logs NaNs, each key under its own policy; every rank must see the same outcome."""
    rank = torch.distributed.get_rank()
    store = metric_store(resolve())
    nan = math.nan if rank == 1 else 1.0
    store.log("ignored", nan, weight=torch.tensor(3.0), nan="ignore")
    store.log("ignored", 2.0 + rank, weight=np.int64(1), nan="ignore")
    store.log("filled", nan, reduce="sum", nan=10.0)
    store.log("vector", torch.tensor([nan, 1.0]), reduce="sum", nan="ignore")
    store.log("checked", 1.0, nan="error")
    values: dict[str, object] = {"clean": store.compute()}
    store.log("checked", nan, nan="error")
    try:
        store.compute()
    except MetricNaN as error:
        values["error"] = (type(error).__name__, error.keys)
    return values
