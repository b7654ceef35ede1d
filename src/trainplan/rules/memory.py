"""Memory rules: every candidate layout's arithmetic as a row, the order they are preferred in, and the policy.

Everything the memory-aware choice (`resolve.memory`) decides from lives here. A layout row says where each category
of a training step's memory goes (the ZeRO paper's partitioning of model states, Rajbhandari et al. 2020, §5):

- `whole`: every device holds all of it (DDP's replicas);
- `sharded`: split over the data-parallel ranks (ZeRO/FSDP: ÷ Nd);
- `node`: split over one node's ranks, replicated across nodes (HSDP);
- `host`: moved to host memory, split over the data-parallel ranks (ZeRO-Offload; FSDP's CPU offload).

Tensor parallelism divides parameters, gradients, optimizer states, activations and the backward's temporaries by its
degree (Megatron-LM with sequence parallelism, Korthikanti et al. 2022); the data-parallel degree is then the world
over that degree. A layout that shards parameters gathers whole layers while it runs them (`gathered_layers`: the
layer's parameters and its unsharded gradients). Activation checkpointing keeps each layer's input and recomputes one
layer at a time.

The order of preference is a row too (`MEMORY_ORDER`): the fewest communication costs first. The reasons are the
published traffic per step: DDP all-reduces gradients (2Ψ); ZeRO stages 1 and 2 move the same volume (reduce-scatter
then all-gather); HSDP and FSDP/ZeRO-3 move 1.5× (parameters all-gathered in forward and backward), HSDP's gathers
inside a node; tensor parallelism all-reduces activations in every layer; recomputation costs about a third more
compute; offload crosses PCIe every step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

import attrs

from trainplan.spec.memory import MemoryPolicy
from trainplan.spec.names import PrecisionName, StrategyKey
from trainplan.spec.options import FSDPOptions, ModelParallelOptions, StrategyOptions

Placement = Literal["whole", "sharded", "node", "host"]
"""Where one category of memory goes under a layout (see the module's docstring)."""


@attrs.frozen(kw_only=True)
class MemoryLayout:
    """A candidate layout: the strategy (and options) that runs it, and where each category of memory goes."""

    name: str
    strategy: StrategyKey
    options: StrategyOptions | None = None
    """The options record the plan takes (None: the strategy's own, its preset applied)."""
    parameters: Placement
    gradients: Placement
    optimizer: Placement
    tensor_parallel: int = 1
    gathered_layers: int = 0
    """Layer-sized buffers a sharded layout holds at once (a layer's gathered parameters and unsharded gradients)."""
    gradient_buckets: int = 0
    """Copies of the gradients a layout's reducer keeps beside them (DDP's buckets: 1)."""
    min_processes: int = 2
    max_processes: int | None = None
    min_nodes: int = 1
    description: str


def _tp_fsdp(degree: int) -> MemoryLayout:
    return MemoryLayout(
        name=f"tp{degree}_fsdp",
        strategy="model_parallel",
        options=ModelParallelOptions(tp=degree),
        parameters="sharded",
        gradients="sharded",
        optimizer="sharded",
        tensor_parallel=degree,
        gathered_layers=2,
        min_processes=degree,
        description=f"tensor parallel {degree} inside a node × FSDP2 over the rest",
    )


MEMORY_LAYOUTS: Final[tuple[MemoryLayout, ...]] = (
    MemoryLayout(
        name="single_device",
        strategy="single_device",
        parameters="whole",
        gradients="whole",
        optimizer="whole",
        min_processes=1,
        max_processes=1,
        description="one device holds everything",
    ),
    MemoryLayout(
        name="ddp",
        strategy="ddp",
        parameters="whole",
        gradients="whole",
        optimizer="whole",
        gradient_buckets=1,  # torch's Reducer copies gradients into its buckets (gradient_as_bucket_view=False)
        description="DDP: every rank a full replica",
    ),
    MemoryLayout(
        name="zero1",
        strategy="deepspeed_stage_1",
        parameters="whole",
        gradients="whole",
        optimizer="sharded",
        description="ZeRO-1: optimizer states sharded",
    ),
    MemoryLayout(
        name="zero2",
        strategy="deepspeed_stage_2",
        parameters="whole",
        gradients="sharded",
        optimizer="sharded",
        description="ZeRO-2: gradients and optimizer states sharded",
    ),
    MemoryLayout(
        name="hsdp",
        strategy="fsdp",
        options=FSDPOptions(sharding_strategy="HYBRID_SHARD"),
        parameters="node",
        gradients="node",
        optimizer="node",
        gathered_layers=2,
        min_nodes=2,
        description="HSDP: FSDP inside each node, replicas across nodes",
    ),
    MemoryLayout(
        name="fsdp",
        strategy="fsdp",
        parameters="sharded",
        gradients="sharded",
        optimizer="sharded",
        gathered_layers=2,
        description="FSDP full shard (ZeRO-3): everything sharded",
    ),
    MemoryLayout(
        name="zero3",
        strategy="deepspeed_stage_3",
        parameters="sharded",
        gradients="sharded",
        optimizer="sharded",
        gathered_layers=2,
        description="DeepSpeed ZeRO-3: everything sharded",
    ),
    _tp_fsdp(2),
    _tp_fsdp(4),
    _tp_fsdp(8),
    MemoryLayout(
        name="zero2_offload",
        strategy="deepspeed_stage_2_offload",
        parameters="whole",
        gradients="host",
        optimizer="host",
        description="ZeRO-Offload: gradients and optimizer states in host memory",
    ),
    MemoryLayout(
        name="fsdp_offload",
        strategy="fsdp_cpu_offload",
        parameters="host",
        gradients="host",
        optimizer="host",
        gathered_layers=2,
        min_processes=1,
        description="FSDP with CPU offload: parameters, gradients and optimizer states in host memory",
    ),
)
"""Every candidate layout, by the strategy that runs it."""


SAME_ARITHMETIC: Final[dict[str, tuple[str, str]]] = {
    # every DDP flavour holds DDP's replicas and buckets: how the processes start (spawn, fork, a notebook) and
    # whether the reducer searches for unused parameters leave the memory of a step as DDP's
    "ddp": ("ddp", "ddp"),
    # DeepSpeed's stage 3 offload preset (offload_optimizer and offload_parameters) moves parameters, gradients and
    # optimizer states to host memory, sharded: FSDP's CPU offload row
    "deepspeed_stage_3_offload": ("fsdp_offload", "zero3_offload"),
}
"""An explicit strategy no layout row names, keyed by the strategy or its family: (the row whose arithmetic it
runs, the name its estimate takes). A strategy neither names (dp, deepspeed with a config, stage 1 offload, NVMe
offload, a custom one) is not checked, and the plan says so."""


@attrs.frozen(kw_only=True)
class MemoryOrder:
    """The order candidates are preferred in: each on-device layout without recomputation, then each with it, then
    each offloading layout without and with it."""

    on_device: tuple[str, ...]
    offloaded: tuple[str, ...]
    reason: str

    def candidates(self) -> tuple[tuple[str, bool], ...]:
        """(layout name, activation checkpointing), most preferred first."""
        return (
            *((name, False) for name in self.on_device),
            *((name, True) for name in self.on_device),
            *((name, checkpointing) for name in self.offloaded for checkpointing in (False, True)),
        )


MEMORY_ORDER: Final = MemoryOrder(
    on_device=("single_device", "ddp", "zero1", "zero2", "hsdp", "fsdp", "zero3", "tp2_fsdp", "tp4_fsdp", "tp8_fsdp"),
    offloaded=("zero2_offload", "fsdp_offload"),
    reason=(
        "fewest communication costs first: one device; DDP (all-reduce, 2Ψ a step); ZeRO-1/2 (the same volume); "
        "HSDP then FSDP/ZeRO-3 (1.5×, HSDP's gathers inside a node); tensor parallelism (activations all-reduced in "
        "every layer); then the same with activation checkpointing (about a third more compute); offload last "
        "(host traffic every step)"
    ),
)

MEMORY_POLICY: Final = MemoryPolicy()
"""The policy of a request that names none: 10% of each device left free; checkpointing and offload allowed."""

WHAT_IF_VOCABULARY: Final = 32000
"""The vocabulary `transformer_facts` assumes unless told (Llama's): its embedding and head are the root unit."""

MIXED_PRECISION_ADAM: Final = (2, 2, 12)
"""Bytes per parameter of (weights, gradients, optimizer states) under 16-bit mixed precision with Adam: the ZeRO
paper's 2Ψ + 2Ψ + KΨ, K = 12 (fp32 master weights, momentum and variance)."""

BYTES_PER_PARAMETER: Final = {
    "bf16-mixed": MIXED_PRECISION_ADAM,
    "16-mixed": MIXED_PRECISION_ADAM,
    "32-true": (4, 4, 8),
    "bf16-true": (2, 2, 4),
    "16-true": (2, 2, 4),
    "64-true": (8, 8, 16),
}
"""What `transformer_facts` assumes per parameter with Adam, by precision (weights, gradients, optimizer states)."""

WHAT_IF_PRECISION: Final = "bf16-mixed"
"""The precision `transformer_facts` assumes unless told: how large models are trained."""

MODEL_DTYPES: Final[tuple[str, ...]] = (
    "float32", "bfloat16", "float16", "float64",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
    "int8", "uint8", "int16", "int32", "int64", "complex32", "complex64", "complex128",
)  # fmt: skip
"""The dtypes a model's parameters are held in, by torch's names (`str(torch.bfloat16)` less `torch.`):
`ModelFacts.dtype` is one of them."""

MEMORY_ACCELERATORS: Final[frozenset[str]] = frozenset({"cuda"})
"""The accelerators whose devices' memory the environment states (`Environment.cuda_memory_bytes`, NVML's)."""

ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN: Final = 34
"""A transformer layer's saved activations, bytes per token per hidden unit, 16-bit, with flash attention (no s²
scores): Korthikanti et al. 2022, eq. 2 without its 5as/h term."""


MEASURED_PRECISION: Final[Mapping[str, PrecisionName]] = {
    "float32": "32-true",
    "bfloat16": "bf16-true",
    "float16": "16-true",
    "float64": "64-true",
}
"""The precision a measured step ran at, by its parameters' dtype (`measure_model`): the step runs without
autocast, so the module's own dtype throughout (another dtype: not said)."""


__all__ = [
    "ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN",
    "BYTES_PER_PARAMETER",
    "MEASURED_PRECISION",
    "MEMORY_ACCELERATORS",
    "MEMORY_LAYOUTS",
    "MEMORY_ORDER",
    "MEMORY_POLICY",
    "MODEL_DTYPES",
    "SAME_ARITHMETIC",
    "WHAT_IF_PRECISION",
    "WHAT_IF_VOCABULARY",
    "MemoryLayout",
    "MemoryOrder",
    "Placement",
]
