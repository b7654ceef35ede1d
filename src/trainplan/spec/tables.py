"""The rules, as data. Everything that decides what may be combined with what lives in this module.

The resolver reads these tables through one lookup site (`lookup`), so a missing key becomes a
domain error naming it rather than a bare `KeyError`. `trainplan matrix` and the README's
compatibility table are generated from the same data; nothing here is repeated by hand elsewhere.

Each row carries a provenance comment where the reason is not obvious. Reference behaviour is
PyTorch Lightning 2.x's accelerator connector; deliberate differences are listed in `DIFFERENCES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, TypeAlias, TypeVar

import attrs

from trainplan.spec.errors import TrainplanError
from trainplan.spec.frozen import freeze_nested_maps
from trainplan.spec.names import (
    STRATEGY_NAMES,
    AcceleratorFlag,
    AcceleratorKey,
    AcceleratorName,
    BackendKey,
    BackendName,
    ClusterFlag,
    ClusterName,
    LauncherName,
    MeshDimension,
    MetricsStore,
    PrecisionFlag,
    PrecisionKey,
    PrecisionName,
    StartMethod,
    StrategyFamily,
    StrategyKey,
    StrategyName,
)
from trainplan.spec.options import DDPOptions, DeepSpeedOptions, FSDPOptions, ModelParallelOptions

K = TypeVar("K")
V = TypeVar("V")


class MissingRule(TrainplanError, LookupError):
    """A table has no row for a key: a gap in the rules, reported with the table and the key."""

    def __init__(self, *, table: str, key: object) -> None:
        self.table = table
        self.key = key
        super().__init__(
            f"The rule table {table} has no row for {key!r}: this combination is not covered by trainplan's "
            "rules. Report it as a bug, and pick explicit values meanwhile."
        )


def lookup(table: Mapping[K, V], key: K, *, name: str) -> V:
    """The one place tables are read: a row, or `MissingRule` naming the table and the key."""
    try:
        return table[key]
    except (KeyError, TypeError):
        raise MissingRule(table=name, key=key) from None


# --------------------------------------------------------------------------------------------------
# Accelerators


EnvironmentCount: TypeAlias = Literal["cuda_device_count", "mps_available", "xla_device_count", "device_counts"]

COUNTED_THROUGH: Final[Mapping[EnvironmentCount, str]] = {"xla_device_count": "torch_xla"}
"""The package through which `probe()` counts an accelerator's devices: a machine assumed to have them has it."""
"""An `Environment` fact that counts an accelerator's devices (a bool counts one; `device_counts`, the counts a
framework supplies for the accelerators it adds, is read at the accelerator's name)."""

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
    fork_blocked_by: Literal["cuda_initialized"] | None  # the Environment fact after which a forked child fails
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

CLUSTER_ALIASES: Final[Mapping[str, ClusterFlag]] = {"torchrun": "torchelastic", "lightning": "local"}
"""Cluster spellings normalised before validation (`lightning`: Lightning's LightningEnvironment, this machine)."""

GPU_ACCELERATORS: Final[tuple[AcceleratorKey, ...]] = ("cuda", "mps")
"""What `accelerator="gpu"` may become, in order of preference (the first available wins)."""

ACCELERATOR_GROUPS: Final[Mapping[str, tuple[AcceleratorKey, ...]]] = {"gpu": GPU_ACCELERATORS}
"""Flags that name a group of accelerators: the first available of the group is chosen."""


# --------------------------------------------------------------------------------------------------
# Launchers


@attrs.frozen(kw_only=True)
class LauncherRule:
    name: LauncherName
    description: str
    """A verb phrase, read as "launcher: <it>" in explain() and as "strategy X would <it>" in a refusal."""
    starts_processes: bool
    joins: bool  # the processes exist already: this one joins their world (global rank known from the job)
    interactive_compatible: bool
    start_method: StartMethod | None
    forks: bool  # trainplan forks this process itself (refused where fork is unavailable or CUDA is initialised)
    in_started_job: LauncherName | None  # what it becomes inside a job that started every process; None: unchanged
    trainplan_starts: bool  # trainplan's own launcher starts these workers (torch_xla starts the xla launcher's)


LAUNCHERS: Final[Mapping[LauncherName, LauncherRule]] = {
    rule.name: rule
    for rule in (
        LauncherRule(
            name="none",
            description="run in this process",
            starts_processes=False,
            joins=False,
            interactive_compatible=True,
            start_method=None,
            forks=False,
            in_started_job=None,
            trainplan_starts=False,
        ),
        LauncherRule(
            name="subprocess",
            description="re-run the script in fresh interpreters, one per local rank",
            starts_processes=True,
            # A notebook has no script to re-run.
            joins=False,
            interactive_compatible=False,
            start_method=None,
            forks=False,
            in_started_job="external",
            trainplan_starts=True,
        ),
        LauncherRule(
            name="spawn",
            description="start fresh interpreters with multiprocessing's spawn method",
            starts_processes=True,
            # spawn pickles the function; functions defined in a notebook's __main__ cannot be imported back.
            joins=False,
            interactive_compatible=False,
            start_method="spawn",
            forks=False,
            in_started_job="external",
            trainplan_starts=True,
        ),
        LauncherRule(
            name="fork",
            description="fork this process, one child per local rank",
            starts_processes=True,
            joins=False,
            interactive_compatible=True,
            start_method="fork",
            forks=True,
            in_started_job="external",
            trainplan_starts=True,
        ),
        LauncherRule(
            name="xla",
            description="start the workers through torch_xla's multiprocessing launcher",
            starts_processes=True,
            joins=False,
            interactive_compatible=True,  # torch_xla forks its workers
            start_method="fork",
            forks=False,
            in_started_job=None,
            trainplan_starts=False,
        ),
        LauncherRule(
            name="external",
            description="join the world the cluster manager already started (it started every process)",
            starts_processes=False,
            joins=True,
            interactive_compatible=True,
            start_method=None,
            forks=False,
            in_started_job=None,
            trainplan_starts=False,
        ),
    )
}


@attrs.frozen(kw_only=True)
class TorchrunProcesses:
    """One of torchrun's `--nproc-per-node` words that names an accelerator, as trainplan's request reads it
    (`trainplan launch --nproc-per-node gpu`)."""

    word: str  # torchrun's word
    accelerator: AcceleratorFlag  # the accelerator it names
    overrides_asked: bool  # it replaces an accelerator asked for (False: it fills in accelerator='auto' only)
    per_host_cpu: bool  # one process per CPU of this machine (False: one per visible device, devices=-1)
    explained: str  # what it starts, for the hint ("every visible GPU")


TORCHRUN_PROCESSES: Final[Mapping[str, TorchrunProcesses]] = {
    row.word: row
    for row in (
        TorchrunProcesses(
            word="gpu", accelerator="gpu", overrides_asked=False, per_host_cpu=False, explained="every visible GPU"
        ),
        TorchrunProcesses(
            word="cpu", accelerator="cpu", overrides_asked=True, per_host_cpu=True, explained="one process per CPU"
        ),
    )
}
"""torchrun's `--nproc-per-node` words that name an accelerator (its others are a count and `auto`)."""


SERVED_START_METHODS: Final[Mapping[LauncherName, StartMethod]] = {"spawn": "forkserver"}
"""How a launcher's workers are started fastest with its guarantees kept, where the platform offers the method:
spawn's workers fork from a forkserver, itself a fresh interpreter that imported torch once (no CUDA state and
nothing of the caller's but what is pickled, as with spawn; torch is imported once, not once per worker)."""

FORKSERVER_PRELOAD: Final[tuple[str, ...]] = ("torch", "torch.distributed", "trainplan.effects.launching")
"""What the forkserver imports before it forks a worker: what every worker imports anyway."""


# --------------------------------------------------------------------------------------------------
# Strategies


@attrs.frozen(kw_only=True)
class FamilyRule:
    family: StrategyFamily
    description: str
    accelerators: frozenset[AcceleratorKey]
    multi_process: bool  # one process per device (True) or one process for all devices (False)
    max_devices_per_node: int | None  # None: no limit beyond the hardware
    max_nodes: int | None
    has_process_group: bool
    requires_package: str | None
    precisions: frozenset[PrecisionKey]
    why_not: Mapping[AcceleratorKey, str]  # the reason per accelerator the family refuses
    accelerator_fix: str | None = None  # the fix where it refuses an accelerator; None: the accelerator's own
    base_strategy: StrategyName | None = None  # the name without a preset, suggested beside strategy_options

    __attrs_post_init__ = freeze_nested_maps  # nested maps read-only: nobody changes a rule in place


_ALL_PRECISIONS: Final[frozenset[PrecisionName]] = frozenset(
    {
        "64-true",
        "32-true",
        "16-mixed",
        "bf16-mixed",
        "16-true",
        "bf16-true",
        "transformer-engine",
        "transformer-engine-float16",
    }
)

FAMILIES: Final[Mapping[StrategyFamily, FamilyRule]] = {
    rule.family: rule
    for rule in (
        FamilyRule(
            family="single_device",
            description="one process on one device",
            accelerators=frozenset({"cpu", "cuda", "mps"}),
            multi_process=False,
            max_devices_per_node=1,
            max_nodes=1,
            has_process_group=False,
            requires_package=None,
            precisions=_ALL_PRECISIONS,
            why_not={"xla": "XLA devices run through the XLA strategies"},
        ),
        FamilyRule(
            family="dp",
            description="torch.nn.DataParallel: one process driving several GPUs",
            # DataParallel scatters over CUDA devices only.
            accelerators=frozenset({"cuda"}),
            multi_process=False,
            max_devices_per_node=None,
            # DataParallel lives in one process, so it cannot span machines.
            max_nodes=1,
            has_process_group=False,
            requires_package=None,
            precisions=_ALL_PRECISIONS - {"transformer-engine", "transformer-engine-float16"},
            why_not={
                "cpu": "DataParallel scatters over CUDA devices only",
                "mps": "DataParallel scatters over CUDA devices only",
                "xla": "XLA devices run through the XLA strategies",
            },
        ),
        FamilyRule(
            family="ddp",
            description="DistributedDataParallel: one process per device",
            accelerators=frozenset({"cpu", "cuda"}),
            multi_process=True,
            max_devices_per_node=None,
            max_nodes=None,
            has_process_group=True,
            requires_package=None,
            precisions=_ALL_PRECISIONS,
            why_not={
                "mps": "no process-group backend reduces MPS tensors, and a Mac has a single MPS device",
                "xla": "XLA devices run through the XLA strategies",
            },
            base_strategy="ddp",
        ),
        FamilyRule(
            family="fsdp",
            description="Fully Sharded Data Parallel",
            # torch FSDP shards over CUDA devices; Lightning refuses it on other accelerators too.
            accelerators=frozenset({"cuda"}),
            multi_process=True,
            max_devices_per_node=None,
            max_nodes=None,
            has_process_group=True,
            requires_package=None,
            # FSDP's mixed-precision policy has no float64 mode (Lightning's FSDPPrecision).
            precisions=_ALL_PRECISIONS - {"64-true"},
            why_not={
                "cpu": "FSDP shards parameters across CUDA devices",
                "mps": "FSDP shards parameters across CUDA devices",
                # Fabric swaps fsdp for xla_fsdp on a TPU; trainplan names the strategy instead of swapping.
                "xla": "torch FSDP shards over CUDA devices; XLA devices shard through strategy='xla_fsdp'",
            },
            base_strategy="fsdp",
        ),
        FamilyRule(
            family="deepspeed",
            description="DeepSpeed ZeRO",
            accelerators=frozenset({"cuda"}),
            multi_process=True,
            max_devices_per_node=None,
            max_nodes=None,
            has_process_group=True,
            requires_package="deepspeed",
            # DeepSpeed owns precision through its config: no float64, no Transformer Engine.
            precisions=frozenset({"32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"}),
            why_not={
                "cpu": "DeepSpeed's ZeRO engine in trainplan targets CUDA devices",
                "mps": "DeepSpeed's ZeRO engine in trainplan targets CUDA devices",
                "xla": "XLA devices run through the XLA strategies",
            },
            base_strategy="deepspeed",
        ),
        FamilyRule(
            family="model_parallel",
            description="an N-D device mesh: FSDP2 data parallelism (replicas × shards) with context, tensor and "
            "pipeline parallelism",
            # torch's DeviceMesh, FSDP2 and DTensor run over NCCL on CUDA and over gloo on CPU (testable anywhere).
            accelerators=frozenset({"cpu", "cuda"}),
            multi_process=True,
            max_devices_per_node=None,
            max_nodes=None,
            has_process_group=True,
            requires_package=None,
            # Transformer Engine shards its FP8 layers over process groups of its own, not the mesh's.
            precisions=_ALL_PRECISIONS - {"transformer-engine", "transformer-engine-float16"},
            why_not={
                "mps": "no process-group backend reduces MPS tensors, so MPS has no device mesh",
                "xla": "XLA devices shard through torch_xla's SPMD, not a torch device mesh",
            },
            base_strategy="model_parallel",
        ),
        FamilyRule(
            family="xla",
            description="torch_xla's multi-device data parallel",
            accelerators=frozenset({"xla"}),
            multi_process=True,
            max_devices_per_node=None,
            max_nodes=None,
            has_process_group=True,
            requires_package=None,
            # Lightning's XLAPrecision accepts 32-true, 16-true and bf16-true only.
            precisions=frozenset({"32-true", "16-true", "bf16-true"}),
            why_not={
                "cpu": "the XLA strategies need XLA devices",
                "cuda": "the XLA strategies need XLA devices",
                "mps": "the XLA strategies need XLA devices",
            },
            accelerator_fix="Use accelerator='xla' on an XLA machine, or strategy='auto'",
        ),
        FamilyRule(
            family="xla_fsdp",
            description="torch_xla's Fully Sharded Data Parallel (XlaFullyShardedDataParallel)",
            accelerators=frozenset({"xla"}),
            multi_process=True,
            max_devices_per_node=None,
            max_nodes=None,
            has_process_group=True,
            requires_package=None,
            # Fabric's XLAFSDPStrategy takes Lightning's XLAPrecision only: 32-true, 16-true and bf16-true.
            precisions=frozenset({"32-true", "16-true", "bf16-true"}),
            why_not={
                "cpu": "the XLA strategies need XLA devices",
                "cuda": "the XLA strategies need XLA devices (torch FSDP on CUDA is strategy='fsdp')",
                "mps": "the XLA strategies need XLA devices",
            },
            accelerator_fix="Use accelerator='xla' on an XLA machine, or strategy='fsdp' on CUDA",
        ),
        FamilyRule(
            family="single_xla",
            description="one process on one XLA device",
            accelerators=frozenset({"xla"}),
            multi_process=False,
            max_devices_per_node=1,
            max_nodes=1,
            has_process_group=False,
            requires_package=None,
            precisions=frozenset({"32-true", "16-true", "bf16-true"}),
            why_not={
                "cpu": "the XLA strategies need XLA devices",
                "cuda": "the XLA strategies need XLA devices",
                "mps": "the XLA strategies need XLA devices",
            },
            accelerator_fix="Use accelerator='xla' on an XLA machine, or strategy='auto'",
        ),
    )
}


