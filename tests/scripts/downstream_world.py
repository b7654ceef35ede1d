"""A training script of a downstream framework's strategy, run under `trainplan launch --rules` and an emitted
torchrun line: `trainplan.resolve()` must plan with the framework's rule set (which the launcher or the job names),
join the world over gloo and reduce across it."""

from __future__ import annotations

import json

import trainplan as tp


def main() -> dict[str, object]:
    plan = tp.resolve()
    with tp.join(plan):
        import torch
        from torch import distributed

        rank = plan.cluster.global_rank
        assert rank is not None
        total = torch.tensor([float(rank + 1)])
        distributed.all_reduce(total)
        return {
            "rank": rank,
            "world_size": plan.world_size,
            "strategy": plan.strategy.name,
            "options": repr(plan.strategy.options),
            "precision": plan.precision,
            "rules": plan.rules,
            "cluster": plan.cluster.kind,
            "backend": distributed.get_backend(),
            "sum": total.item(),
        }


if __name__ == "__main__":
    print("REPORT " + json.dumps(main()), flush=True)
