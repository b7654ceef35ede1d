"""Metric reduction in real 2-process gloo worlds: exact against the single-process computation."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests import metric_workers
from tests.metric_workers import MAX_DATA, MEAN_DATA, SUM_DATA, VECTOR_DATA
from trainplan import Environment, Plan, Request, WorkerFailed, launch, launch_with
from trainplan.resolve import resolve

pytestmark = pytest.mark.processes


def world(strategy: str = "ddp_fork") -> Plan:
    return resolve(Request(accelerator="cpu", strategy=strategy, devices=2), Environment(cpu_count=4))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def reports() -> list[dict[str, Any]]:
    return launch_with(world(), metric_workers.log_everything, timeout=120)


def test_weighted_mean_is_the_mean_over_all_ranks_data(reports: list[dict[str, Any]]) -> None:
    pairs = MEAN_DATA[0] + MEAN_DATA[1]
    expected = sum(value * weight for value, weight in pairs) / sum(weight for _, weight in pairs)
    for report in reports:
        assert report["synced"]["loss"] == pytest.approx(expected, abs=1e-12)
        assert report["synced"]["loss_number"] == pytest.approx(expected, abs=1e-12)
        assert report["synced"]["loss_cpu"] == pytest.approx(expected, abs=1e-12)


def test_integer_sums_are_exact(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        assert report["synced"]["samples"] == sum(SUM_DATA[0] + SUM_DATA[1])
        assert isinstance(report["synced"]["samples"], int)
        assert report["synced"]["samples_tensor"] == sum(SUM_DATA[0] + SUM_DATA[1])


def test_max_and_min(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        assert report["synced"]["peak"] == max(MAX_DATA[0] + MAX_DATA[1])
        assert report["synced"]["floor"] == min(MAX_DATA[0] + MAX_DATA[1])


def test_nd_tensors_reduce_per_element(reports: list[dict[str, Any]]) -> None:
    rows = VECTOR_DATA[0] + VECTOR_DATA[1]
    weights = [2] * len(VECTOR_DATA[0]) + [1] * len(VECTOR_DATA[1])
    for report in reports:
        assert report["synced"]["vector_sum"] == [sum(column) for column in zip(*rows, strict=True)]
        assert report["synced"]["vector_max"] == [max(column) for column in zip(*rows, strict=True)]
        expected = [
            sum(value * weight for value, weight in zip(column, weights, strict=True)) / sum(weights)
            for column in zip(*rows, strict=True)
        ]
        assert report["synced"]["vector_mean"] == pytest.approx(expected)


def test_nan_and_inf_propagate(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        assert math.isnan(report["synced"]["poisoned_max"])
        assert report["synced"]["infinite"] == math.inf
    assert reports[0]["local"]["poisoned_max"] == 1.0 and math.isnan(reports[1]["local"]["poisoned_max"])


def test_local_values_without_sync(reports: list[dict[str, Any]]) -> None:
    assert reports[0]["local"]["samples"] == sum(SUM_DATA[0])
    assert reports[1]["local"]["samples"] == sum(SUM_DATA[1])


def test_one_collective_per_bucket_the_key_check_carrying_the_small_sum(reports: list[dict[str, Any]]) -> None:
    # Buckets: sum/float64 (carried by the key check), sum/int64, max/float64, min/float64 on cpu.
    assert {report["collectives"] for report in reports} == {4}


def test_collectives_do_not_grow_with_keys() -> None:
    small = launch(world(), metric_workers.many_keys, 1)
    large = launch(world(), metric_workers.many_keys, 100)
    assert small[0][1] == 2  # the key check carrying the sum bucket, the max bucket
    assert large[0][1] == 3  # the sum bucket (200 elements) is too large to be carried: a collective of its own
    values = large[0][0]
    assert values["max_99"] == 99.0 and values["mean_4"] == pytest.approx(4.0)


def test_nan_policies_are_applied_alike_on_every_rank() -> None:
    """Rank 1 alone logs NaNs: 'ignore' leaves them out (the weighted mean of the rest, weights a 0-d tensor and a
    numpy scalar), a fill value replaces them, and 'error' raises MetricNaN on both ranks, not only on rank 1."""
    reports = launch_with(world(), metric_workers.nan_policies, timeout=120)
    for report in reports:
        clean = report["clean"]
        assert isinstance(clean, dict)
        assert clean["ignored"] == pytest.approx((1.0 * 3 + 2.0 * 1 + 3.0 * 1) / 5)
        assert clean["filled"] == 11.0 and clean["vector"] == [1.0, 2.0] and clean["checked"] == 1.0
        assert report["error"] == ("MetricNaN", ["checked"])


def test_different_keys_raise_on_every_rank_without_hanging() -> None:
    messages = launch_with(world(), metric_workers.mismatched_keys, timeout=60)
    for message in messages:
        assert "'only_on_one' is missing on rank(s) [0]" in message
        assert "'loss_sum' is logged with another reduce op" in message


def test_stateful_metric_is_reduced_by_itself() -> None:
    pytest.importorskip("torchmetrics")
    pairs = MEAN_DATA[0] + MEAN_DATA[1]
    expected = sum(value * weight for value, weight in pairs) / sum(weight for _, weight in pairs)
    for values in launch(world(), metric_workers.stateful_mean):
        assert values["mean_metric"] == pytest.approx(expected)


def test_a_failing_metric_worker_is_reported() -> None:
    with pytest.raises(WorkerFailed):
        launch(world(), metric_workers.many_keys, "not a number")


def test_hostile_metric_cases_in_a_real_world() -> None:
    reports = launch_with(world(), metric_workers.hostile_metrics, timeout=120)
    for rank, report in enumerate(reports):
        assert report["computes"] == [{"tokens": [2.0, 4.0]}, {"tokens": [2.0, 4.0]}, {"tokens": [1.0, 2.0]}], rank
        assert report["counts"] == [{"n": 10}, {"n": 12}]
        empty = str(report["empty_rank"])
        assert empty.startswith("MetricKeyMismatch: ") and "'loss' is missing on rank(s) [0]" in empty
        assert report["next_collective"] == [200.0, 400.0], "nothing paired with a stray check"
        for name in ("python", "tensor"):
            assert str(report[f"overflow_{name}"]).startswith("MetricOverflow: "), report
        assert report["final_collective"] == 2.0


def test_stateful_metrics_logged_in_another_order_reduce_pairwise() -> None:
    pytest.importorskip("torchmetrics")
    assert launch(world(), metric_workers.stateful_in_either_order) == [{"a": 2.0, "b": 101.0}] * 2
