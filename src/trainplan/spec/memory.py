"""Memory: the facts of a model's training step, the policy for fitting it, and the per-device estimate a plan carries.

`ModelFacts` is what the memory-aware choice needs of a model: written by hand for a what-if (or built by
`trainplan.transformer_facts` from a shape), or measured from a module by `trainplan.measure_model` (an effect:
FakeTensorMode and torch's MemTracker, no real allocation). Every byte count is for one training step of the whole,
unsharded model on one device. `MemoryPolicy` says how much room to leave and what may be used to fit. `MemoryPlan`
is the answer: the estimate per device by category for each candidate layout considered, and the one chosen.
Records only: the arithmetic is `trainplan.rules.memory` (its rows) and `trainplan.resolve.memory`.
"""

from __future__ import annotations

import attrs

from trainplan.spec.names import PrecisionKey, StrategyKey

GIB = 1 << 30


@attrs.frozen(kw_only=True)
class ModelFacts:
    """What one training step of a model holds in memory on one device, unsharded, by category (bytes)."""

    parameter_count: int
    parameter_bytes: int
    """The weights as the step holds them (2 bytes each under 16-bit mixed precision: the ZeRO paper's 2Ψ)."""
    gradient_bytes: int
    optimizer_bytes: int
    """The optimizer's states, fp32 master weights included under mixed precision (Adam: the ZeRO paper's KΨ, K=12)."""
    activation_bytes_per_sample: int
    """Activations saved for the backward pass, per sample, over every layer."""
    layer_count: int = 1
    """The repeated blocks (a transformer's layers): activation checkpointing keeps one input per block."""
    layer_input_bytes_per_sample: int = 0
    """One block's input per sample: what activation checkpointing keeps of each block."""
    largest_layer_bytes: int = 0
    """The parameters of the largest block: what a sharded layout gathers at once."""
    root_bytes: int = 0
    """Parameters outside the repeated blocks (embeddings, the output head): a sharded layout gathers them for the
    whole forward and backward (FSDP's root unit)."""
    temporary_bytes: int = 0
    """Other peak memory of the forward and backward (buffers, the loss, workspace), per device."""
    optimizer_step_bytes: int = 0
    """What the optimizer's step allocates for itself (a foreach AdamW's intermediates: about one copy of the
    parameters), sharded as the optimizer's states are."""
    batch_size: int = 1
    """Samples per device in one step (the activations scale with it)."""
    hidden_size: int = 0
    """The width of a block's input (a transformer's hidden size), which tensor parallelism splits; 0: not known."""
    dtype: str = "bfloat16"
    """The parameters' dtype as measured or assumed (for the explanation)."""
    precision: PrecisionKey | None = None
    """The training precision the facts were built or measured for: their bytes a parameter and their activations
    follow it (`transformer_facts(precision=...)` says it; `measure_model` measures a step without autocast, so its
    facts are the parameters' dtype's '-true' precision). A request that writes no precision takes it; one that
    writes another is refused, since no factor turns one precision's facts into another's. None: not said (facts
    written by hand), and the request's precision is taken as theirs."""

    @property
    def activation_bytes_per_layer(self) -> int:
        """One block's saved activations per sample."""
        return self.activation_bytes_per_sample // max(self.layer_count, 1)


@attrs.frozen(kw_only=True)
class MemoryPolicy:
    """How a model is fitted to the devices' memory (the rule set's `memory_policy` row is the default)."""

    headroom: float = 0.1
    """The fraction of each device's memory left free: the CUDA context, NCCL's buffers, the allocator's
    fragmentation."""
    activation_checkpointing: bool = True
    """Whether a layout may recompute activations (about a third more compute) to fit."""
    offload: bool = True
    """Whether a layout may move optimizer states or parameters to host memory (slower: PCIe traffic each step)."""


@attrs.frozen(kw_only=True)
class MemoryEstimate:
    """One candidate layout's memory per device (bytes), by category, and the verdict on it."""

    layout: str
    """The layout row's name (`rules.memory.MEMORY_LAYOUTS`)."""
    strategy: StrategyKey
    checkpointing: bool
    tensor_parallel: int
    data_parallel: int
    parameters: int
    gradients: int
    optimizer: int
    activations: int
    gathered: int
    """Parameters and gradients of whole layers gathered at once by a sharded layout (and its root unit)."""
    temporaries: int
    """The forward's and backward's other peak memory, DDP's gradient buckets included."""
    step: int
    """What the optimizer's step allocates for itself, on this device."""
    host: int
    """Bytes moved to host memory per process (offload)."""
    fits: bool
    verdict: str
    """"chosen", or why not: "needs 46.1 GiB > 36.0 GiB", "fits; a preferred layout fits too", "not allowed: ..."."""

    @property
    def total(self) -> int:
        """The predicted peak per device: the larger of the forward-backward's peak (everything but the step's own
        buffers) and the optimizer step's (the model states and those buffers; the activations are freed by then)."""
        states = self.parameters + self.gradients + self.optimizer
        return states + max(self.activations + self.gathered + self.temporaries, self.step)


@attrs.frozen(kw_only=True)
class MemoryPlan:
    """The memory arithmetic of a plan: the budget per device and every candidate considered, in preference order."""

    device_bytes: int
    """Memory per device (the smallest of the plan's devices)."""
    budget_bytes: int
    """What a layout may use per device: `device_bytes` less the policy's headroom."""
    host_bytes: int | None
    """Host memory per node, when known (offload is checked against it)."""
    policy: MemoryPolicy
    chosen: str | None
    """The chosen layout's name; None when the strategy was given and no layout row describes it."""
    candidates: tuple[MemoryEstimate, ...]

    @property
    def estimate(self) -> MemoryEstimate | None:
        """The chosen layout's estimate: the candidate marked chosen (a layout is a candidate twice, without and with
        activation checkpointing, so its name alone does not say which)."""
        return next((item for item in self.candidates if item.layout == self.chosen and item.verdict == "chosen"), None)

    @property
    def checkpointing(self) -> bool:
        """Whether the chosen layout recomputes activations (the training loop turns it on)."""
        chosen = self.estimate
        return chosen is not None and chosen.checkpointing


__all__ = ["GIB", "MemoryEstimate", "MemoryPlan", "MemoryPolicy", "ModelFacts"]
