"""What a job carries and where it ends: trainplan's own variables, the variables the probe reads, the process-group
timeout, Kubernetes resources, and the limits beyond which a layout is not a machine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from trainplan.rules.clusters import JOB_VARIABLES
from trainplan.spec.names import (
    AcceleratorKey,
    AcceleratorName,
)

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

LAUNCH_CHOICES_VARIABLE: Final[str] = "TRAINPLAN_LAUNCH_CHOICES"
"""Set by `trainplan launch` for its workers: the request fields its flags wrote (comma-separated), so that a
script's own `Request` takes a flag given at its default value too (`mapping.workers.with_launch_choices`)."""

RULES_VARIABLE: Final[str] = "TRAINPLAN_RULES"
"""Set by emitted jobs whose plan was made from a downstream rule set: its reference ("package.module:NAME").
`trainplan.resolve()` with no request resolves the carried request with it when the job's script has it (imported,
or passed as `rules=`), and refuses otherwise: a variable names a rule set, it never imports one."""

LAUNCHER_RULES_VARIABLE: Final[str] = "TRAINPLAN_LAUNCHER_RULES"
"""Set by `trainplan launch --rules MODULE:NAME` for the workers it starts itself: "<its pid> <the reference>". A
worker imports that rule set only when the pid is its parent's (the launcher that was told `--rules` started this
very process); inherited any further, or set by anything else, the variable is ignored."""

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
