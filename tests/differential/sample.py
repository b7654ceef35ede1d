"""The sample of requests × environments on which trainplan is compared with Lightning's connector."""

from __future__ import annotations

import itertools
import random
from typing import Any, Literal, TypeAlias

from trainplan import Environment, ModelParallelOptions, Request

SLURM_TASK = {
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_NNODES": "1",
    "SLURM_PROCID": "1",
    "SLURM_STEP_ID": "0",  # an srun task (the batch script and salloc's shell have none)
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_JOB_NAME": "train",
    "SLURM_JOB_ID": "5555",
    "SLURM_NODELIST": "gpu[01]",
}
TORCHRUN_WORKER = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "GROUP_RANK": "0",
    "LOCAL_WORLD_SIZE": "2",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "x",
}

ACCELERATORS = ("auto", "cpu", "cuda", "gpu")
STRATEGIES = (
    "auto",
    "ddp",
    "ddp_spawn",
    "ddp_fork",
    "ddp_notebook",
    "ddp_find_unused_parameters_true",
    "fsdp",
    "deepspeed",
    "dp",
    "single_device",
)
DEVICES: tuple[Any, ...] = ("auto", 1, 2, 3, -1, [0], [1], "0,1", "1,")
NODES = (1, 2)
PRECISIONS: tuple[Any, ...] = ("32-true", "16-mixed", "bf16-mixed", "64-true", 16, "bf16", "16-true")
CUDA_COUNTS = (0, 1, 2, 4)
VARIABLES: tuple[dict[str, str], ...] = ({}, SLURM_TASK, TORCHRUN_WORKER, {**SLURM_TASK, "SLURM_JOB_NAME": "bash"})


def sample(size: int, seed: int = 20261130) -> list[tuple[dict[str, Any], Environment]]:
    """A reproducible sample of (flags, environment) pairs."""
    space = list(
        itertools.product(
            ACCELERATORS, STRATEGIES, DEVICES, NODES, PRECISIONS, CUDA_COUNTS, (False, True), range(len(VARIABLES))
        )
    )
    chosen = random.Random(seed).sample(space, size)
    cases = []
    for accelerator, strategy, devices, nodes, precision, cuda, interactive, variables in chosen:
        flags = {
            "accelerator": accelerator,
            "strategy": strategy,
            "devices": devices,
            "num_nodes": nodes,
            "precision": precision,
        }
        env = Environment(cuda_device_count=cuda, cpu_count=8, interactive=interactive, variables=VARIABLES[variables])
        cases.append((flags, env))
    return cases


Size: TypeAlias = int | Literal["auto"]

LIGHTNING_SIZES: tuple[tuple[Size, Size] | None, ...] = (
    None,
    ("auto", "auto"),
    (2, "auto"),
    ("auto", 2),
    (1, 2),
    (2, 2),
    (4, 1),
    (1, 4),
)
"""ModelParallelStrategy's (data_parallel_size, tensor_parallel_size), or None: the strategy without sizes."""


def model_parallel_sample() -> list[tuple[dict[str, Any], Environment]]:
    """Every model_parallel request Lightning can spell (its two sizes, or none) on 1-2 nodes of 2-8 GPUs."""
    cases = []
    for sizes, nodes, cuda, devices, precision in itertools.product(
        LIGHTNING_SIZES, (1, 2), (2, 4, 8), ("auto", 2, 4), ("32-true", "bf16-mixed", "16-mixed", "64-true", "16-true")
    ):
        flags: dict[str, Any] = {
            "accelerator": "cuda",
            "strategy": "model_parallel",
            "devices": devices,
            "num_nodes": nodes,
            "precision": precision,
        }
        if sizes is not None:
            flags["strategy_options"] = ModelParallelOptions(data_parallel_size=sizes[0], tensor_parallel_size=sizes[1])
        cases.append((flags, Environment(cuda_device_count=cuda, cpu_count=8)))
    return cases


def request_for(flags: dict[str, Any]) -> Request:
    return Request(**flags)
