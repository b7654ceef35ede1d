"""Inside a 2-process `trainplan launch` world: for the same sizes, Lightning's ModelParallelStrategy and trainplan.

For each pair of Lightning sizes: trainplan's plan for them (Lightning's spelling), Lightning's own
ModelParallelStrategy built with them as written, and Lightning's strategy built by trainplan's adapter from the
plan; each builds its mesh in this world, and the report says what each mesh is on this rank (sizes, coordinates,
the members of each group). Accelerate's ParallelismConfig, built by trainplan's adapter, builds its mesh too.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Literal

from torch import distributed
from torch.distributed.device_mesh import DeviceMesh

import trainplan as tp

warnings.filterwarnings("ignore")

SIZES: list[tuple[int | Literal["auto"], int | Literal["auto"]]] = [
    ("auto", "auto"),
    (1, 2),
    (2, 1),
    ("auto", 2),
    (1, "auto"),
    (2, "auto"),
    ("auto", 1),
    (2, 2),
]


def _described(mesh: DeviceMesh, names: list[str]) -> dict[str, object]:
    return {
        "sizes": [mesh.size(mesh.mesh_dim_names.index(name)) for name in names] if mesh.mesh_dim_names else [],
        "coordinate": [mesh.get_local_rank(name) for name in names],
        "groups": [list(distributed.get_process_group_ranks(mesh.get_group(name))) for name in names],
    }


def _set_up(trainer: Any) -> dict[str, object]:
    """Lightning's strategy sets up its environment (its mesh) as in `Trainer.fit`, for a bare LightningModule."""
    import pytorch_lightning

    strategy = trainer.strategy
    strategy.connect(pytorch_lightning.LightningModule())
    try:
        strategy.setup_environment()
    except RuntimeError as error:  # Lightning's own refusal: the sizes do not multiply to the world size
        return {"error": str(error)}
    described = _described(strategy.device_mesh, ["data_parallel", "tensor_parallel"])
    described["arguments"] = [strategy._data_parallel_size, strategy._tensor_parallel_size]
    return described


def _trainer(**arguments: Any) -> Any:
    import pytorch_lightning

    return pytorch_lightning.Trainer(**arguments, logger=False, enable_checkpointing=False, enable_progress_bar=False)


def main() -> list[dict[str, object]]:
    from pytorch_lightning.strategies import ModelParallelStrategy

    base = tp.resolve()
    cases: list[dict[str, object]] = []
    with tp.join(base):
        for data, tensor in SIZES:
            options = tp.ModelParallelOptions(data_parallel_size=data, tensor_parallel_size=tensor)
            case: dict[str, object] = {"sizes": [data, tensor], "rank": base.global_rank}
            try:
                plan = tp.resolve(tp.Request(accelerator="cpu", strategy="model_parallel", strategy_options=options))
            except tp.TrainplanError as error:
                case["trainplan"] = {"error": str(error)}
            else:
                with tp.runtime(plan) as rt:
                    case["trainplan"] = _described(rt.mesh, ["dp_shard", "tp"])
                    case["notes"] = [note.code for note in plan.notes]
                case["adapter"] = _set_up(_trainer(**tp.lightning_trainer_arguments(plan)))
                try:
                    config = tp.accelerate_parallelism_config(plan)
                except tp.MissingExtra as error:  # tensor parallelism in Accelerate needs transformers
                    case["accelerate"] = {"missing": str(error)}
                else:
                    mesh = config.build_device_mesh("cpu")
                    names = list(mesh.mesh_dim_names) if mesh is not None else []
                    case["accelerate"] = {"names": names, **(_described(mesh, ["dp_shard"]) if mesh else {})}
            strategy = ModelParallelStrategy(data_parallel_size=data, tensor_parallel_size=tensor)
            case["lightning"] = _set_up(_trainer(accelerator="cpu", devices=2, strategy=strategy))
            cases.append(case)
        distributed.barrier()
    return cases


if __name__ == "__main__":
    print("REPORT " + json.dumps(main()), flush=True)
