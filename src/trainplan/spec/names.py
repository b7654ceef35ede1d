"""The vocabulary: every name a request, an environment or a plan may hold, as `Literal` types.

Downstream code type-checks against these, so `Request(accelerator="gpux")` is a mypy error there;
the runtime normaliser (`trainplan.parse.normalise`) accepts the same names plus aliases and case.
The tuples beside each type are the runtime view of the same set; a test keeps them in step.
"""

from __future__ import annotations

import re
from typing import Final, Literal, NewType, TypeAlias, get_args

AcceleratorName = Literal["cpu", "cuda", "mps", "xla"]
"""A resolved accelerator: the device kind the run uses."""

AcceleratorFlag: TypeAlias = Literal["auto", "gpu", "tpu"] | AcceleratorName
"""What a request may say for the accelerator: a device kind, `gpu` (CUDA or MPS), `tpu` (= xla) or `auto`."""


StrategyName = Literal[
    "single_device",
    "dp",
    "ddp",
    "ddp_find_unused_parameters_true",
    "ddp_find_unused_parameters_false",
    "ddp_spawn",
    "ddp_spawn_find_unused_parameters_true",
    "ddp_spawn_find_unused_parameters_false",
    "ddp_fork",
    "ddp_fork_find_unused_parameters_true",
    "ddp_fork_find_unused_parameters_false",
    "ddp_notebook",
    "ddp_notebook_find_unused_parameters_true",
    "ddp_notebook_find_unused_parameters_false",
    "fsdp",
    "fsdp_cpu_offload",
    "deepspeed",
    "deepspeed_stage_1",
    "deepspeed_stage_1_offload",
    "deepspeed_stage_2",
    "deepspeed_stage_2_offload",
    "deepspeed_stage_3",
    "deepspeed_stage_3_offload",
    "deepspeed_stage_3_offload_nvme",
    "model_parallel",
    "xla",
    "single_xla",
    "xla_fsdp",
]
"""A registered strategy name; each maps to a family and preset options in `rules.STRATEGIES`."""

StrategyFlag: TypeAlias = Literal["auto"] | StrategyName
"""What a request may say for the strategy: a registered name or `auto`."""

CustomName = NewType("CustomName", str)
"""A strategy, accelerator, precision, backend or cluster name a downstream rule set adds (`trainplan.Rules.extend`).
Built-in names stay `Literal`-checked: a bare string is not a `CustomName`, so `Request(strategy="ddpx")` is still
a type error, while `Request(strategy=rule.name)` for a `StrategyRule(name=CustomName("ddp_custom_checkpoint_io"),
...)` is not (nor `Request(accelerator=NPU)` for `NPU = CustomName("npu")`)."""

CUSTOM_NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,63}", flags=re.ASCII)
"""A downstream rule set's name (a strategy's, an accelerator's, a backend's, a cluster's): lowercase, digits,
underscores."""
CUSTOM_PRECISION: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}", flags=re.ASCII)
"""A downstream precision's name: as `CUSTOM_NAME`, and hyphens too (as the built-in ones: "bf16-mixed")."""

StrategyKey: TypeAlias = StrategyName | CustomName
"""A strategy name in a rule set: a built-in one or a downstream one."""

StrategyFamily = Literal[
    "single_device", "dp", "ddp", "fsdp", "deepspeed", "model_parallel", "xla", "single_xla", "xla_fsdp"
]
"""How work is distributed, independent of how the processes are started."""

LauncherName = Literal["none", "subprocess", "spawn", "fork", "xla", "external"]
"""Who starts the worker processes: nobody (one process), trainplan (re-running the script, spawning or
forking), torch_xla, or a cluster manager that has already started them (`external`)."""

PrecisionName = Literal[
    "64-true",
    "32-true",
    "16-mixed",
    "bf16-mixed",
    "16-true",
    "bf16-true",
    "transformer-engine",
    "transformer-engine-float16",
]
"""A canonical precision."""

