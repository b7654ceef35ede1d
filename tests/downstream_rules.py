"""A downstream framework's rule set, as a framework would ship it: trainplan's own rules plus its strategies, an
accelerator (with its backend), a precision and two DDP options.

Lightning users register strategies such as `ddp_custom_checkpoint_io` in Lightning's global `StrategyRegistry`,
and accelerators such as Ascend's NPU or Gaudi's HPU through plugins (and pass DDP keywords of their own); with
trainplan the framework builds a value instead and passes it to `resolve`, `check`, `render_matrix` and the CLI
(`trainplan plan --rules tests.downstream_rules:RULES --strategy ddp_custom_checkpoint_io`, `--assume npu=8
--accelerator npu`). A cluster manager trainplan does not know is a row of its own (`PBS_RULES`).
"""

from __future__ import annotations

from typing import Final

import attrs

from trainplan import (
    BUILTIN_RULES,
    AcceleratorRule,
    BackendRule,
    ClusterRule,
    CustomName,
    FrameworkAccelerator,
    JobVariable,
    JobVariables,
    PrecisionName,
    PrecisionRecipe,
    PrecisionRule,
    Rules,
    StrategyRule,
)
from trainplan.rules import HandlerField, Keyword, OptionRow, Refused, TrueOrFalse, WholeNumber

CHECKPOINT_IO: Final = CustomName("ddp_custom_checkpoint_io")
"""DDP with the framework's own checkpoint IO: one process per device, started by re-running the script."""

CHECKPOINT_IO_NOTEBOOK: Final = CustomName("ddp_custom_checkpoint_io_notebook")
"""The same, forked (for notebooks); a started job runs it as CHECKPOINT_IO."""

STATIC_DEEPSPEED: Final = CustomName("deepspeed_static_stage_1")
"""ZeRO stage 1 under the framework's name (a preset of the deepspeed family)."""

CUSTOM_NAMES: Final = (CHECKPOINT_IO, CHECKPOINT_IO_NOTEBOOK, STATIC_DEEPSPEED)

BUCKET_CAP: Final = OptionRow(
    family="ddp",
    name="bucket_cap_mb",
    default=25,
    check=WholeNumber(minimum=1, maximum=1024, above="DDP's buckets are megabytes each", fix="Write e.g. 25"),
    torch=(Keyword("bucket_cap_mb"),),
    lightning=(Keyword("bucket_cap_mb"),),  # DDPStrategy passes its keywords on to DDP
    accelerate=(HandlerField("DistributedDataParallelKwargs", "bucket_cap_mb"),),
    deepspeed_config=None,
)
"""An option the framework adds to DDP: the gradient bucket size, which torch, Lightning and Accelerate all take."""

INIT_SYNC: Final = OptionRow(
    family="ddp",
    name="init_sync",
    default=True,
    check=TrueOrFalse(),
    torch=(Keyword("init_sync"),),
    lightning=(Keyword("init_sync"),),
    accelerate=Refused("Accelerate's DistributedDataParallelKwargs has no init_sync (Accelerate 1.15)"),
    deepspeed_config=None,
)
"""An option Accelerate cannot express: DDP without its first broadcast (refused for Accelerate unless True)."""

NPU: Final = CustomName("npu")
"""Ascend's NPU, as its torch plugin (torch_npu) registers it: device type "npu", devices counted by the plugin."""

HCCL: Final = CustomName("hccl")
"""Ascend's collective library: the NPU's process-group backend."""

INT8_QAT: Final = CustomName("int8-qat")
"""Quantisation-aware training: bfloat16 autocast over fake-quantised int8 layers (the framework's own modules)."""

_FAMILIES = BUILTIN_RULES.families
_PRECISIONS = BUILTIN_RULES.precisions
_NPU_PRECISIONS: Final[tuple[PrecisionName, ...]] = ("32-true", "bf16-mixed", "bf16-true")  # as the plugin runs them

