"""Precisions (accelerators, needs, fallbacks, aliases, the default) and process-group backends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from trainplan.spec.frozen import freeze_nested_maps
from trainplan.spec.names import (
    AcceleratorKey,
    BackendKey,
    MetricsStore,
    PrecisionFlag,
    PrecisionKey,
    PrecisionName,
)


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

DEVICE_TYPES_WITHOUT_FLOAT64: Final[frozenset[str]] = frozenset({"mps"})
"""torch device types that have no float64 (Metal has none): a metric store accumulates floats there in float32."""
