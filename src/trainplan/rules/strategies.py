"""Strategy families and registered strategies: accelerators, precisions, launchers, presets, aliases, the `auto`
choice and the fork/spawn/script counterparts (derived: the strategy of the same family and preset with the other
launcher)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, TypeAlias

import attrs

from trainplan.rules.launchers import LAUNCHERS, LauncherRule
from trainplan.spec.frozen import freeze_nested_maps
from trainplan.spec.names import (
    PRECISIONS,
    AcceleratorKey,
    AcceleratorName,
    LauncherName,
    PrecisionKey,
    PrecisionName,
    StrategyFamily,
    StrategyKey,
    StrategyName,
)
from trainplan.spec.options import DDPOptions, DeepSpeedOptions, FSDPOptions, ModelParallelOptions


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


_ALL_PRECISIONS: Final[frozenset[PrecisionName]] = frozenset(PRECISIONS)

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
        # ddp_notebook is ddp_fork under the name notebook users look for: registered after it, it is the forked
        # counterpart the tables below suggest.
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

    def matches(self, accelerator: AcceleratorKey, devices: int, num_nodes: int, interactive: bool) -> bool:
        """Whether the row holds for `devices` devices of `accelerator` on `num_nodes` nodes (in an interactive
        session or not): the resolver's choice and the rule set's check read this one predicate."""
        return (
            (self.accelerators is None or accelerator in self.accelerators)
            and devices >= self.min_devices
            and (self.max_devices is None or devices <= self.max_devices)
            and num_nodes >= self.min_nodes
            and (self.interactive is None or self.interactive == interactive)
        )


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


AUTO_STRATEGY_FOR_OPTIONS: Final[Mapping[StrategyFamily, StrategyName]] = {"model_parallel": "model_parallel"}
"""strategy='auto' with this family's options record chooses this strategy (a mesh's degrees say what to run; the
other families' records fit several strategies, and 'auto' decides from the devices as usual)."""


def counterparts(
    strategies: Mapping[StrategyKey, StrategyRule],
    launchers: Mapping[LauncherName, LauncherRule],
    *,
    source: Callable[[LauncherRule], bool],
    target: Callable[[LauncherRule], bool],
) -> dict[StrategyKey, StrategyKey]:
    """The counterpart of each strategy a `source` launcher starts: the strategy of the same family and preset that a
    `target` launcher starts (where several are, the one registered last: `ddp_notebook`, not `ddp_fork`)."""
    found = {
        (rule.family, frozenset(rule.preset.items())): rule.name
        for rule in strategies.values()
        if target(launchers[rule.launcher])
    }
    table: dict[StrategyKey, StrategyKey] = {}
    for rule in strategies.values():
        counterpart = found.get((rule.family, frozenset(rule.preset.items())))
        if counterpart is not None and source(launchers[rule.launcher]):
            table[rule.name] = counterpart
    return table


def _starts_from_a_function(launcher: LauncherRule) -> bool:
    """trainplan starts the workers by running a function in them (spawn, fork), not by re-running the script."""
    return launcher.trainplan_starts and launcher.start_method is not None


FORK_STRATEGY_FOR: Final[Mapping[StrategyKey, StrategyKey]] = counterparts(
    STRATEGIES,
    LAUNCHERS,
    source=lambda launcher: launcher.trainplan_starts and not launcher.interactive_compatible,
    target=lambda launcher: launcher.forks,
)
"""The notebook-compatible counterpart suggested when an interactive session rejects a launcher: the forked strategy
of the same family and preset."""

SPAWN_STRATEGY_FOR: Final[Mapping[StrategyKey, StrategyKey]] = counterparts(
    STRATEGIES,
    LAUNCHERS,
    source=lambda launcher: launcher.forks,
    target=lambda launcher: _starts_from_a_function(launcher) and not launcher.forks,
)
"""The spawn counterpart suggested when forking is impossible: the strategy of the same family and preset whose
workers start as fresh interpreters."""

SCRIPT_STRATEGY_FOR: Final[Mapping[StrategyKey, StrategyKey]] = counterparts(
    STRATEGIES,
    LAUNCHERS,
    source=_starts_from_a_function,
    target=lambda launcher: launcher.trainplan_starts and launcher.start_method is None,
)
"""The script-mode counterpart of a strategy that starts its workers from a function (spawn, fork): what a
script runs as when something else (torchrun, srun, `trainplan launch`) already started every process (the strategy
of the same family and preset that re-runs the script)."""
