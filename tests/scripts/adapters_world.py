"""Inside a 2-process `trainplan launch` world: build Lightning's Trainer, Fabric and Accelerate's Accelerator
from the plan through trainplan's adapters, and report what each framework sees.

Then, for every option row (`tests.option_witnesses`: derived from the rows), build the objects of its witness plan
and of its baseline (the option at its default) and report what each holds where the row spells the option: torch's
DistributedDataParallel (from the runtime, from Fabric's `setup_module` and from Accelerate's `prepare`) or FSDP
(the runtime's wrapper), the device mesh, Lightning's and Fabric's strategy, Accelerate's handlers and plugins,
DeepSpeed's config; or the refusal, by rule."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

import trainplan as tp
from tests.option_witnesses import Witness

warnings.filterwarnings("ignore")


def main() -> dict[str, object]:
    plan = tp.resolve()
    world = tp.join(plan)  # the plan's process group: its timeout is the strategy's option
    import lightning_fabric
    import pytorch_lightning
    import torch

    trainer = pytorch_lightning.Trainer(
        **tp.lightning_trainer_arguments(plan), logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    fabric = lightning_fabric.Fabric(**tp.fabric_arguments(plan))
    strategy = trainer.strategy
    group = torch.distributed.distributed_c10d._get_default_group()
    report: dict[str, object] = {
        "rank": plan.global_rank,
        "process_group_timeout": group._get_backend(torch.device("cpu")).options._timeout.total_seconds(),
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
        "timeout": accelerator.init_handler.timeout.total_seconds(),
    }
    report["options"] = options_report(world)
    world.leave()
    return report


# --------------------------------------------------------------------------------------------------
# Every option row, in the frameworks' own objects


def options_report(world: Any) -> dict[str, dict[str, object]]:
    from tests.option_witnesses import spelled_keys, witness
    from trainplan.rules import OPTION_TARGETS_OF, spellings

    rules = tp.BUILTIN_RULES
    report: dict[str, dict[str, object]] = {}
    for rows in rules.options.values():
        for row in rows:
            found = witness(row, rules)
            if found is None:
                report[f"{row.family}.{row.name}"] = {}
                continue
            seen: dict[str, object] = {}
            for target in spellings(row):
                if target not in OPTION_TARGETS_OF[row.family]:
                    continue
                keys = spelled_keys(row, target, rules.options[row.family])
                seen[target] = {
                    "witness": _read(target, keys, found, found.request, world),
                    "baseline": _read(target, keys, found, found.baseline, world),
                }
            report[found.name] = seen
    return report


def _read(target: str, keys: tuple[str, ...], found: Witness, request: tp.Request, world: Any) -> object:
    """What the objects `target` builds for the request's plan hold at `keys` (repr), or why none was built."""
    plan = tp.resolve(request) if found.accelerator == "cpu" else tp.resolve(request, found.env)
    try:
        readers = _objects(target, plan, world, found)
    except tp.Incompatible as refusal:
        return {"refused": refusal.rule, "message": str(refusal)}
    except tp.MissingExtra as missing:
        return {"missing": str(missing)}
    if isinstance(readers, str):
        return {"unbuilt": readers}
    read = {name: {key: reader(key) for key in keys} for name, reader in readers.items()}
    return {
        name: {key: repr(value) for key, value in values.items() if value is not _NOT_HERE}
        for name, values in read.items()
    }


_ABSENT = "<absent>"
_NOT_HERE = object()  # a key of another of Accelerate's objects


def _attribute(holder: object) -> Callable[[str], object]:
    """A key read off an object: its attribute, else its private one (Lightning keeps `_timeout`), else a
    keyword it stores for later (Lightning's `_ddp_kwargs`, Accelerate's handlers)."""

    def read(key: str) -> object:
        field = key.rpartition(".")[2]
        stored = getattr(holder, "_ddp_kwargs", None)
        if isinstance(stored, dict) and field in stored:
            return stored[field]
        for name in (field, f"_{field}"):
            if hasattr(holder, name):
                return getattr(holder, name)
        return _ABSENT

    return read


def _handler(name: str, holder: object) -> Callable[[str], object]:
    """An Accelerate handler's or plugin's fields, read where a key names it (`DeepSpeedPlugin.zero_stage`)."""
    read = _attribute(holder)
    return lambda key: read(key) if key.partition(".")[0] == name else _NOT_HERE


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))