OptionsType: TypeAlias = type[DDPOptions] | type[FSDPOptions] | type[DeepSpeedOptions] | type[ModelParallelOptions]

OPTION_TYPES: Final[Mapping[StrategyFamily, OptionsType]] = {
    "ddp": DDPOptions,
    "fsdp": FSDPOptions,
    "deepspeed": DeepSpeedOptions,
    "model_parallel": ModelParallelOptions,
}
"""Which options record each family takes; families not listed take none. A plan's JSON names the record by its
family here (`"kind": "ddp"`)."""


@attrs.frozen(kw_only=True)
class StrategyRule:
    """A registered strategy: its family, launcher and the options its name fixes.

    Downstream frameworks add their own through `Rules.extend` (with a `CustomName`)."""

    name: StrategyKey
    family: StrategyFamily
    launcher: LauncherName
    preset: Mapping[str, object] = attrs.field(factory=dict)
    """Options the name fixes (field → value); `strategy_options` may repeat them but not contradict them."""

    __attrs_post_init__ = freeze_nested_maps  # nested maps read-only: nobody changes a rule in place


def _ddp(name: StrategyName, launcher: LauncherName, unused: bool | None) -> StrategyRule:
    preset: dict[str, object] = {} if unused is None else {"find_unused_parameters": unused}
    return StrategyRule(name=name, family="ddp", launcher=launcher, preset=preset)


def _deepspeed(name: StrategyName, **preset: object) -> StrategyRule:
    return StrategyRule(name=name, family="deepspeed", launcher="subprocess", preset=preset)


STRATEGIES: Final[Mapping[StrategyKey, StrategyRule]] = {
    rule.name: rule
    for rule in (
        StrategyRule(name="single_device", family="single_device", launcher="none"),
        StrategyRule(name="dp", family="dp", launcher="none"),
        # `ddp` re-runs the script per local rank, as Lightning's _SubprocessScriptLauncher does.
        _ddp("ddp", "subprocess", None),
        _ddp("ddp_find_unused_parameters_true", "subprocess", True),
        _ddp("ddp_find_unused_parameters_false", "subprocess", False),
        _ddp("ddp_spawn", "spawn", None),
        _ddp("ddp_spawn_find_unused_parameters_true", "spawn", True),
        _ddp("ddp_spawn_find_unused_parameters_false", "spawn", False),
        _ddp("ddp_fork", "fork", None),
        _ddp("ddp_fork_find_unused_parameters_true", "fork", True),
        _ddp("ddp_fork_find_unused_parameters_false", "fork", False),
        # ddp_notebook is ddp_fork under the name notebook users look for.
        _ddp("ddp_notebook", "fork", None),
        _ddp("ddp_notebook_find_unused_parameters_true", "fork", True),
        _ddp("ddp_notebook_find_unused_parameters_false", "fork", False),
        StrategyRule(name="fsdp", family="fsdp", launcher="subprocess"),
        StrategyRule(name="fsdp_cpu_offload", family="fsdp", launcher="subprocess", preset={"cpu_offload": True}),
        # Lightning's `deepspeed` default is ZeRO stage 2 (DeepSpeedOptions' default).
        _deepspeed("deepspeed"),
        _deepspeed("deepspeed_stage_1", stage=1),
        _deepspeed("deepspeed_stage_1_offload", stage=1, offload_optimizer=True),
        _deepspeed("deepspeed_stage_2", stage=2),
        _deepspeed("deepspeed_stage_2_offload", stage=2, offload_optimizer=True),
        _deepspeed("deepspeed_stage_3", stage=3),
        _deepspeed("deepspeed_stage_3_offload", stage=3, offload_optimizer=True, offload_parameters=True),
        _deepspeed(
            "deepspeed_stage_3_offload_nvme",
            stage=3,
            offload_optimizer=True,
            offload_parameters=True,
            offload_device="nvme",
        ),
        # Lightning's ModelParallelStrategy re-runs the script per local rank too (_SubprocessScriptLauncher).
        StrategyRule(name="model_parallel", family="model_parallel", launcher="subprocess"),
        StrategyRule(name="xla", family="xla", launcher="xla"),
        StrategyRule(name="single_xla", family="single_xla", launcher="none"),
        # Fabric's XLAFSDPStrategy starts its workers through torch_xla (_XLALauncher), as XLAStrategy does.
        StrategyRule(name="xla_fsdp", family="xla_fsdp", launcher="xla"),
    )
}

STRATEGY_ALIASES: Final[Mapping[str, StrategyName]] = {
    "single": "single_device",
    "ddp_find_unused_parameters": "ddp_find_unused_parameters_true",
    "xla_single": "single_xla",
    "tpu": "xla",
    # Names Lightning 2.6 still registers: `single_tpu` in both registries, `xla_debug` in the Trainer's.
    "single_tpu": "single_xla",
    "xla_debug": "xla",
}
"""Spellings normalised to a strategy name before validation (case is folded first)."""

STRATEGY_ALIAS_NOTES: Final[Mapping[str, str]] = {
    "single_tpu": "strategy='single_tpu' is Lightning's older name for 'single_xla'; write 'single_xla'",
    "xla_debug": (
        "strategy='xla_debug' is Lightning's XLAStrategy(debug=True); trainplan plans strategy='xla' (set "
        "PT_XLA_DEBUG=1 for torch_xla's debug output)"
    ),
}
"""Aliases whose use the plan notes as a deprecation (by the spelling given, case folded)."""


@attrs.frozen(kw_only=True)
class AutoStrategyRule:
    """One row of strategy='auto': the first row whose conditions hold names the strategy."""

    strategy: StrategyName
    reason: str  # a template: {num_nodes}, {devices}
    accelerators: frozenset[AcceleratorName] | None = None  # None: any accelerator
    min_devices: int = 1
    max_devices: int | None = None
    min_nodes: int = 1
    interactive: bool | None = None  # None: either


AUTO_STRATEGIES: Final[tuple[AutoStrategyRule, ...]] = (
    AutoStrategyRule(
        strategy="xla", accelerators=frozenset({"xla"}), min_devices=2, reason="'auto' with several XLA devices"
    ),
    AutoStrategyRule(strategy="single_xla", accelerators=frozenset({"xla"}), reason="'auto' with one XLA device"),
    AutoStrategyRule(strategy="ddp", min_nodes=2, reason="'auto' with num_nodes={num_nodes}"),
    AutoStrategyRule(strategy="single_device", max_devices=1, reason="'auto' with one device"),
    # As Lightning: an interactive session cannot re-run a script, so fork.
    AutoStrategyRule(
        strategy="ddp_fork",
        interactive=True,
        reason="'auto' with several devices in an interactive session (fork-based)",
    ),
    AutoStrategyRule(strategy="ddp", reason="'auto' with several devices"),
)
"""strategy='auto' after the options rows (`AUTO_STRATEGY_FOR_OPTIONS`): tried in order, the first match wins."""

FORK_STRATEGY_FOR: Final[Mapping[StrategyKey, StrategyKey]] = {
    "ddp": "ddp_notebook",
    "ddp_find_unused_parameters_true": "ddp_notebook_find_unused_parameters_true",
    "ddp_find_unused_parameters_false": "ddp_notebook_find_unused_parameters_false",
    "ddp_spawn": "ddp_notebook",
    "ddp_spawn_find_unused_parameters_true": "ddp_notebook_find_unused_parameters_true",
    "ddp_spawn_find_unused_parameters_false": "ddp_notebook_find_unused_parameters_false",
}
"""The notebook-compatible counterpart suggested when an interactive session rejects a launcher."""

AUTO_STRATEGY_FOR_OPTIONS: Final[Mapping[StrategyFamily, StrategyName]] = {"model_parallel": "model_parallel"}
"""strategy='auto' with this family's options record chooses this strategy (a mesh's degrees say what to run; the
other families' records fit several strategies, and 'auto' decides from the devices as usual)."""

SPAWN_STRATEGY_FOR: Final[Mapping[StrategyKey, StrategyKey]] = {
    "ddp_fork": "ddp_spawn",
    "ddp_fork_find_unused_parameters_true": "ddp_spawn_find_unused_parameters_true",
    "ddp_fork_find_unused_parameters_false": "ddp_spawn_find_unused_parameters_false",
    "ddp_notebook": "ddp_spawn",
    "ddp_notebook_find_unused_parameters_true": "ddp_spawn_find_unused_parameters_true",
    "ddp_notebook_find_unused_parameters_false": "ddp_spawn_find_unused_parameters_false",
}
"""The spawn counterpart suggested when forking is impossible."""

SCRIPT_STRATEGY_FOR: Final[Mapping[StrategyKey, StrategyKey]] = {
    "ddp_spawn": "ddp",
    "ddp_spawn_find_unused_parameters_true": "ddp_find_unused_parameters_true",
    "ddp_spawn_find_unused_parameters_false": "ddp_find_unused_parameters_false",
    "ddp_fork": "ddp",
    "ddp_fork_find_unused_parameters_true": "ddp_find_unused_parameters_true",
    "ddp_fork_find_unused_parameters_false": "ddp_find_unused_parameters_false",
    "ddp_notebook": "ddp",
    "ddp_notebook_find_unused_parameters_true": "ddp_find_unused_parameters_true",
    "ddp_notebook_find_unused_parameters_false": "ddp_find_unused_parameters_false",
}
"""The script-mode counterpart of a strategy that starts its workers from a function (spawn, fork): what a
script runs as when something else (torchrun, srun, `trainplan launch`) already started every process."""


# --------------------------------------------------------------------------------------------------
# Precision


