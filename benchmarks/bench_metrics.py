"""Metric sync and log() cost on 2 gloo processes: ours vs Lightning's `_ResultCollection` (sync_dist=True)
vs one torchmetrics `MeanMetric` per key, for 1, 10 and 100 keys, in one run.

Each worker logs `STEPS` values per key (weighted means), then computes once with sync; collectives are
counted by wrapping torch.distributed's entry points inside the workers (benchmark only).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from benchmarks.common import Row, human
from trainplan import Environment, Request, launch, metric_store
from trainplan import resolve as resolve_here
from trainplan.resolve import resolve

KEYS = (1, 10, 100)
STEPS = 20
REPEATS = 9
COUNTED = ("all_reduce", "all_gather", "all_gather_into_tensor", "barrier", "broadcast", "reduce_scatter")


def _count_collectives() -> dict[str, int]:
    from torch import distributed

    counts = {"calls": 0}
    for name in COUNTED:
        original = getattr(distributed, name)

        def counted(*args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            counts["calls"] += 1
            return _original(*args, **kwargs)

        setattr(distributed, name, counted)
    return counts


def _ours(keys: int, values: list[Any], counts: dict[str, int]) -> tuple[float, float, int]:
    store = metric_store(resolve_here())
    start = time.perf_counter()
    for step in range(STEPS):
        for key in range(keys):
            store.log(f"k{key}", values[step], weight=8)
    log_time = (time.perf_counter() - start) / (STEPS * keys)
    before = counts["calls"]
    start = time.perf_counter()
    store.compute()
    return log_time, time.perf_counter() - start, counts["calls"] - before


def _lightning(keys: int, values: list[Any], counts: dict[str, int]) -> tuple[float, float, int]:
    from lightning_fabric.utilities.distributed import _sync_ddp_if_available
    from pytorch_lightning.trainer.connectors.logger_connector.result import _ResultCollection

    results = _ResultCollection(training=True)
    start = time.perf_counter()
    for step in range(STEPS):
        for key in range(keys):
            results.log(
                "training_step",
                f"k{key}",
                values[step],
                on_step=False,
                on_epoch=True,
                sync_dist=True,
                sync_dist_fn=_sync_ddp_if_available,
                batch_size=8,
            )
    log_time = (time.perf_counter() - start) / (STEPS * keys)
    before = counts["calls"]
    start = time.perf_counter()
    results.metrics(on_step=False)
    return log_time, time.perf_counter() - start, counts["calls"] - before


def _torchmetrics(keys: int, values: list[Any], counts: dict[str, int]) -> tuple[float, float, int]:
    from torchmetrics import MeanMetric

    metrics = [MeanMetric() for _ in range(keys)]
    start = time.perf_counter()
    for step in range(STEPS):
        for metric in metrics:
            metric.update(values[step], 8)
    log_time = (time.perf_counter() - start) / (STEPS * keys)
    before = counts["calls"]
    start = time.perf_counter()
    for metric in metrics:
        metric.compute()
    return log_time, time.perf_counter() - start, counts["calls"] - before


def worker() -> dict[str, dict[int, tuple[float, float, int]]]:
    import torch

    counts = _count_collectives()
    values = [torch.tensor(float(step)) for step in range(STEPS)]
    report: dict[str, dict[int, tuple[float, float, int]]] = {}
    contenders = (("ours", _ours), ("lightning", _lightning), ("torchmetrics", _torchmetrics))
    for _, run in contenders:  # warm up: first collectives, lazy imports, allocator
        run(10, values, counts)
    for name, run in contenders:
        report[name] = {}
        for keys in KEYS:
            runs = [run(keys, values, counts) for _ in range(REPEATS)]
            # Best of the repeats, for every contender alike: two processes share two cores here, and a
            # descheduled rank stalls the collective of the other.
            report[name][keys] = (min(item[0] for item in runs), min(item[1] for item in runs), runs[-1][2])
    return report


def run() -> list[Row]:
    plan = resolve(Request(accelerator="cpu", strategy="ddp_fork", devices=2), Environment(cpu_count=2))
    report = launch(plan, partial(worker))[0]
    rows = []
    for keys in KEYS:
        ours_log, ours_sync, ours_calls = report["ours"][keys]
        anchors = (
            ("lightning", "Lightning `_ResultCollection` (sync_dist)"),
            ("torchmetrics", "torchmetrics `MeanMetric` per key"),
        )
        for anchor, label in anchors:
            log_time, sync_time, calls = report[anchor][keys]
            rows.append(
                Row(
                    f"synced compute(), {keys} key(s): time (collectives {ours_calls} vs {calls})",
                    human(ours_sync),
                    human(sync_time),
                    label,
                    sync_time / ours_sync,
                    "≥ 10× vs Lightning at 100 keys" if anchor == "lightning" and keys == 100 else "—",
                )
            )
        log_time, _, _ = report["lightning"][keys]
        rows.append(
            Row(
                f"log() of a 0-d tensor, {keys} key(s)",
                human(ours_log),
                human(log_time),
                "Lightning `_ResultCollection.log`",
                log_time / ours_log,
                "≥ 5×",
            )
        )
    return rows
