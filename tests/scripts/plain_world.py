"""One plain training script, run unchanged under torchrun, `trainplan launch` and `trainplan.launch`.

It starts no workers itself: it asks trainplan for the plan of the job it is in, joins that world, logs
a weighted mean and a sum, and calls `trainplan.launch` (which must run in place, inside the job).
"""

from __future__ import annotations

import json
import os

import trainplan as tp


def main() -> dict[str, object]:
    plan = tp.resolve()
    with tp.join(plan) as world:
        from torch import distributed

        rank = plan.cluster.global_rank
        assert rank is not None
        store = tp.metric_store(plan)
        store.log("loss", float(rank + 1), weight=rank + 1)
        store.log("tokens", 1000 * (rank + 1), reduce="sum")
        values = store.compute()
        in_place = tp.launch(plan, os.getpid)
        report: dict[str, object] = {
            "rank": rank,
            "local_rank": plan.cluster.local_rank,
            "world_size": plan.world_size,
            "group_size": distributed.get_world_size(),
            "group_rank": distributed.get_rank(),
            "launcher": plan.launcher,
            "cluster": plan.cluster.kind,
            "values": values,
            "in_place": in_place == [os.getpid()],
            "timeout": world.timeout_seconds,
            "precision": plan.precision,
        }
    return report


if __name__ == "__main__":
    print("REPORT " + json.dumps(main()), flush=True)