RULES: Final[Rules] = BUILTIN_RULES.extend(
    accelerators=[
        AcceleratorRule(
            name=NPU,
            description="Ascend NPU through the torch_npu plugin",
            auto_priority=5,  # the framework prefers its own hardware where it is present
            default_backend=HCCL,
            device_type="npu",
            count_fact="device_counts",  # the framework supplies the count: probe().with_device_counts(...)
            takes_indices=True,
            device_counts="any",
            counts_why="",
            host=False,
            interactive_auto_devices=None,
            visibility_variable=None,
            slurm_gpus=False,
            job_layout=True,
            probes_usable=False,
            fork_blocked_by=None,
            strategy_fix="Use strategy='ddp', 'single_device' or 'auto' on NPUs",
        )
    ],
    backends=[
        BackendRule(
            name=HCCL,
            description="Huawei's collective communication library (NPU tensors)",
            accelerators=frozenset({NPU}),
            needs_device_tensors=True,
            why_not={"cpu": "HCCL reduces NPU tensors only", "cuda": "HCCL reduces NPU tensors only"},
        )
    ],
    precisions=[
        *(
            attrs.evolve(_PRECISIONS[name], accelerators=_PRECISIONS[name].accelerators | {NPU})
            for name in _NPU_PRECISIONS
        ),
        PrecisionRule(
            name=INT8_QAT,
            description="int8 quantisation-aware training (bfloat16 autocast over fake-quantised layers)",
            accelerators=frozenset({"cpu", "cuda", NPU}),
            fallback={},
            fallback_why={},
            requires_package="torchao",  # its fake-quantised layers
            why_not={"mps": "the fake-quantised kernels have no MPS build", "xla": "XLA casts the whole model"},
            instead={"mps": "bf16-mixed", "xla": "bf16-true"},
        ),
    ],
    precision_recipes=[
        PrecisionRecipe(
            name=INT8_QAT,
            autocast_dtype="bfloat16",
            parameter_dtype="float32",
            grad_scaler_on=frozenset(),
            accelerate=None,
            engine="torch",
        )
    ],
    options=[BUCKET_CAP, INIT_SYNC],
    strategies=[
        StrategyRule(name=CHECKPOINT_IO, family="ddp", launcher="subprocess", preset={"static_graph": True}),
        StrategyRule(name=CHECKPOINT_IO_NOTEBOOK, family="ddp", launcher="fork", preset={"static_graph": True}),
        StrategyRule(name=STATIC_DEEPSPEED, family="deepspeed", launcher="subprocess", preset={"stage": 1}),
    ],
    # The framework's DeepSpeed build also runs on CPU processes (DeepSpeed has a CPU accelerator).
    families=[
        attrs.evolve(
            BUILTIN_RULES.families["deepspeed"],
            accelerators=BUILTIN_RULES.families["deepspeed"].accelerators | {"cpu"},
            why_not={
                accelerator: why
                for accelerator, why in BUILTIN_RULES.families["deepspeed"].why_not.items()
                if accelerator != "cpu"
            },
        ),
        # One-device and DDP runs take the NPU; they, FSDP and the device mesh take int8 QAT.
        *(
            attrs.evolve(
                _FAMILIES[family],
                accelerators=_FAMILIES[family].accelerators | ({NPU} if family in ("single_device", "ddp") else set()),
                precisions=_FAMILIES[family].precisions | {INT8_QAT},
            )
            for family in ("single_device", "ddp", "fsdp", "model_parallel")
        ),
    ],
    script_counterparts={CHECKPOINT_IO_NOTEBOOK: CHECKPOINT_IO},
    fork_counterparts={CHECKPOINT_IO: CHECKPOINT_IO_NOTEBOOK},
    name="tests.downstream_rules:RULES",  # plans record it; a launched worker imports it from here
)

ASCEND_RESOURCE: Final = "huawei.com/Ascend910"
"""The Kubernetes resource Ascend's device plugin advertises for each NPU."""

PLUGGED: Final[Rules] = RULES.extend(
    # The framework's Lightning plugin registers an "npu" accelerator that takes device indices, as CUDA's does;
    # Accelerate names NPUs with --gpu_ids and starts one process per device.
    framework_accelerators=[
        FrameworkAccelerator(
            accelerator=NPU,
            lightning="npu",
            lightning_devices="indices",
            accelerate_cpu=False,
            accelerate_gpu_ids=True,
            accelerate_processes=True,
        )
    ],
    kubernetes_resources={NPU: ASCEND_RESOURCE},
    name="tests.downstream_rules:PLUGGED",
)
"""The same rules, with what the frameworks and Kubernetes call the NPU: the adapters and a PyTorchJob take it."""

PBS: Final = CustomName("pbs")
"""A PBS-like cluster manager (invented for the tests): `pbsdsh -u` starts one process per node, with the job's id and
the node's index in its variables, and `trainplan launch` there starts the node's workers."""

PBS_NODES: Final = ClusterRule(
    name=PBS,
    description="PBS, one process per node started by pbsdsh -u (trainplan starts the node's workers)",
    detect_variables=(frozenset({"PBS_JOBID", "PBS_NODENUM"}),),
    detect_priority=2,  # below the managers that start every process themselves: inside them, they started it
    creates_processes=False,
    node_rank_variable="PBS_NODENUM",
    schemas=(
        JobVariables(
            label="PBS",
            reason="PBS was {how} (PBS_JOBID and PBS_NODENUM are set: pbsdsh started this node's process)",
            node_rank=JobVariable(names=("PBS_NODENUM",), required=True),
            num_nodes=JobVariable(names=("PBS_NUM_NODES",)),
            main_address=(
                JobVariable(names=("MASTER_ADDR",), format="host"),
                JobVariable(names=("PBS_MOM_HOST",), format="host"),  # the job's first node: rank 0's
            ),
            main_port=JobVariable(names=("MASTER_PORT",), format="port"),
        ),
    ),
    launch_hint="qsub -l nodes={num_nodes}, then pbsdsh -u trainplan launch --devices {processes_per_node} ...",
)

PBS_RULES: Final[Rules] = RULES.extend(clusters=[PBS_NODES], name="tests.downstream_rules:PBS_RULES")
"""The framework's rules with the PBS-like cluster: its plans read back from JSON, and `trainplan launch --rules`
runs them."""