@attrs.frozen(kw_only=True)
class PrecisionRule:
    name: PrecisionKey
    description: str
    accelerators: frozenset[AcceleratorKey]
    fallback: Mapping[AcceleratorKey, PrecisionKey]  # accelerators where another precision is used instead
    fallback_why: Mapping[AcceleratorKey, str]  # why, for the note
    requires_package: str | None
    why_not: Mapping[AcceleratorKey, str]
    instead: Mapping[AcceleratorKey, PrecisionKey]  # what to suggest where refused

    __attrs_post_init__ = freeze_nested_maps  # nested maps read-only: nobody changes a rule in place


PRECISIONS: Final[Mapping[PrecisionKey, PrecisionRule]] = {
    rule.name: rule
    for rule in (
        PrecisionRule(
            name="64-true",
            description="float64 weights and compute",
            accelerators=frozenset({"cpu", "cuda"}),
            fallback={},
            fallback_why={},
            requires_package=None,
            why_not={
                "mps": "the MPS backend has no float64 support",
                # Lightning's XLAPrecision accepts 32-true, 16-true and bf16-true only.
                "xla": "trainplan's XLA precisions are 32-true, 16-true and bf16-true",
            },
            instead={"mps": "32-true", "xla": "32-true"},
        ),
        PrecisionRule(
            name="32-true",
            description="float32 weights and compute",
            accelerators=frozenset({"cpu", "cuda", "mps", "xla"}),
            fallback={},
            fallback_why={},
            requires_package=None,
            why_not={},
            instead={},
        ),
        PrecisionRule(
            name="16-mixed",
            description="float16 automatic mixed precision",
            accelerators=frozenset({"cpu", "cuda", "mps"}),
            # torch.autocast on CPU supports bfloat16 only; Lightning falls back the same way.
            fallback={"cpu": "bf16-mixed"},
            fallback_why={"cpu": "autocast there supports bfloat16 only"},
            requires_package=None,
            why_not={"xla": "XLA has no automatic mixed precision in trainplan; XLA casts the whole model"},
            instead={"xla": "16-true"},
        ),
        PrecisionRule(
            name="bf16-mixed",
            description="bfloat16 automatic mixed precision",
            accelerators=frozenset({"cpu", "cuda", "mps"}),
            fallback={},
            fallback_why={},
            requires_package=None,
            why_not={"xla": "XLA has no automatic mixed precision in trainplan; XLA casts the whole model"},
            instead={"xla": "bf16-true"},
        ),
        PrecisionRule(
            name="16-true",
            description="float16 weights and compute",
            accelerators=frozenset({"cpu", "cuda", "mps", "xla"}),
            fallback={},
            fallback_why={},
            requires_package=None,
            why_not={},
            instead={},
        ),
        PrecisionRule(
            name="bf16-true",
            description="bfloat16 weights and compute",
            accelerators=frozenset({"cpu", "cuda", "mps", "xla"}),
            fallback={},
            fallback_why={},
            requires_package=None,
            why_not={},
            instead={},
        ),
        PrecisionRule(
            name="transformer-engine",
            description="NVIDIA Transformer Engine FP8 with bfloat16 weights",
            accelerators=frozenset({"cuda"}),
            fallback={},
            fallback_why={},
            requires_package="transformer_engine",
            why_not={
                "cpu": "Transformer Engine's FP8 kernels run on NVIDIA GPUs only",
                "mps": "Transformer Engine's FP8 kernels run on NVIDIA GPUs only",
                "xla": "Transformer Engine's FP8 kernels run on NVIDIA GPUs only",
            },
            instead={"cpu": "bf16-mixed", "mps": "bf16-mixed", "xla": "bf16-true"},
        ),
        PrecisionRule(
            name="transformer-engine-float16",
            description="NVIDIA Transformer Engine FP8 with float16 weights",
            accelerators=frozenset({"cuda"}),
            fallback={},
            fallback_why={},
            requires_package="transformer_engine",
            why_not={
                "cpu": "Transformer Engine's FP8 kernels run on NVIDIA GPUs only",
                "mps": "Transformer Engine's FP8 kernels run on NVIDIA GPUs only",
                "xla": "Transformer Engine's FP8 kernels run on NVIDIA GPUs only",
            },
            instead={"cpu": "bf16-mixed", "mps": "16-mixed", "xla": "16-true"},
        ),
    )
}

PRECISION_ALIASES: Final[Mapping[str, PrecisionName]] = {
    # Short spellings from Lightning 1.x; they keep working and the plan notes the canonical name.
    "64": "64-true",
    "32": "32-true",
    "16": "16-mixed",
    "bf16": "bf16-mixed",
    "double": "64-true",
    "float64": "64-true",
    "float": "32-true",
    "float32": "32-true",
    "half": "16-true",
    "fp16": "16-mixed",
    "transformer_engine": "transformer-engine",
    "te": "transformer-engine",
}

PRECISION_FLAG_ALIASES: Final[Mapping[PrecisionFlag, PrecisionName]] = {64: "64-true", 32: "32-true", 16: "16-mixed"}
"""Integer precision flags (as in `Trainer(precision=16)`)."""

DEFAULT_PRECISION: Final[PrecisionName] = "32-true"


# --------------------------------------------------------------------------------------------------
# Process-group backends


@attrs.frozen(kw_only=True)
class BackendRule:
    name: BackendKey
    description: str
    accelerators: frozenset[AcceleratorKey]
    needs_device_tensors: bool  # collectives take tensors on the accelerator only (metric placement reads this)
    why_not: Mapping[AcceleratorKey, str]

    __attrs_post_init__ = freeze_nested_maps  # nested maps read-only: nobody changes a rule in place


BACKENDS: Final[Mapping[BackendKey, BackendRule]] = {
    rule.name: rule
    for rule in (
        BackendRule(
            name="nccl",
            description="NVIDIA's collective library",
            accelerators=frozenset({"cuda"}),
            # NCCL reduces CUDA tensors only ("Tensors must be CUDA and dense").
            needs_device_tensors=True,
            why_not={
                "cpu": "NCCL reduces CUDA tensors only",
                "mps": "NCCL reduces CUDA tensors only",
                "xla": "XLA devices communicate through the xla backend",
            },
        ),
        BackendRule(
            name="gloo",
            description="Meta's CPU collective library (also reduces CUDA tensors, through host copies)",
            accelerators=frozenset({"cpu", "cuda"}),
            needs_device_tensors=False,
            why_not={
                "mps": "gloo cannot reduce MPS tensors",
                "xla": "XLA devices communicate through the xla backend",
            },
        ),
        BackendRule(
            name="mpi",
            description="an MPI implementation torch was built against (CUDA tensors need a CUDA-aware MPI)",
            accelerators=frozenset({"cpu", "cuda"}),
            needs_device_tensors=False,
            why_not={
                "mps": "MPI cannot reduce MPS tensors",
                "xla": "XLA devices communicate through the xla backend",
            },
        ),
        BackendRule(
            name="xla",
            description="torch_xla's collective backend",
            accelerators=frozenset({"xla"}),
            needs_device_tensors=True,
            why_not={
                "cpu": "the xla backend serves XLA devices only",
                "cuda": "the xla backend serves XLA devices only",
                "mps": "the xla backend serves XLA devices only",
            },
        ),
    )
}

# Metric placement (the backend's `needs_device_tensors` and the accelerator's `host` decide the rest).

HOST_METRICS_STORE: Final[MetricsStore] = "cpu"
"""The `metrics_store` that keeps logged tensors in host memory (Lightning's `move_metrics_to_cpu=True`); the other
keeps them on the run's device."""

HOST_DEVICE: Final[str] = next(rule.device_type for rule in ACCELERATORS.values() if rule.host)
"""The torch device of host memory (the device type of the accelerator whose devices are the host's CPUs): where a
CPU-stored metric lives."""

DEVICE_TYPES_WITHOUT_FLOAT64: Final[frozenset[str]] = frozenset({"mps"})
"""torch device types that have no float64 (Metal has none): a metric store accumulates floats there in float32."""


# --------------------------------------------------------------------------------------------------
# Device meshes (strategy `model_parallel`): the dimensions, in the mesh's fixed order, and where each may grow.


@attrs.frozen(kw_only=True)
class MeshDimensionRule:
    name: MeshDimension
    title: str  # what its groups are called in messages and drawings
    description: str
    splits_data: bool  # ranks along it read different batches (the sampler's replicas); the others read the same
    inside_node: bool  # its groups stay inside one node: the degree (times the inner ones) divides a node's processes
    stage_aligned: bool  # each block of ranks it cuts the world into holds whole nodes, or a node holds whole blocks
    accelerators: frozenset[AcceleratorKey]  # where a degree above 1 runs
    why_not: Mapping[AcceleratorKey, str]
    precisions_refused: Mapping[PrecisionKey, str]  # precisions a degree above 1 cannot run with, and why
    instead: Mapping[PrecisionKey, PrecisionKey]  # what to suggest for each refused precision
    lightning_size: str | None  # the ModelParallelStrategy size this degree multiplies into; None: Lightning has none
    accelerate_size: str | None  # Accelerate's ParallelismConfig field; None: Accelerate has none

    __attrs_post_init__ = freeze_nested_maps  # nested maps read-only: nobody changes a rule in place


_MESH_ACCELERATORS: Final[frozenset[AcceleratorKey]] = frozenset({"cpu", "cuda"})

# torch's DTensor reduces GradScaler's found_inf over the placements of the first gradient only: with a replicated
# gradient first and a sharded one holding the inf, one rank of a tp (or cp) group skips the step and another takes it.
_SCALER_ACROSS_PLACEMENTS: Final = (
    "torch's GradScaler reduces its overflow check over the placements of the first DTensor gradient only, so with "
    "replicated and sharded gradients the ranks of one group can disagree on skipping a step"
)

MESH_DIMENSIONS: Final[Mapping[MeshDimension, MeshDimensionRule]] = {
    rule.name: rule
    for rule in (
        MeshDimensionRule(
            name="pp",
            title="pipeline",
            description="pipeline stages: the model's layers split in order, activations passed stage to stage",
            splits_data=False,
            inside_node=False,
            # The outermost dimension, so the pipeline crosses nodes: a stage never straddles a node boundary.
            stage_aligned=True,
            accelerators=_MESH_ACCELERATORS,
            why_not={},
            precisions_refused={
                # torch.distributed.pipelining runs backward inside the schedule, stage by stage.
                "16-mixed": (
                    "a pipeline schedule runs backward itself, stage by stage, so a GradScaler finds overflow in one "
                    "stage's gradients only and the stages would skip different steps"
                ),
            },
            instead={"16-mixed": "bf16-mixed"},
            lightning_size=None,
            accelerate_size=None,
        ),
        MeshDimensionRule(
            name="dp_replicate",
            title="data-parallel replica",
            description="data-parallel replicas: whole (or, with dp_shard, sharded) copies of the model, gradients "
            "all-reduced",
            splits_data=True,
            inside_node=False,
            stage_aligned=False,
            accelerators=_MESH_ACCELERATORS,
            why_not={},
            precisions_refused={},
            instead={},
            lightning_size="data_parallel_size",
            accelerate_size="dp_replicate_size",
        ),
        MeshDimensionRule(
            name="dp_shard",
            title="data-parallel shard",
            description="data-parallel shards: FSDP2 shards parameters, gradients and optimizer state",
            splits_data=True,
            inside_node=False,
            stage_aligned=False,
            accelerators=_MESH_ACCELERATORS,
            why_not={},
            precisions_refused={},
            instead={},
            lightning_size="data_parallel_size",
            accelerate_size="dp_shard_size",
        ),
        MeshDimensionRule(
            name="cp",
            title="context-parallel",
            description="context parallelism: each sequence split over the ranks, attention computed as a ring",
            splits_data=False,
            # Ring attention passes key/value blocks every layer: it needs the node's links.
            inside_node=True,
            stage_aligned=False,
            # torch's context_parallel swaps in ring variants of the CUDA SDPA kernels (flash, efficient, cuDNN).
            accelerators=frozenset({"cuda"}),
            why_not={
                "cpu": "torch's context parallelism rewrites the CUDA attention kernels (flash, memory-efficient, "
                "cuDNN); the CPU attention kernel has no ring variant",
            },
            precisions_refused={
                "64-true": "context parallelism runs attention through the flash, memory-efficient and cuDNN kernels, "
                "none of which computes in float64",
                "16-mixed": _SCALER_ACROSS_PLACEMENTS,
            },
            instead={"64-true": "32-true", "16-mixed": "bf16-mixed"},
            lightning_size=None,
            accelerate_size="cp_size",
        ),
        MeshDimensionRule(
            name="tp",
            title="tensor-parallel",
            description="tensor parallelism: each layer's weights split over the ranks, reduced inside every layer",
            splits_data=False,
            # Tensor parallelism reduces inside every layer: the innermost dimension, on the node's own links.
            inside_node=True,
            stage_aligned=False,
            accelerators=_MESH_ACCELERATORS,
            why_not={},
            precisions_refused={"16-mixed": _SCALER_ACROSS_PLACEMENTS},
            instead={"16-mixed": "bf16-mixed"},
            lightning_size="tensor_parallel_size",
            accelerate_size="tp_size",
        ),
    )
}
"""The mesh's dimensions in its fixed order, outermost first (the order of `names.MeshDimension`)."""