def _objects(target: str, plan: tp.Plan, world: Any, found: Witness) -> dict[str, Callable[[str], object]] | str:
    """The objects `target` builds for the plan, each as a reader of keys; a text where none can be built here."""
    from trainplan.effects.runtime import Runtime, TorchWrappers
    from trainplan.mapping.frameworks import deepspeed_config, family_recipe, option_keywords

    wrapper = family_recipe(plan).wrapper
    if target == "torch":
        if wrapper == "mesh":
            if found.accelerator != "cpu":
                return "a CUDA plan's mesh: this machine has no GPU (its degrees are checked from the plan)"
            runtime = Runtime(plan, world)
            mesh, expert, stages = runtime.mesh, runtime.expert_mesh, runtime.pipeline
            sizes: dict[str, object] = dict(zip(mesh.mesh_dim_names or (), mesh.shape, strict=True))
            # ep is the expert mesh's, the pipeline options torch's schedule's: read off the objects torch built.
            sizes["expert"] = dict(zip(expert.mesh_dim_names or (), expert.shape, strict=True))
            sizes["pipeline"] = (stages.schedule_class.__name__, stages.microbatches, stages.num_stages)
            return {"DeviceMesh": _mesh(sizes, None)}
        if found.accelerator == "cpu":  # the runtime's own DDP, and the one Fabric's strategy builds
            import lightning_fabric

            ddp = Runtime(plan, world).wrap(_model())
            fabric = lightning_fabric.Fabric(**tp.fabric_arguments(plan))
            fabric.launch()
            fabric_ddp = fabric.setup_module(_model())._forward_module
            return {"runtime's DDP": _attribute(ddp), "Fabric's DDP": _attribute(fabric_ddp)}
        import torch

        keywords = option_keywords(plan, "torch", "torch", tp.BUILTIN_RULES)
        module = TorchWrappers().fsdp(_model(), torch.device("cpu"), keywords)  # over gloo: the world's CPUs
        return {"runtime's FSDP": _attribute(module)}
    if target == "lightning":
        parallelize = (lambda model, mesh: model) if plan.mesh is not None else None
        trainer = tp.lightning_trainer_arguments(plan)["strategy"]
        fabric = tp.fabric_arguments(plan, parallelize=parallelize)["strategy"]
        if plan.mesh is not None:
            return {"trainer": _lightning_mesh(trainer), "fabric": _lightning_mesh(fabric)}
        return {"trainer": _attribute(trainer), "fabric": _attribute(fabric)}
    if target == "accelerate":
        import accelerate

        arguments = tp.accelerator_arguments(plan)
        handlers = {type(handler).__name__: handler for handler in arguments["kwargs_handlers"]}
        handlers.update(
            (type(plugin).__name__, plugin) for name, plugin in arguments.items() if name.endswith("_plugin")
        )
        readers = {name: _handler(name, holder) for name, holder in handlers.items()}
        if plan.mesh is not None:
            config = arguments["parallelism_config"]
            sizes = {"dp_replicate": config.dp_replicate_size, "dp_shard": config.dp_shard_size, "cp": config.cp_size}
            mesh_sizes = {**sizes, "tp": config.tp_size}
            readers["ParallelismConfig"] = lambda key: mesh_sizes if key == "mesh" else _NOT_HERE
            if config.cp_handler is not None:  # context parallelism's rotate method: Accelerate's cp_comm_strategy
                readers["TorchContextParallelConfig"] = _handler("TorchContextParallelConfig", config.cp_handler)
        if found.accelerator == "cpu":  # the DDP Accelerate's `prepare` builds
            # Accelerate's state is one per process (the job's plan made it at another precision): made again.
            accelerate.state.AcceleratorState._reset_state()
            prepared = accelerate.Accelerator(**arguments).prepare(_model())
            readers["Accelerate's DDP"] = _handler("DistributedDataParallelKwargs", prepared)
        return readers
    config = deepspeed_config(plan)

    def at(path: str) -> object:
        value: object = config
        for part in path.split("."):
            value = value.get(part, _ABSENT) if isinstance(value, dict) else _ABSENT
        return value

    return {"config": at}


def _mesh(sizes: dict[str, object], holder: object) -> Callable[[str], object]:
    """A mesh's sizes, read as the key `mesh` (a degree's); any other key off `holder` (none: absent)."""
    read = _attribute(holder) if holder is not None else (lambda key: _ABSENT)
    return lambda key: sizes if key == "mesh" else read(key)


def _lightning_mesh(strategy: object) -> Callable[[str], object]:
    """Lightning's ModelParallelStrategy: its two sizes (the mesh), and its other keywords (its timeout)."""
    sizes = {name: getattr(strategy, f"_{name}", _ABSENT) for name in ("data_parallel_size", "tensor_parallel_size")}
    return _mesh(sizes, strategy)


if __name__ == "__main__":
    print("REPORT " + json.dumps(main()), flush=True)
