"""Context parallelism's options reach torch, in a real 2-process CPU world over gloo: inside the runtime's
`context_parallel` each rank holds the shard of its sequence the plan's load balancer gives (head-tail: rank r holds
chunks r and 2·cp - 1 - r of 2·cp; none: the r-th block), torch's rotate method is the plan's, and after it the
buffer is whole again and torch's settings are as they were."""

from __future__ import annotations

import json
from typing import Any

import pytest

import trainplan as tp
from tests.scripts import context_parallel_world

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def reports() -> list[dict[str, Any]]:
    plan = tp.resolve(tp.Request(accelerator="cpu", devices=2, strategy="ddp"), tp.Environment(cpu_count=2))
    found = tp.launch_with(plan, context_parallel_world.report, timeout=120)
    return [json.loads(json.dumps(report)) for report in found]


def test_the_load_balancer_decides_each_ranks_shard(reports: list[dict[str, Any]]) -> None:
    assert reports[0]["head_tail"]["shard"] == [0.0, 1.0, 6.0, 7.0]
    assert reports[1]["head_tail"]["shard"] == [2.0, 3.0, 4.0, 5.0]
    assert reports[0]["none"]["shard"] == [0.0, 1.0, 2.0, 3.0]
    assert reports[1]["none"]["shard"] == [4.0, 5.0, 6.0, 7.0]


def test_the_rotate_method_is_the_plans_inside_and_torchs_own_after(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        assert (report["head_tail"]["rotate"], report["head_tail"]["load_balance"]) == ("ALL_TO_ALL", True)
        assert (report["none"]["rotate"], report["none"]["load_balance"]) == ("ALL_GATHER", False)
        assert report["after"] == report["before"] == ["ALL_GATHER", True], "torch's settings put back"
        whole = [float(token) for token in range(context_parallel_world.SEQUENCE)]
        assert report["head_tail"]["after"] == report["none"]["after"] == whole, "the buffer is whole again"