MESH_BACKENDS: Final[Mapping[AcceleratorKey, BackendName]] = {"cuda": "nccl", "cpu": "gloo"}
"""The backend a device mesh runs over on each accelerator: the ones torch's FSDP2 and DTensor are built and tested
on (NCCL on CUDA; gloo on CPU, which also makes every layout testable without a GPU)."""


@attrs.frozen(kw_only=True)
class LightningSize:
    """One of Lightning's `ModelParallelStrategy` sizes, read as a trainplan degree."""

    argument: str  # ModelParallelStrategy's argument (and ModelParallelOptions' field for Lightning's spelling)
    dimension: MeshDimension  # the degree it becomes
    mesh_name: str  # the name of its dimension in Lightning's own mesh
    auto: Literal["num_nodes", "processes_per_node"]  # what Lightning's "auto" takes when both sizes are "auto"


LIGHTNING_SIZES: Final[tuple[LightningSize, ...]] = (
    # Lightning applies FSDP2 over its data-parallel dimension, so it is trainplan's dp_shard.
    LightningSize(argument="data_parallel_size", dimension="dp_shard", mesh_name="data_parallel", auto="num_nodes"),
    LightningSize(
        argument="tensor_parallel_size", dimension="tp", mesh_name="tensor_parallel", auto="processes_per_node"
    ),
)
"""Lightning's spelling of a 2-D mesh (`ModelParallelStrategy(data_parallel_size=..., tensor_parallel_size=...)`)."""


# --------------------------------------------------------------------------------------------------
# From plan to loop: how each precision and each strategy family becomes torch objects, and other frameworks'
# arguments (read by `resolve.training` and the effects' runtime and adapters).

DtypeName: TypeAlias = Literal["float64", "float32", "float16", "bfloat16"]
WrapperName: TypeAlias = Literal["move", "data_parallel", "ddp", "fsdp", "deepspeed", "mesh", "xla"]
AccelerateMixedPrecision: TypeAlias = Literal["no", "fp16", "bf16", "fp8"]


@attrs.frozen(kw_only=True)
class PrecisionRecipe:
    """What the runtime does with a precision (a downstream precision brings its own: `Rules.extend`)."""

    name: PrecisionKey
    autocast_dtype: DtypeName | None  # mixed precision: the dtype torch.autocast computes in; None: no autocast
    parameter_dtype: DtypeName  # the dtype the model's parameters are cast to
    grad_scaler_on: frozenset[AcceleratorKey]  # where the loss must be scaled (fp16 AMP on CUDA)
    accelerate: AccelerateMixedPrecision | None  # Accelerate's mixed_precision; None: Accelerate has no such mode
    engine: Literal["torch", "transformer_engine"]


PRECISION_RECIPES: Final[Mapping[PrecisionKey, PrecisionRecipe]] = {
    recipe.name: recipe
    for recipe in (
        PrecisionRecipe(
            name="64-true",
            autocast_dtype=None,
            parameter_dtype="float64",
            grad_scaler_on=frozenset(),
            accelerate=None,
            engine="torch",
        ),
        PrecisionRecipe(
            name="32-true",
            autocast_dtype=None,
            parameter_dtype="float32",
            grad_scaler_on=frozenset(),
            accelerate="no",
            engine="torch",
        ),
        # float16 gradients underflow without loss scaling; CUDA AMP is where torch (and Lightning) scale.
        PrecisionRecipe(
            name="16-mixed",
            autocast_dtype="float16",
            parameter_dtype="float32",
            grad_scaler_on=frozenset({"cuda"}),
            accelerate="fp16",
            engine="torch",
        ),
        PrecisionRecipe(
            name="bf16-mixed",
            autocast_dtype="bfloat16",
            parameter_dtype="float32",
            grad_scaler_on=frozenset(),
            accelerate="bf16",
            engine="torch",
        ),
        PrecisionRecipe(
            name="16-true",
            autocast_dtype=None,
            parameter_dtype="float16",
            grad_scaler_on=frozenset(),
            accelerate=None,
            engine="torch",
        ),
        PrecisionRecipe(
            name="bf16-true",
            autocast_dtype=None,
            parameter_dtype="bfloat16",
            grad_scaler_on=frozenset(),
            accelerate=None,
            engine="torch",
        ),
        PrecisionRecipe(
            name="transformer-engine",
            autocast_dtype=None,
            parameter_dtype="bfloat16",
            grad_scaler_on=frozenset(),
            accelerate="fp8",
            engine="transformer_engine",
        ),
        PrecisionRecipe(
            name="transformer-engine-float16",
            autocast_dtype=None,
            parameter_dtype="float16",
            grad_scaler_on=frozenset(),
            accelerate="fp8",
            engine="transformer_engine",
        ),
    )
}


@attrs.frozen(kw_only=True)
class FamilyRecipe:
    family: StrategyFamily
    wrapper: WrapperName  # how the runtime places and wraps the model
    lightning_strategy: str | None  # the Lightning/Fabric strategy class built from the options; None: none
    accelerate_launch: tuple[str, ...]  # `accelerate launch` flags for this family (several processes)
    sharded_grad_scaler: bool = False  # each rank holds a shard: inf checks must agree across ranks
    lightning_precisions: frozenset[PrecisionName] | None = None  # what the Lightning strategy takes; None: any
    lightning_backend: bool = False  # the Lightning strategy takes `process_group_backend`
    accelerate_multi_gpu: bool = False  # several GPU processes run under `accelerate launch --multi_gpu`
    lightning_registered: StrategyName | None = None
    """The framework builds the strategy itself from this registered name (torch_xla's strategies need torch_xla
    to be constructed, so on a machine without it the adapter passes the name); None: the adapter builds it."""
    trainer_instead: StrategyName | None = None
    """None: Lightning's Trainer registers this family's strategy too. A name: only Fabric registers it, and the
    Trainer is refused with this strategy as the one it runs instead."""
    accelerate_why_not: str | None = None  # why Accelerate cannot run the family; None: it can
    accelerate_instead: StrategyName | None = None  # the strategy suggested to Accelerate where it cannot


FAMILY_RECIPES: Final[Mapping[StrategyFamily, FamilyRecipe]] = {
    recipe.family: recipe
    for recipe in (
        FamilyRecipe(
            family="single_device", wrapper="move", lightning_strategy="SingleDeviceStrategy", accelerate_launch=()
        ),
        # Lightning 2.0 removed DataParallel; Accelerate has no counterpart either.
        FamilyRecipe(
            family="dp",
            wrapper="data_parallel",
            lightning_strategy=None,
            accelerate_launch=(),
            accelerate_why_not="Accelerate runs one process per device; it has no DataParallel mode",
            accelerate_instead="ddp",
        ),
        FamilyRecipe(
            family="ddp",
            wrapper="ddp",
            lightning_strategy="DDPStrategy",
            accelerate_launch=(),
            lightning_backend=True,
            accelerate_multi_gpu=True,
        ),
        FamilyRecipe(
            family="fsdp",
            wrapper="fsdp",
            lightning_strategy="FSDPStrategy",
            lightning_backend=True,
            accelerate_launch=("--use_fsdp",),
            sharded_grad_scaler=True,
        ),
        FamilyRecipe(
            family="deepspeed",
            wrapper="deepspeed",
            lightning_strategy="DeepSpeedStrategy",
            accelerate_launch=("--use_deepspeed",),
        ),
        # The user's parallelize function applies the mesh (as Lightning's ModelParallelStrategy asks for one). fp16
        # AMP runs with data parallelism alone (tp and cp refuse 16-mixed, pp too), where every gradient is a DTensor
        # of the same placements, so torch's own GradScaler finds the same overflow on every rank.
        FamilyRecipe(
            family="model_parallel",
            wrapper="mesh",
            lightning_strategy="ModelParallelStrategy",
            accelerate_launch=("--use_parallelism_config",),
            # Lightning's ModelParallelStrategy refuses the other precisions (its connector's own list).
            lightning_precisions=frozenset({"32-true", "bf16-mixed", "bf16-true", "16-true"}),
            lightning_backend=True,
        ),
        FamilyRecipe(
            family="xla",
            wrapper="xla",
            lightning_strategy="XLAStrategy",
            accelerate_launch=("--tpu",),
            lightning_registered="xla",
        ),
        FamilyRecipe(
            family="single_xla",
            wrapper="xla",
            lightning_strategy="SingleDeviceXLAStrategy",
            accelerate_launch=("--tpu",),
            lightning_registered="single_xla",
        ),
        # Fabric registers `xla_fsdp` (XLAFSDPStrategy, beside `xla` and `single_xla`); Lightning 2.6's Trainer
        # does not. Accelerate 1.x shards through torch FSDP on CUDA only: it has no XlaFullyShardedDataParallel.
        FamilyRecipe(
            family="xla_fsdp",
            wrapper="xla",
            lightning_strategy="XLAFSDPStrategy",
            accelerate_launch=("--tpu",),
            lightning_registered="xla_fsdp",
            trainer_instead="xla",
            accelerate_why_not="Accelerate has no XLA FSDP (its FSDP plugin is torch FSDP on CUDA devices)",
            accelerate_instead="xla",
        ),
    )
}

DEEPSPEED_NO_OFFLOAD: Final[str] = "none"
"""DeepSpeed's (and `accelerate launch`'s) offload device for a part that stays on the accelerator."""


LightningDevices: TypeAlias = Literal["count", "indices", "one_index_or_count"]
"""How Lightning takes `devices` for an accelerator: a count, a list of indices, or one index as a list (else a
count)."""


@attrs.frozen(kw_only=True)
class FrameworkAccelerator:
    """How Lightning/Fabric and Hugging Face Accelerate spell an accelerator and its devices."""

    accelerator: AcceleratorKey
    lightning: str  # Lightning's accelerator name
    lightning_devices: LightningDevices  # how Lightning takes `devices`
    accelerate_cpu: bool  # Accelerate runs it as `Accelerator(cpu=True)` / `accelerate launch --cpu`
    accelerate_gpu_ids: bool  # `accelerate launch --gpu_ids` names its devices
    accelerate_processes: bool  # Accelerate starts several processes of it (and builds a ParallelismConfig mesh)


FRAMEWORK_ACCELERATORS: Final[Mapping[AcceleratorKey, FrameworkAccelerator]] = {
    row.accelerator: row
    for row in (
        # accelerate launch starts several CPU processes only through MPI; its mesh is for GPU runs only.
        FrameworkAccelerator(
            accelerator="cpu",
            lightning="cpu",
            lightning_devices="count",
            accelerate_cpu=True,
            accelerate_gpu_ids=False,
            accelerate_processes=False,
        ),
        FrameworkAccelerator(
            accelerator="cuda",
            lightning="cuda",
            lightning_devices="indices",  # GPU indices as a list
            accelerate_cpu=False,
            accelerate_gpu_ids=True,
            accelerate_processes=True,
        ),
        FrameworkAccelerator(
            accelerator="mps",
            lightning="mps",
            lightning_devices="count",
            accelerate_cpu=False,
            accelerate_gpu_ids=False,
            accelerate_processes=True,
        ),
        # Lightning takes XLA cores as a count (all of them) or a one-index list.
        FrameworkAccelerator(
            accelerator="xla",
            lightning="tpu",
            lightning_devices="one_index_or_count",
            accelerate_cpu=False,
            accelerate_gpu_ids=False,
            accelerate_processes=True,
        ),
    )
}
"""The frameworks' spelling of each accelerator (the adapters read it)."""


