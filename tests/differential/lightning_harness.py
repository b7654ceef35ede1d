"""Build PyTorch Lightning's `_AcceleratorConnector` for a (request, environment) and describe its answer
in trainplan's terms. Lightning reads the machine itself, so the environment is simulated the way
Lightning's own test-suite does it: its CUDA device count and interactive flag are patched, and the
cluster's variables are set in `os.environ` (all undone afterwards).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import pytest

from trainplan import Environment, Plan, Request, TrainplanError
from trainplan.resolve import resolve
from trainplan.rules import LIGHTNING_SIZES, RELEVANT_VARIABLE_PREFIXES, RELEVANT_VARIABLES


@attrs.frozen
class Outcome:
    """What a connector decided, in comparable terms (or that it refused)."""

    error: bool
    accelerator: str | None = None
    family: str | None = None
    devices: tuple[int, ...] | None = None
    num_nodes: int | None = None
    world_size: int | None = None
    launcher: str | None = None
    cluster: str | None = None
    precision: str | None = None
    mesh: tuple[int, ...] | None = None
    """ModelParallelStrategy's (data parallel, tensor parallel) sizes; trainplan's whole mesh shape where it uses a
    dimension Lightning has no size for; None for other strategies."""


def ours(request: Request, env: Environment) -> Outcome:
    try:
        plan: Plan = resolve(request, env)
    except TrainplanError:
        return Outcome(error=True)
    launcher = plan.launcher
    return Outcome(
        error=False,
        accelerator=plan.accelerator,
        family=plan.strategy.family,
        devices=plan.devices,
        num_nodes=plan.num_nodes,
        world_size=plan.world_size,
        launcher=launcher,
        cluster=plan.cluster.kind,
        precision=plan.precision,
        mesh=None if plan.mesh is None else _lightning_sizes(plan),
    )


def _lightning_sizes(plan: Plan) -> tuple[int, ...]:
    mesh = plan.mesh
    assert mesh is not None
    named = {size.dimension for size in LIGHTNING_SIZES}
    if any(mesh.size(name) > 1 for name in mesh.dimensions if name not in named):
        return mesh.shape
    return tuple(mesh.size(size.dimension) for size in LIGHTNING_SIZES)


def _lightning_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The connector's arguments: a `model_parallel` request's Lightning sizes become its `ModelParallelStrategy`."""
    given = dict(flags)
    options = given.pop("strategy_options", None)
    if given.get("strategy") == "model_parallel":
        from pytorch_lightning.strategies import ModelParallelStrategy

        sizes = {
            size.argument: "auto" if getattr(options, size.argument, None) is None else getattr(options, size.argument)
            for size in LIGHTNING_SIZES
        }
        given["strategy"] = ModelParallelStrategy(**sizes)
    elif options is not None:
        raise ValueError(f"the harness passes no strategy options but a model_parallel request's: {options!r}")
    return given


def _set_up_sizes(strategy: Any) -> tuple[int, int] | None:
    """ModelParallelStrategy.setup_environment's sizes (Lightning 2.x): an 'auto' data-parallel size is the number of
    nodes, an 'auto' tensor-parallel size the processes per node, and the two must multiply to the world size or
    `_setup_device_mesh` raises (None here: the run fails when it starts)."""
    data = strategy.num_nodes if strategy._data_parallel_size == "auto" else strategy._data_parallel_size
    tensor = strategy.num_processes if strategy._tensor_parallel_size == "auto" else strategy._tensor_parallel_size
    return (data, tensor) if data * tensor == strategy.world_size else None


@contextlib.contextmanager
def simulated(monkeypatch: pytest.MonkeyPatch, env: Environment) -> Iterator[None]:
    import lightning_fabric.accelerators.cuda as fabric_cuda
    import pytorch_lightning.accelerators.cuda as lightning_cuda
    import pytorch_lightning.trainer.connectors.accelerator_connector as connector_module

    with monkeypatch.context() as patch:
        patch.setattr(fabric_cuda, "num_cuda_devices", lambda: env.cuda_device_count)
        patch.setattr(lightning_cuda, "num_cuda_devices", lambda: env.cuda_device_count)
        patch.setattr(connector_module, "_IS_INTERACTIVE", env.interactive)
        for key in list(os.environ):
            if key in RELEVANT_VARIABLES or key.startswith(RELEVANT_VARIABLE_PREFIXES):
                patch.delenv(key)
        for key, value in env.variables.items():
            patch.setenv(key, value)
        yield


_ACCELERATORS = {"CPUAccelerator": "cpu", "CUDAAccelerator": "cuda", "MPSAccelerator": "mps", "XLAAccelerator": "xla"}
_FAMILIES = {
    "SingleDeviceStrategy": "single_device",
    "ModelParallelStrategy": "model_parallel",
    "DDPStrategy": "ddp",
    "FSDPStrategy": "fsdp",
    "DeepSpeedStrategy": "deepspeed",
    "XLAStrategy": "xla",
    "SingleDeviceXLAStrategy": "single_xla",
}
_CLUSTERS = {
    "LightningEnvironment": "local",
    "SLURMEnvironment": "slurm",
    "TorchElasticEnvironment": "torchelastic",
    "LSFEnvironment": "lsf",
    "MPIEnvironment": "mpi",
    "KubeflowEnvironment": "kubeflow",
}


def lightning(monkeypatch: pytest.MonkeyPatch, flags: Mapping[str, Any], env: Environment) -> Outcome:
    from pytorch_lightning.trainer.connectors.accelerator_connector import _AcceleratorConnector

    with simulated(monkeypatch, env), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            connector = _AcceleratorConnector(**_lightning_flags(flags))
        except Exception:  # Lightning raises ValueError, MisconfigurationException, RuntimeError, ...
            return Outcome(error=True)
        strategy = connector.strategy
        cluster = _CLUSTERS.get(
            type(connector.cluster_environment).__name__, type(connector.cluster_environment).__name__
        )
        launcher_object = strategy.launcher
        if launcher_object is None:
            external = getattr(connector.cluster_environment, "creates_processes_externally", False)
            launcher = "external" if external and hasattr(strategy, "parallel_devices") else "none"
        else:
            name = type(launcher_object).__name__
            launcher = {"_SubprocessScriptLauncher": "subprocess", "_XLALauncher": "xla"}.get(name, name)
            if name == "_SubprocessScriptLauncher" and connector.cluster_environment.creates_processes_externally:
                launcher = "external"  # Lightning keeps the launcher object but it starts nothing
            if name == "_MultiProcessingLauncher":
                launcher = "fork" if launcher_object._start_method in ("fork", "forkserver") else "spawn"
        if hasattr(strategy, "parallel_devices") and strategy.parallel_devices:
            devices = tuple(
                device.index if device.index is not None else number
                for number, device in enumerate(strategy.parallel_devices)
            )
            world = strategy.num_nodes * len(devices)
            nodes = strategy.num_nodes
        else:
            root = strategy.root_device
            devices = (root.index if root.index is not None else 0,)
            world, nodes = 1, 1
        mesh = None
        if type(strategy).__name__ == "ModelParallelStrategy":
            mesh = _set_up_sizes(strategy)
            if mesh is None:
                return Outcome(error=True)
        return Outcome(
            error=False,
            mesh=mesh,
            accelerator=_ACCELERATORS.get(type(connector.accelerator).__name__, type(connector.accelerator).__name__),
            family=_FAMILIES.get(type(strategy).__name__, type(strategy).__name__),
            devices=devices,
            num_nodes=nodes,
            world_size=world,
            launcher=launcher,
            cluster=cluster,
            precision=str(connector.precision_plugin.precision),
        )