PrecisionFlag = Literal[64, 32, 16, "64", "32", "16", "bf16", PrecisionName]
"""What a request may say for precision, short aliases included."""


BackendName = Literal["nccl", "gloo", "mpi", "xla"]
"""A torch.distributed process-group backend."""

ContextParallelRotate = Literal["allgather", "alltoall"]
"""How torch's context parallelism passes key/value shards between the cp ranks
(`torch.distributed.tensor.experimental._attention.set_rotate_method`): all-gathered after the first block, or
passed around by all-to-all."""

ContextParallelBalancer = Literal["head_tail", "none"]
"""How torch's `context_parallel` splits each sequence over the cp ranks: `head_tail` (its default load balancer:
2·cp chunks, rank r taking chunk r and chunk 2·cp - 1 - r, so causal attention costs each rank the same), or
`none` (rank r takes the r-th contiguous block)."""

GroupBackend = Literal["nccl", "gloo"]
"""A backend one mesh dimension's groups may run over instead of the world's
(`ModelParallelOptions(tp_group_backend=...)`): the device mesh's backends (`rules.MESH_BACKENDS`), each where it
runs."""


ClusterName = Literal["local", "slurm", "torchelastic", "lsf", "mpi", "kubeflow", "torch_env"]
"""A resolved cluster environment."""

ClusterFlag: TypeAlias = Literal["auto"] | ClusterName
"""What a request may say for the cluster environment; `auto` detects it from environment variables."""

MetricsStore = Literal["device", "cpu"]
"""Where logged metric tensors are kept between reductions by default."""

StartMethod = Literal["fork", "spawn", "forkserver"]
"""A multiprocessing start method."""

EmitFormat = Literal["torchrun", "slurm", "kubeflow"]
"""What `trainplan plan --emit` prints the plan as: a torchrun command line, an sbatch script, a Kubeflow PyTorchJob
(formats named after the engines that run them, not the cluster rules of the same names)."""

NoteLevel = Literal["info", "warning", "deprecation"]
"""How loud a plan note is."""

MetricKind = Literal["tensor", "stateful"]
"""What is logged: a plain value/tensor, or a stateful metric object (torchmetrics `Metric`)."""

MeshDimension = Literal["pp", "dp_replicate", "dp_shard", "cp", "sp", "tp"]
"""A dimension of a device mesh, in the mesh's fixed order (outermost first, as torchtitan orders them, with
Accelerate's `sp` between `cp` and `tp`): pipeline stages, data-parallel replicas, data-parallel shards (FSDP2),
context (ring-attention) shards, sequence (Ulysses all-to-all) shards, tensor shards.
The outer dimensions talk least (a pipeline passes activations once per micro-batch), the inner ones most (tensor
parallelism reduces inside every layer), so the inner ones sit on the ranks that share a node."""

ExpertDimension = Literal["pp", "dp_replicate", "efsdp", "ep"]
"""A dimension of the expert mesh (torchtitan's sparse mesh), outermost first: the same pipeline stages and replicas
as the dense mesh, then the ranks of `dp_shard × cp × sp × tp` regrouped as `efsdp × ep`: the experts are split over
`ep` ranks and sharded (FSDP2) over the `efsdp` ranks left."""

PipelineSchedule = Literal["1F1B", "GPipe", "Interleaved1F1B", "ZBVZeroBubble", "InterleavedZeroBubble"]
"""A pipeline schedule, by torch's own name (`torch.distributed.pipelining.schedules.get_schedule_class`)."""

MeshName = Literal[
    "pp", "dp_replicate", "dp_shard", "cp", "sp", "tp", "ep", "efsdp",
    "dp", "batch", "fsdp", "dp_shard_cp", "dp_cp", "loss", "data_parallel", "tensor_parallel",
]  # fmt: skip
"""Every name `rt.mesh` answers to: its own six dimensions, the expert mesh's two, and the names peers flatten or
rename them to (torchtitan's `batch`, `fsdp`, `dp_shard_cp`, `dp_cp`/`loss`; Lightning's `data_parallel`,
`tensor_parallel`; `dp`)."""