# --------------------------------------------------------------------------------------------------
# Cluster environments


SLURM_DEFAULT_PORT: Final[int] = 12910
"""Lightning's SLURM main port when there is no job id."""

SLURM_PORT_BASE: Final[int] = 15000
"""SLURM main port with a job id: 15000 + the job id's last four digits (Lightning's rule, so every task agrees)."""

LSF_PORT_BASE: Final[int] = 10000
"""LSF main port: 10000 + job id modulo 1000 (Lightning's rule)."""

DEFAULT_MAIN_PORT: Final[int] = 29500
"""torch.distributed's customary port, used where a cluster gives neither MASTER_PORT nor a job id (MPI)."""

LAUNCHED_MARKER: Final[str] = "TRAINPLAN_LAUNCHED"
"""Set by `trainplan.launch` in every worker it starts. Those workers also carry torchrun's variables (RANK,
LOCAL_RANK, GROUP_RANK, LOCAL_WORLD_SIZE) for scripts that expect them; the marker tells the resolver that
trainplan, not torchrun, started them, so the plan keeps its own launcher and gains the worker's ranks."""

RUN_ID_VARIABLE: Final[str] = "TORCHELASTIC_RUN_ID"
"""torchrun's run id: `trainplan launch` sets it too (`TRAINPLAN_RUN_ID_PREFIX`), so another one in a process that
carries trainplan's marker means a torchrun started inside a trainplan worker gave this process its world."""

JobFact = Literal[
    "world_size",
    "processes_per_node",
    "global_rank",
    "local_rank",
    "node_rank",
    "num_nodes",
    "main_address",
    "main_port",
]
"""A fact of a started job that its variables state (and trainplan's launchers write for their workers)."""

VariableFormat = Literal["integer", "port", "host", "tasks_per_node", "job_number", "slurm_hostlist", "rank_hosts"]
"""How a variable spells its fact; `resolve.cluster` has one parser per format, whichever cluster sets it:

- `integer`: a whole number in ASCII digits (a count, a rank, a job id): at least 1 for a count, 0 for the rest;
- `port`: a TCP port, 1-65535;
- `host`: a host name or an IP address, without a port (`[::1]` loses its brackets);
- `tasks_per_node`: SLURM's `4` or `4(x2)` (an uneven `4(x2),2` has no single value: refused);
- `job_number`: a job id that may be blank (then the job has none);
- `slurm_hostlist`: SLURM's host list (`node[001-004,7],gpu2`), checked whole: its first host;
- `rank_hosts`: LSF's `host count host count ...`: the hosts that run ranks (the first, the launch node, runs none
  under jsrun, as Lightning reads it): their number, or the first of them.
"""


@attrs.frozen(kw_only=True)
class JobVariable:
    """Where one fact of a started job comes from: the first of `names` that is set (the others are fallbacks, in
    order), read in `format`. When none is set, the fact is `default` (None: unknown), or, for a `required` one, a
    `ClusterEnvironmentError` naming the last name (the one every such process carries) with `unset_reason` and
    `unset_fix` ({cluster}: the schema's label)."""

    names: tuple[str, ...]
    format: VariableFormat = "integer"
    required: bool = False
    default: int | None = None
    unset_reason: str = "it is not set, and the cluster environment needs it"
    unset_fix: str = "Start the processes with the {cluster} launcher, which sets it, or set it by hand"


def _required(*names: str, format: VariableFormat = "integer") -> JobVariable:
    return JobVariable(names=names, format=format, required=True)


def _optional(*names: str, format: VariableFormat = "integer", default: int | None = None) -> JobVariable:
    return JobVariable(names=names, format=format, default=default)


# torch.distributed's env:// meeting point, which a user (or a launcher) may set under any cluster manager.
_MAIN_ADDRESS = _optional("MASTER_ADDR", format="host")
_MAIN_PORT = _optional("MASTER_PORT", format="port")


@attrs.frozen(kw_only=True)
class JobVariables:
    """The variables a cluster manager gives each process it starts: for each fact of the job, the variable that
    states it and its format. One reader (`resolve.cluster`) reads every schema. A fact without a variable is unknown
    (None: the resolver derives what it can), a number is a fact of the cluster itself.

    Counts are at least 1 and ranks at least 0; a rank is checked against its count (global rank < world size,
    local rank < processes per node, node rank < nodes) where both come from variables. Without a node count
    variable, the nodes are world size / processes per node where that divides evenly."""

    label: str  # the cluster as messages name it ("SLURM")
    reason: str  # why the plan is in this cluster: {how} ("detected" or "asked for"), {values[fact]}, {managers}
    reason_asked: str = ""  # the reason when asked for by name, where it is not `reason` with {how}
    world_size: JobVariable | None = None
    processes_per_node: JobVariable | int | None = None
    global_rank: JobVariable | None = None
    local_rank: JobVariable | int | None = None
    node_rank: JobVariable | None = None
    num_nodes: JobVariable | None = None
    main_address: tuple[JobVariable, ...] = ()  # the first that is set gives the host of rank 0; else 127.0.0.1
    loopback_needs_one_node: bool = False  # 127.0.0.1 only for a job known to run on one node (else unknown)
    main_port: JobVariable | None = None
    job_id: JobVariable | None = None  # read by the row's port formula (a required one is checked in any case)
    detail_unit: str = ""  # what the world size counts, in messages ("pods")


def job_variables(schema: JobVariables) -> tuple[tuple[JobFact | Literal["job_id"], JobVariable], ...]:
    """Every variable of a schema with the fact it states (what the probe copies, and what a launcher writes)."""
    found: list[tuple[JobFact | Literal["job_id"], JobVariable]] = []
    for fact, source in (
        ("world_size", schema.world_size),
        ("processes_per_node", schema.processes_per_node),
        ("global_rank", schema.global_rank),
        ("local_rank", schema.local_rank),
        ("node_rank", schema.node_rank),
        ("num_nodes", schema.num_nodes),
        *(("main_address", address) for address in schema.main_address),
        ("main_port", schema.main_port),
        ("job_id", schema.job_id),
    ):
        if isinstance(source, JobVariable):
            found.append((fact, source))  # type: ignore[arg-type]  # the facts above are JobFacts
    return tuple(found)


@attrs.frozen(kw_only=True)
class JobPort:
    """A main port every process of a job computes alike from the job's id (the schema's `job_id`), Lightning's
    rules: `base + id % modulo`."""

    base: int
    modulo: int


@attrs.frozen(kw_only=True)
class DefaultPort:
    """The main port when neither the port variable nor a job id gives one; where `note` is given, a note (code
    `note_code`; {port} and {variable}, the port variable, filled in) says so."""

    port: int
    note_code: str = ""
    note: str = ""


@attrs.frozen(kw_only=True)
class NotDetectedWhen:
    """A value of a variable under which the cluster's variables are present but it does not manage the processes
    (SLURM's interactive allocations): detection passes it by, with a note."""

    variable: str
    values: frozenset[str]
    note_code: str
    note: str  # the note's message: {variable} and {value} are filled in


@attrs.frozen(kw_only=True)
class ClusterRule:
    name: ClusterName
    description: str
    detect_variables: tuple[frozenset[str], ...]  # detected when every variable of any one set is present
    detect_priority: int | None  # higher is tried first; None: only on request
    creates_processes: bool  # the cluster manager starts every process itself
    node_rank_variable: str  # what names the node rank in messages (the variable the cluster sets, or a phrase)
    # The variables its processes carry. Several are dialects (Open MPI's, then MPICH's): the first whose world size
    # variable is set is read, else the last.
    schemas: tuple[JobVariables, ...]
    max_processes_per_node: int | None = None  # None: no limit beyond the hardware
    launch_hint: str = ""  # how to start the job with another layout: {num_nodes}, {processes_per_node}, {world_size}
    job_port: JobPort | None = None  # the main port from the job id when the port variable is not set
    default_port: DefaultPort | None = None  # the main port when neither gives one (None: the launcher picks one)
    not_detected_when: NotDetectedWhen | None = None


def _set_by_torchrun(name: str, format: VariableFormat) -> JobVariable:
    return JobVariable(
        names=(name,),
        format=format,
        required=True,
        unset_reason="torchrun always sets it, and it is missing",
        unset_fix="Start the script with torchrun",
    )


