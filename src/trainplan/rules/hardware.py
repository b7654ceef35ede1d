"""Accelerators: what each needs, how many devices it offers, its device policy, its aliases and groups."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, TypeAlias

import attrs

from trainplan.spec.names import (
    AcceleratorFlag,
    AcceleratorKey,
    BackendKey,
)

EnvironmentCount: TypeAlias = Literal["cuda_device_count", "mps_available", "xla_device_count", "device_counts"]
"""An `Environment` fact that counts an accelerator's devices (a bool counts one; `device_counts`, the counts a
framework supplies for the accelerators it adds, is read at the accelerator's name)."""

SUPPLIED_COUNTS: Final[EnvironmentCount] = "device_counts"
"""The count fact of a downstream accelerator: the counts a framework supplies (`Environment.device_counts`), read at
the accelerator's name."""

COUNTED_THROUGH: Final[Mapping[EnvironmentCount, str]] = {"xla_device_count": "torch_xla"}
"""The package through which `probe()` counts an accelerator's devices: a machine assumed to have them has it."""

ForkBlocker: TypeAlias = Literal["cuda_initialized"]
"""An `Environment` fact after which a forked child fails (CUDA initialised in the parent cannot be forked)."""

DeviceCounts: TypeAlias = Literal["any", "one", "one_or_all"]
"""Which device counts an accelerator takes: any up to what is visible; exactly one; one or all of them (and a
single index)."""


@attrs.frozen(kw_only=True)
class AcceleratorRule:
    """An accelerator and its device policy: how `devices` is read for it."""

    name: AcceleratorKey
    description: str  # shown where the accelerator is chosen (the plan's reasons)
    auto_priority: int  # higher wins when accelerator="auto"
    default_backend: BackendKey
    device_type: str  # the torch device type string
    count_fact: EnvironmentCount | None  # the Environment fact that counts its devices; None: always one place to run
    takes_indices: bool  # whether `devices` may name device indices (False: `devices` counts processes, no -1)
    device_counts: DeviceCounts
    counts_why: str  # why other counts are refused ("" where any count is taken)
    host: bool  # the devices are the host's CPUs (a CPU-stored metric is already where it is reduced)
    interactive_auto_devices: int | None  # devices='auto' in a notebook with several devices takes this many
    visibility_variable: str | None  # the variable that hides devices (CUDA_VISIBLE_DEVICES)
    slurm_gpus: bool  # SLURM allocates its devices as GPUs (an emitted job asks --gpus-per-node for them)
    job_layout: bool  # inside a started job, devices='auto' takes the job's processes per node (local rank i → i)
    probes_usable: bool  # select_usable_gpus can pick among its devices (the usable-GPU probe)
    fork_blocked_by: ForkBlocker | None  # the Environment fact after which a forked child fails
    strategy_fix: str | None  # the fix when a strategy refuses this accelerator (None: the generic one)
    binds_device: bool = True  # a worker makes its device torch's current one (torch.cuda.set_device, a plugin's)


ACCELERATORS: Final[Mapping[AcceleratorKey, AcceleratorRule]] = {
    rule.name: rule
    for rule in (
        AcceleratorRule(
            name="xla",
            description="TPU or other XLA device through torch_xla",
            auto_priority=4,  # RFC: TPU/XLA > CUDA > MPS > CPU
            default_backend="xla",
            device_type="xla",
            count_fact="xla_device_count",
            takes_indices=True,
            device_counts="one_or_all",
            counts_why="XLA runs on one device or on all {total} of them, not {count}",
            host=False,
            interactive_auto_devices=None,
            visibility_variable=None,
            slurm_gpus=False,
            job_layout=False,
            probes_usable=False,
            fork_blocked_by=None,
            strategy_fix="Use strategy='xla' (several devices), 'xla_fsdp' (sharded), 'single_xla' or 'auto'",
            binds_device=False,
        ),
        AcceleratorRule(
            name="cuda",
            description="NVIDIA GPU through CUDA",
            auto_priority=3,
            default_backend="nccl",
            device_type="cuda",
            count_fact="cuda_device_count",
            takes_indices=True,
            device_counts="any",
            counts_why="",
            host=False,
            interactive_auto_devices=1,
            visibility_variable="CUDA_VISIBLE_DEVICES",
            slurm_gpus=True,
            job_layout=True,
            probes_usable=True,
            fork_blocked_by="cuda_initialized",
            strategy_fix=None,
        ),
        AcceleratorRule(
            name="mps",
            description="Apple-silicon GPU through Metal Performance Shaders",
            auto_priority=2,
            default_backend="gloo",
            device_type="mps",
            count_fact="mps_available",
            takes_indices=True,
            device_counts="one",
            counts_why="one MPS device (a Mac has one GPU)",
            host=False,
            interactive_auto_devices=None,
            visibility_variable=None,
            slurm_gpus=False,
            job_layout=False,
            probes_usable=False,
            fork_blocked_by=None,
            strategy_fix="Use strategy='auto' (one MPS device), or accelerator='cpu' for several processes",
            binds_device=False,
        ),
        AcceleratorRule(
            name="cpu",
            description="CPU processes",
            auto_priority=1,
            default_backend="gloo",
            device_type="cpu",
            # CPU processes have no device index; `devices` counts processes.
            count_fact=None,
            takes_indices=False,
            device_counts="any",
            counts_why="",
            host=True,
            interactive_auto_devices=None,
            visibility_variable=None,
            slurm_gpus=False,
            job_layout=True,
            probes_usable=False,
            fork_blocked_by=None,
            strategy_fix=None,
            binds_device=False,
        ),
    )
}

ACCELERATOR_ALIASES: Final[Mapping[str, AcceleratorFlag]] = {
    "tpu": "xla",  # Lightning's older name for the XLA accelerator
    "gpus": "gpu",
    "nvidia": "cuda",
}
"""Spellings normalised to a flag before validation (case is folded first)."""

ACCELERATOR_ALIAS_NOTES: Final[Mapping[str, str]] = {"tpu": "accelerator='tpu' means 'xla'; write 'xla'"}
"""Aliases whose use the plan notes as a deprecation (by the spelling given, case folded)."""


GPU_ACCELERATORS: Final[tuple[AcceleratorKey, ...]] = ("cuda", "mps")
"""What `accelerator="gpu"` may become, in order of preference (the first available wins)."""

ACCELERATOR_GROUPS: Final[Mapping[str, tuple[AcceleratorKey, ...]]] = {"gpu": GPU_ACCELERATORS}
"""Flags that name a group of accelerators: the first available of the group is chosen."""


def auto_order_key(rule: AcceleratorRule) -> int:
    """Where `rule` stands in the order accelerator='auto' tries (a sort key: the highest priority first)."""
    return -rule.auto_priority