ACCELERATORS: Final[tuple[AcceleratorName, ...]] = get_args(AcceleratorName)
ACCELERATOR_FLAGS: Final[tuple[AcceleratorFlag, ...]] = ("auto", *ACCELERATORS[:2], "gpu", *ACCELERATORS[2:], "tpu")
STRATEGY_NAMES: Final[tuple[StrategyName, ...]] = get_args(StrategyName)
STRATEGY_FLAGS: Final[tuple[StrategyFlag, ...]] = ("auto", *STRATEGY_NAMES)
STRATEGY_FAMILIES: Final[tuple[StrategyFamily, ...]] = get_args(StrategyFamily)
LAUNCHERS: Final[tuple[LauncherName, ...]] = get_args(LauncherName)
PRECISION_FLAGS: Final[tuple[PrecisionFlag, ...]] = get_args(PrecisionFlag)
PRECISIONS: Final[tuple[PrecisionName, ...]] = get_args(PrecisionName)
BACKENDS: Final[tuple[BackendName, ...]] = get_args(BackendName)
GROUP_BACKENDS: Final[tuple[GroupBackend, ...]] = get_args(GroupBackend)
CONTEXT_PARALLEL_ROTATES: Final[tuple[ContextParallelRotate, ...]] = get_args(ContextParallelRotate)
CONTEXT_PARALLEL_BALANCERS: Final[tuple[ContextParallelBalancer, ...]] = get_args(ContextParallelBalancer)
CLUSTERS: Final[tuple[ClusterName, ...]] = get_args(ClusterName)
CLUSTER_FLAGS: Final[tuple[ClusterFlag, ...]] = ("auto", *CLUSTERS)
METRICS_STORES: Final[tuple[MetricsStore, ...]] = get_args(MetricsStore)
DEFAULT_PRECISION: Final[PrecisionName] = "32-true"
"""The precision of a request that names none (`Request().precision`): the record's default, which the rules read."""
HOST_DEVICE: Final[str] = "cpu"
"""torch's device type for host memory, which takes no index ("cpu", never "cpu:1"): where a CPU-stored metric lives,
and the device of every process of the accelerator whose devices are the host's CPUs (`AcceleratorRule.host`)."""
START_METHODS: Final[tuple[StartMethod, ...]] = get_args(StartMethod)
EMIT_FORMATS: Final[tuple[EmitFormat, ...]] = get_args(EmitFormat)
NAMED_EMIT_FORMATS: Final[tuple[EmitFormat, ...]] = ("slurm", "kubeflow")
"""The emitted forms that carry a job's name (`--job-name`): an sbatch script and a PyTorchJob; a torchrun line has
none."""
NOTE_LEVELS: Final[tuple[NoteLevel, ...]] = get_args(NoteLevel)
MESH_DIMENSIONS: Final[tuple[MeshDimension, ...]] = get_args(MeshDimension)
EXPERT_DIMENSIONS: Final[tuple[ExpertDimension, ...]] = get_args(ExpertDimension)
MESH_NAMES: Final[tuple[MeshName, ...]] = get_args(MeshName)
PIPELINE_SCHEDULES: Final[tuple[PipelineSchedule, ...]] = get_args(PipelineSchedule)

AcceleratorKey: TypeAlias = AcceleratorName | CustomName
"""An accelerator in a rule set: a built-in one or a downstream one (`Rules.extend(accelerators=...)`)."""

PrecisionKey: TypeAlias = PrecisionName | CustomName
"""A precision in a rule set: a built-in one or a downstream one (`Rules.extend(precisions=...)`)."""

BackendKey: TypeAlias = BackendName | CustomName
"""A backend in a rule set: a built-in one or a downstream one (a device plugin's, such as Ascend's "hccl")."""

ClusterKey: TypeAlias = ClusterName | CustomName
"""A cluster environment in a rule set: a built-in one or a downstream one (`Rules.extend(clusters=...)`)."""