CLUSTERS: Final[Mapping[ClusterName, ClusterRule]] = {
    rule.name: rule
    for rule in (
        ClusterRule(
            name="torchelastic",
            description="torchrun / torch.distributed.elastic",
            detect_variables=(frozenset({"RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}),),
            # torchrun can run inside a SLURM allocation, so it is checked first (as Lightning does).
            detect_priority=6,
            creates_processes=True,
            node_rank_variable="GROUP_RANK",
            schemas=(
                JobVariables(
                    label="torchelastic",
                    reason="torchelastic was {how} (RANK, GROUP_RANK, LOCAL_RANK and LOCAL_WORLD_SIZE are set)",
                    world_size=_required("WORLD_SIZE"),
                    processes_per_node=_required("LOCAL_WORLD_SIZE"),
                    global_rank=_required("RANK"),
                    local_rank=_required("LOCAL_RANK"),
                    node_rank=_required("GROUP_RANK"),
                    main_address=(_set_by_torchrun("MASTER_ADDR", "host"),),
                    main_port=_set_by_torchrun("MASTER_PORT", "port"),
                ),
            ),
            launch_hint="torchrun --nnodes={num_nodes} --nproc-per-node={processes_per_node}",
        ),
        ClusterRule(
            name="slurm",
            description="SLURM, processes started by srun",
            detect_variables=(frozenset({"SLURM_NTASKS"}),),
            detect_priority=5,
            creates_processes=True,
            node_rank_variable="SLURM_NODEID",
            schemas=(
                JobVariables(
                    label="SLURM",
                    reason="SLURM was {how} (SLURM_NTASKS is set and SLURM_JOB_NAME is not an interactive allocation)",
                    world_size=_required("SLURM_NTASKS"),
                    processes_per_node=_optional("SLURM_NTASKS_PER_NODE", format="tasks_per_node"),
                    global_rank=_required("SLURM_PROCID"),
                    local_rank=_required("SLURM_LOCALID"),
                    node_rank=_required("SLURM_NODEID"),
                    num_nodes=_optional("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
                    main_address=(
                        _MAIN_ADDRESS,
                        _optional("SLURM_NODELIST", "SLURM_JOB_NODELIST", format="slurm_hostlist"),
                    ),
                    main_port=_MAIN_PORT,
                    job_id=_optional("SLURM_JOB_ID", format="job_number"),
                ),
            ),
            launch_hint=(
                "#SBATCH --nodes={num_nodes} --ntasks-per-node={processes_per_node}, and run the script with srun"
            ),
            # 15000 + the job id's last four digits, so every task agrees (Lightning's rule); 12910 without a job id.
            job_port=JobPort(base=SLURM_PORT_BASE, modulo=10000),
            default_port=DefaultPort(port=SLURM_DEFAULT_PORT),
            # `salloc`/`srun --pty bash` sessions: SLURM does not manage the processes there (Lightning's rule).
            not_detected_when=NotDetectedWhen(
                variable="SLURM_JOB_NAME",
                values=frozenset({"bash", "interactive"}),
                note_code="slurm-interactive",
                note=(
                    "{variable}={value!r} is an interactive allocation, so SLURM does not manage the processes; "
                    "trainplan starts them itself (cluster='slurm' overrides this)"
                ),
            ),
        ),
        ClusterRule(
            name="lsf",
            description="IBM Spectrum LSF with jsrun",
            detect_variables=(
                frozenset({"LSB_JOBID", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK"}),
            ),
            detect_priority=3,
            creates_processes=True,
            node_rank_variable="node rank",
            schemas=(
                JobVariables(
                    label="LSF",
                    reason="LSF was {how} (LSB_JOBID and the JSM_NAMESPACE_* variables are set)",
                    world_size=_required("JSM_NAMESPACE_SIZE"),
                    global_rank=_required("JSM_NAMESPACE_RANK"),
                    local_rank=_required("JSM_NAMESPACE_LOCAL_RANK"),
                    num_nodes=_optional("LSB_MCPU_HOSTS", format="rank_hosts"),
                    main_address=(_MAIN_ADDRESS, _optional("LSB_MCPU_HOSTS", format="rank_hosts")),
                    main_port=_MAIN_PORT,
                    job_id=_required("LSB_JOBID"),
                ),
            ),
            launch_hint="jsrun --nrs {num_nodes} --tasks_per_rs {processes_per_node}",
            job_port=JobPort(base=LSF_PORT_BASE, modulo=1000),  # 10000 + id % 1000 (Lightning)
        ),
        ClusterRule(
            name="mpi",
            description="mpirun / mpiexec (Open MPI, MPICH, Intel MPI)",
            # Open MPI, then the PMI variables of MPICH, Intel MPI and other Hydra-based launchers.
            detect_variables=(
                frozenset({"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"}),
                frozenset({"PMI_SIZE", "PMI_RANK"}),
            ),
            detect_priority=2,
            creates_processes=True,
            node_rank_variable="node rank",
            schemas=(
                JobVariables(
                    label="MPI",
                    reason="MPI was {how} (OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_RANK are set)",
                    world_size=_required("OMPI_COMM_WORLD_SIZE"),
                    processes_per_node=_optional("OMPI_COMM_WORLD_LOCAL_SIZE"),
                    global_rank=_required("OMPI_COMM_WORLD_RANK"),
                    local_rank=_optional("OMPI_COMM_WORLD_LOCAL_RANK"),
                    main_address=(_MAIN_ADDRESS,),
                    loopback_needs_one_node=True,  # MPI names no hosts
                    main_port=_MAIN_PORT,
                ),
                JobVariables(
                    label="MPI",
                    reason="MPI was {how} (PMI_SIZE and PMI_RANK are set)",
                    world_size=_required("PMI_SIZE"),
                    processes_per_node=_optional("MPI_LOCALNRANKS"),
                    global_rank=_required("PMI_RANK"),
                    local_rank=_optional("MPI_LOCALRANKID"),
                    main_address=(_MAIN_ADDRESS,),
                    loopback_needs_one_node=True,
                    main_port=_MAIN_PORT,
                ),
            ),
            launch_hint="mpirun -np {world_size} --map-by ppr:{processes_per_node}:node",
            default_port=DefaultPort(
                port=DEFAULT_MAIN_PORT,
                note_code="mpi-default-port",
                note="MPI gives no port; using {port} (export {variable} to choose another)",
            ),
        ),
        ClusterRule(
            name="kubeflow",
            description="Kubeflow PyTorchJob: one process per pod",
            detect_variables=(frozenset({"KUBERNETES_PORT", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}),),
            # Every pod has KUBERNETES_PORT, but with RANK, WORLD_SIZE and MASTER_ADDR/PORT beside it the pod is one
            # rank of a PyTorchJob (torchrun inside a pod sets LOCAL_RANK too and is found first, as torchelastic).
            # Lightning never detects it (its detect() raises): a deliberate difference.
            detect_priority=4,
            creates_processes=True,
            node_rank_variable="node rank",
            schemas=(
                JobVariables(
                    label="Kubeflow",
                    reason="Kubeflow was {how}",
                    world_size=_required("WORLD_SIZE"),
                    global_rank=_required("RANK"),
                    # One process per pod (Lightning's KubeflowEnvironment counts its world in pods): the pod's rank
                    # is its node's, and its process local rank 0.
                    processes_per_node=1,
                    local_rank=0,
                    node_rank=_required("RANK"),
                    main_address=(_MAIN_ADDRESS,),
                    loopback_needs_one_node=True,
                    main_port=_MAIN_PORT,
                    detail_unit="pods",
                ),
            ),
            # A PyTorchJob runs one process per pod (Lightning's KubeflowEnvironment counts its world in pods).
            max_processes_per_node=1,
            launch_hint="a PyTorchJob with {num_nodes} replicas",
        ),
        ClusterRule(
            name="local",
            description="this machine (or machines you start yourself with NODE_RANK and MASTER_ADDR)",
            detect_variables=(frozenset(),),
            detect_priority=0,
            creates_processes=False,
            node_rank_variable="NODE_RANK",
            schemas=(
                JobVariables(
                    label="local",
                    reason="no cluster manager's variables were found ({managers})",
                    reason_asked="cluster='local' was asked for",
                    node_rank=_optional("NODE_RANK", "GROUP_RANK", default=0),
                    main_address=(_MAIN_ADDRESS,),
                    main_port=_MAIN_PORT,
                ),
            ),
            launch_hint="set NODE_RANK, MASTER_ADDR and MASTER_PORT on each node",
        ),
    )
}


@attrs.frozen(kw_only=True)
class LaunchedWorkers:
    """What trainplan's own launchers give each worker, and how the worker reads it back: every variable of `schema`
    (each name of a fact) and of `also_written` is written, and `schema` is read. `launch_hint` is how to start the
    job with another layout (as `ClusterRule.launch_hint`)."""

    schema: JobVariables
    also_written: Mapping[str, JobFact]
    launch_hint: str

    __attrs_post_init__ = freeze_nested_maps  # nested maps read-only: nobody changes a rule in place


LAUNCHED_WORKERS: Final[LaunchedWorkers] = LaunchedWorkers(
    schema=JobVariables(
        label="trainplan launch",
        reason=(
            "this process is worker {values[global_rank]} of {values[world_size]} that trainplan's {launcher!r} "
            f"launcher started ({LAUNCHED_MARKER} is set)"
        ),
        # torchrun's variables, for scripts that expect them.
        world_size=_required("WORLD_SIZE"),
        processes_per_node=_required("LOCAL_WORLD_SIZE"),
        global_rank=_required("RANK"),
        local_rank=_required("LOCAL_RANK"),
        # A static meeting gives NODE_RANK; a c10d rendezvous assigns node ranks as nodes arrive (GROUP_RANK).
        node_rank=_required("NODE_RANK", "GROUP_RANK"),
        main_address=(_MAIN_ADDRESS,),
        main_port=_MAIN_PORT,
    ),
    # torchelastic's role variables, which some frameworks read; trainplan writes them and reads none.
    also_written={"ROLE_RANK": "global_rank", "ROLE_WORLD_SIZE": "world_size"},
    launch_hint="trainplan launch with num_nodes={num_nodes} and devices={processes_per_node}",
)
"""The workers `trainplan launch`, `tp.launch` and the emitted jobs start (marked by `LAUNCHED_MARKER`)."""

JOB_VARIABLES: Final[frozenset[str]] = frozenset(
    {
        *(name for rule in CLUSTERS.values() for group in rule.detect_variables for name in group),
        *(rule.not_detected_when.variable for rule in CLUSTERS.values() if rule.not_detected_when is not None),
        *(
            name
            for schema in (*(schema for rule in CLUSTERS.values() for schema in rule.schemas), LAUNCHED_WORKERS.schema)
            for _, source in job_variables(schema)
            for name in source.names
        ),
        *LAUNCHED_WORKERS.also_written,
        LAUNCHED_MARKER,
        RUN_ID_VARIABLE,
    }
)
"""Every variable the cluster rows and trainplan's launched workers name: what detection and the readers look at."""

MAX_DEVICES_PER_NODE: Final[int] = 4096
"""More processes or devices on one node than any machine has: refused rather than planned (and allocated)."""

MAX_NODES: Final[int] = 1_000_000
"""More nodes than any cluster has."""

MAX_WORLD_SIZE: Final[int] = 2**31 - 1
"""torch.distributed ranks are int32."""

MAX_CPU_COUNT: Final[int] = 1 << 20
"""An Environment's cpu_count beyond this is not a machine."""

TRAINPLAN_RUN_ID_PREFIX: Final[str] = "trainplan-"
"""`trainplan launch` sets TORCHELASTIC_RUN_ID=trainplan-<port> (for frameworks that look for torchelastic); another
run id in a process that carries trainplan's marker means a torchrun inside a trainplan worker started it."""

SYNC_BATCHNORM_ACCELERATORS: Final[frozenset[AcceleratorName]] = frozenset({"cuda"})
"""Where torch.nn.SyncBatchNorm runs ("SyncBatchNorm layers only work with GPU modules")."""

PLAN_VARIABLE: Final[str] = "TRAINPLAN_PLAN"
"""Holds the launcher's plan as JSON in every worker trainplan starts (`trainplan.resolve()` there returns it,
seen from that worker)."""

REQUEST_VARIABLE: Final[str] = "TRAINPLAN_REQUEST"
"""Set by emitted jobs (torchrun line, sbatch script) when the request chose more than the layout (a precision, a
strategy, its options): `trainplan.resolve()` with no arguments resolves that request inside the job."""

SELECTED_DEVICES_VARIABLE: Final[str] = "TRAINPLAN_SELECTED_DEVICES"
"""Set beside CUDA_VISIBLE_DEVICES by trainplan's launchers: the device indices the launcher was asked for (as the
launching process saw them), so that the same explicit `devices=[0, 2]` inside the job names the same GPUs."""

DEFAULT_PROCESS_GROUP_TIMEOUT: Final[int] = 1800
"""Seconds a collective may wait for its peers when the strategy's options set no timeout (torch's and
Lightning's default)."""

KUBERNETES_DEVICE_RESOURCES: Final[Mapping[AcceleratorKey, str | None]] = {
    "cpu": None,
    "cuda": "nvidia.com/gpu",  # NVIDIA's device plugin
}
"""The accelerators a Kubeflow PyTorchJob can run on, and the Kubernetes resource each pod asks for per device
(None: CPUs, which every node has)."""

KUBEFLOW_MASTER_PORT: Final[int] = 23456
"""The Kubeflow training operator's default master port (its container port named `pytorchjob-port`)."""

RELEVANT_VARIABLE_PREFIXES: Final[tuple[str, ...]] = (
    "SLURM_",
    "LSB_",
    "JSM_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "TORCHELASTIC_",
    "TRAINPLAN_",
)
RELEVANT_VARIABLES: Final[frozenset[str]] = frozenset(
    {"CUDA_VISIBLE_DEVICES", "PJRT_DEVICE", "TPU_NUM_DEVICES", *JOB_VARIABLES}
)
"""The environment variables the probe copies into `Environment.variables` (everything else is ignored): the devices'
variables and every variable a cluster row or trainplan's launched workers name (`JOB_VARIABLES`)."""


# --------------------------------------------------------------------------------------------------
# Incompatibility rules: the reason and fix of every rejection, as data.


@attrs.frozen(kw_only=True)
class Rule:
    """A named rejection. `reason` and `fix` are templates filled with the values involved."""

    id: str
    reason: str
    fix: str


RULES: Final[Mapping[str, Rule]] = {
    rule.id: rule
    for rule in (
        Rule(
            id="strategy-accelerator",
            reason="strategy {strategy!r} runs on {supported}, not {accelerator!r}: {why}",
            fix="{fix}",
        ),
        Rule(
            id="options-accelerator",
            reason=(
                "strategy='auto' with {options} chose strategy {strategy!r}, which runs on {supported}, not "
                "{accelerator!r}: {why}"
            ),
            fix="Drop strategy_options to run on {accelerator!r}, or keep them and use accelerator={supported}",
        ),
        Rule(
            id="strategy-package",
            reason="strategy {strategy!r} needs the {package!r} package, which is not installed",
            fix="Install it (`pip install {package}`) or choose another strategy, e.g. strategy='ddp'",
        ),
        Rule(
            id="strategy-nodes",
            reason="strategy {strategy!r} runs in a single process, which cannot span {num_nodes} nodes",
            fix="Use strategy='ddp' for several nodes, or num_nodes=1",
        ),
        Rule(
            id="strategy-device-count",
            reason="strategy {strategy!r} drives exactly one device, but {count} devices were selected",
            fix="Use strategy='ddp' (or 'auto') for several devices, or select one device, e.g. devices=1",
        ),
        Rule(
            id="strategy-options",
            reason="strategy_options of type {given} do not fit strategy {strategy!r}, which takes {expected}",
            fix="{fix}",
        ),
        Rule(
            id="strategy-preset",
            reason="strategy {strategy!r} already sets {field}={preset!r}, but strategy_options say {field}={given!r}",
            fix="Use the base strategy {base!r} with strategy_options, or drop the conflicting option",
        ),
        Rule(
            id="deepspeed-offload-stage",
            reason="DeepSpeed offloads parameters only at ZeRO stage 3, but stage {stage} was asked for",
            fix="Use DeepSpeedOptions(stage=3, offload_parameters=True), or offload_parameters=False",
        ),
        Rule(
            id="fork-unavailable",
            reason="strategy {strategy!r} forks this process, and this platform offers only {methods}",
            fix="Use strategy={instead!r}",
        ),
        Rule(
            id="fork-after-cuda",
            reason=(
                "strategy {strategy!r} forks this process, and CUDA is already initialised here; "
                "a forked child cannot use CUDA after that"
            ),
            fix=(
                "Use strategy={instead!r}, or make sure nothing touches CUDA before the fork "
                "(find_usable_cuda_devices() is safe: it never initialises CUDA)"
            ),
        ),
        Rule(
            id="interactive-launcher",
            reason=(
                "strategy {strategy!r} would {launcher_description}, which an interactive session "
                "(notebook, REPL) cannot do"
            ),
            fix="Use strategy={instead!r}, or run the code as a script",
        ),
        Rule(
            id="backend-accelerator",
            reason="process_group_backend={backend!r} cannot serve accelerator {accelerator!r}: {why}",
            fix="Use process_group_backend={instead!r} (the default for {accelerator!r}), or leave it unset",
        ),
        Rule(
            id="backend-without-group",
            reason="strategy {strategy!r} runs one process and creates no process group, so a backend has no effect",
            fix="Remove process_group_backend, or use a multi-process strategy such as 'ddp'",
        ),
        Rule(
            id="precision-accelerator",
            reason="precision={precision!r} is not available on accelerator {accelerator!r}: {why}",
            fix="Use precision={instead!r}",
        ),
        Rule(
            id="precision-strategy",
            reason="precision={precision!r} is not supported by strategy {strategy!r}, which accepts {supported}",
            fix="Use one of {supported}",
        ),
        Rule(
            id="precision-package",
            reason="precision={precision!r} needs the {package!r} package, which is not installed",
            fix="Install it (`pip install {package}`), or use precision='bf16-mixed'",
        ),
        Rule(
            id="cluster-world-size",
            reason=(
                "{cluster} started {started} ({detail}), but the request asks for num_nodes={num_nodes} × "
                "{processes_per_node} processes per node = {world_size}"
            ),
            fix="{fix}",
        ),
        Rule(
            id="cluster-rank-range",
            reason="{what} {value} is outside the plan's {limit_name} of {limit}",
            fix="{fix}",
        ),
        Rule(
            id="cluster-main-address",
            reason="{cluster} spans {num_nodes} nodes but gives no main address for them to meet at",
            fix="Export MASTER_ADDR=<host of rank 0> to every process (for mpirun: -x MASTER_ADDR)",
        ),
        Rule(
            id="cluster-one-process-per-node",
            reason="{cluster} runs one process per pod, but {processes_per_node} processes per node were asked for",
            fix="Use devices=1 (one device per pod), and raise the number of pods (num_nodes) instead",
        ),
        Rule(
            id="usable-with-indices",
            reason="select_usable_gpus picks GPUs itself, but devices={devices!r} already names them",
            fix="Give a count instead (devices=2), or drop select_usable_gpus and keep the indices",
        ),
        Rule(
            id="usable-needs-cuda",
            reason="select_usable_gpus picks CUDA GPUs, but the accelerator is {accelerator!r}",
            fix="Use accelerator='cuda' (or 'gpu'), or drop select_usable_gpus",
        ),
        Rule(
            id="legacy-conflict",
            reason="{first} and {second} both set {what}{how}",
            fix="Keep one of them: {fix}",
        ),
        Rule(
            id="legacy-removed",
            reason="{reason}",
            fix="{fix}",
        ),
        Rule(
            id="job-layout-unknown",
            reason=(
                "{cluster} started {world_size} processes ({detail}) but does not say how many run on each node, so "
                "devices='auto' cannot take the job's layout"
            ),
            fix="Ask for the job's layout explicitly: devices=<processes per node>, num_nodes=<nodes>",
        ),
        Rule(
            id="job-gpus",
            reason=(
                "{cluster} started {processes_per_node} processes on this node, one GPU each, but only {visible} "
                "GPU(s) are visible to this process"
            ),
            fix=(
                "Make every GPU the node's processes use visible to each of them (CUDA_VISIBLE_DEVICES, SLURM "
                "--gpus-per-node rather than --gpus-per-task), or start {visible} process(es) per node"
            ),
        ),
        Rule(
            id="job-device-selection",
            reason=("this job was started on devices {selected} ({variable}), and devices={devices} names other ones"),
            fix="Write devices='auto' inside the job (it takes the job's GPUs), or devices={selected}",
        ),
        Rule(
            id="nested-launch",
            reason=(
                "this process is rank {rank} of a world of {world} that {started_by} started, and the plan's "
                "launcher {launcher!r} would start {world_size} more workers from it: a second world inside the first"
            ),
            fix=(
                "Resolve the plan inside the job (trainplan.resolve() takes the job's layout, launcher 'external'); "
                "trainplan.launch then runs the function here, in the existing world"
            ),
        ),
        Rule(
            id="multi-node-port",
            reason=(
                "num_nodes={num_nodes} with no main port: each node would choose its own free port, and the nodes "
                "would never meet"
            ),
            fix=(
                "Give every node the same main port and address: `trainplan launch --main-port 29500 --main-address "
                "node0`, or export MASTER_PORT=29500 and MASTER_ADDR on every node before launching"
            ),
        ),
        Rule(
            id="kubeflow-accelerator",
            reason=(
                "a Kubeflow PyTorchJob's pods get their devices from Kubernetes, which schedules {supported}, not "
                "{accelerator!r}"
            ),
            fix="Plan for accelerator='cpu' or 'cuda' to emit a PyTorchJob, or use {accelerator!r}'s own launcher",
        ),
        Rule(
            id="kubeflow-resource",
            reason=(
                "accelerator {accelerator!r} is a row of {rules}, which names no Kubernetes resource for its devices, "
                "so a PyTorchJob's pods could not ask for them"
            ),
            fix=(
                "Name the resource its device plugin advertises: {rules_builder}.extend(kubernetes_resources="
                "{{{accelerator!r}: 'vendor.com/device'}}), or plan for accelerator='cpu' or 'cuda'"
            ),
        ),
        Rule(
            id="framework-accelerator",
            reason=(
                "accelerator {accelerator!r} is a row of {rules}, which says nothing of how {framework} spells it: "
                "{framework} has no accelerator of that name unless a plugin registers one"
            ),
            fix=(
                "Add the spelling the plugin registers: {rules_builder}.extend(framework_accelerators=["
                "FrameworkAccelerator(accelerator={accelerator!r}, lightning=..., lightning_devices='indices', "
                "accelerate_cpu=False, accelerate_gpu_ids=False, accelerate_processes=True)]), or build "
                "{framework}'s arguments by hand"
            ),
        ),
        Rule(
            id="framework-precision",
            reason=(
                "precision {precision!r} is a row of {rules}; {framework} has no precision of that name (its "
                "precision plugins are the built-in precisions)"
            ),
            fix=(
                "Run the plan's loop through trainplan.runtime, which reads the precision's recipe, or give "
                "{framework} your own precision plugin and plan with one of {supported} for the adapter"
            ),
        ),
        Rule(
            id="plan-rules",
            reason=(
                "the plan was made from {plan_rules}, and the rules given here ({given}) have no row for its {what} "
                "{value!r}"
            ),
            fix="Pass the plan's own rule set as rules= ({how})",
        ),
        Rule(
            id="sync-batchnorm-device",
            reason="torch's SyncBatchNorm synchronises batch statistics across CUDA devices only, not {accelerator!r}",
            fix="Drop sync_batchnorm (each process then normalises its own batch), or run on CUDA GPUs",
        ),
        Rule(
            id="sync-batchnorm-framework",
            reason="{framework} has no sync_batchnorm setting, so the plan's sync_batchnorm=True would be lost",
            fix="Convert the model before handing it over: torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)",
        ),
        Rule(
            id="accelerate-cpu-processes",
            reason="`accelerate launch` starts several CPU processes only through MPI (--mpirun_hostfile)",
            fix="Start the processes with trainplan launch or torchrun, and build the Accelerator inside each one",
        ),
        Rule(
            id="deepspeed-config",
            reason="only a DeepSpeed plan has a DeepSpeed config",
            fix="Resolve a plan with strategy='deepspeed' (or a deepspeed_stage_* preset)",
        ),
        Rule(id="deepspeed-count", reason="{name} counts samples or steps", fix="Write {name}=1 or more"),
        Rule(
            id="lightning-trainer-strategy",
            reason="Lightning's Trainer registers no {strategy_class} (only Fabric does)",
            fix="Run the plan with Fabric (trainplan.fabric_arguments(plan)), or use strategy={instead!r} with the "
            "Trainer",
        ),
        Rule(
            id="lightning-strategy",
            reason="Lightning has no strategy for it (Lightning 2.0 removed DataParallel)",
            fix="Use strategy='ddp' (one process per GPU), which Lightning and trainplan both run",
        ),
        Rule(
            id="accelerate-precision",
            reason="Accelerate has no mode that casts the whole model; its mixed_precision is no, fp16, bf16 or fp8",
            fix="Use precision='32-true' with Accelerate and cast the model yourself, or a '-mixed' precision",
        ),
        Rule(
            id="accelerate-strategy",
            reason="{why}",
            fix="Use strategy={instead!r} with Accelerate",
        ),
        Rule(
            id="mesh-product",
            reason=(
                "the parallel degrees multiply to {product} ({spelled}), but the world has {world_size} processes "
                "({layout})"
            ),
            fix=(
                "Use degrees whose product is {world_size}, e.g. {fitting}, or leave one of them 'auto' to take the "
                "rest"
            ),
        ),
        Rule(
            id="mesh-remainder",
            reason=(
                "{auto}='auto' takes what the other degrees leave, but they multiply to {product} ({spelled}), which "
                "does not divide the world of {world_size} processes ({layout})"
            ),
            fix="Use degrees that divide {world_size}, e.g. {fitting}",
        ),
        Rule(
            id="mesh-autos",
            reason="{names} say 'auto', but only one degree can take what the others leave",
            fix="Write numbers for all but one of them, e.g. {fitting}",
        ),
        Rule(
            id="mesh-spellings",
            reason="Lightning's sizes ({lightning}) and trainplan's degrees ({degrees}) both describe the mesh",
            fix="Keep one spelling: {suggestion}",
        ),
        Rule(
            id="mesh-inside-node",
            reason="{took}{what} needs {needed} processes on one node ({why}); {shortfall}",
            fix="Use {choices}, e.g. {fitting}",
        ),
        Rule(
            id="mesh-pipeline-nodes",
            reason=(
                "{took}pipeline stages span nodes, each stage holding whole nodes or sharing a node with whole "
                "stages, but {dimension}={degree} makes stages of {stage} processes on {num_nodes} nodes of "
                "{processes_per_node}"
            ),
            fix="Use {choices}, e.g. {fitting}",
        ),
        Rule(
            id="mesh-accelerator",
            reason="{took}{dimension}={degree} does not run on {accelerator!r}: {why}",
            fix="Use {dimension}=1 there, e.g. {fitting}, or run on {supported}",
        ),
        Rule(
            id="mesh-backend",
            reason=(
                "a device mesh on {accelerator!r} runs over {allowed!r}, the backend torch's FSDP2 and DTensor are "
                "built on, not {backend!r}"
            ),
            fix="Use process_group_backend={allowed!r}, or leave it unset",
        ),
        Rule(
            id="mesh-precision",
            reason="{took}{dimension}={degree} does not run with precision={precision!r}: {why}",
            fix="Use precision={instead!r}, or {dimension}=1",
        ),
        Rule(
            id="lightning-mesh",
            reason=(
                "Lightning's ModelParallelStrategy has one data-parallel and one tensor-parallel dimension, so {lost}"
            ),
            fix="{fix}",
        ),
        Rule(
            id="lightning-precision",
            reason="Lightning's {strategy_class} runs precision {supported} only",
            fix="Use one of them with Lightning, or run the plan's loop through trainplan.runtime",
        ),
        Rule(
            id="fabric-parallelize",
            reason=(
                "Fabric's ModelParallelStrategy applies the mesh through a function it calls with the model and the "
                "device mesh, and none was given"
            ),
            fix="Pass it: fabric_arguments(plan, parallelize=fn), where fn(model, device_mesh) returns the model",
        ),
        Rule(id="accelerate-mesh", reason="{why}", fix="{fix}"),
        Rule(
            id="metric-stateful-cpu",
            reason=(
                "a stateful metric object kept on CPU cannot be reduced with backend {backend!r}: its states are "
                "reduced by the metric itself, on the device its tensors live on, and {backend!r} only takes "
                "{device_type} tensors; moving them to the device and back would mean patching the metric"
            ),
            fix="Keep stateful metrics on the device (store_on_cpu=False), or log the plain value instead",
        ),
    )
}

# --------------------------------------------------------------------------------------------------
# Deliberate differences from PyTorch Lightning's connector (each also stated in the README).

DIFFERENCES: Final[Mapping[str, str]] = {
    "ddp-under-cluster-with-spawn": (
        "ddp_spawn / ddp_fork / ddp_notebook inside SLURM, torchrun or trainplan launch: Lightning starts extra "
        "processes inside each task; trainplan runs the process as the strategy's script counterpart "
        "(strategy='ddp'), joining the world the job started, with a note, so the same script runs under every "
        "launcher."
    ),
    "cluster-world-size": (
        "A cluster whose world disagrees with num_nodes × devices: trainplan refuses it while planning, naming "
        "both numbers and the launch line that fits; Lightning's connector accepts it (its SLURM environment "
        "checks --ntasks-per-node only later, when the strategy sets up, and torchrun's world size not at all)."
    ),
    "torchelastic-visible-devices": (
        "Under torchrun with one visible GPU, Lightning skips its check that the requested GPUs exist; "
        "trainplan refuses device indices this process cannot see, since it could not use them."
    ),
    "interactive-under-cluster": (
        "A notebook or REPL inside a SLURM or torchrun job with strategy='ddp': Lightning refuses it because "
        "its script launcher is not interactive-compatible; trainplan accepts it, since the cluster started "
        "the processes and nothing is re-run."
    ),
    "strategy-dp": (
        "strategy='dp': trainplan plans torch.nn.DataParallel (one process, several GPUs); Lightning 2.0 removed it."
    ),
    "single-device-strategy": (
        "strategy='single_device': Lightning's registered strategy ignores devices= and num_nodes= (it uses "
        "the first device, on one node); trainplan uses the device asked for, and refuses several devices or "
        "nodes, pointing to strategy='ddp'."
    ),
    "backend-on-single-process": (
        "process_group_backend with a single-process strategy: Lightning ignores it; trainplan refuses it, since "
        "it can have no effect."
    ),
    "mps-ddp": (
        "strategy='ddp' with accelerator='mps': Lightning refuses DDP-family strategies only when MPS is "
        "available; trainplan refuses the pair on any machine, and lets accelerator='cpu' use DDP on a Mac."
    ),
    "kubeflow-detected": (
        "A Kubeflow PyTorchJob pod (KUBERNETES_PORT with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT) is detected "
        "as a started job; Lightning detects it only when asked for (its KubeflowEnvironment cannot detect itself), "
        "so there each pod would plan a world of its own."
    ),
    "auto-adopts-job": (
        "devices='auto' and num_nodes='auto' inside a started job (torchrun, srun, mpirun, jsrun, trainplan "
        "launch): trainplan takes the layout the job started (its processes per node and nodes); Lightning "
        "counts the visible devices (all GPUs, or one CPU process) and defaults to one node, so a job whose "
        "layout differs fails later, or silently runs a different world."
    ),
    "fork-after-cuda": (
        "A fork-based strategy after CUDA was initialised: Lightning finds out at launch; trainplan refuses the "
        "plan when the environment says CUDA is initialised already."
    ),
    "model-parallel-auto": (
        "ModelParallelStrategy with one size 'auto': Lightning takes data parallel = the nodes and tensor parallel = "
        "the processes per node whatever the other size says, and fails unless they multiply to the world size; "
        "trainplan's 'auto' takes what the other size leaves (the same sizes wherever Lightning succeeds)."
    ),
    "model-parallel-default": (
        "strategy='model_parallel' without sizes: Lightning's ModelParallelStrategy() makes tensor parallelism span "
        "each node; trainplan shards data over every process (dp_shard='auto', torchtitan's default), since tensor "
        "parallelism needs a function that knows the model's layers. Lightning's spelling with both sizes 'auto' "
        "gives Lightning's layout."
    ),
    "model-parallel-precision": (
        "ModelParallelStrategy's precisions: Lightning runs 32-true, bf16-mixed, bf16-true and 16-true; trainplan "
        "also plans 16-mixed, with data parallelism alone (replicas and shards: not with pipeline stages, nor with "
        "tensor or context parallelism, where torch's GradScaler can make the ranks of one group disagree on skipping "
        "a step; use bf16-mixed there), and 64-true except with context parallelism. The Lightning adapter refuses "
        "what Lightning cannot run."
    ),
    "deepspeed-cpu": (
        "DeepSpeed on accelerator='cpu': Lightning's connector accepts it (DeepSpeed has a CPU accelerator); "
        "trainplan's deepspeed rows run on CUDA only, since its ZeRO offload and precision paths are planned and "
        "tested for CUDA devices. A framework that runs DeepSpeed on CPU extends the rule set with a deepspeed row "
        "that lists 'cpu' (tests/downstream_rules.py does)."
    ),
    "xla-fsdp-trainer": (
        "strategy='xla_fsdp': Fabric registers it (XLAFSDPStrategy, torch_xla's FSDP) and the Trainer does not, so "
        "Lightning's Trainer refuses the name; trainplan plans it (XLA devices, torch_xla's launcher, 32-true, "
        "16-true or bf16-true), fabric_arguments builds it, and lightning_trainer_arguments refuses it, pointing to "
        "strategy='xla'. Fabric also turns strategy='fsdp' on a TPU into xla_fsdp; trainplan refuses fsdp on XLA "
        "and names xla_fsdp."
    ),
}


# --------------------------------------------------------------------------------------------------
# Legacy flags (the deprecation bridge, `Request.from_legacy`): the old → new mapping as data.


@attrs.frozen(kw_only=True)
class LegacyStrategy:
    """What an old strategy name (given as `accelerator=`, `distributed_backend=`, `plugins=`, ...) becomes.

    `strategy` None means the strategy no longer exists and has no faithful modern counterpart:
    `from_legacy` then raises `Incompatible` with `reason` and `fix`.
    """

    strategy: StrategyName | None
    accelerator: AcceleratorFlag | None = None
    options: Mapping[str, object] = attrs.field(factory=dict)
    differs: str = ""  # what the modern strategy does differently, for the note
    reason: str = ""  # why there is no modern counterpart (strategy None)
    fix: str = ""

    __attrs_post_init__ = freeze_nested_maps  # nested maps read-only: nobody changes a rule in place


LEGACY_STRATEGIES: Final[Mapping[str, LegacyStrategy]] = {
    **{name: LegacyStrategy(strategy=name) for name in STRATEGY_NAMES},
    # Lightning 1.x spelled "DDP on CPU processes" as its own accelerator; the accelerator now says where.
    "ddp_cpu": LegacyStrategy(strategy="ddp", accelerator="cpu"),
    "ddp_spawn_cpu": LegacyStrategy(strategy="ddp_spawn", accelerator="cpu"),
    # fairscale's sharded DDP sharded optimizer state and gradients (ZeRO stage 2): FSDP's SHARD_GRAD_OP
    # is the same sharding in torch itself. Both needed CUDA.
    "ddp_sharded": LegacyStrategy(
        strategy="fsdp",
        options={"sharding_strategy": "SHARD_GRAD_OP"},
        differs="FSDP in torch replaces fairscale; SHARD_GRAD_OP shards optimizer state and gradients like it did",
    ),
    "ddp_sharded_spawn": LegacyStrategy(
        strategy="fsdp",
        options={"sharding_strategy": "SHARD_GRAD_OP"},
        differs=(
            "FSDP in torch replaces fairscale, with SHARD_GRAD_OP sharding; its workers are started by re-running "
            "the script instead of being spawned (FSDP has no spawn variant)"
        ),
    ),
    "ddp_fully_sharded": LegacyStrategy(
        strategy="fsdp", differs="fairscale's FullyShardedDataParallel is torch's FSDP now"
    ),
    "fsdp_native": LegacyStrategy(strategy="fsdp"),
    "fsdp_native_full_shard_offload": LegacyStrategy(strategy="fsdp_cpu_offload"),
    "tpu_spawn": LegacyStrategy(strategy="xla", accelerator="xla"),
    "single_tpu": LegacyStrategy(strategy="single_xla", accelerator="xla"),
    "ddp2": LegacyStrategy(
        strategy=None,
        reason=(
            "ddp2 (DataParallel inside each node, DDP across nodes) was removed in Lightning 1.7 and has no "
            "counterpart in torch today"
        ),
        fix="Use strategy='ddp' (one process per GPU on every node); it is faster than ddp2 was",
    ),
    "horovod": LegacyStrategy(
        strategy=None,
        reason="Horovod support was removed in Lightning 2.0, and horovodrun is not a launcher trainplan drives",
        fix="Use strategy='ddp' and start the job with torchrun (or `trainplan launch`) instead of horovodrun",
    ),
}
"""Old strategy names and what they become; every modern name maps to itself."""

LEGACY_PRECISION_PLUGINS: Final[Mapping[str, PrecisionName]] = {
    "native_amp": "16-mixed",
    "mixed_precision": "16-mixed",
    "double_precision": "64-true",
    "bf16_amp": "bf16-mixed",
}
"""Precision plugins once passed by name in `plugins=`."""

LEGACY_ACCELERATORS: Final[Mapping[str, AcceleratorFlag]] = {
    "cpu": "cpu",
    "gpu": "gpu",
    "cuda": "cuda",
    "tpu": "xla",
    "xla": "xla",
    "mps": "mps",
    "auto": "auto",
}
"""Accelerator names that kept their meaning; any other `accelerator=` value is looked up as a strategy."""

UNSUPPORTED_ACCELERATORS: Final[Mapping[str, str]] = {
    "ipu": "Graphcore IPUs",
    "hpu": "Habana Gaudi HPUs",
}
"""Hardware old configs may name that trainplan does not plan for."""


@attrs.frozen(kw_only=True)
class LegacyDeviceFlag:
    """An old per-hardware device flag (`gpus=`, `tpu_cores=`, `num_processes=`): what it implied."""

    accelerator: AcceleratorFlag  # the accelerator the flag implied
    why: str  # why devices= replaced it, for the note
    none_accelerator: AcceleratorFlag | None  # where to run when the flag asks for none of its devices (gpus=0)
    none_why: str = ""  # the note's reason for that


LEGACY_DEVICE_FLAGS: Final[Mapping[str, LegacyDeviceFlag]] = {
    "gpus": LegacyDeviceFlag(
        accelerator="gpu",
        why="devices= counts or lists devices of any accelerator; gpus= was removed in Lightning 2.0",
        # Lightning 1.x read gpus=0 (and [] or "0") as "train on the CPU".
        none_accelerator="cpu",
        none_why="gpus=0 meant no GPU; say where to run instead",
    ),
    "tpu_cores": LegacyDeviceFlag(
        accelerator="xla",
        why="TPUs run through the XLA accelerator, and devices= counts its cores",
        none_accelerator=None,
    ),
    "num_processes": LegacyDeviceFlag(
        accelerator="cpu", why="num_processes counted CPU processes; devices= does that now", none_accelerator=None
    ),
}
"""The old per-hardware device flags, in the order their claims are made."""

LEGACY_STRATEGY_FLAGS: Final[Mapping[str, str]] = {
    "accelerator": "`accelerator` names hardware now; the distribution strategy has its own flag",
    "distributed_backend": "distributed_backend was renamed strategy (and accelerator names hardware)",
    "training_type": "training_type was the RFC's interim name for strategy",
    "plugins": "strategies are no longer plugins",
    "strategy": "the strategy was renamed",
}
"""The flags that may carry an old strategy name, and why the strategy moved out of each (for the note)."""

LEGACY_CONFLICT_FIXES: Final[Mapping[str, str]] = {
    "accelerator": "write accelerator= once, with the hardware (cpu, gpu, cuda, mps, xla)",
    "devices": "write devices= once (it replaces gpus=, tpu_cores= and num_processes=)",
    "strategy": "write strategy= once (it replaces accelerator='ddp', distributed_backend=, training_type= and "
    "strategy plugins)",
    "precision": "write precision= once (it replaces precision plugins and amp_backend)",
    "metrics_store": "write metrics_store= once",
}
"""The fix when old and new flags disagree on a topic (other topics: "write <topic>= once")."""
