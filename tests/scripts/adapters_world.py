"""Inside a 2-process `trainplan launch` world: build Lightning's Trainer, Fabric and Accelerate's Accelerator
from the plan through trainplan's adapters, and report what each framework sees."""

from __future__ import annotations

import json
import warnings

import trainplan as tp

warnings.filterwarnings("ignore")


def main() -> dict[str, object]:
    plan = tp.resolve()
    import lightning_fabric
    import pytorch_lightning

    trainer = pytorch_lightning.Trainer(
        **tp.lightning_trainer_arguments(plan), logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    fabric = lightning_fabric.Fabric(**tp.fabric_arguments(plan))
    strategy = trainer.strategy
    report: dict[str, object] = {
        "rank": plan.global_rank,
        "trainer": {
            "strategy": type(strategy).__name__,
            "ddp_kwargs": dict(getattr(strategy, "_ddp_kwargs", {})),
            "timeout": strategy._timeout.total_seconds(),
            "world_size": trainer.world_size,
            "global_rank": trainer.global_rank,
            "precision": trainer.precision,
            "accelerator": type(trainer.accelerator).__name__,
            "environment": type(strategy.cluster_environment).__name__,
        },
        "fabric": {
            "strategy": type(fabric.strategy).__name__,
            "ddp_kwargs": dict(getattr(fabric.strategy, "_ddp_kwargs", {})),
            "world_size": fabric.world_size,
            "precision": type(fabric._precision).__name__,
        },
    }
    import accelerate

    accelerator = accelerate.Accelerator(**tp.accelerator_arguments(plan))
    report["accelerate"] = {
        "distributed_type": str(accelerator.distributed_type),
        "num_processes": accelerator.num_processes,
        "process_index": accelerator.process_index,
        "mixed_precision": accelerator.mixed_precision,
        "ddp_kwargs": accelerator.ddp_handler.to_kwargs() if accelerator.ddp_handler is not None else {},
    }
    return report


if __name__ == "__main__":
    print("REPORT " + json.dumps(main()), flush=True)
